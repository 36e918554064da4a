/* model.c — the control plane's state, its changes and its rules (see model.h). */
#include "control/model.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/nsfields.h"
#include "control/slotmap.h"

int model_fail(struct model_err *e, int status, const char *field, const char *rule,
               const char *fmt, ...)
{
    e->status = status;
    snprintf(e->field, sizeof e->field, "%s", *field ? field : "\"\""); /* a key "" */
    snprintf(e->rule, sizeof e->rule, "%s", rule);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return status;
}

/* A namespace's settings, their bounds and defaults: common/nsfields.h, shared with the
 * routers and nodes that check and enforce them. */
#define NS_EVICTION_DEFAULT (nsf_evictions[NSF_EVICTION_DEFAULT])

/* Names of pools, namespaces and teams: 1-64 letters, digits, '_', '-' or '.' (so they fit in
 * a URL path and in a node's namespace table). */
static bool name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > MODEL_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* "host:port": a name or IPv4 address of letters, digits, '.', '-', or "[v6]", then a port
 * 1-65535. */
static bool addr_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n < 3 || n > MODEL_ADDR_MAX) return false;
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s) return false;
    if (s[0] == '[') {
        if (colon[-1] != ']' || colon - s < 3) return false;
        for (const char *p = s + 1; p < colon - 1; p++)
            if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F') ||
                  *p == ':' || *p == '.'))
                return false;
    } else {
        for (const char *p = s; p < colon; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                  *p == '.' || *p == '-'))
                return false;
    }
    const char *d = colon + 1;
    if (*d == 0 || strlen(d) > 5) return false;
    unsigned long port = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return false;
        port = port * 10 + (unsigned long)(*d - '0');
    }
    return port >= 1 && port <= 65535;
}

json_t *model_new(void)
{
    return json_pack("{s:i,s:i,s:i,s:{},s:{}}", "format", MODEL_FORMAT, "version", 0,
                     "gutter_ttl", 10, "pools", "namespaces");
}

uint64_t model_version(const json_t *m)
{
    return (uint64_t)json_integer_value(json_object_get(m, "version"));
}

static bool int_in(const json_t *v, uint64_t lo, uint64_t hi)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    uint64_t x = (uint64_t)json_integer_value(v);
    return x >= lo && x <= hi;
}

/* Check one namespace field's type and range (not rules across fields) for namespace `name`.
 * `path` prefixes the field's name in the error ("" for a request's own fields). */
static int ns_field_check(const char *name, const char *field, const json_t *v, const char *path,
                          struct model_err *e)
{
    char f[400];
#define FIELD_PATH() snprintf(f, sizeof f, "%s%s", path, field) /* only on failure: hot on load */
    const struct nsf_int *fi = nsf_int_find(field);
    if (fi) {
        if (!nsf_int_ok(fi, v, NULL))
            return FIELD_PATH(),
                   model_fail(e, 400, f, "range", "%s must be an integer from %llu to %llu: %s",
                              f, (unsigned long long)fi->lo, (unsigned long long)fi->hi, fi->help);
        return 0;
    }
    if (!strcmp(field, "eviction")) {
        if (nsf_eviction_of(v) >= 0) return 0;
        return FIELD_PATH(), model_fail(e, 400, f, "one_of",
                                        "%s must be \"lru\", \"lfu\" or \"s3fifo\" (the default)",
                                        f);
    }
    if (!strcmp(field, "team")) {
        const char *s = json_string_value(v);
        if (s == NULL || (*s && !name_ok(s)))
            return FIELD_PATH(),
                   model_fail(e, 400, f, "name",
                              "%s must be a string of at most %d letters, digits, '_', '-' or "
                              "'.' (\"\": no team)", f, MODEL_NAME_MAX);
        return 0;
    }
    if (!strcmp(field, NSF_INVALIDATION)) {
        struct nsf_err ie;
        if (nsf_invalidation_check(name, v, &ie) == 0) return 0;
        snprintf(f, sizeof f, "%s%s", path, ie.field);
        return model_fail(e, 400, f, ie.rule, "%s%s", path, ie.msg);
    }
    if (!strcmp(field, "pool")) {
        if (!json_is_string(v))
            return FIELD_PATH(),
                   model_fail(e, 400, f, "type", "%s must be the name of a pool (a string)", f);
        return 0;
    }
    FIELD_PATH();
#undef FIELD_PATH
    return model_fail(e, 400, f, "unknown_field",
                      "unknown field '%s'; namespace fields are name, team, pool, memory, copies, "
                      "eviction, default_ttl, max_ttl, lease_ttl, stale_ttl, lease_period, "
                      "max_value_bytes, ops_per_sec, bytes_per_sec, invalidation", f);
}

