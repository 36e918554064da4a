/* topo.c — topology document parsing, key routing and the table registry (see topo.h).
 *
 * Schema (docs/router.md has the full description):
 *   {"version": N, "pools": {NAME: {"nodes": ["host:port", ...], "mode": "sharded"|"replicated",
 *                                   "warm_from": POOL,
 *                                   "slots": [{"from": A, "to": B, "node": "host:port"}, ...]}},
 *    "gutter_pool": NAME, "gutter_ttl": S,
 *    "namespaces": {NAME: {"pool": NAME, "default_ttl": S, "max_ttl": S, "max_value_bytes": B,
 *                          "ops_per_sec": N, "bytes_per_sec": B,
 *                          "team": T, "memory": B, "copies": 1|2, "eviction": "lru"|"lfu"|"s3fifo",
 *                          "lease_ttl": S, "stale_ttl": S, "lease_period": S,
 *                          "invalidation": {"tables": {...}}}}}
 * (the last eight are the control plane's, checked and kept but not acted on here;
 * invalidation is shoal-invalidator's key templates, common/nsfields.h).
 * Unknown fields are refused, so a typo is an error that names it rather than a silent
 * default. */
#include "router/topo.h"

#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/nsfields.h"

#define TOPO_FILE_MAX (16 << 20)

static int topo_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int topo_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

void topo_destroy(struct topo **tp)
{
    struct topo *t = *tp;
    if (t == NULL) return;
    for (uint32_t i = 0; i < t->npools; i++) {
        free(t->pools[i].nodes);
        free(t->pools[i].owner);
        free(t->pools[i].replica);
    }
    free(t->pools);
    free(t->nodes);
    free(t->ns);
    free(t->doc);
    free(t);
    *tp = NULL;
}

/* Only the listed keys may appear in `obj`. */
static int topo_check_keys(json_t *obj, const char *path, const char *const *allowed, char *err,
                           size_t errlen)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            if (!strcmp(*a, k)) ok = true;
        if (!ok) {
            char list[256] = "";
            for (const char *const *a = allowed; *a; a++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         a == allowed ? "" : ", ", *a);
            return topo_err(err, errlen, "%s%s%s: unknown field; known here: %s", path,
                            *path ? "." : "", k, list);
        }
    }
    return 0;
}

static bool topo_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > TOPO_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] == ':' || s[i] == 0x7f) return false;
    return true;
}

/* Index of node `addr` in t->nodes, adding (and resolving) it when new. */
static int topo_node_index(struct topo *t, uint32_t *cap, const char *addr, const char *path,
                           unsigned flags, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < t->nnodes; i++)
        if (!strcmp(t->nodes[i].addr, addr)) return (int)i;
    size_t n = strlen(addr);
    const char *colon = strrchr(addr, ':');
    if (n == 0 || n >= TOPO_ADDR_MAX || colon == NULL || colon == addr || colon[1] == 0)
        return topo_err(err, errlen, "%s: '%.200s' is not host:port", path, addr);
    char host[TOPO_ADDR_MAX];
    size_t nh = (size_t)(colon - addr);
    memcpy(host, addr, nh);
    host[nh] = 0;
    if (host[0] == '[' && nh >= 2 && host[nh - 1] == ']') { /* [v6]:port */
        memmove(host, host + 1, nh - 2);
        host[nh - 2] = 0;
    }
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || errno || port == 0 || port > 65535)
        return topo_err(err, errlen, "%s: '%.200s' has no valid port (1-65535)", path, addr);
    if (t->nnodes >= TOPO_NODES_MAX)
        return topo_err(err, errlen, "%s: more than %d nodes", path, TOPO_NODES_MAX);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV}, *res = NULL;
    if (flags & TOPO_NUMERIC_HOSTS) hints.ai_flags |= AI_NUMERICHOST;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0 || res == NULL)
        return topo_err(err, errlen, "%s: cannot resolve '%.200s': %s", path, host,
                        rc ? gai_strerror(rc) : "no address");
    if (t->nnodes == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 8;
        struct topo_node *nn = realloc(t->nodes, nc * sizeof *nn);
        if (nn == NULL) {
            freeaddrinfo(res);
            return topo_err(err, errlen, "%s: out of memory", path);
        }
        t->nodes = nn;
        *cap = nc;
    }
    struct topo_node *node = &t->nodes[t->nnodes];
    memset(node, 0, sizeof *node);
    memcpy(node->addr, addr, n + 1);
    memcpy(&node->sa, res->ai_addr, res->ai_addrlen);
    node->salen = res->ai_addrlen;
    freeaddrinfo(res);
    return (int)t->nnodes++;
}

