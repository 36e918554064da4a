/* rows.c — row changes to keys (rows.h).
 *
 * Which rows give keys: an INSERT its new row's keys (a cache may hold a miss, or a list the row
 * joins); an UPDATE the new row's and the old row's (both when a templated column changed, one
 * when not); a DELETE the old row's. The old row is what pgoutput sends: the whole row under
 * REPLICA IDENTITY FULL, the identity columns otherwise, and nothing on an UPDATE that changed
 * no identity column; setup.c makes sure every templated column is in it. A value PostgreSQL
 * did not send (an unchanged TOASTed column, 'u') is taken from the old row when it is there.
 * The invalidation table gives one key per inserted row (its "key" column); its updates and
 * deletes (the cleaner's) give none.
 *
 * A key that cannot be made because its column's value is not known (as opposed to NULL) is a
 * key that may stay stale: the column was renamed or dropped under a running invalidator, an
 * UPDATE or DELETE's old row lacks it because the table's replica identity was changed back
 * from FULL, or an unchanged TOASTed value came without an old row. Such a change flushes the
 * table's namespaces instead (as a truncate does), counted in keys_missing and logged at error
 * level once per description of the relation: a wider invalidation than asked, never a
 * missed one. */
#include "invalidator/rows.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "invalidator/config.h"
#include "invalidator/invalidator.h"
#include "invalidator/pgoutput.h"
#include "common/template.h"

#define NS_SLOTS 4096 /* distinct namespaces interned for invalidation table keys */

struct rel {
    uint32_t relid;
    char *names;               /* "schema\0relname\0col0\0col1\0...": what a new map is
                                  resolved against (rows_set_map) */
    const char **colv;         /* into names */
    uint8_t *colflags;         /* per column: pgoutput's flags (1: in the replica identity) */
    char replident;            /* 'd' default, 'f' full, 'i' index, 'n' nothing */
    uint16_t ncols;
    const struct inv_table *t; /* NULL: not mapped (or the invalidation table) */
    int inv;                   /* the invalidation table */
    int keycol, idcol;         /* invalidation table columns, -1 when absent */
    int *refcol;               /* per template, per placeholder: column index or -1 */
    size_t nrefcol;
    uint8_t *oldok;            /* per template: an UPDATE's or DELETE's old row holds all its
                                  columns (identity FULL, or each one in the identity) */
    int warned;                /* a missing value was logged since this description */
};

struct rows {
    const struct inv_config *conf; /* the invalidation table */
    const struct inv_config *map;  /* the tables: conf, or `owned` */
    struct inv_config *owned;      /* a map rows_set_map handed over, or NULL */
    struct inv_figs *figs;
    struct rel *rels;
    size_t nrels, cap;
    char *ns[NS_SLOTS];
    size_t nns;
};

#define FIG_ADD(r, name, v)                                                                      \
    do {                                                                                         \
        if ((r)->figs) atomic_fetch_add(&(r)->figs->name, (v));                                  \
    } while (0)

void keyset_reset(struct keyset *ks)
{
    ks->nbytes = ks->n = ks->nflush = 0;
    ks->max_inv_id = 0;
    ks->truncated = 0;
    if (ks->nindex > 4096) { /* after a large transaction, do not clear a large index each time */
        free(ks->index);
        ks->index = NULL;
        ks->nindex = 0;
    } else if (ks->nindex) {
        memset(ks->index, 0, ks->nindex * sizeof *ks->index);
    }
}

void keyset_free(struct keyset *ks)
{
    free(ks->bytes);
    free(ks->e);
    free(ks->flush);
    free(ks->index);
    memset(ks, 0, sizeof *ks);
}