/* Rules across a namespace's fields and the rest of the model. */
static int ns_rules(const json_t *m, const char *name, const json_t *ns, const char *path,
                    struct model_err *e)
{
    char f[160];
    const char *pool = json_string_value(json_object_get(ns, "pool"));
    const json_t *p = json_object_get(json_object_get(m, "pools"), pool ? pool : "");
    if (p == NULL) {
        snprintf(f, sizeof f, "%spool", path);
        return model_fail(e, 400, f, "exists",
                          "%s: no pool named '%.64s'; create it first with POST /v1/pools", f,
                          pool ? pool : "");
    }
    uint64_t def = (uint64_t)json_integer_value(json_object_get(ns, "default_ttl")),
             max = (uint64_t)json_integer_value(json_object_get(ns, "max_ttl"));
    if (!nsf_ttls_ok(def, max)) {
        snprintf(f, sizeof f, "%sdefault_ttl", path);
        return model_fail(e, 400, f, "at_most_max_ttl",
                          "%s (%llu) is longer than max_ttl (%llu): lower it or raise max_ttl", f,
                          (unsigned long long)def, (unsigned long long)max);
    }
    size_t nodes = json_array_size(json_object_get(p, "nodes"));
    uint64_t copies = (uint64_t)json_integer_value(json_object_get(ns, "copies"));
    if (copies > nodes) {
        snprintf(f, sizeof f, "%scopies", path);
        return model_fail(e, 409, f, "at_most_nodes",
                          "namespace %s has copies %llu but pool %s has %zu node%s: add a node "
                          "or lower copies", name, (unsigned long long)copies, pool, nodes,
                          nodes == 1 ? "" : "s");
    }
    return 0;
}

/* A namespace with every field at its default, in `pool`. */
static json_t *ns_default(const char *pool)
{
    json_t *ns = json_object();
    if (ns == NULL) return NULL;
    json_object_set_new(ns, "team", json_string(""));
    json_object_set_new(ns, "pool", json_string(pool));
    json_object_set_new(ns, "eviction", json_string(NS_EVICTION_DEFAULT));
    for (size_t i = 0; i < nsf_nints; i++)
        json_object_set_new(ns, nsf_ints[i].name, json_integer((json_int_t)nsf_ints[i].def));
    return ns;
}

/* Copy a request's fields onto namespace `name`'s `ns` after checking each. "name" is skipped
 * (the caller's). */
static int ns_apply(json_t *ns, json_t *body, const char *name, struct model_err *e)
{
    if (!json_is_object(body))
        return model_fail(e, 400, "body", "object",
                          "the body must be a JSON object of namespace fields, e.g. "
                          "{\"pool\": \"main\", \"memory\": 67108864}");
    const char *field;
    json_t *v;
    json_object_foreach(body, field, v) {
        if (!strcmp(field, "name")) {
            if (!json_is_string(v) || (name && strcmp(json_string_value(v), name)))
                return model_fail(e, 400, "name", "immutable",
                                  "name cannot be changed; create a new namespace instead");
            continue;
        }
        if (json_is_null(v) && !strcmp(field, NSF_INVALIDATION)) { /* optional: null drops it */
            json_object_del(ns, field);
            continue;
        }
        int st = ns_field_check(name, field, v, "", e);
        if (st) return st;
        json_object_set(ns, field, v);
    }
    return 0;
}