static int topo_uint(json_t *v, const char *path, uint64_t lo, uint64_t hi, uint64_t *out,
                     char *err, size_t errlen)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) < lo || (uint64_t)json_integer_value(v) > hi)
        return topo_err(err, errlen, "%s: must be an integer from %llu to %llu", path,
                        (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* An explicit slot map: ranges that cover every slot exactly once, each naming a pool node. */
static int topo_parse_slots(struct topo *t, struct topo_pool *p, json_t *slots, const char *ppath,
                            char *err, size_t errlen)
{
    char path[256];
    if (!json_is_array(slots) || json_array_size(slots) == 0)
        return topo_err(err, errlen, "%s.slots: must be a non-empty array of {from, to, node}",
                        ppath);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) p->owner[s] = UINT16_MAX;
    size_t i;
    json_t *r;
    json_array_foreach(slots, i, r) {
        snprintf(path, sizeof path, "%.100s.slots[%zu]", ppath, i);
        static const char *const keys[] = {"from", "to", "node", "replica", NULL};
        if (!json_is_object(r)) return topo_err(err, errlen, "%s: must be an object", path);
        if (topo_check_keys(r, path, keys, err, errlen) < 0) return -1;
        uint64_t from, to;
        char sub[300];
        snprintf(sub, sizeof sub, "%.200s.from", path);
        if (topo_uint(json_object_get(r, "from"), sub, 0, SLOT_COUNT - 1, &from, err, errlen) < 0)
            return -1;
        snprintf(sub, sizeof sub, "%.200s.to", path);
        if (topo_uint(json_object_get(r, "to"), sub, from, SLOT_COUNT - 1, &to, err, errlen) < 0)
            return -1;
        const char *addr = json_string_value(json_object_get(r, "node"));
        snprintf(sub, sizeof sub, "%.200s.node", path);
        if (addr == NULL) return topo_err(err, errlen, "%s: must be a node of the pool", sub);
        uint32_t owner = UINT32_MAX;
        for (uint32_t k = 0; k < p->nnodes; k++)
            if (!strcmp(t->nodes[p->nodes[k]].addr, addr)) owner = p->nodes[k];
        if (owner == UINT32_MAX)
            return topo_err(err, errlen, "%s: '%.200s' is not in %s.nodes", sub, addr, ppath);
        /* design.md's copies = 2: the range's second node, read while the primary is marked
         * down (route.c) */
        json_t *rv = json_object_get(r, "replica");
        uint32_t rep = TOPO_NO_REPLICA;
        if (rv) {
            const char *ra = json_string_value(rv);
            for (uint32_t k = 0; ra && k < p->nnodes; k++)
                if (!strcmp(t->nodes[p->nodes[k]].addr, ra)) rep = p->nodes[k];
            if (rep == TOPO_NO_REPLICA || !strcmp(ra, addr))
                return topo_err(err, errlen, "%.200s.replica: must be another node of %s.nodes",
                                path, ppath);
            if (p->replica == NULL) {
                if ((p->replica = malloc(SLOT_COUNT * sizeof *p->replica)) == NULL)
                    return topo_err(err, errlen, "%s: out of memory", path);
                for (uint32_t s = 0; s < SLOT_COUNT; s++) p->replica[s] = TOPO_NO_REPLICA;
            }
        }
        for (uint64_t s = from; s <= to; s++) {
            if (p->owner[s] != UINT16_MAX)
                return topo_err(err, errlen, "%s: slot %llu is already assigned", path,
                                (unsigned long long)s);
            p->owner[s] = (uint16_t)owner;
            if (p->replica) p->replica[s] = (uint16_t)rep;
        }
    }
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (p->owner[s] == UINT16_MAX)
            return topo_err(err, errlen, "%s.slots: slot %u has no node; ranges must cover 0-%d",
                            ppath, s, SLOT_COUNT - 1);
    return 0;
}

static int topo_parse_pools(struct topo *t, json_t *pools, unsigned flags, char *err,
                            size_t errlen)
{
    if (!json_is_object(pools) || json_object_size(pools) == 0)
        return topo_err(err, errlen, "pools: must be an object with at least one pool");
    if (json_object_size(pools) > TOPO_POOLS_MAX)
        return topo_err(err, errlen, "pools: more than %d pools", TOPO_POOLS_MAX);
    t->pools = calloc(json_object_size(pools), sizeof *t->pools);
    if (t->pools == NULL) return topo_err(err, errlen, "pools: out of memory");
    uint32_t cap = 0;
    const char *name;
    json_t *pv;
    char path[256];
    json_object_foreach(pools, name, pv) {
        snprintf(path, sizeof path, "pools.%.64s", name);
        if (!topo_name_ok(name))
            return topo_err(err, errlen, "%s: pool names are 1-%d bytes without spaces or ':'",
                            path, TOPO_NAME_MAX);
        if (!json_is_object(pv)) return topo_err(err, errlen, "%s: must be an object", path);
        static const char *const keys[] = {"nodes", "slots", "mode", "warm_from", NULL};
        if (topo_check_keys(pv, path, keys, err, errlen) < 0) return -1;
        struct topo_pool *p = &t->pools[t->npools++];
        snprintf(p->name, sizeof p->name, "%s", name);
        p->warm_from = -1;
        json_t *mode = json_object_get(pv, "mode");
        if (mode) {
            const char *m = json_string_value(mode);
            if (m == NULL || (strcmp(m, "sharded") && strcmp(m, "replicated")))
                return topo_err(err, errlen, "%s.mode: must be \"sharded\" (the default) or "
                                "\"replicated\"", path);
            p->replicated = !strcmp(m, "replicated");
            if (p->replicated && json_object_get(pv, "slots"))
                return topo_err(err, errlen, "%s.slots: a replicated pool has no slot map (every "
                                "node holds every key)", path);
        }
        json_t *nodes = json_object_get(pv, "nodes");
        if (!json_is_array(nodes) || json_array_size(nodes) == 0)
            return topo_err(err, errlen, "%s.nodes: must be a non-empty array of \"host:port\"",
                            path);
        if (json_array_size(nodes) > TOPO_NODES_MAX)
            return topo_err(err, errlen, "%s.nodes: more than %d nodes", path, TOPO_NODES_MAX);
        p->nodes = calloc(json_array_size(nodes), sizeof *p->nodes);
        p->owner = malloc(SLOT_COUNT * sizeof *p->owner);
        if (p->nodes == NULL || p->owner == NULL)
            return topo_err(err, errlen, "%s: out of memory", path);
        size_t i;
        json_t *nv;
        json_array_foreach(nodes, i, nv) {
            char npath[300];
            snprintf(npath, sizeof npath, "%.200s.nodes[%zu]", path, i);
            if (!json_is_string(nv))
                return topo_err(err, errlen, "%s: must be a string \"host:port\"", npath);
            int idx = topo_node_index(t, &cap, json_string_value(nv), npath, flags, err, errlen);
            if (idx < 0) return -1;
            for (uint32_t k = 0; k < p->nnodes; k++)
                if (p->nodes[k] == (uint32_t)idx)
                    return topo_err(err, errlen, "%s: '%s' is listed twice", npath,
                                    json_string_value(nv));
            p->nodes[p->nnodes++] = (uint32_t)idx;
        }
        json_t *slots = json_object_get(pv, "slots");
        if (slots) {
            if (topo_parse_slots(t, p, slots, path, err, errlen) < 0) return -1;
        } else {
            for (uint32_t s = 0; s < SLOT_COUNT; s++)
                p->owner[s] = (uint16_t)p->nodes[slot_default_owner(s, p->nnodes)];
        }
    }
    return 0;
}

static int topo_pool_index(const struct topo *t, const char *name)
{
    for (uint32_t i = 0; i < t->npools; i++)
        if (!strcmp(t->pools[i].name, name)) return (int)i;
    return -1;
}

/* warm_from names another pool; resolved once every pool is known. */
static int topo_parse_warm(struct topo *t, json_t *pools, char *err, size_t errlen)
{
    const char *name;
    json_t *pv;
    json_object_foreach(pools, name, pv) {
        json_t *v = json_object_get(pv, "warm_from");
        if (v == NULL) continue;
        int self = topo_pool_index(t, name);
        int from = json_is_string(v) ? topo_pool_index(t, json_string_value(v)) : -1;
        if (from < 0 || from == self)
            return topo_err(err, errlen, "pools.%.64s.warm_from: must name another pool", name);
        t->pools[self].warm_from = from;
    }
    return 0;
}

/* A namespace's settings (common/nsfields.h, shared with shoal-control and shoal-node): all
 * are checked with the node's bounds, so a document the router holds is one every follower can
 * use, and kept in the document (GET /v1/topology returns them); the router acts on those in
 * struct topo_ns. */
static int topo_parse_ns_settings(struct topo_ns *ns, json_t *nv, const char *path, char *err,
                                  size_t errlen)
{
    static const struct {
        const char *name;
        size_t off;
    } kept[] = {
        {"default_ttl", offsetof(struct topo_ns, default_ttl)},
        {"max_ttl", offsetof(struct topo_ns, max_ttl)},
        {"max_value_bytes", offsetof(struct topo_ns, max_value_bytes)},
        {"ops_per_sec", offsetof(struct topo_ns, ops.rate)},
        {"bytes_per_sec", offsetof(struct topo_ns, bytes.rate)},
    };
    char sub[300];
    json_t *v;
    for (size_t i = 0; i < nsf_nints; i++) {
        const struct nsf_int *f = &nsf_ints[i];
        if ((v = json_object_get(nv, f->name)) == NULL) continue;
        snprintf(sub, sizeof sub, "%.200s.%s", path, f->name);
        uint64_t n;
        if (topo_uint(v, sub, f->lo, f->hi, &n, err, errlen) < 0) return -1;
        for (size_t k = 0; k < sizeof kept / sizeof kept[0]; k++)
            if (!strcmp(kept[k].name, f->name)) *(uint64_t *)((char *)ns + kept[k].off) = n;
    }
    if (!nsf_ttls_ok(ns->default_ttl, ns->max_ttl))
        return topo_err(err, errlen, "%s.default_ttl: %llu is longer than max_ttl (%llu)", path,
                        (unsigned long long)ns->default_ttl, (unsigned long long)ns->max_ttl);
    if ((v = json_object_get(nv, "team")) != NULL &&
        (!json_is_string(v) || json_string_length(v) > TOPO_NAME_MAX))
        return topo_err(err, errlen, "%s.team: must be a string of 0-%d bytes (\"\": no team)", path,
                        TOPO_NAME_MAX);
    if ((v = json_object_get(nv, "eviction")) != NULL && nsf_eviction_of(v) < 0)
        return topo_err(err, errlen, "%s.eviction: must be \"lru\", \"lfu\" or \"s3fifo\"", path);
    struct nsf_err ie;
    if ((v = json_object_get(nv, NSF_INVALIDATION)) != NULL &&
        nsf_invalidation_check(ns->name, v, &ie) < 0)
        return topo_err(err, errlen, "%s.%s", path, ie.msg);
    return 0;
}

static int topo_parse_namespaces(struct topo *t, json_t *nss, char *err, size_t errlen)
{
    if (!json_is_object(nss))
        return topo_err(err, errlen, "namespaces: must be an object that includes \"default\"");
    t->ns = calloc(json_object_size(nss) + 1, sizeof *t->ns);
    if (t->ns == NULL) return topo_err(err, errlen, "namespaces: out of memory");
    const char *name;
    json_t *nv;
    char path[256];
    bool have_default = false;
    json_object_foreach(nss, name, nv) {
        snprintf(path, sizeof path, "namespaces.%.64s", name);
        if (!topo_name_ok(name))
            return topo_err(err, errlen,
                            "%s: namespace names are 1-%d bytes without spaces or ':'", path,
                            TOPO_NAME_MAX);
        if (!json_is_object(nv)) return topo_err(err, errlen, "%s: must be an object", path);
        static const char *const keys[] = {"pool", "team", "eviction", NSF_INVALIDATION,
#define X(name, lo, hi, def, help) #name,
                                           NSF_INTS(X)
#undef X
                                           NULL};
        if (topo_check_keys(nv, path, keys, err, errlen) < 0) return -1;
        struct topo_ns *ns = &t->ns[t->nns];
        snprintf(ns->name, sizeof ns->name, "%s", name);
        ns->nname = strlen(ns->name);
        const char *pool = json_string_value(json_object_get(nv, "pool"));
        if (pool == NULL)
            return topo_err(err, errlen, "%s.pool: required, the name of a pool", path);
        int pi = topo_pool_index(t, pool);
        if (pi < 0) return topo_err(err, errlen, "%s.pool: no pool named '%.64s'", path, pool);
        ns->pool = (uint32_t)pi;
        json_t *cv = json_object_get(nv, "copies");
        ns->copies = json_is_integer(cv) && json_integer_value(cv) == 2 ? 2 : 1;
        if (topo_parse_ns_settings(ns, nv, path, err, errlen) < 0) return -1;
        ns->ops.milli = (int64_t)ns->ops.rate * 1000; /* start full */
        ns->bytes.milli = (int64_t)ns->bytes.rate * 1000;
        if (!strcmp(name, "default")) {
            have_default = true;
            t->default_ns = t->nns;
        }
        t->nns++;
    }
    if (!have_default)
        return topo_err(err, errlen, "namespaces.default: required (keys without ':' use it)");
    return 0;
}

int topo_parse(const char *text, size_t len, unsigned flags, struct topo **out, char *err,
               size_t errlen)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return topo_err(err, errlen, "not valid JSON at line %d column %d: %s", je.line,
                        je.column, je.text);
    struct topo *t = calloc(1, sizeof *t);
    int rc = -1;
    if (t == NULL) {
        topo_err(err, errlen, "out of memory");
        goto out;
    }
    t->gutter_pool = -1;
    t->gutter_ttl = TOPO_GUTTER_TTL_DEFAULT;
    if (!json_is_object(root)) {
        topo_err(err, errlen, "the document must be a JSON object");
        goto out;
    }
    static const char *const keys[] = {"version", "pools", "gutter_pool", "gutter_ttl",
                                       "namespaces", NULL};
    if (topo_check_keys(root, "", keys, err, errlen) < 0) goto out;
    json_t *v = json_object_get(root, "version");
    if (v == NULL) {
        topo_err(err, errlen, "version: required, an integer >= 1 that grows with every change");
        goto out;
    }
    if (topo_uint(v, "version", 1, INT64_MAX, &t->version, err, errlen) < 0) goto out;
    if (topo_parse_pools(t, json_object_get(root, "pools"), flags, err, errlen) < 0 ||
        topo_parse_warm(t, json_object_get(root, "pools"), err, errlen) < 0)
        goto out;
    if ((v = json_object_get(root, "gutter_pool")) != NULL) {
        if (!json_is_string(v) || (t->gutter_pool = topo_pool_index(t, json_string_value(v))) < 0) {
            topo_err(err, errlen, "gutter_pool: must name a pool of \"pools\"");
            goto out;
        }
    }
    if ((v = json_object_get(root, "gutter_ttl")) != NULL &&
        topo_uint(v, "gutter_ttl", 1, 86400, &t->gutter_ttl, err, errlen) < 0)
        goto out;
    if (topo_parse_namespaces(t, json_object_get(root, "namespaces"), err, errlen) < 0) goto out;
    if ((t->doc = json_dumps(root, JSON_INDENT(2))) == NULL) {
        topo_err(err, errlen, "out of memory");
        goto out;
    }
    rc = 0;
    *out = t;
    t = NULL;
out:
    topo_destroy(&t);
    json_decref(root);
    return rc;
}