static uint64_t key_hash(const char *k, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)k[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* The index slot holding `key`, or the empty slot where it would go. */
static uint32_t *index_slot(const struct keyset *ks, const char *key, size_t n)
{
    size_t mask = ks->nindex - 1;
    for (size_t i = (size_t)key_hash(key, n) & mask;; i = (i + 1) & mask) {
        uint32_t *s = &ks->index[i];
        if (*s == 0) return s;
        const struct keyent *e = &ks->e[*s - 1];
        if (e->len == n && !memcmp(ks->bytes + e->off, key, n)) return s;
    }
}

static int index_grow(struct keyset *ks)
{
    size_t cap = ks->nindex ? ks->nindex * 2 : 64;
    uint32_t *idx = calloc(cap, sizeof *idx);
    if (idx == NULL) return -1;
    free(ks->index);
    ks->index = idx;
    ks->nindex = cap;
    for (size_t i = 0; i < ks->n; i++)
        *index_slot(ks, ks->bytes + ks->e[i].off, ks->e[i].len) = (uint32_t)(i + 1);
    return 0;
}

int keyset_add(struct keyset *ks, const char *key, size_t n, const char *ns)
{
    if ((ks->n + 1) * 2 > ks->nindex && index_grow(ks) < 0) return -1;
    uint32_t *slot = index_slot(ks, key, n);
    if (*slot) return 0; /* the transaction names it already */
    if (ks->capb - ks->nbytes < n) {
        size_t cap = ks->capb ? ks->capb * 2 : 4096;
        while (cap - ks->nbytes < n) cap *= 2;
        char *b = realloc(ks->bytes, cap);
        if (b == NULL) return -1;
        ks->bytes = b;
        ks->capb = cap;
    }
    if (ks->n == ks->cap) {
        size_t cap = ks->cap ? ks->cap * 2 : 64;
        struct keyent *e = realloc(ks->e, cap * sizeof *e);
        if (e == NULL) return -1;
        ks->e = e;
        ks->cap = cap;
    }
    memcpy(ks->bytes + ks->nbytes, key, n);
    ks->e[ks->n++] = (struct keyent){ks->nbytes, (uint32_t)n, ns};
    ks->nbytes += n;
    *slot = (uint32_t)ks->n;
    return 0;
}

int keyset_flush(struct keyset *ks, const char *ns)
{
    for (size_t i = 0; i < ks->nflush; i++)
        if (!strcmp(ks->flush[i], ns)) return 0;
    if (ks->nflush == ks->capflush) {
        size_t cap = ks->capflush ? ks->capflush * 2 : 8;
        const char **f = realloc(ks->flush, cap * sizeof *f);
        if (f == NULL) return -1;
        ks->flush = f;
        ks->capflush = cap;
    }
    ks->flush[ks->nflush++] = ns;
    return 0;
}

struct rows *rows_create(const struct inv_config *conf, struct inv_figs *figs)
{
    struct rows *r = calloc(1, sizeof *r);
    if (r == NULL) return NULL;
    r->conf = r->map = conf;
    r->figs = figs;
    return r;
}

static void map_free(struct inv_config **m)
{
    if (*m == NULL) return;
    inv_config_free(*m);
    free(*m);
    *m = NULL;
}

void rows_destroy(struct rows **pr)
{
    struct rows *r = *pr;
    if (r == NULL) return;
    for (size_t i = 0; i < r->nrels; i++) {
        free(r->rels[i].refcol);
        free(r->rels[i].names);
        free(r->rels[i].colv);
        free(r->rels[i].colflags);
        free(r->rels[i].oldok);
    }
    free(r->rels);
    map_free(&r->owned);
    for (size_t i = 0; i < NS_SLOTS; i++) free(r->ns[i]);
    free(r);
    *pr = NULL;
}

static struct rel *find_rel(struct rows *r, uint32_t relid)
{
    for (size_t i = 0; i < r->nrels; i++)
        if (r->rels[i].relid == relid) return &r->rels[i];
    return NULL;
}

static int colindex(const struct rel *rel, const char *name)
{
    for (int i = 0; i < rel->ncols; i++)
        if (!strcmp(rel->colv[i], name)) return i;
    return -1;
}

/* What the relation is in the map and the configuration: its table and where each templated
 * column sits, or the invalidation table. 0, or -1 out of memory (then not mapped). */
static int rel_resolve(struct rows *r, struct rel *rel)
{
    free(rel->refcol);
    free(rel->oldok);
    rel->refcol = NULL;
    rel->oldok = NULL;
    rel->nrefcol = 0;
    rel->warned = 0;
    rel->inv = 0;
    rel->keycol = rel->idcol = -1;
    rel->t = NULL;
    if (rel->names == NULL) return 0; /* its description did not fit in memory */
    const char *schema = rel->names, *relname = schema + strlen(schema) + 1;
    if (r->conf->inv_name && !strcmp(r->conf->inv_schema, schema) &&
        !strcmp(r->conf->inv_name, relname)) {
        rel->inv = 1;
        rel->keycol = colindex(rel, "key");
        rel->idcol = colindex(rel, "id");
    }
    const struct inv_table *t = inv_config_table(r->map, schema, relname);
    if (t) {
        size_t n = 0;
        for (size_t k = 0; k < t->nkeys; k++) n += tmpl_nrefs(t->keys[k]);
        rel->refcol = malloc((n ? n : 1) * sizeof *rel->refcol);
        rel->oldok = malloc(t->nkeys ? t->nkeys : 1);
        if (rel->refcol == NULL || rel->oldok == NULL) return -1;
        for (size_t k = 0; k < t->nkeys; k++) {
            rel->oldok[k] = 1;
            for (size_t j = 0; j < tmpl_nrefs(t->keys[k]); j++) {
                int c = colindex(rel, tmpl_ref(t->keys[k], j));
                rel->refcol[rel->nrefcol++] = c;
                if (rel->replident != 'f' && (c < 0 || !(rel->colflags[c] & 1)))
                    rel->oldok[k] = 0;
            }
        }
        rel->t = t;
    }
    return 0;
}

int rows_set_map(struct rows *r, struct inv_config *map)
{
    r->map = map;
    int rc = 0;
    for (size_t i = 0; i < r->nrels; i++)
        if (rel_resolve(r, &r->rels[i]) < 0) rc = -1;
    map_free(&r->owned);
    r->owned = map;
    return rc;
}

int rows_relation(struct rows *r, const struct pgo_msg *m)
{
    struct rel *rel = find_rel(r, m->relid);
    if (rel == NULL) {
        if (r->nrels == r->cap) {
            size_t cap = r->cap ? r->cap * 2 : 16;
            struct rel *n = realloc(r->rels, cap * sizeof *n);
            if (n == NULL) return -1;
            r->rels = n;
            r->cap = cap;
        }
        rel = &r->rels[r->nrels++];
        memset(rel, 0, sizeof *rel);
        rel->relid = m->relid;
    }
    const char *schema = m->nspname[0] ? m->nspname : "pg_catalog";
    size_t len = strlen(schema) + strlen(m->relname) + 2;
    for (int i = 0; i < m->ncols; i++) len += strlen(m->cols[i].name) + 1;
    char *names = malloc(len);
    const char **colv = malloc((m->ncols ? m->ncols : 1) * sizeof *colv);
    uint8_t *colflags = malloc(m->ncols ? m->ncols : 1);
    if (names == NULL || colv == NULL || colflags == NULL) {
        free(names);
        free(colv);
        free(colflags);
        return -1; /* the reader reconnects: PostgreSQL describes the relation again */
    }
    char *w = stpcpy(names, schema) + 1;
    w = stpcpy(w, m->relname) + 1;
    for (int i = 0; i < m->ncols; i++) {
        colv[i] = w;
        colflags[i] = m->cols[i].flags;
        w = stpcpy(w, m->cols[i].name) + 1;
    }
    free(rel->names);
    free(rel->colv);
    free(rel->colflags);
    rel->names = names;
    rel->colv = colv;
    rel->colflags = colflags;
    rel->replident = m->replident;
    rel->ncols = m->ncols;
    return rel_resolve(r, rel);
}

/* A template's column whose value is not known: no such column (renamed or dropped), or a
 * TOASTed value sent as unchanged with no old row to take it from. */
#define KEY_MISSING (-100)

/* Evaluate template k on `t` (values it lacks, 'u', from `fallback` when given). The key's
 * length, a TMPL_* code, or KEY_MISSING. */
static int eval(const struct tmpl *k, const int *refcol, const struct pgo_tuple *t,
                const struct pgo_tuple *fallback, char *out)
{
    struct tmpl_val vals[64];
    size_t n = tmpl_nrefs(k);
    if (n > 64) return TMPL_TOO_LONG;
    for (size_t i = 0; i < n; i++) {
        int c = refcol[i];
        if (c < 0 || c >= t->ncols) return KEY_MISSING;
        const struct pgo_value *v = &t->vals[c];
        if (v->kind == 'u' && fallback && c < fallback->ncols) v = &fallback->vals[c];
        if (v->kind == 'u') return KEY_MISSING;
        vals[i].null = v->kind == 'n';
        vals[i].p = v->data;
        vals[i].n = v->len;
    }
    return tmpl_eval(k, vals, out, TMPL_KEY_MAX);
}

static const char *intern(struct rows *r, const char *key, size_t n);

/* Template t's key for this change cannot be made (see the head of this file): flush the
 * table's namespaces in its place. */
static int missing(struct rows *r, struct rel *rel, const struct tmpl *t, const int *refcol,
                   struct keyset *ks)
{
    FIG_ADD(r, keys_missing, 1);
    if (!rel->warned) {
        rel->warned = 1;
        const char *col = "?", *why = "its value was not sent (an unchanged TOASTed value "
                                      "without the old row)";
        for (size_t j = 0; j < tmpl_nrefs(t); j++) {
            col = tmpl_ref(t, j);
            if (refcol[j] < 0) {
                why = "the table has no such column now (renamed or dropped)";
                break;
            }
            if (rel->replident != 'f' && !(rel->colflags[refcol[j]] & 1)) {
                why = "the column is not in the replica identity now, so an UPDATE or DELETE "
                      "does not carry its old value (ALTER TABLE ... REPLICA IDENTITY FULL)";
                break;
            }
        }
        log_error("table %s.%s: template %s: column %s: %s; its changes flush the table's "
                  "namespaces instead of deleting keys until this is fixed",
                  rel->names, rel->names + strlen(rel->names) + 1, tmpl_text(t), col, why);
    }
    for (size_t j = 0; j < rel->t->nns; j++)
        if (keyset_flush(ks, rel->t->namespaces[j]) < 0) return -1;
    return 0;
}

static int table_keys(struct rows *r, struct rel *rel, const struct pgo_msg *m,
                      struct keyset *ks)
{
    const struct pgo_tuple *newt = m->kind == PGO_DELETE ? NULL : &m->new;
    const struct pgo_tuple *oldt = m->old_kind ? &m->old : NULL;
    const int *refcol = rel->refcol;
    for (size_t k = 0; k < rel->t->nkeys; k++) {
        const struct tmpl *t = rel->t->keys[k];
        const char *ns = tmpl_namespace(t);
        char a[TMPL_KEY_MAX], b[TMPL_KEY_MAX];
        int la = newt ? eval(t, refcol, newt, oldt, a) : TMPL_NULL - 100;
        /* an UPDATE or DELETE's old key, from an old row that holds its columns: without
         * one, an UPDATE changed no identity column, which gives the new row's key only when
         * every templated column is in the identity */
        int lb = !rel->oldok[k] && m->kind != PGO_INSERT ? KEY_MISSING
                 : oldt                                  ? eval(t, refcol, oldt, NULL, b)
                                                         : TMPL_NULL - 100;
        if (la == KEY_MISSING || lb == KEY_MISSING) {
            if (missing(r, rel, t, refcol, ks) < 0) return -1;
            if (lb == KEY_MISSING) lb = TMPL_NULL - 100;
        }
        refcol += tmpl_nrefs(t);
        int res[2] = {la, lb};
        for (int i = 0; i < 2; i++) {
            if (res[i] == TMPL_NULL) FIG_ADD(r, keys_null, 1);
            else if (res[i] == TMPL_TOO_LONG || res[i] == TMPL_BAD_BYTE)
                FIG_ADD(r, keys_unusable, 1);
        }
        /* a template that does not fix its namespace: each key's own, so that a flush
         * replacing a backlog can name it (deliver.h) */
        if (la >= 0 && keyset_add(ks, a, (size_t)la, ns ? ns : intern(r, a, (size_t)la)) < 0)
            return -1;
        if (lb >= 0 && !(la == lb && !memcmp(a, b, (size_t)la)) &&
            keyset_add(ks, b, (size_t)lb, ns ? ns : intern(r, b, (size_t)lb)) < 0)
            return -1;
    }
    return 0;
}

/* The namespace of an invalidation table key, interned (NULL: none, or the table is full). */
static const char *intern(struct rows *r, const char *key, size_t n)
{
    const char *colon = memchr(key, ':', n);
    if (colon == NULL) return NULL;
    size_t len = (size_t)(colon - key);
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)key[i]) * 16777619u;
    for (size_t i = 0; i < NS_SLOTS; i++) {
        char **s = &r->ns[(h + i) % NS_SLOTS];
        if (*s == NULL) {
            if (r->nns >= NS_SLOTS / 2) return NULL;
            *s = strndup(key, len);
            if (*s) r->nns++;
            return *s;
        }
        if (strlen(*s) == len && !memcmp(*s, key, len)) return *s;
    }
    return NULL;
}