int model_ns_create(json_t *m, json_t *body, const char **name, struct model_err *e)
{
    if (!json_is_object(body))
        return model_fail(e, 400, "body", "object",
                          "the body must be a JSON object, e.g. {\"name\": \"catalog\", \"pool\": "
                          "\"main\"}");
    const char *n = json_string_value(json_object_get(body, "name"));
    *name = n;
    if (!name_ok(n))
        return model_fail(e, 400, "name", "name",
                          "name is required: 1 to %d letters, digits, '_', '-' or '.'",
                          MODEL_NAME_MAX);
    json_t *all = json_object_get(m, "namespaces");
    if (json_object_get(all, n))
        return model_fail(e, 409, "name", "unique",
                          "namespace %s exists; change it with PUT /v1/namespaces/%s", n, n);
    if (json_object_get(body, "pool") == NULL)
        return model_fail(e, 400, "pool", "required", "pool is required: the pool that holds "
                          "the namespace's keys");
    if (json_object_size(all) >= MODEL_NS_MAX)
        return model_fail(e, 409, "name", "limit", "at most %d namespaces; delete one first",
                          MODEL_NS_MAX);
    json_t *ns = ns_default("");
    if (ns == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    int st = ns_apply(ns, body, n, e);
    if (st == 0) st = ns_rules(m, n, ns, "", e);
    /* the pool's namespace limit is model_check's (one count for every rule) */
    if (st) {
        json_decref(ns);
        return st;
    }
    json_object_set_new(all, n, ns);
    *name = json_object_iter_key(json_object_iter_at(all, n)); /* outlives the body */
    return 0;
}

int model_ns_update(json_t *m, const char *name, json_t *body, struct model_err *e)
{
    json_t *ns = json_object_get(json_object_get(m, "namespaces"), name);
    if (ns == NULL)
        return model_fail(e, 404, "name", "exists",
                          "no namespace %.64s; create it with POST /v1/namespaces", name);
    int st = ns_apply(ns, body, name, e);
    if (st == 0) st = ns_rules(m, name, ns, "", e);
    return st; /* the pool's namespace limit is model_check's */
}

int model_ns_delete(json_t *m, const char *name, struct model_err *e)
{
    json_t *all = json_object_get(m, "namespaces");
    if (json_object_get(all, name) == NULL)
        return model_fail(e, 404, "name", "exists", "no namespace %.64s", name);
    if (!strcmp(name, "default"))
        return model_fail(e, 400, "name", "default_kept",
                          "namespace default holds every key without a namespace: change it "
                          "(PUT) instead");
    json_object_del(all, name);
    return 0;
}

/* ---- pools and slot maps ---------------------------------------------------------------- */

int model_node_index(const json_t *nodes, const char *addr)
{
    size_t i;
    json_t *v;
    json_array_foreach(nodes, i, v)
        if (!strcmp(json_string_value(json_object_get(v, "node")) ?: "", addr)) return (int)i;
    return -1;
}

json_t *model_listed_only(const json_t *m, const json_t *obj)
{
    json_t *kept = json_object();
    const char *pname;
    json_t *p;
    json_object_foreach(json_object_get(m, "pools"), pname, p) {
        size_t i;
        json_t *nd;
        json_array_foreach(json_object_get(p, "nodes"), i, nd) {
            const char *a = json_string_value(json_object_get(nd, "node"));
            json_t *v = a && kept ? (obj ? json_object_get(obj, a) : json_true()) : NULL;
            if (v && json_object_set(kept, a, v) < 0) {
                json_decref(kept);
                return NULL;
            }
        }
    }
    return kept;
}

/* The pool's slot ranges as an owner per slot (indexes into its nodes), and, when `replica` is
 * not NULL, each slot's replica (SLOTMAP_NONE where the range names none). A replica must be
 * another node of the pool. */
static int pool_slots(const json_t *pool, const char *path, uint16_t *owner, uint16_t *replica,
                      struct model_err *e)
{
    static __thread uint8_t seen[SLOT_COUNT];
    memset(seen, 0, sizeof seen);
    const json_t *nodes = json_object_get(pool, "nodes"), *slots = json_object_get(pool, "slots");
    char f[200];
    snprintf(f, sizeof f, "%s.slots", path);
    if (!json_is_array(slots))
        return model_fail(e, 500, f, "slot_map", "%s: missing slot map", f);
    size_t i;
    json_t *r;
    json_array_foreach(slots, i, r) {
        const json_t *from = json_object_get(r, "from"), *to = json_object_get(r, "to");
        const char *node = json_string_value(json_object_get(r, "node"));
        const json_t *rv = json_object_get(r, "replica");
        int idx = node ? model_node_index(nodes, node) : -1;
        int ridx = rv ? model_node_index(nodes, json_string_value(rv) ?: "") : (int)SLOTMAP_NONE;
        if (!int_in(from, 0, SLOT_COUNT - 1) || !int_in(to, 0, SLOT_COUNT - 1) ||
            json_integer_value(from) > json_integer_value(to) || idx < 0)
            return model_fail(e, 500, f, "slot_map",
                              "%s[%zu]: needs from <= to within 0-16383 and a node of the pool",
                              f, i);
        if (ridx < 0 || ridx == idx)
            return model_fail(e, 500, f, "replica",
                              "%s[%zu]: a replica must be another node of the pool", f, i);
        for (json_int_t s = json_integer_value(from); s <= json_integer_value(to); s++) {
            if (seen[s]++) return model_fail(e, 500, f, "slot_map", "%s: slot %lld twice", f,
                                             (long long)s);
            owner[s] = (uint16_t)idx;
            if (replica) replica[s] = (uint16_t)ridx;
        }
    }
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (!seen[s]) return model_fail(e, 500, f, "slot_map", "%s: slot %u has no node", f, s);
    return 0;
}

/* The map as ranges; `replica` NULL: none. */
static json_t *ranges_json_r(const uint16_t *owner, const uint16_t *replica, const json_t *nodes)
{
    static __thread struct slot_range r[SLOT_COUNT];
    size_t n = slotmap_to_ranges_r(owner, replica, r);
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
        json_t *o = json_pack("{s:i,s:i,s:O}", "from", (int)r[i].from, "to", (int)r[i].to,
                              "node", json_object_get(json_array_get(nodes, r[i].node), "node"));
        if (o && r[i].replica != SLOTMAP_NONE)
            json_object_set(o, "replica",
                            json_object_get(json_array_get(nodes, r[i].replica), "node"));
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *ranges_json(const uint16_t *owner, const json_t *nodes)
{
    return ranges_json_r(owner, NULL, nodes);
}

/* A node entry from a request: "host:port" or {"node": "host:port", "admin": "host:port"}. */
static json_t *node_entry(json_t *v, const char *field, struct model_err *e)
{
    const char *node = NULL, *admin = NULL;
    const json_t *zone = NULL;
    char f[160];
    if (json_is_string(v)) {
        node = json_string_value(v);
    } else if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (strcmp(k, "node") && strcmp(k, "admin") && strcmp(k, "zone")) {
                snprintf(f, sizeof f, "%s%s%s", field, *field ? "." : "", k);
                model_fail(e, 400, f, "unknown_field",
                           "unknown field '%s'; a node is {\"node\": \"host:port\", \"admin\": "
                           "\"host:port\", \"zone\": \"name\"}", k);
                return NULL;
            }
        }
        zone = json_object_get(v, "zone");
        snprintf(f, sizeof f, "%s%szone", field, *field ? "." : "");
        if (zone && !name_ok(json_string_value(zone))) {
            model_fail(e, 400, f, "name",
                       "%s must be the node's zone label: 1 to %d letters, digits, '_', '-' or "
                       "'.'", f, MODEL_NAME_MAX);
            return NULL;
        }
        node = json_string_value(json_object_get(v, "node"));
        admin = json_string_value(json_object_get(v, "admin"));
        snprintf(f, sizeof f, "%s%sadmin", field, *field ? "." : "");
        if (json_object_get(v, "admin") && !addr_ok(admin)) {
            model_fail(e, 400, f, "host_port",
                       "%s must be the node's admin address, host:port (port 1-65535)", f);
            return NULL;
        }
    }
    snprintf(f, sizeof f, "%s%snode", field, *field ? "." : "");
    if (!addr_ok(node)) {
        model_fail(e, 400, *field && !json_is_object(v) ? field : f, "host_port",
                   "%s must be the node's data address, host:port (port 1-65535)", f);
        return NULL;
    }
    json_t *o = json_pack("{s:s}", "node", node);
    if (o && admin) json_object_set_new(o, "admin", json_string(admin));
    if (o && zone) json_object_set(o, "zone", (json_t *)zone);
    if (o == NULL) model_fail(e, 507, field, "memory", "out of memory");
    return o;
}