int topo_load_file(const char *path, struct topo **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return topo_err(err, errlen, "topology %s: %s; check the path given to --config", path,
                        strerror(errno));
    char *text = malloc(TOPO_FILE_MAX);
    size_t n = text ? fread(text, 1, TOPO_FILE_MAX, f) : 0;
    bool big = text && n == TOPO_FILE_MAX;
    fclose(f);
    if (text == NULL || big) {
        free(text);
        return topo_err(err, errlen, "topology %s: larger than %d bytes or out of memory", path,
                        TOPO_FILE_MAX);
    }
    char msg[512];
    int rc = topo_parse(text, n, 0, out, msg, sizeof msg);
    free(text);
    if (rc < 0) topo_err(err, errlen, "topology %s: %s", path, msg);
    return rc;
}

const struct topo_ns *topo_namespace(const struct topo *t, const char *key, size_t nkey)
{
    const char *colon = memchr(key, ':', nkey);
    if (colon) {
        size_t n = (size_t)(colon - key);
        for (uint32_t i = 0; i < t->nns; i++)
            if (t->ns[i].nname == n && !memcmp(t->ns[i].name, key, n)) return &t->ns[i];
    }
    return &t->ns[t->default_ns];
}

static uint32_t topo_replica;

void topo_set_replica(uint32_t hash) { topo_replica = hash; }

