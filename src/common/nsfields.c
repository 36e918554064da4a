/* nsfields.c — the namespace settings table and its checks (see nsfields.h). */
#include "common/nsfields.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/template.h"

const struct nsf_int nsf_ints[] = {
#define X(name, lo, hi, def, help) {#name, lo, hi, def, true, help},
    NSF_NODE_INTS(X)
#undef X
#define X(name, lo, hi, def, help) {#name, lo, hi, def, false, help},
    NSF_PLANE_INTS(X)
#undef X
};
const size_t nsf_nints = sizeof nsf_ints / sizeof nsf_ints[0];

const char *const nsf_evictions[] = {
#define X(name) #name,
    NSF_EVICTIONS(X)
#undef X
};
const size_t nsf_nevictions = sizeof nsf_evictions / sizeof nsf_evictions[0];

const struct nsf_int *nsf_int_find(const char *name)
{
    for (size_t i = 0; i < nsf_nints; i++)
        if (!strcmp(name, nsf_ints[i].name)) return &nsf_ints[i];
    return NULL;
}

bool nsf_int_ok(const struct nsf_int *f, const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    uint64_t x = (uint64_t)json_integer_value(v);
    if (x < f->lo || x > f->hi) return false;
    if (out) *out = x;
    return true;
}

int nsf_eviction_of(const json_t *v)
{
    const char *s = json_string_value(v);
    for (size_t i = 0; s && i < nsf_nevictions; i++)
        if (!strcmp(s, nsf_evictions[i])) return (int)i;
    return -1;
}

bool nsf_ttls_ok(uint64_t default_ttl, uint64_t max_ttl)
{
    return max_ttl == 0 || default_ttl <= max_ttl;
}

uint64_t nsf_share(uint64_t memory, uint64_t nnodes)
{
    return nnodes ? memory / nnodes : 0;
}

static int inv_fail(struct nsf_err *e, const char *rule, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int inv_fail(struct nsf_err *e, const char *rule, const char *field, const char *fmt, ...)
{
    snprintf(e->field, sizeof e->field, "%s", field);
    snprintf(e->rule, sizeof e->rule, "%s", rule);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static bool ident_ok(const char *s, size_t n)
{
    if (n == 0 || n > NSF_INV_IDENT_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return false;
    return true;
}

bool nsf_table_name_ok(const char *s)
{
    const char *dot = s ? strchr(s, '.') : NULL;
    return dot && ident_ok(s, (size_t)(dot - s)) && ident_ok(dot + 1, strlen(dot + 1));
}

/* One table's templates: a non-empty list of at most NSF_INV_KEYS_MAX templates whose keys are
 * the namespace's own. */
static int inv_table_check(const char *ns, const char *table, const json_t *keys,
                           struct nsf_err *e)
{
    char f[200], err[300];
    snprintf(f, sizeof f, NSF_INVALIDATION ".tables.%.100s", table);
    if (!json_is_array(keys) || json_array_size(keys) == 0)
        return inv_fail(e, "type", f,
                        "%s must be a non-empty list of key templates such as \"%.64s:item:{id}\"",
                        f, ns);
    if (json_array_size(keys) > NSF_INV_KEYS_MAX)
        return inv_fail(e, "limit", f, "%s: at most %d templates per table", f, NSF_INV_KEYS_MAX);
    for (size_t i = 0; i < json_array_size(keys); i++) {
        const char *s = json_string_value(json_array_get(keys, i));
        snprintf(f, sizeof f, NSF_INVALIDATION ".tables.%.100s[%zu]", table, i);
        if (s == NULL) return inv_fail(e, "type", f, "%s must be a string", f);
        if (strlen(s) > NSF_INV_TEMPLATE_MAX)
            return inv_fail(e, "limit", f, "%s: a template is at most %d bytes", f,
                            NSF_INV_TEMPLATE_MAX);
        struct tmpl *t = tmpl_parse(s, err, sizeof err);
        if (t == NULL) return inv_fail(e, "template", f, "%s: %s", f, err);
        const char *fixed = tmpl_namespace(t);
        bool mine = fixed ? !strcmp(fixed, ns) : !strcmp(ns, "default");
        tmpl_free(&t);
        if (!mine)
            return inv_fail(e, "namespace", f,
                            "%s: template \"%.100s\" must make keys of namespace %s: start it "
                            "with \"%s:\"%s",
                            f, s, ns, ns,
                            strcmp(ns, "default") ? "" : " or put no ':' before its first {column}");
    }
    return 0;
}

int nsf_invalidation_check(const char *ns, const json_t *v, struct nsf_err *e)
{
    const char *k;
    json_t *x;
    if (!json_is_object(v))
        return inv_fail(e, "type", NSF_INVALIDATION,
                        NSF_INVALIDATION " must be an object {\"tables\": {\"schema.table\": "
                        "[\"%.64s:item:{id}\", ...]}} (null on a PUT removes it)", ns);
    json_object_foreach((json_t *)v, k, x) {
        if (strcmp(k, "tables")) {
            char f[200];
            snprintf(f, sizeof f, NSF_INVALIDATION ".%.100s", k);
            return inv_fail(e, "unknown_field", f, "unknown field '%s'; " NSF_INVALIDATION
                            " has only \"tables\"", f);
        }
    }
    const json_t *tables = json_object_get(v, "tables");
    if (!json_is_object(tables))
        return inv_fail(e, "type", NSF_INVALIDATION ".tables",
                        NSF_INVALIDATION ".tables must be an object of \"schema.table\": "
                        "[templates]");
    if (json_object_size(tables) > NSF_INV_TABLES_MAX)
        return inv_fail(e, "limit", NSF_INVALIDATION ".tables",
                        NSF_INVALIDATION ".tables: at most %d tables per namespace",
                        NSF_INV_TABLES_MAX);
    json_object_foreach((json_t *)tables, k, x) {
        if (!nsf_table_name_ok(k)) {
            char f[200];
            snprintf(f, sizeof f, NSF_INVALIDATION ".tables.%.100s", k);
            return inv_fail(e, "table_name", f,
                            "%s: name the table as \"schema.table\" (each part 1-%d bytes, as "
                            "PostgreSQL stores it)", f, NSF_INV_IDENT_MAX);
        }
        if (inv_table_check(ns, k, x, e) < 0) return -1;
    }
    return 0;
}