int model_pool_create(json_t *m, json_t *body, const char **name, struct model_err *e)
{
    if (!json_is_object(body))
        return model_fail(e, 400, "body", "object",
                          "the body must be a JSON object, e.g. {\"name\": \"main\", \"nodes\": "
                          "[\"10.0.0.1:11211\"]}");
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
        if (strcmp(k, "name") && strcmp(k, "nodes") && strcmp(k, "gutter") &&
            strcmp(k, "gutter_ttl"))
            return model_fail(e, 400, k, "unknown_field",
                              "unknown field '%s'; pool fields are name, nodes, gutter, "
                              "gutter_ttl", k);
    const char *n = json_string_value(json_object_get(body, "name"));
    *name = n;
    if (!name_ok(n))
        return model_fail(e, 400, "name", "name",
                          "name is required: 1 to %d letters, digits, '_', '-' or '.'",
                          MODEL_NAME_MAX);
    json_t *pools = json_object_get(m, "pools");
    if (json_object_get(pools, n))
        return model_fail(e, 409, "name", "unique",
                          "pool %s exists; add nodes with POST /v1/pools/%s/nodes", n, n);
    if (json_object_size(pools) >= MODEL_POOLS_MAX)
        return model_fail(e, 409, "name", "limit", "at most %d pools", MODEL_POOLS_MAX);
    json_t *nodes = json_object_get(body, "nodes");
    if (!json_is_array(nodes) || json_array_size(nodes) == 0)
        return model_fail(e, 400, "nodes", "nonempty",
                          "nodes is required: a non-empty array of \"host:port\" or "
                          "{\"node\": \"host:port\", \"admin\": \"host:port\"}");
    if (json_array_size(nodes) > SLOTMAP_NODES_MAX)
        return model_fail(e, 400, "nodes", "limit", "at most %d nodes in a pool",
                          SLOTMAP_NODES_MAX);
    json_t *gutter = json_object_get(body, "gutter"), *gttl = json_object_get(body, "gutter_ttl");
    if (gutter && !json_is_boolean(gutter))
        return model_fail(e, 400, "gutter", "type", "gutter must be true or false");
    if (gttl && !int_in(gttl, 1, 86400))
        return model_fail(e, 400, "gutter_ttl", "range",
                          "gutter_ttl must be an integer from 1 to 86400: the longest TTL of "
                          "anything stored through the gutter pool, seconds");
    if (gttl && !json_is_true(gutter))
        return model_fail(e, 400, "gutter_ttl", "gutter_only",
                          "gutter_ttl goes with \"gutter\": true");
    if (json_is_true(gutter) && json_object_get(m, "gutter_pool"))
        return model_fail(e, 409, "gutter", "one_gutter", "pool %s is already the gutter pool",
                          json_string_value(json_object_get(m, "gutter_pool")));
    json_t *list = json_array();
    size_t i;
    json_array_foreach(nodes, i, v) {
        char f[32];
        snprintf(f, sizeof f, "nodes[%zu]", i);
        json_t *o = node_entry(v, f, e);
        if (o == NULL) {
            json_decref(list);
            return e->status;
        }
        if (model_node_index(list, json_string_value(json_object_get(o, "node"))) >= 0) {
            json_decref(o);
            json_decref(list);
            return model_fail(e, 400, f, "unique", "%s: node listed twice", f);
        }
        json_array_append_new(list, o);
    }
    static __thread uint16_t owner[SLOT_COUNT];
    slotmap_even(owner, (uint32_t)json_array_size(list));
    json_t *pool = json_pack("{s:o,s:o}", "nodes", list, "slots", ranges_json(owner, list));
    if (pool == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    json_object_set_new(pools, n, pool);
    *name = json_object_iter_key(json_object_iter_at(pools, n));
    if (json_is_true(gutter)) {
        json_object_set_new(m, "gutter_pool", json_string(n));
        if (gttl) json_object_set(m, "gutter_ttl", gttl);
    }
    json_t *nss = json_object_get(m, "namespaces");
    if (json_object_get(nss, "default") == NULL && !json_is_true(gutter))
        json_object_set_new(nss, "default", ns_default(n));
    return 0;
}

int model_node_add(json_t *m, const char *pool, json_t *body, uint32_t *moved,
                   struct model_err *e)
{
    *moved = 0;
    json_t *p = json_object_get(json_object_get(m, "pools"), pool);
    if (p == NULL) return model_fail(e, 404, "pool", "exists", "no pool %.64s", pool);
    if (!json_is_object(body))
        return model_fail(e, 400, "body", "object",
                          "the body must be {\"node\": \"host:port\", \"admin\": \"host:port\"}");
    json_t *o = node_entry(body, "", e);
    if (o == NULL) return e->status;
    json_t *nodes = json_object_get(p, "nodes");
    const char *addr = json_string_value(json_object_get(o, "node"));
    if (model_node_index(nodes, addr) >= 0) {
        model_fail(e, 409, "node", "unique", "node %s is already in pool %s", addr, pool);
        json_decref(o);
        return e->status;
    }
    uint32_t n = (uint32_t)json_array_size(nodes);
    if (n >= SLOTMAP_NODES_MAX) {
        json_decref(o);
        return model_fail(e, 409, "node", "limit", "at most %d nodes in a pool",
                          SLOTMAP_NODES_MAX);
    }
    static __thread uint16_t owner[SLOT_COUNT], replica[SLOT_COUNT];
    int st = pool_slots(p, pool, owner, replica, e);
    if (st) {
        json_decref(o);
        return st;
    }
    json_array_append_new(nodes, o);
    *moved = slotmap_add(owner, n);
    /* a slot the new node took keeps its replica (unless that is the new node: none) */
    json_object_set_new(p, "slots", ranges_json_r(owner, replica, nodes));
    return 0;
}

int model_node_remove(json_t *m, const char *pool, const char *node, uint32_t *moved,
                      struct model_err *e)
{
    *moved = 0;
    json_t *p = json_object_get(json_object_get(m, "pools"), pool);
    if (p == NULL) return model_fail(e, 404, "pool", "exists", "no pool %.64s", pool);
    json_t *nodes = json_object_get(p, "nodes");
    int idx = model_node_index(nodes, node);
    if (idx < 0)
        return model_fail(e, 404, "node", "exists", "node %.200s is not in pool %s", node, pool);
    uint32_t n = (uint32_t)json_array_size(nodes);
    if (n == 1)
        return model_fail(e, 409, "node", "last_node",
                          "node %s is the last of pool %s: a pool keeps at least one node", node,
                          pool);
    static __thread uint16_t owner[SLOT_COUNT], replica[SLOT_COUNT];
    int st = pool_slots(p, pool, owner, replica, e);
    if (st) return st;
    *moved = slotmap_remove(owner, n, (uint32_t)idx);
    /* its replicas are gone; a slot it gave to its own replica has none (model_replicas_sync
     * gives each another) */
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (replica[s] == (uint16_t)idx) replica[s] = SLOTMAP_NONE;
        else if (replica[s] != SLOTMAP_NONE && replica[s] > (uint16_t)idx) replica[s]--;
        if (replica[s] == owner[s]) replica[s] = SLOTMAP_NONE;
    }
    json_array_remove(nodes, (size_t)idx);
    json_object_set_new(p, "slots", ranges_json_r(owner, replica, nodes));
    return 0;
}

