/* ns.c — namespace registry: lookups by key prefix, changes from JSON, safe table replacement
 * (see ns.h). */
#include "node/ns.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"

#define NS_INDEX_SIZE (NS_MAX * 2)

static uint32_t ns_name_hash(const char *name, size_t n)
{
    return (uint32_t)XXH3_64bits(name, n) & (NS_INDEX_SIZE - 1);
}

const struct ns *ns_find(const struct ns_table *t, const char *name, size_t nname)
{
    for (uint32_t h = ns_name_hash(name, nname), i = 0; i < NS_INDEX_SIZE; i++) {
        uint16_t slot = t->index[(h + i) & (NS_INDEX_SIZE - 1)];
        if (slot == 0) return NULL;
        const struct ns *ns = t->byid[slot - 1];
        if (ns->nname == nname && !memcmp(ns->name, name, nname)) return ns;
    }
    return NULL;
}

const struct ns *ns_of_key(const struct ns_table *t, const char *key, size_t nkey)
{
    if (t->count > 1) {
        const char *colon = memchr(key, ':', nkey);
        if (colon && colon > key) {
            const struct ns *ns = ns_find(t, key, (size_t)(colon - key));
            if (ns) return ns;
        }
    }
    return t->byid[NS_DEFAULT_ID];
}

uint32_t ns_exptime(const struct ns *ns, int64_t exptime, uint32_t now)
{
    uint32_t exp;
    if (exptime == 0) exp = ns->cfg.default_ttl ? now + (uint32_t)ns->cfg.default_ttl : 0;
    else exp = clock_exptime(exptime, now);
    if (ns->cfg.max_ttl && exp != 1) { /* 1 = already expired: nothing to clamp */
        uint32_t limit = now + (uint32_t)ns->cfg.max_ttl;
        if (exp == 0 || exp > limit) exp = limit;
    }
    return exp;
}

static void ns_index_rebuild(struct ns_table *t)
{
    memset(t->index, 0, sizeof t->index);
    t->count = 0;
    for (int id = 0; id < NS_MAX; id++) {
        struct ns *ns = t->byid[id];
        if (ns == NULL) continue;
        t->count++;
        uint32_t h = ns_name_hash(ns->name, ns->nname);
        while (t->index[h]) h = (h + 1) & (NS_INDEX_SIZE - 1);
        t->index[h] = (uint16_t)(id + 1);
    }
}

_Static_assert(NS_EVICT_LRU == 0 && NS_EVICT_LFU == 1 && NS_EVICT_S3FIFO == 2,
               "enum ns_eviction follows NSF_EVICTIONS");

const char *ns_eviction_name(enum ns_eviction e)
{
    return (unsigned)e < nsf_nevictions ? nsf_evictions[e] : "lru";
}

static void ns_config_default(struct ns_config *c)
{
    memset(c, 0, sizeof *c);
    c->eviction = NS_EVICT_DEFAULT;
}

int ns_registry_init(struct ns_registry *r, uint64_t **seen, size_t nreaders)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
    r->seen = seen;
    r->nreaders = nreaders;
    struct ns_table *t = calloc(1, sizeof *t);
    struct ns *def = calloc(1, sizeof *def);
    if (t == NULL || def == NULL) {
        free(t);
        free(def);
        return -1;
    }
    def->id = NS_DEFAULT_ID;
    strcpy(def->name, "default");
    def->nname = 7;
    ns_config_default(&def->cfg);
    t->byid[NS_DEFAULT_ID] = def;
    t->version = 1;
    ns_index_rebuild(t);
    r->table = t;
    return 0;
}

