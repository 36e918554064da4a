/* scopestats.h — figures per pool and per namespace for /metrics: requests, errors, timeouts
 * and latency (pools and namespaces) and limit refusals (namespaces).
 *
 * Counters are indexed by the pool's or namespace's position in the topology table that
 * routed the request, and labelled with the names of the table in use when /metrics is
 * scraped. A reload that keeps every pool and namespace in place (the usual case: nodes or
 * limits change) keeps their series; one that renames, removes or reorders them leaves the
 * counts of a position under the name that now holds it (a new name may start from a
 * removed one's count). Counters never go back.
 *
 * Same layout as nodestats.h: one block of slots per worker, written only by that worker
 * (relaxed stores, no shared cache lines on the request path), summed by the admin thread. */
#ifndef SHOAL_ROUTER_SCOPESTATS_H
#define SHOAL_ROUTER_SCOPESTATS_H

#include <stddef.h>
#include <stdint.h>

#include "router/lathist.h"
#include "router/topo.h"

struct buf;
struct nodestats;

/* Namespaces past this position are not counted (pools are bounded by TOPO_POOLS_MAX). */
#define SCOPESTATS_NS_MAX 1024

struct scopestat {
    uint64_t requests, errors, timeouts, refusals; /* refusals: namespaces only */
};

/* One worker's counters; aligned so two workers never share a cache line. */
struct scopestat_block {
    struct scopestat pool[TOPO_POOLS_MAX];
    struct scopestat ns[SCOPESTATS_NS_MAX];
} __attribute__((aligned(64)));

/* One worker's latency histograms, apart from the counters: 400 KB a worker, mapped rather
 * than zeroed so that the pages of pools and namespaces never used take no memory.
 *   pool: a request sent to one of the pool's nodes, from when it was handed to a connection to
 *         its reply (what the node's latency measures; failures and timeouts not included);
 *   ns:   a client request routed to nodes, from when the router parsed it to when its reply
 *         was complete (every fragment of a split multi-get merged, warm-up lookups included). */
struct scopestat_lat {
    struct lathist pool[TOPO_POOLS_MAX];
    struct lathist ns[SCOPESTATS_NS_MAX];
} __attribute__((aligned(64)));

struct scopestats {
    struct scopestat_block *w; /* nworkers blocks */
    struct scopestat_lat *lat; /* nworkers blocks */
    size_t nworkers;
};

/* Returns 0, or -1 when memory runs out. */
int scopestats_init(struct scopestats *s, size_t nworkers);
void scopestats_teardown(struct scopestats *s);

/* Single-writer increments by worker `wid` for pool `pool` / namespace `ns` (indices into the
 * routing table; negative or out of range: not counted). */
static inline void scopestat_add(struct scopestats *s, int wid, int32_t pool, int32_t ns,
                                 size_t off)
{
    if (s->w == NULL) return;
    struct scopestat_block *b = &s->w[wid];
    if (pool >= 0 && pool < TOPO_POOLS_MAX) {
        uint64_t *p = (uint64_t *)((char *)&b->pool[pool] + off);
        __atomic_store_n(p, *p + 1, __ATOMIC_RELAXED);
    }
    if (ns >= 0 && ns < SCOPESTATS_NS_MAX) {
        uint64_t *p = (uint64_t *)((char *)&b->ns[ns] + off);
        __atomic_store_n(p, *p + 1, __ATOMIC_RELAXED);
    }
}
#define SCOPESTAT_ADD(s, wid, pool, ns, field) \
    scopestat_add((s), (wid), (pool), (ns), offsetof(struct scopestat, field))

/* Single-writer record of one latency by worker `wid` for pool `pool` and/or namespace `ns`
 * (indices as for scopestat_add; -1 leaves one out). */
static inline void scopestat_latency(struct scopestats *s, int wid, int32_t pool, int32_t ns,
                                     uint64_t us)
{
    if (s->lat == NULL) return;
    if (pool >= 0 && pool < TOPO_POOLS_MAX) lathist_record(&s->lat[wid].pool[pool], us);
    if (ns >= 0 && ns < SCOPESTATS_NS_MAX) lathist_record(&s->lat[wid].ns[ns], us);
}

/* Prometheus text for every pool and namespace of `t` (the table in use; the caller keeps it
 * from being freed): shoal_router_pool_{requests,errors,timeouts}, shoal_router_pool_nodes_{up,
 * down} (a node counts as down when any worker has it marked down, per `nodes`) and the
 * shoal_router_pool_latency_us summary, labelled pool="name"; shoal_router_namespace_{requests,
 * errors,timeouts,limit_refusals} and the shoal_router_namespace_latency_us summary, labelled
 * namespace="name". */
void scopestats_render(struct scopestats *s, const struct topo *t, struct nodestats *nodes,
                       struct buf *out);

#endif