/* ---- the whole model ---------------------------------------------------------------------- */

static int pool_check(const char *name, const json_t *p, struct model_err *e)
{
    char path[100];
    snprintf(path, sizeof path, "pools.%s", name);
    if (!name_ok(name)) return model_fail(e, 500, path, "name", "%s: bad pool name", path);
    const json_t *nodes = json_object_get(p, "nodes");
    size_t n = json_array_size(nodes);
    if (n == 0 || n > SLOTMAP_NODES_MAX)
        return model_fail(e, 500, path, "nonempty", "%s: 1 to %d nodes", path, SLOTMAP_NODES_MAX);
    size_t i;
    json_t *v;
    json_array_foreach(nodes, i, v) {
        const char *a = json_string_value(json_object_get(v, "node"));
        const json_t *adm = json_object_get(v, "admin");
        if (!addr_ok(a) || (adm && !addr_ok(json_string_value(adm))) || model_node_index(nodes, a) != (int)i)
            return model_fail(e, 500, path, "host_port", "%s.nodes[%zu]: bad or repeated", path, i);
    }
    static __thread uint16_t owner[SLOT_COUNT], replica[SLOT_COUNT];
    int st = pool_slots(p, path, owner, replica, e);
    if (st) return st;
    /* Within one of even, unless a promotion (a dead node's slots went to their replicas) or
     * a drain (swapped with them) marked the pool "uneven": slots are never moved back to even
     * by control, since that would drop their items. */
    if (!json_is_true(json_object_get(p, "uneven")) && slotmap_check_even(owner, (uint32_t)n) < 0)
        return model_fail(e, 500, path, "even", "%s.slots: not within one slot of even", path);
    return 0;
}

/* No pool holds more than MODEL_NS_PER_POOL_MAX namespaces; only those named in `which` are
 * counted when it is not NULL. One pass over the namespaces. */