int ns_registry_set_apply(struct ns_registry *r,
                          int (*apply)(void *, uint16_t, const struct ns_config *, char *, size_t),
                          void *ctx, char *err, size_t errlen)
{
    pthread_mutex_lock(&r->lock);
    r->apply = apply;
    r->apply_ctx = ctx;
    int rc = 0;
    for (int id = 0; id < NS_MAX && rc == 0; id++) {
        const struct ns *ns = r->table->byid[id];
        if (ns && apply(ctx, ns->id, &ns->cfg, err, errlen) != 0) rc = -1;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static void ns_table_free(struct ns_table *t, const struct ns_table *keep)
{
    /* free namespaces that `keep` no longer references */
    for (int id = 0; id < NS_MAX; id++)
        if (t->byid[id] && (keep == NULL || keep->byid[id] != t->byid[id])) free(t->byid[id]);
    free(t);
}

void ns_registry_teardown(struct ns_registry *r)
{
    if (r->table) ns_table_free(r->table, NULL);
    r->table = NULL;
    pthread_mutex_destroy(&r->lock);
}

/* Publish `t` in place of the current table and free the old one once no reader can hold it.
 * Registry lock held. */
static void ns_publish(struct ns_registry *r, struct ns_table *t)
{
    struct ns_table *old = r->table;
    t->version = old->version + 1;
    __atomic_store_n(&r->table, t, __ATOMIC_SEQ_CST);
    if (r->published) r->published(r->published_ctx, t);
    qsbr_synchronize(&r->gen, r->seen, r->nreaders); /* then no reader can hold `old` */
    ns_table_free(old, t);
}

static struct ns_table *ns_table_copy(const struct ns_table *t)
{
    struct ns_table *n = malloc(sizeof *n);
    if (n) memcpy(n, t, sizeof *n);
    return n;
}

static bool ns_name_ok(const char *name, size_t n)
{
    if (n == 0 || n > NS_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

static int ns_error(struct buf *out, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int ns_error(struct buf *out, int status, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = o ? json_dumps(o, 0) : NULL;
    if (s) {
        buf_append_str(out, s);
        buf_append_str(out, "\n");
    }
    free(s);
    json_decref(o);
    return status;
}

int ns_config_from_json(struct ns_config *cfg, const json_t *obj, unsigned flags, char *why,
                        size_t whylen)
{
    if (!json_is_object(obj)) {
        snprintf(why, whylen, "the body must be a JSON object of settings, e.g. "
                              "{\"memory\": 67108864, \"default_ttl\": 600}");
        return -1;
    }
    const char *field;
    json_t *v;
    json_object_foreach((json_t *)obj, field, v) {
        const struct nsf_int *f = nsf_int_find(field);
        if (f && (f->node || (flags & NS_JSON_DOC))) {
            uint64_t x;
            if (!nsf_int_ok(f, v, &x)) {
                snprintf(why, whylen, "field '%s' must be an integer from %llu to %llu: %s", field,
                         (unsigned long long)f->lo, (unsigned long long)f->hi, f->help);
                return -1;
            }
            /* a document's memory is the pool's total; its plane settings are only checked */
            if (!f->node || ((flags & NS_JSON_DOC) && !strcmp(field, "memory"))) continue;
#define X(name, lo, hi, def, help)                                                               \
    if (!strcmp(field, #name)) cfg->name = x;
            NS_SETTINGS(X)
#undef X
        } else if (!strcmp(field, "eviction")) {
            int k = nsf_eviction_of(v);
            if (k < 0) {
                snprintf(why, whylen,
                         "field 'eviction' must be \"lru\" (CLOCK), \"lfu\" (frequency with "
                         "decay) or \"s3fifo\" (small FIFO, main CLOCK and ghost)");
                return -1;
            }
            cfg->eviction = (enum ns_eviction)k;
        } else if (!(flags & NS_JSON_DOC)) {
            snprintf(why, whylen,
                     "unknown field '%s'; fields are memory, default_ttl, max_ttl, eviction, "
                     "lease_ttl, lease_period, stale_ttl",
                     field);
            return -1;
        }
    }
    if (!nsf_ttls_ok(cfg->default_ttl, cfg->max_ttl)) {
        snprintf(why, whylen, "field 'default_ttl' (%llu) is longer than 'max_ttl' (%llu)",
                 (unsigned long long)cfg->default_ttl, (unsigned long long)cfg->max_ttl);
        return -1;
    }
    return 0;
}

/* Apply a JSON object's fields onto `cfg`. Unknown fields and bad values are errors naming the
 * field. Returns 0 or an HTTP status with the message written. */
static int ns_apply_json(struct ns_config *cfg, json_t *obj, struct buf *out)
{
    char why[300];
    if (ns_config_from_json(cfg, obj, 0, why, sizeof why) < 0) return ns_error(out, 400, "%s", why);
    return 0;
}

static json_t *ns_to_json(const struct ns *ns)
{
    json_t *o = json_object();
#define X(name, lo, hi, def, help) json_object_set_new(o, #name, json_integer((json_int_t)ns->cfg.name));
    NS_SETTINGS(X)
#undef X
    json_object_set_new(o, "eviction", json_string(ns_eviction_name(ns->cfg.eviction)));
    return o;
}

void ns_render_json(const struct ns_table *t, const struct ns *one, struct buf *out)
{
    json_t *root;
    if (one) {
        root = ns_to_json(one);
        json_object_set_new(root, "name", json_string(one->name));
    } else {
        json_t *all = json_object();
        for (int id = 0; id < NS_MAX; id++)
            if (t->byid[id]) json_object_set_new(all, t->byid[id]->name, ns_to_json(t->byid[id]));
        root = json_pack("{s:I,s:o}", "version", (json_int_t)t->version, "namespaces", all);
    }
    char *s = root ? json_dumps(root, JSON_SORT_KEYS) : NULL;
    if (s) {
        buf_append_str(out, s);
        buf_append_str(out, "\n");
    }
    free(s);
    json_decref(root);
}

/* Create or change one namespace from a parsed object. Registry lock held. */
static int ns_put_locked(struct ns_registry *r, const char *name, json_t *obj, struct buf *out)
{
    size_t n = strlen(name);
    if (!ns_name_ok(name, n))
        return ns_error(out, 400,
                        "namespace name '%.64s' must be 1 to %d letters, digits, '_', '-' or '.'",
                        name, NS_NAME_MAX);
    const struct ns *cur = ns_find(r->table, name, n);
    struct ns *ns = calloc(1, sizeof *ns);
    if (ns == NULL) return ns_error(out, 507, "out of memory");
    if (cur) {
        *ns = *cur;
    } else {
        ns_config_default(&ns->cfg);
        memcpy(ns->name, name, n);
        ns->nname = (uint8_t)n;
        int id = NS_MAX;
        for (int k = 0; k < NS_MAX - 1; k++) {
            int cand = 1 + (r->next_id + k) % (NS_MAX - 1);
            if (r->table->byid[cand] == NULL) {
                id = cand;
                break;
            }
        }
        if (id == NS_MAX) {
            free(ns);
            return ns_error(out, 507, "at most %d namespaces; delete one first", NS_MAX);
        }
        ns->id = (uint16_t)id;
        r->next_id = (uint16_t)id; /* the next search starts after this id */
        if (r->sum_metrics) r->sum_metrics(r->sum_ctx, ns->id, &ns->base);
    }
    int st = ns_apply_json(&ns->cfg, obj, out);
    if (st == 0 && r->apply) {
        char err[256];
        st = r->apply(r->apply_ctx, ns->id, &ns->cfg, err, sizeof err);
        if (st) ns_error(out, st, "%s", err);
    }
    if (st) {
        free(ns);
        return st;
    }
    struct ns_table *t = ns_table_copy(r->table);
    if (t == NULL) {
        free(ns);
        return ns_error(out, 507, "out of memory");
    }
    t->byid[ns->id] = ns;
    ns_index_rebuild(t);
    ns_publish(r, t);
    log_notice("namespace %s %s (table version %llu)", ns->name, cur ? "changed" : "created",
               (unsigned long long)r->table->version);
    ns_render_json(r->table, ns, out);
    return cur ? 200 : 201;
}

int ns_put_json(struct ns_registry *r, const char *name, const char *json, size_t len,
                struct buf *out)
{
    json_error_t jerr;
    json_t *obj = json_loadb(json, len, 0, &jerr);
    if (obj == NULL)
        return ns_error(out, 400, "body is not valid JSON: %s (line %d)", jerr.text, jerr.line);
    pthread_mutex_lock(&r->lock);
    int st = ns_put_locked(r, name, obj, out);
    pthread_mutex_unlock(&r->lock);
    json_decref(obj);
    return st;
}

int ns_delete(struct ns_registry *r, const char *name, struct buf *out)
{
    if (!strcmp(name, "default"))
        return ns_error(out, 400, "namespace 'default' cannot be removed; change it instead");
    pthread_mutex_lock(&r->lock);
    const struct ns *cur = ns_find(r->table, name, strlen(name));
    int st;
    if (cur == NULL) {
        st = ns_error(out, 404, "no namespace '%.64s'", name);
    } else {
        struct ns_table *t = ns_table_copy(r->table);
        if (t == NULL) {
            st = ns_error(out, 507, "out of memory");
        } else {
            t->byid[cur->id] = NULL;
            ns_index_rebuild(t);
            char err[256];
            if (r->apply) r->apply(r->apply_ctx, cur->id, NULL, err, sizeof err);
            log_notice("namespace %s removed", name);
            ns_publish(r, t);
            buf_append_str(out, "{\"deleted\": true}\n");
            st = 200;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return st;
}

/* A free id for a new namespace: used neither by the table in use nor by `t` (being built), so
 * a namespace removed in the same change does not hand its items to a new one. NS_MAX: none. */
static int ns_pick_id(struct ns_registry *r, const struct ns_table *t)
{
    for (int k = 0; k < NS_MAX - 1; k++) {
        int cand = 1 + (r->next_id + k) % (NS_MAX - 1);
        if (r->table->byid[cand] == NULL && t->byid[cand] == NULL) {
            r->next_id = (uint16_t)cand;
            return cand;
        }
    }
    return NS_MAX;
}

int ns_replace_all(struct ns_registry *r, const struct ns_want *want, size_t n, bool *changed,
                   char *err, size_t errlen)
{
    *changed = false;
    if (errlen) err[0] = 0;
    if (n > NS_MAX) {
        snprintf(err, errlen, "%zu namespaces for this node: at most %d", n, NS_MAX);
        return -1;
    }
    pthread_mutex_lock(&r->lock);
    const struct ns_table *cur = r->table;
    struct ns_table *t = ns_table_copy(cur);
    if (t == NULL) {
        pthread_mutex_unlock(&r->lock);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    bool listed[NS_MAX] = {false}, dirty = false;
    int refused = 0;
    struct ns_want def = {.name = "default"};
    ns_config_default(&def.cfg);
    bool has_default = false;
    for (size_t i = 0; i < n; i++) has_default |= !strcmp(want[i].name, "default");
    for (size_t i = 0; i <= n; i++) {
        const struct ns_want *w = i < n ? &want[i] : has_default ? NULL : &def;
        if (w == NULL) continue;
        size_t len = strlen(w->name);
        const struct ns *old = ns_find(cur, w->name, len);
        if (old) listed[old->id] = true;
        if (old && !memcmp(&old->cfg, &w->cfg, sizeof w->cfg)) continue;
        struct ns *ns = calloc(1, sizeof *ns);
        if (ns == NULL) goto oom;
        if (old) {
            *ns = *old;
        } else {
            int id = ns_pick_id(r, t);
            if (id == NS_MAX || !ns_name_ok(w->name, len)) {
                free(ns);
                snprintf(err + strlen(err), errlen - strlen(err), "%snamespace '%.64s': %s",
                         refused ? "; " : "", w->name,
                         id == NS_MAX ? "no free namespace id" : "invalid name");
                refused++;
                continue;
            }
            memcpy(ns->name, w->name, len);
            ns->nname = (uint8_t)len;
            ns->id = (uint16_t)id;
            if (r->sum_metrics) r->sum_metrics(r->sum_ctx, ns->id, &ns->base);
        }
        ns->cfg = w->cfg;
        char why[256];
        if (r->apply && r->apply(r->apply_ctx, ns->id, &ns->cfg, why, sizeof why) != 0) {
            free(ns);
            snprintf(err + strlen(err), errlen - strlen(err), "%snamespace '%.64s': %s",
                     refused ? "; " : "", w->name, why);
            refused++;
            continue;
        }
        t->byid[ns->id] = ns;
        listed[ns->id] = true;
        dirty = true;
    }
    for (int id = 1; id < NS_MAX; id++) {
        if (cur->byid[id] == NULL || listed[id]) continue;
        char why[256];
        if (r->apply) r->apply(r->apply_ctx, (uint16_t)id, NULL, why, sizeof why);
        log_notice("namespace %s removed", cur->byid[id]->name);
        t->byid[id] = NULL;
        dirty = true;
    }
    if (dirty) {
        ns_index_rebuild(t);
        ns_publish(r, t);
        *changed = true;
    } else {
        free(t); /* shares every namespace with the table in use */
    }
    pthread_mutex_unlock(&r->lock);
    return refused;
oom:
    for (int id = 0; id < NS_MAX; id++)
        if (t->byid[id] && t->byid[id] != cur->byid[id]) free(t->byid[id]);
    free(t);
    pthread_mutex_unlock(&r->lock);
    snprintf(err, errlen, "out of memory");
    return -1;
}

int ns_load_file(struct ns_registry *r, const char *path, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (root == NULL) {
        snprintf(err, errlen, "namespaces file %s: %s (line %d)", path, jerr.text, jerr.line);
        return -1;
    }
    json_t *map = json_object_get(root, "namespaces");
    if (map == NULL) map = root;
    int rc = 0;
    if (!json_is_object(map)) {
        snprintf(err, errlen, "namespaces file %s: expected an object of namespaces", path);
        rc = -1;
    }
    const char *name;
    json_t *v;
    pthread_mutex_lock(&r->lock);
    if (rc == 0) json_object_foreach(map, name, v) {
        struct buf out;
        buf_init(&out);
        int st = ns_put_locked(r, name, v, &out);
        if (st >= 400) {
            json_t *e = json_loadb(buf_start(&out), buf_used(&out), 0, NULL);
            snprintf(err, errlen, "namespaces file %s, namespace '%s': %s", path, name,
                     e ? json_string_value(json_object_get(e, "error")) : "invalid");
            json_decref(e);
            rc = -1;
        }
        buf_release(&out);
        if (rc) break;
    }
    pthread_mutex_unlock(&r->lock);
    json_decref(root);
    return rc;
}
