/* nodestats.h — figures per upstream node for /metrics: requests, errors, timeouts, whether it
 * is marked down, and a latency histogram.
 *
 * One entry per node address, created when a worker first connects to it and kept for the
 * life of the process (a topology reload that drops a node keeps its figures; counters never
 * go back). Each entry has one slot per worker, written only by that worker (relaxed stores,
 * no shared cache lines on the request path) and summed by the admin thread. */
#ifndef SHOAL_ROUTER_NODESTATS_H
#define SHOAL_ROUTER_NODESTATS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "router/lathist.h"
#include "router/topo.h"

struct buf;

struct nodestat_slot {
    uint64_t requests, errors, timeouts, down;
    uint64_t catchup_done; /* the node's catch-up episode this worker has finished (catchup.h):
                            * written by it (release), read by the others (acquire) */
    struct lathist lat; /* reply times (lathist_record) */
} __attribute__((aligned(64)));

struct nodestat {
    char addr[TOPO_ADDR_MAX];
    struct nodestat_slot *slots; /* one per worker */
    uint64_t health;             /* shared mark-down epoch, odd while the node is marked down
                                  * (failover.h); atomics only */
    uint64_t catchup;            /* catch-up episodes started for it (catchup.h); atomics only */
};

struct nodestats {
    pthread_mutex_t lock;
    struct nodestat **v;
    size_t n, cap, nworkers;
};

void nodestats_init(struct nodestats *s, size_t nworkers);
void nodestats_teardown(struct nodestats *s);
/* The entry for `addr`, created on first use. NULL when memory runs out (then the node's
 * figures are simply not kept). Takes the lock: call when connecting, not per request. */
struct nodestat *nodestats_get(struct nodestats *s, const char *addr);
/* Whether any worker has the node at `addr` marked down (false for a node never used). Takes
 * the lock: for the admin thread. */
bool nodestats_is_down(struct nodestats *s, const char *addr);
/* The workers' shared mark-down state of the node at `addr` (its health epoch, failover.h): 1
 * marked down, 0 up, -1 when no worker has sent it a request yet (this router has no word on
 * it: its "up" would count against the routers that do, FAILOVER.md C4). Takes the lock: not
 * for workers. */
int nodestats_state(struct nodestats *s, const char *addr);
/* Prometheus text for every node: shoal_router_node_{requests,errors,timeouts} counters,
 * shoal_router_node_down (workers that have it marked down) and the shoal_router_node_latency_us
 * summary (lathist_render). */
void nodestats_render(struct nodestats *s, struct buf *out);

/* Single-writer increments from the owning worker. */
#define NODESTAT_ADD(field, v) __atomic_store_n(&(field), (field) + (v), __ATOMIC_RELAXED)

#endif