static int pool_limits(const json_t *m, const json_t *which, struct model_err *e)
{
    const json_t *pools = json_object_get(m, "pools");
    if (which && json_object_size(which) == 0) return 0;
    json_t *count = json_object();
    if (count == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    const char *k;
    json_t *v;
    int st = 0;
    /* one pool to count (a change's usual case): a compare per namespace, no lookups */
    const char *only = which && json_object_size(which) == 1
                           ? json_object_iter_key(json_object_iter((json_t *)which))
                           : NULL;
    int n_only = 0;
    json_object_foreach((json_t *)json_object_get(m, "namespaces"), k, v) {
        const char *pool = json_string_value(json_object_get(v, "pool"));
        if (only) {
            if (pool == NULL || strcmp(pool, only) != 0 || ++n_only <= MODEL_NS_PER_POOL_MAX)
                continue;
            st = model_fail(e, 409, "pool", "limit",
                            "pool %s would hold more than %d namespaces, as many as a node can: "
                            "use another pool", pool, MODEL_NS_PER_POOL_MAX);
            break;
        }
        if (pool == NULL || json_object_get(pools, pool) == NULL ||
            (which && json_object_get(which, pool) == NULL))
            continue;
        json_t *c = json_object_get(count, pool);
        json_int_t n = c ? json_integer_value(c) + 1 : 1;
        if (n > MODEL_NS_PER_POOL_MAX) {
            st = model_fail(e, 409, "pool", "limit",
                            "pool %s would hold more than %d namespaces, as many as a node can: "
                            "use another pool", pool, MODEL_NS_PER_POOL_MAX);
            break;
        }
        if (c) json_integer_set(c, n);
        else json_object_set_new(count, pool, json_integer(n));
    }
    json_decref(count);
    return st;
}

int model_check(const json_t *m, struct model_err *e)
{
    return model_check_since(m, NULL, e);
}

int model_check_since(const json_t *m, const json_t *prev, struct model_err *e)
{
    if (!json_is_object(m) || json_integer_value(json_object_get(m, "format")) != MODEL_FORMAT)
        return model_fail(e, 500, "format", "format", "not a shoal-control state (format %d)",
                          MODEL_FORMAT);
    if (!int_in(json_object_get(m, "version"), 0, (uint64_t)1 << 62))
        return model_fail(e, 500, "version", "range", "version must be an integer >= 0");
    const json_t *pools = json_object_get(m, "pools"), *nss = json_object_get(m, "namespaces");
    if (!json_is_object(pools) || !json_is_object(nss))
        return model_fail(e, 500, "pools", "object", "pools and namespaces must be objects");
    const char *k;
    json_t *v;
    const json_t *prev_pools = json_object_get(prev, "pools"),
                 *prev_nss = json_object_get(prev, "namespaces");
    json_object_foreach((json_t *)pools, k, v) {
        if (json_object_get(prev_pools, k) == v) continue; /* the same value, checked before */
        int st = pool_check(k, v, e);
        if (st) return st;
    }
    const json_t *g = json_object_get(m, "gutter_pool");
    if (g && json_object_get(pools, json_string_value(g) ?: "") == NULL)
        return model_fail(e, 500, "gutter_pool", "exists", "gutter_pool names no pool");
    if (!int_in(json_object_get(m, "gutter_ttl"), 1, 86400))
        return model_fail(e, 500, "gutter_ttl", "range", "gutter_ttl must be 1 to 86400");
    if (json_object_size(nss) > MODEL_NS_MAX)
        return model_fail(e, 500, "namespaces", "limit", "more than %d namespaces", MODEL_NS_MAX);
    /* pools that may hold more namespaces than before: those of new or changed ones */
    json_t *grown = json_object();
    if (grown == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    bool pools_same = prev != NULL && json_object_size(pools) == json_object_size(prev_pools);
    json_object_foreach((json_t *)pools, k, v)
        if (pools_same && json_object_get(prev_pools, k) != v) pools_same = false;
    json_object_foreach((json_t *)nss, k, v) {
        /* a namespace value shared with the checked model, in a pool that did not change, was
         * checked then and nothing its rules read has changed since */
        if (prev && json_object_get(prev_nss, k) == v) {
            if (pools_same) continue;
            const char *pool = json_string_value(json_object_get(v, "pool"));
            if (pool && json_object_get(prev_pools, pool) == json_object_get(pools, pool))
                continue;
        }
        const char *pool = json_string_value(json_object_get(v, "pool"));
        if (pool) json_object_set_new(grown, pool, json_true());
        char path[100];
        snprintf(path, sizeof path, "namespaces.%s.", k);
        if (!name_ok(k) || !json_is_object(v))
            return json_decref(grown), model_fail(e, 500, path, "name", "%s: bad namespace", path);
        const char *f;
        json_t *x;
        json_object_foreach(v, f, x) {
            int st = ns_field_check(k, f, x, path, e);
            if (st) return json_decref(grown), st;
        }
        /* every field but the optional invalidation */
        if (json_object_size(v) != nsf_nints + 3 + (json_object_get(v, NSF_INVALIDATION) != NULL))
            return json_decref(grown),
                   model_fail(e, 500, path, "fields", "%s: every field must be present", path);
        int st = ns_rules(m, k, v, path, e);
        if (st) return json_decref(grown), st;
    }
    size_t data_pools = json_object_size(pools) - (g ? 1 : 0);
    if (data_pools > 0 && json_object_get(nss, "default") == NULL)
        return json_decref(grown), model_fail(e, 500, "namespaces.default", "required",
                          "namespace default is required once a pool other than the gutter "
                          "exists");
    int st = pool_limits(m, prev ? grown : NULL, e);
    json_decref(grown);
    return st;
}

json_t *model_topology_frame(const json_t *m)
{
    json_t *doc = json_object(), *pools = json_object();
    if (doc == NULL || pools == NULL) {
        json_decref(doc);
        json_decref(pools);
        return NULL;
    }
    json_object_set(doc, "version", json_object_get(m, "version"));
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(m, "pools"), k, v) {
        json_t *addrs = json_array();
        size_t i;
        json_t *n;
        json_array_foreach(json_object_get(v, "nodes"), i, n)
            json_array_append(addrs, json_object_get(n, "node"));
        json_object_set_new(pools, k, json_pack("{s:o,s:O}", "nodes", addrs, "slots",
                                                json_object_get(v, "slots")));
    }
    json_object_set_new(doc, "pools", pools);
    if (json_object_get(m, "gutter_pool"))
        json_object_set(doc, "gutter_pool", json_object_get(m, "gutter_pool"));
    json_object_set(doc, "gutter_ttl", json_object_get(m, "gutter_ttl"));
    return doc;
}

json_t *model_topology(const json_t *m)
{
    json_t *doc = model_topology_frame(m);
    if (doc && json_object_set_new(doc, "namespaces",
                                   json_deep_copy(json_object_get(m, "namespaces"))) < 0) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

json_t *model_fork(const json_t *m, const char *ns, const char *pool)
{
    json_t *f = json_copy((json_t *)m);
    json_t *nss = json_copy(json_object_get(m, "namespaces"));
    json_t *pools = json_copy(json_object_get(m, "pools"));
    if (f == NULL || nss == NULL || pools == NULL) goto fail;
    json_t *x;
    if (ns && (x = json_object_get(nss, ns)) != NULL &&
        json_object_set_new(nss, ns, json_deep_copy(x)) < 0)
        goto fail;
    if (pool && (x = json_object_get(pools, pool)) != NULL &&
        json_object_set_new(pools, pool, json_deep_copy(x)) < 0)
        goto fail;
    if (json_object_set_new(f, "namespaces", nss) < 0) {
        nss = NULL;
        goto fail;
    }
    nss = NULL;
    if (json_object_set_new(f, "pools", pools) < 0) {
        pools = NULL;
        goto fail;
    }
    return f;
fail:
    json_decref(f);
    json_decref(nss);
    json_decref(pools);
    return NULL;
}

uint64_t model_ns_share(const json_t *m, const char *name)
{
    const json_t *ns = json_object_get(json_object_get(m, "namespaces"), name);
    const json_t *p = json_object_get(json_object_get(m, "pools"),
                                      json_string_value(json_object_get(ns, "pool")) ?: "");
    size_t n = json_array_size(json_object_get(p, "nodes"));
    /* copies 2: each node holds its primary share and as much again as replica */
    uint64_t copies = (uint64_t)json_integer_value(json_object_get(ns, "copies"));
    uint64_t mem = (uint64_t)json_integer_value(json_object_get(ns, "memory"));
    return nsf_share(copies >= 2 && mem <= UINT64_MAX / copies ? mem * copies : mem, n);
}

/* ---- replicas and failover (issue 15) ---------------------------------------------------- */

/* Pools holding at least one namespace with copies 2, as an object of names. */
static json_t *replicated_pools(const json_t *m)
{
    json_t *w = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(m, "namespaces"), k, v)
        if (w && json_integer_value(json_object_get(v, "copies")) >= 2)
            json_object_set_new(w, json_string_value(json_object_get(v, "pool")) ?: "",
                                json_true());
    return w;
}

bool model_pool_replicated(const json_t *m, const char *pool)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(m, "namespaces"), k, v)
        if (json_integer_value(json_object_get(v, "copies")) >= 2 &&
            !strcmp(json_string_value(json_object_get(v, "pool")) ?: "", pool))
            return true;
    return false;
}