const struct topo_pool *topo_pool_of(const struct topo *t, const char *key, size_t nkey)
{
    return &t->pools[topo_namespace(t, key, nkey)->pool];
}

uint32_t topo_route_pool(const struct topo *t, uint32_t pool, const char *key, size_t nkey)
{
    const struct topo_pool *p = &t->pools[pool];
    if (p->replicated) return p->nodes[topo_replica % p->nnodes];
    return p->owner[slot_of_key(key, nkey)];
}

uint32_t topo_route(const struct topo *t, const char *key, size_t nkey)
{
    return topo_route_pool(t, topo_namespace(t, key, nkey)->pool, key, nkey);
}

int64_t topo_replica_route(const struct topo *t, const char *key, size_t nkey)
{
    const struct topo_ns *ns = topo_namespace(t, key, nkey);
    const struct topo_pool *p = &t->pools[ns->pool];
    if (p->replica == NULL || ns->copies < 2) return -1;
    uint16_t r = p->replica[slot_of_key(key, nkey)];
    return r == TOPO_NO_REPLICA ? -1 : r;
}

bool topo_has_replicas(const struct topo *t)
{
    for (uint32_t i = 0; i < t->npools; i++)
        if (t->pools[i].replica) return true;
    return false;
}

int64_t topo_gutter_route(const struct topo *t, const char *key, size_t nkey)
{
    if (t->gutter_pool < 0) return -1;
    return t->pools[t->gutter_pool].owner[slot_of_key(key, nkey)];
}

void topo_registry_init(struct topo_registry *r, struct topo *t, uint64_t **seen, size_t nreaders)
{
    pthread_mutex_init(&r->lock, NULL);
    r->cur = t;
    r->gen = 1;
    r->seen = seen;
    r->nreaders = nreaders;
}

void topo_registry_teardown(struct topo_registry *r)
{
    topo_destroy(&r->cur);
    pthread_mutex_destroy(&r->lock);
}

int topo_publish(struct topo_registry *r, struct topo *t, char *err, size_t errlen)
{
    pthread_mutex_lock(&r->lock);
    struct topo *old = r->cur;
    if (t->version <= old->version) {
        topo_err(err, errlen, "version %llu is not newer than version %llu in use",
                 (unsigned long long)t->version, (unsigned long long)old->version);
        pthread_mutex_unlock(&r->lock);
        topo_destroy(&t);
        return -1;
    }
    __atomic_store_n(&r->cur, t, __ATOMIC_SEQ_CST);
    qsbr_synchronize(&r->gen, r->seen, r->nreaders); /* then no reader can hold `old` */
    pthread_mutex_unlock(&r->lock);
    topo_destroy(&old);
    return 0;
}