static int inv_row(struct rows *r, const struct rel *rel, const struct pgo_msg *m,
                   struct keyset *ks)
{
    if (m->kind != PGO_INSERT) return 0;
    if (rel->idcol >= 0 && rel->idcol < m->new.ncols && m->new.vals[rel->idcol].kind == 't') {
        const struct pgo_value *v = &m->new.vals[rel->idcol];
        uint64_t id = 0;
        for (uint32_t i = 0; i < v->len && i < 20; i++)
            if (v->data[i] >= '0' && v->data[i] <= '9') id = id * 10 + (uint64_t)(v->data[i] - '0');
        if (id > ks->max_inv_id) ks->max_inv_id = id;
    }
    if (rel->keycol < 0 || rel->keycol >= m->new.ncols || m->new.vals[rel->keycol].kind != 't') {
        FIG_ADD(r, keys_null, 1);
        return 0;
    }
    const struct pgo_value *v = &m->new.vals[rel->keycol];
    int ok = v->len > 0 && v->len <= TMPL_KEY_MAX;
    for (uint32_t i = 0; ok && i < v->len; i++)
        if ((unsigned char)v->data[i] <= ' ' || v->data[i] == 0x7f) ok = 0;
    if (!ok) {
        FIG_ADD(r, keys_unusable, 1);
        return 0;
    }
    FIG_ADD(r, invalidation_rows, 1);
    return keyset_add(ks, v->data, v->len, intern(r, v->data, v->len));
}