static bool pool_has_replicas(const json_t *p)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(p, "slots"), i, r)
        if (json_object_get(r, "replica")) return true;
    return false;
}

/* Give pool `name` (value p) the slots `owner`/`replica` (a shallow copy of p, so a value
 * shared with older models is never edited); nothing when they render as it has. */
static int pool_set_slots(json_t *m, const char *name, json_t *p, const uint16_t *owner,
                          const uint16_t *replica, bool uneven, struct model_err *e)
{
    json_t *slots = ranges_json_r(owner, replica, json_object_get(p, "nodes"));
    if (slots == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    if (json_equal(slots, json_object_get(p, "slots"))) {
        json_decref(slots);
        return 0;
    }
    json_t *np = json_copy(p);
    if (np && uneven) json_object_set_new(np, "uneven", json_true());
    if (np == NULL || json_object_set_new(np, "slots", slots) < 0 ||
        json_object_set_new(json_object_get(m, "pools"), name, np) < 0)
        return model_fail(e, 507, "body", "memory", "out of memory");
    return 0;
}

/* Zone ids of the pool's nodes (the index of the first node with the same label; no label is
 * a zone of its own, ""), and whether any node has a label. */
static bool pool_zones(const json_t *nodes, uint16_t *zone)
{
    size_t n = json_array_size(nodes);
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        const char *zi = json_string_value(json_object_get(json_array_get(nodes, i), "zone")) ?: "";
        any |= *zi != 0;
        zone[i] = (uint16_t)i;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(zi, json_string_value(json_object_get(json_array_get(nodes, j), "zone")) ?: "")) {
                zone[i] = (uint16_t)j;
                break;
            }
    }
    return any;
}

