/* config.c — reading and checking shoal-invalidator's JSON configuration (config.h). Every
 * error names the field and what would fix it; unknown fields are refused so a typo does not
 * silently drop a table. */
#include "invalidator/config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/template.h"

static char *own(struct inv_config *c, const char *s, size_t n)
{
    char **o = realloc(c->owned, (c->nowned + 1) * sizeof *o);
    if (o == NULL) return NULL;
    c->owned = o;
    char *d = strndup(s, n);
    if (d) c->owned[c->nowned++] = d;
    return d;
}

/* "schema.table" (or "table": schema public) into two owned strings. */
static int split_name(struct inv_config *c, const char *full, const char **schema,
                      const char **name)
{
    const char *dot = strchr(full, '.');
    if (dot) {
        *schema = own(c, full, (size_t)(dot - full));
        *name = own(c, dot + 1, strlen(dot + 1));
    } else {
        *schema = own(c, "public", 6);
        *name = own(c, full, strlen(full));
    }
    return (*schema && *name) ? 0 : -1;
}

static int only_fields(json_t *o, const char *const *allowed, const char *where, char *err,
                       size_t errlen)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (size_t i = 0; allowed[i]; i++) ok |= !strcmp(k, allowed[i]);
        if (!ok) {
            snprintf(err, errlen, "%s: unknown field \"%.100s\"", where, k);
            return -1;
        }
    }
    return 0;
}

static int parse_clusters(struct inv_config *c, json_t *cl, char *err, size_t errlen)
{
    static const char *const fields[] = {"routers", "replica", NULL};
    if (!json_is_object(cl) || json_object_size(cl) == 0) {
        snprintf(err, errlen, "\"clusters\" must be an object naming at least one cluster, e.g. "
                              "{\"local\": {\"routers\": [\"127.0.0.1:11211\"]}}");
        return -1;
    }
    c->clusters = calloc(json_object_size(cl), sizeof *c->clusters);
    if (c->clusters == NULL) return snprintf(err, errlen, "out of memory"), -1;
    const char *name;
    json_t *v;
    json_object_foreach(cl, name, v) {
        char where[160];
        snprintf(where, sizeof where, "clusters.%.100s", name);
        if (!json_is_object(v)) return snprintf(err, errlen, "%s must be an object", where), -1;
        if (only_fields(v, fields, where, err, errlen) < 0) return -1;
        json_t *r = json_object_get(v, "routers");
        if (!json_is_array(r) || json_array_size(r) == 0) {
            snprintf(err, errlen, "%s.routers must be a non-empty list of \"host:port\"", where);
            return -1;
        }
        struct deliver_cluster_cfg *dc = &c->clusters[c->nclusters++];
        dc->name = name;
        const char **rs = calloc(json_array_size(r), sizeof *rs);
        if (rs == NULL) return snprintf(err, errlen, "out of memory"), -1;
        dc->routers = rs;
        for (size_t i = 0; i < json_array_size(r); i++) {
            const char *a = json_string_value(json_array_get(r, i));
            const char *colon = a ? strrchr(a, ':') : NULL;
            if (colon == NULL || colon == a || atoi(colon + 1) <= 0 || atoi(colon + 1) > 65535) {
                snprintf(err, errlen, "%s.routers[%zu] must be \"host:port\"", where, i);
                return -1;
            }
            rs[dc->nrouters++] = a;
        }
        json_t *rep = json_object_get(v, "replica");
        if (rep && !json_is_string(rep)) {
            snprintf(err, errlen, "%s.replica must be a PostgreSQL conninfo string", where);
            return -1;
        }
        dc->replica = rep ? json_string_value(rep) : NULL;
    }
    return 0;
}

