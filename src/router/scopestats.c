/* scopestats.c — per-pool and per-namespace figures (see scopestats.h). */
#include "router/scopestats.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/buf.h"
#include "router/nodestats.h"

int scopestats_init(struct scopestats *s, size_t nworkers)
{
    s->nworkers = nworkers;
    s->lat = NULL;
    size_t bytes = nworkers * sizeof *s->w; /* a multiple of 64: the block is aligned */
    s->w = aligned_alloc(64, bytes);
    if (s->w == NULL) return -1;
    memset(s->w, 0, bytes);
    /* anonymous pages read as zeros and are backed only once written */
    s->lat = mmap(NULL, nworkers * sizeof *s->lat, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->lat == MAP_FAILED) {
        s->lat = NULL;
        scopestats_teardown(s);
        return -1;
    }
    return 0;
}

void scopestats_teardown(struct scopestats *s)
{
    free(s->w);
    s->w = NULL;
    if (s->lat) munmap(s->lat, s->nworkers * sizeof *s->lat);
    s->lat = NULL;
}

static uint64_t scope_sum(const struct scopestats *s, bool pool, uint32_t i, size_t off)
{
    uint64_t sum = 0;
    for (size_t wi = 0; wi < s->nworkers; wi++) {
        const struct scopestat *e = pool ? &s->w[wi].pool[i] : &s->w[wi].ns[i];
        sum += __atomic_load_n((const uint64_t *)((const char *)e + off), __ATOMIC_RELAXED);
    }
    return sum;
}

/* The latency summary of each of the first `n` pools (`pool`) or namespaces of `t`, summed
 * over workers. */
static void scope_render_latency(const struct scopestats *s, const struct topo *t, bool pool,
                                 uint32_t n, struct buf *out)
{
    const char *name = pool ? "shoal_router_pool_latency_us" : "shoal_router_namespace_latency_us";
    lathist_render_head(out, name,
                        pool ? "reply time of requests sent to the pool's nodes, measured per "
                               "event-loop batch (quantiles: upper bound of a power-of-two bucket)"
                             : "time from parsing a request of the namespace (a multi-key get: "
                               "its first key's) to its complete reply, measured per event-loop "
                               "batch (quantiles: upper bound of a power-of-two bucket)");
    for (uint32_t i = 0; i < n && s->lat; i++) {
        struct lathist h = {0};
        for (size_t wi = 0; wi < s->nworkers; wi++)
            lathist_add(&h, pool ? &s->lat[wi].pool[i] : &s->lat[wi].ns[i]);
        lathist_render(out, name, pool ? "pool" : "namespace",
                       pool ? t->pools[i].name : t->ns[i].name, &h);
    }
}

void scopestats_render(struct scopestats *s, const struct topo *t, struct nodestats *nodes,
                       struct buf *out)
{
    if (s->w == NULL) return;
    static const struct {
        const char *name, *help;
        size_t off;
    } pseries[] = {
        {"requests", "requests sent to the pool's nodes (gutter fail-over under the gutter pool)",
         offsetof(struct scopestat, requests)},
        {"errors", "requests for the pool answered SERVER_ERROR by the router (timeouts included)",
         offsetof(struct scopestat, errors)},
        {"timeouts", "requests for the pool that timed out", offsetof(struct scopestat, timeouts)},
    }, nseries[] = {
        {"requests", "requests (keys, for a multi-get) for the namespace, refused ones included",
         offsetof(struct scopestat, requests)},
        {"errors", "requests for the namespace answered SERVER_ERROR by the router for a node "
                   "(timeouts included)", offsetof(struct scopestat, errors)},
        {"timeouts", "requests for the namespace that timed out",
         offsetof(struct scopestat, timeouts)},
        {"limit_refusals", "requests refused by a namespace limit (size, ops/s, bytes/s)",
         offsetof(struct scopestat, refusals)},
    };
    uint32_t npools = t->npools < TOPO_POOLS_MAX ? t->npools : TOPO_POOLS_MAX;
    uint32_t nns = t->nns < SCOPESTATS_NS_MAX ? t->nns : SCOPESTATS_NS_MAX;
    for (size_t k = 0; k < sizeof pseries / sizeof pseries[0]; k++) {
        buf_printf(out, "# HELP shoal_router_pool_%s %s\n# TYPE shoal_router_pool_%s counter\n",
                   pseries[k].name, pseries[k].help, pseries[k].name);
        for (uint32_t i = 0; i < npools; i++)
            buf_printf(out, "shoal_router_pool_%s{pool=\"%s\"} %llu\n", pseries[k].name,
                       t->pools[i].name,
                       (unsigned long long)scope_sum(s, true, i, pseries[k].off));
    }
    buf_append_str(out, "# HELP shoal_router_pool_nodes_down nodes of the pool that a worker "
                        "has marked down\n# TYPE shoal_router_pool_nodes_down gauge\n");
    uint32_t *down = calloc(npools ? npools : 1, sizeof *down);
    for (uint32_t i = 0; i < npools && down; i++) {
        for (uint32_t k = 0; k < t->pools[i].nnodes; k++)
            if (nodestats_is_down(nodes, t->nodes[t->pools[i].nodes[k]].addr)) down[i]++;
        buf_printf(out, "shoal_router_pool_nodes_down{pool=\"%s\"} %u\n", t->pools[i].name,
                   down[i]);
    }
    buf_append_str(out, "# HELP shoal_router_pool_nodes_up nodes of the pool in use\n"
                        "# TYPE shoal_router_pool_nodes_up gauge\n");
    for (uint32_t i = 0; i < npools && down; i++)
        buf_printf(out, "shoal_router_pool_nodes_up{pool=\"%s\"} %u\n", t->pools[i].name,
                   t->pools[i].nnodes - down[i]);
    free(down);
    scope_render_latency(s, t, true, npools, out);
    for (size_t k = 0; k < sizeof nseries / sizeof nseries[0]; k++) {
        buf_printf(out,
                   "# HELP shoal_router_namespace_%s %s\n# TYPE shoal_router_namespace_%s counter\n",
                   nseries[k].name, nseries[k].help, nseries[k].name);
        for (uint32_t i = 0; i < nns; i++)
            buf_printf(out, "shoal_router_namespace_%s{namespace=\"%s\"} %llu\n", nseries[k].name,
                       t->ns[i].name,
                       (unsigned long long)scope_sum(s, false, i, nseries[k].off));
    }
    scope_render_latency(s, t, false, nns, out);
}
