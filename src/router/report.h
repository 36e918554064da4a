/* report.h — shoal-router --control: reports of the nodes' states to the control plane, for
 * its failure detection (FAILOVER.md C4; docs/router.md, "Reports").
 *
 * A thread of its own (never a worker: an HTTP request blocks) POSTs `URL/v1/reports`
 * {"router": <its follower id: --client-id or the host name>, "nodes": {"host:port": "up" |
 * "down", ...}} listing every node of the topology's non-gutter pools that a worker has sent a
 * request to (a router that never talks to a node has no word on it)
 * (the workers' shared mark-down state, failover.h: "down" while marked down), every
 * --report-ms and at once when a node is marked down or up. It watches router.health_gen, which
 * every mark-down and mark-up bumps, every 10 ms. A control plane that answers 404 (one without
 * the call) is logged once and asked again only every minute; one that does not answer is
 * asked at the next period (the next member of a --control list first). */
#ifndef SHOAL_ROUTER_REPORT_H
#define SHOAL_ROUTER_REPORT_H

#include <stddef.h>

#include "router/router.h"

/* Start reporting to r->cfg.control (which is set). -1 with a message when the thread cannot
 * start. */
int reporter_start(struct router *r, char *err, size_t errlen);
/* Stop the thread (at once, even in the middle of a request) and free; NULL is fine. */
void reporter_stop(struct router *r);

#endif
