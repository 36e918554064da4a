/* catchup.h — before a worker reads a failed primary's copies-2 keys from their slots'
 * replicas, the replicas get the deletes the primary may have acknowledged without streaming.
 *
 * Replication is asynchronous: a delete the primary P acknowledged in its last milliseconds may
 * not have reached its replica R when P dies. From P's first failure until control promotes R
 * and the routers replay their recent deletes (dellog.h) the router reads P's keys from R, which
 * would serve the deleted value meanwhile. So when P fails (a request of P's keys is retried on
 * a slot's replica, or P is marked down, whichever comes first), every worker sends the deletes
 * of its recent-deletes log that it routed to P since its last reply from P, less
 * --replay-margin-ms (P's replication lag is assumed below it), and not before its own previous
 * catch-up for P (a flapping primary: what that one sent is there), to each key's slot replica as
 * quiet `md <key> q` batches closed by `mn` (catchup_deletes; one log line per worker). That
 * is an episode.
 *
 * Order. A worker reaches a node over several connections and the node may apply them in any
 * order; and deletes routed by one worker must be on R before another reads there. So while an
 * episode runs, every request a worker routes to a replica in place of its failed primary
 * (frag.via_replica: reads, and the writes that follow them, so a client's pipeline keeps its
 * order there) is held on the replica's upnode, neither sent nor failed nor sent to the gutter,
 * until every worker has had the `mn` of each of its batches answered (each worker publishes
 * that in its slot of the node's shared figures, nodestats.h), or --catchup-wait-ms has passed
 * (then they go ahead, counted in catchup_timeouts): since the worker's wait began, and since
 * each request was held, whichever comes first (episodes overlapping never extend it). A batch the replica fails counts as
 * answered (catchup_failures): nothing better is known of it.
 *
 * Sharing. The node's episode count is one shared word (nodestat.catchup): the worker that
 * starts one bumps it, bumps router.health_gen and wakes the other workers, which join at the
 * start of their next batch (failover_sync). A worker starts an episode at most once per failure
 * of P: not again until P has answered it since. Nothing shared is touched on the request path
 * while no node fails: the hold test is a load of the worker's own counter. */
#ifndef SHOAL_ROUTER_CATCHUP_H
#define SHOAL_ROUTER_CATCHUP_H

#include <stdbool.h>

#include "router/request.h"
#include "router/router.h"

struct upnode;

/* A request of `p`'s keys is about to go to a slot's replica because p failed it or is marked
 * down (or fenced): start an episode for p unless this worker has since p last answered it. */
void catchup_begin(struct rworker *w, struct upnode *p);
/* Join the episodes other workers started (from failover_sync, once health_gen moved). */
void catchup_sync(struct rworker *w);
/* At the start of a batch and on the tick: release the held requests once every episode this
 * worker waits for is over, or has waited --catchup-wait-ms. Cheap when none: one load. */
void catchup_poll(struct rworker *w);
/* From upnode_submit: hold f (for `un`) while an episode runs; true when it was held. */
bool catchup_hold(struct upnode *un, struct frag *f);
/* A catch-up batch was answered (`failed`: the router failed it). */
void catchup_batch_done(struct rworker *w, bool failed);
/* At an upnode's destruction: its held requests (the worker is exiting). */
void catchup_drop_held(struct upnode *un);

#endif