/* Recompute pool `name`'s replicas (want: it should have them). */
static int pool_replicas(json_t *m, const char *name, json_t *p, bool want, model_live_fn live,
                         void *ctx, struct model_err *e)
{
    static __thread uint16_t owner[SLOT_COUNT], replica[SLOT_COUNT], zone[SLOTMAP_NODES_MAX];
    static __thread uint8_t alive[SLOTMAP_NODES_MAX];
    int st = pool_slots(p, name, owner, replica, e);
    if (st) return st;
    const json_t *nodes = json_object_get(p, "nodes");
    uint32_t n = (uint32_t)json_array_size(nodes);
    if (!want) {
        for (uint32_t s = 0; s < SLOT_COUNT; s++) replica[s] = SLOTMAP_NONE;
    } else {
        for (uint32_t i = 0; i < n; i++)
            alive[i] = live == NULL ||
                       live(ctx, json_string_value(json_object_get(json_array_get(nodes, i), "node")));
        bool zoned = pool_zones(nodes, zone);
        slotmap_replicas(owner, replica, n, zoned ? zone : NULL, alive);
    }
    return pool_set_slots(m, name, p, owner, replica, false, e);
}

int model_replicas_sync(json_t *m, const char *touched, model_live_fn live, void *ctx,
                        struct model_err *e)
{
    json_t *want = replicated_pools(m);
    if (want == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    const char *k;
    json_t *p;
    int st = 0;
    void *tmp;
    json_object_foreach_safe(json_object_get(m, "pools"), tmp, k, p) {
        bool w = json_object_get(want, k) != NULL;
        if (w == pool_has_replicas(p) && !(touched && !strcmp(touched, k))) continue;
        if ((st = pool_replicas(m, k, p, w, live, ctx, e)) != 0) break;
    }
    json_decref(want);
    return st;
}

/* The start of a promotion or a swap: pool `pool`, node `node`'s index in it (*d), and its
 * slot map as owner and replica per slot. 0, or an HTTP status with `e` filled. */
static int pool_maps_for(json_t *m, const char *pool, const char *node, json_t **pp, int *d,
                         uint16_t *owner, uint16_t *replica, struct model_err *e)
{
    json_t *p = json_object_get(json_object_get(m, "pools"), pool);
    if (p == NULL) return model_fail(e, 404, "pool", "exists", "no pool %.64s", pool);
    *d = model_node_index(json_object_get(p, "nodes"), node);
    if (*d < 0)
        return model_fail(e, 404, "node", "exists", "node %.200s is not in pool %s", node, pool);
    *pp = p;
    return pool_slots(p, pool, owner, replica, e);
}

int model_promote(json_t *m, const char *pool, const char *dead, model_live_fn live, void *ctx,
                  uint32_t *promoted, struct model_err *e)
{
    static __thread uint16_t owner[SLOT_COUNT], replica[SLOT_COUNT];
    *promoted = 0;
    json_t *p;
    int d;
    int st = pool_maps_for(m, pool, dead, &p, &d, owner, replica, e);
    if (st) return st;
    const json_t *nodes = json_object_get(p, "nodes");
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (replica[s] == (uint16_t)d) replica[s] = SLOTMAP_NONE;
        if (owner[s] != (uint16_t)d || replica[s] == SLOTMAP_NONE) continue;
        /* a replica dead too holds nothing worth promoting: the range stays (the gutter's) */
        if (live && !live(ctx, json_string_value(json_object_get(json_array_get(nodes, replica[s]),
                                                                 "node")))) {
            replica[s] = SLOTMAP_NONE;
            continue;
        }
        owner[s] = replica[s];
        replica[s] = SLOTMAP_NONE;
        (*promoted)++;
    }
    return pool_set_slots(m, pool, p, owner, replica, *promoted > 0, e);
}

int model_swap(json_t *m, const char *pool, const char *node, const uint8_t *slots,
               uint32_t *swapped, struct model_err *e)
{
    static __thread uint16_t owner[SLOT_COUNT], replica[SLOT_COUNT];
    *swapped = 0;
    json_t *p;
    int d;
    int st = pool_maps_for(m, pool, node, &p, &d, owner, replica, e);
    if (st) return st;
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (!slots[s] || owner[s] != (uint16_t)d || replica[s] == SLOTMAP_NONE) continue;
        owner[s] = replica[s];
        replica[s] = (uint16_t)d;
        (*swapped)++;
    }
    return pool_set_slots(m, pool, p, owner, replica, *swapped > 0, e);
}
