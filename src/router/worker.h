/* worker.h — shoal-router's worker threads: one epoll loop each over the shared listening
 * socket (EPOLLEXCLUSIVE), the clients it accepted and its own upstream connections. */
#ifndef SHOAL_ROUTER_WORKER_H
#define SHOAL_ROUTER_WORKER_H

#include <stdbool.h>
#include <stddef.h>

#include "common/metrics.h"
#include "router/router.h"

extern const struct metric_desc router_metric_descs[];
extern const size_t ROUTER_NMETRICS;

/* Create workers and their epoll sets (no threads yet). 0, or -1 with a message in err. */
int worker_setup(struct router *r, char *err, size_t errlen);
int worker_start(struct router *r, char *err, size_t errlen);
/* Stop and join every worker; close its clients and upstreams. */
void worker_teardown(struct router *r);
/* Does this worker have upstreams for the topology of this batch? False only when building
 * them ran out of memory (requests are then answered SERVER_ERROR out of memory). */
bool worker_topology_ready(struct rworker *w);

#endif