/* A table's namespaces for a truncate: those listed, else those its templates fix. */
static int table_namespaces(struct inv_table *t, json_t *ns, const char *where, char *err,
                            size_t errlen)
{
    size_t cap = ns ? json_array_size(ns) : t->nkeys;
    t->namespaces = calloc(cap ? cap : 1, sizeof *t->namespaces);
    if (t->namespaces == NULL) return snprintf(err, errlen, "out of memory"), -1;
    if (ns) {
        if (!json_is_array(ns) || json_array_size(ns) == 0) {
            snprintf(err, errlen, "%s.namespaces must be a non-empty list of namespace names",
                     where);
            return -1;
        }
        for (size_t i = 0; i < json_array_size(ns); i++) {
            const char *s = json_string_value(json_array_get(ns, i));
            if (s == NULL || !*s || strpbrk(s, ": \t\r\n")) {
                snprintf(err, errlen, "%s.namespaces[%zu] must be a namespace name", where, i);
                return -1;
            }
            t->namespaces[t->nns++] = s;
        }
        return 0;
    }
    for (size_t i = 0; i < t->nkeys; i++) {
        const char *n = tmpl_namespace(t->keys[i]);
        if (n == NULL) {
            snprintf(err, errlen,
                     "%s.keys[%zu] \"%.100s\" does not fix its namespace (the text before the "
                     "key's first ':'), so a truncate of the table cannot say what to flush: "
                     "list it in %s.namespaces",
                     where, i, tmpl_text(t->keys[i]), where);
            return -1;
        }
        int seen = 0;
        for (size_t j = 0; j < t->nns; j++) seen |= !strcmp(t->namespaces[j], n);
        if (!seen) t->namespaces[t->nns++] = n;
    }
    return 0;
}

static int parse_table(struct inv_config *c, const char *full, json_t *v, char *err,
                       size_t errlen)
{
    static const char *const fields[] = {"keys", "namespaces", NULL};
    char where[160];
    snprintf(where, sizeof where, "tables.%.100s", full);
    struct inv_table *t = &c->tables[c->ntables];
    if (!json_is_object(v)) return snprintf(err, errlen, "%s must be an object", where), -1;
    if (only_fields(v, fields, where, err, errlen) < 0) return -1;
    if (split_name(c, full, &t->schema, &t->name) < 0)
        return snprintf(err, errlen, "out of memory"), -1;
    if (!*t->schema || !*t->name) {
        snprintf(err, errlen, "%s: name the table as \"schema.table\"", where);
        return -1;
    }
    json_t *keys = json_object_get(v, "keys");
    if (!json_is_array(keys) || json_array_size(keys) == 0) {
        snprintf(err, errlen, "%s.keys must be a non-empty list of key templates such as "
                              "\"catalog:product:{id}\"", where);
        return -1;
    }
    t->keys = calloc(json_array_size(keys), sizeof *t->keys);
    if (t->keys == NULL) return snprintf(err, errlen, "out of memory"), -1;
    c->ntables++; /* from here inv_config_free frees the templates */
    for (size_t i = 0; i < json_array_size(keys); i++) {
        const char *s = json_string_value(json_array_get(keys, i));
        if (s == NULL) return snprintf(err, errlen, "%s.keys[%zu] must be a string", where, i), -1;
        char e[300];
        t->keys[t->nkeys] = tmpl_parse(s, e, sizeof e);
        if (t->keys[t->nkeys] == NULL)
            return snprintf(err, errlen, "%s.keys[%zu]: %s", where, i, e), -1;
        t->nkeys++;
    }
    return table_namespaces(t, json_object_get(v, "namespaces"), where, err, errlen);
}

static int config_parse(const char *text, size_t len, struct inv_config *c, int control,
                        char *err, size_t errlen)
{
    static const char *const fields[] = {"clusters", "tables", "invalidation_table", NULL};
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    if (doc == NULL) {
        snprintf(err, errlen, "not valid JSON: line %d: %s", je.line, je.text);
        return -1;
    }
    c->doc = doc;
    if (!json_is_object(doc)) {
        snprintf(err, errlen, "the document must be a JSON object");
        goto fail;
    }
    if (only_fields(doc, fields, "the document", err, errlen) < 0) goto fail;
    if (parse_clusters(c, json_object_get(doc, "clusters"), err, errlen) < 0) goto fail;
    json_t *tables = json_object_get(doc, "tables");
    if (tables && !json_is_object(tables)) {
        snprintf(err, errlen,
                 "\"tables\" must be an object of \"schema.table\": {\"keys\": [...]}");
        goto fail;
    }
    c->tables = calloc(json_object_size(tables) + 1, sizeof *c->tables);
    if (c->tables == NULL) goto oom;
    const char *k;
    json_t *v;
    json_object_foreach(tables, k, v) {
        if (parse_table(c, k, v, err, errlen) < 0) goto fail;
    }
    json_t *inv = json_object_get(doc, "invalidation_table");
    if (inv) {
        if (!json_is_string(inv) || !*json_string_value(inv)) {
            snprintf(err, errlen,
                     "\"invalidation_table\" must be a table name (\"schema.table\")");
            goto fail;
        }
        if (split_name(c, json_string_value(inv), &c->inv_schema, &c->inv_name) < 0) goto oom;
        if (inv_config_table(c, c->inv_schema, c->inv_name)) {
            snprintf(err, errlen, "\"invalidation_table\" %.200s is also listed under \"tables\"",
                     json_string_value(inv));
            goto fail;
        }
    }
    if (c->ntables == 0 && inv == NULL && !control) {
        snprintf(err, errlen, "nothing to read: list \"tables\" or an \"invalidation_table\" "
                              "(or take tables from the control plane with --control)");
        goto fail;
    }
    return 0;
oom:
    snprintf(err, errlen, "out of memory reading the configuration");
fail:
    inv_config_free(c);
    return -1;
}