int rows_table_flush(struct rows *r, const char *schema, const char *name, struct keyset *ks)
{
    const struct inv_table *t = inv_config_table(r->map, schema, name);
    if (t == NULL) return 0;
    for (size_t j = 0; j < t->nns; j++)
        if (keyset_flush(ks, t->namespaces[j]) < 0) return -1;
    return (int)t->nns;
}

int rows_flush_all(struct rows *r, struct keyset *ks)
{
    for (size_t i = 0; i < r->map->ntables; i++)
        for (size_t j = 0; j < r->map->tables[i].nns; j++)
            if (keyset_flush(ks, r->map->tables[i].namespaces[j]) < 0) return -1;
    return 0;
}

int rows_change(struct rows *r, const struct pgo_msg *m, struct keyset *ks)
{
    if (m->kind == PGO_TRUNCATE) {
        for (uint32_t i = 0; i < m->nrels; i++) {
            const struct rel *rel = find_rel(r, pgo_truncate_relid(m, i));
            if (rel == NULL || rel->t == NULL) continue;
            ks->truncated = 1;
            for (size_t j = 0; j < rel->t->nns; j++)
                if (keyset_flush(ks, rel->t->namespaces[j]) < 0) return -1;
        }
        return 0;
    }
    struct rel *rel = find_rel(r, m->relid);
    if (rel == NULL) return -1;
    if (rel->inv) return inv_row(r, rel, m, ks);
    if (rel->t == NULL) return 0;
    FIG_ADD(r, changes, 1);
    return table_keys(r, rel, m, ks);
}