int inv_config_parse(const char *text, size_t len, struct inv_config *c, char *err,
                     size_t errlen)
{
    return config_parse(text, len, c, 0, err, errlen);
}

int inv_map_parse(json_t *tables, struct inv_config *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->doc = tables;
    m->tables = calloc(json_object_size(tables) + 1, sizeof *m->tables);
    if (m->tables == NULL) {
        snprintf(err, errlen, "out of memory");
        inv_config_free(m);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(tables, k, v) {
        if (parse_table(m, k, v, err, errlen) < 0) {
            inv_config_free(m);
            return -1;
        }
    }
    return 0;
}

json_t *inv_config_tables_json(const struct inv_config *c)
{
    json_t *out = json_object();
    for (size_t i = 0; out && i < c->ntables; i++) {
        const struct inv_table *t = &c->tables[i];
        json_t *keys = json_array(), *nss = json_array();
        for (size_t k = 0; k < t->nkeys; k++)
            json_array_append_new(keys, json_string(tmpl_text(t->keys[k])));
        for (size_t k = 0; k < t->nns; k++) json_array_append_new(nss, json_string(t->namespaces[k]));
        char name[300];
        snprintf(name, sizeof name, "%s.%s", t->schema, t->name);
        if (json_object_set_new(out, name, json_pack("{s:o,s:o}", "keys", keys, "namespaces",
                                                     nss)) < 0) {
            json_decref(out);
            out = NULL;
        }
    }
    return out;
}

int inv_config_load(const char *path, struct inv_config *c, int control, char *err,
                    size_t errlen)
{
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open config file %s: %s", path, strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    int oom = 0;
    for (;;) {
        if (cap - len < 4096) {
            char *t = realloc(text, cap = cap * 2 + 8192);
            if (t == NULL) {
                oom = 1;
                break;
            }
            text = t;
        }
        size_t r = fread(text + len, 1, cap - len, f);
        if (r == 0) break;
        len += r;
    }
    fclose(f);
    if (oom || text == NULL) {
        free(text);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    char e[600];
    int rc = config_parse(text, len, c, control, e, sizeof e);
    if (rc < 0) snprintf(err, errlen, "config file %s: %s", path, e);
    free(text);
    return rc;
}

void inv_config_free(struct inv_config *c)
{
    for (size_t i = 0; i < c->nclusters; i++) free((void *)c->clusters[i].routers);
    free(c->clusters);
    for (size_t i = 0; i < c->ntables; i++) {
        for (size_t j = 0; j < c->tables[i].nkeys; j++) tmpl_free(&c->tables[i].keys[j]);
        free(c->tables[i].keys);
        free(c->tables[i].namespaces);
    }
    free(c->tables);
    for (size_t i = 0; i < c->nowned; i++) free(c->owned[i]);
    free(c->owned);
    if (c->doc) json_decref(c->doc);
    memset(c, 0, sizeof *c);
}

const struct inv_table *inv_config_table(const struct inv_config *c, const char *schema,
                                         const char *name)
{
    for (size_t i = 0; i < c->ntables; i++)
        if (!strcmp(c->tables[i].schema, schema) && !strcmp(c->tables[i].name, name))
            return &c->tables[i];
    return NULL;
}
