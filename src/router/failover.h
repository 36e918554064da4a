/* failover.h — when a node fails a request (refuses the connection, resets it, times out), the
 * request is retried once on the gutter pool before its client is answered (the paper's §3.3,
 * mcrouter's failover routes); and a node marked down by one worker thread is marked down for
 * every worker.
 *
 * Which requests. Routing marks each fragment it sends to the owner of its keys in a sharded
 * pool (not one sent to the gutter already, not a warm-up's, not a replicated pool's) with
 * what may be retried:
 *   FAILOVER_ANY    a request the node may have run before it failed and that a second run
 *                   answers and leaves alike: get, gets, gat, gats, mg, me; set, replace,
 *                   delete, touch; ms in set or replace mode and md, without a compare (C);
 *   FAILOVER_UNSENT the others (add, append, prepend, cas, incr, decr, ma; ms in add, append or
 *                   prepend mode or with C; md with C): retried only when none of its bytes
 *                   reached the node (a refused connect, a request failed fast during
 *                   --retry-ms, one waiting for the window, or one still in the router's
 *                   output buffer when the connection broke). Once sent, its effect may have
 *                   happened, and a retry could tell the client the opposite of what it did
 *                   (an add the owner stored, answered STORED again by the gutter as a second
 *                   win; an incr answered from the gutter's copy): it is answered with the
 *                   node's failure, as before, and its key logged for the owner's repair.
 * A retry goes, per key, to the gutter pool's node for the key (the same slot rule), with TTLs
 * capped by gutter_ttl, as a request routed there for a node marked down; a multi-key get
 * whose keys have different gutter nodes is split, and merged in key order as any split get.
 * A retry that goes to a copies-2 key's slot replica first has the owner's recent deletes sent
 * there (catchup.h), and waits for them.
 * It is the same fragment of the same client request, so the client's replies keep their order,
 * and the requests that were in flight on a connection that broke are retried in the order
 * they were sent, on their client's connection to the gutter node. Once: a retried request
 * that fails again is answered with its failure. A retried write logs its key for the owner's
 * repair (outage.h), as a write to a node marked down does (one that may have reached the owner
 * as a failed write: its repair waits a probe interval). No retry without a gutter pool, when
 * the key's gutter node is the failed node or is marked down, nor for a request over
 * FAILOVER_KEEP_MAX bytes once handed to a connection that did not keep its bytes (below).
 *
 * Shared mark-down. Each node's entry in the router's per-node table (nodestats.h) holds a
 * health epoch, odd while the node is marked down. A worker that marks a node down (after
 * down_after failures of its own) or finds it healthy again (its probe) moves the epoch and
 * bumps router.health_gen; every worker looks at health_gen at the start of each event-loop
 * batch and adopts the epochs that moved: it marks the node down itself (routes around it,
 * logs its writes, probes it) or back up (repairs what it logged before reading it again).
 * Marking a node down, either way, closes the worker's connections to it and retries (or
 * fails) the requests they had in flight and those waiting for them, at once: a later request
 * of the same client, routed to the gutter from now on, must not overtake them there. */
#ifndef SHOAL_ROUTER_FAILOVER_H
#define SHOAL_ROUTER_FAILOVER_H

#include <stdbool.h>
#include <stdint.h>

#include "protocol/protocol.h"
#include "router/request.h"
#include "router/router.h"

struct upnode;

enum { FAILOVER_NONE = 0, FAILOVER_UNSENT, FAILOVER_ANY };

/* A request handed to a connection keeps its bytes (line and value) until it is answered, so
 * that it can be retried; one longer than this gives its value back at once instead (as every
 * request did before retries: a node's window of 1 MB values would otherwise hold 512 MB per
 * node per worker) and is then not retried. Except a movable one (not moved yet), which may
 * meet a slot's handoff fence whatever its size: it keeps its bytes while they fit the
 * router's --moved-keep-max (frag_keep, request.h; given back once answered or resent).
 * Before it reaches a connection (refused, failed fast, waiting for the window) any request
 * may be. */
#define FAILOVER_KEEP_MAX 16384

/* What of `req` may be retried when it goes to the owner of its key(s) (see above). */
uint8_t failover_kind(const struct proto_req *req);

/* f failed on `from` by the node's fault (refused, reset, timed out) and has been taken out of
 * every queue of it; `sent` when its bytes reached the node. When it may be retried (f->failover
 * and the rules above), sends it on to the gutter pool and returns true: the caller forgets it.
 * False: the caller answers it with the failure. */
bool failover_retry(struct upnode *from, struct frag *f, bool sent);

/* This worker marked `un` down (`down`) or found it healthy: tell the other workers. */
void failover_publish(struct upnode *un, bool down);
/* Adopt the mark-downs and mark-ups other workers published since this worker last looked
 * (cheap when none: one atomic load). At the start of a batch, before any request is routed. */
void failover_sync(struct rworker *w);

/* Moved-retry (FAILOVER.md C6). A node answers `SERVER_ERROR slot lease expired` (its lease on
 * the slot ran out: a replica may be promoted over it) or `SERVER_ERROR slot moving` (a planned
 * handoff) for a key whose slot it no longer may serve. That is a routing failure, not the
 * request's answer: a fragment routed to a node of a pool with replicas (frag.movable) that
 * gets it is parked in its worker (never blocking it) until the worker adopts a newer topology,
 * then sent once more to where that table routes its key(s) (the new owner; the replica or the
 * gutter if the owner is down there), counted in moved_retries. When none comes within
 * --moved-wait-ms, a read falls back as for a node marked down (the replica, the gutter pool);
 * a write or delete is sent once more to where the table routes it (the owner, unless marked
 * down there), never to the gutter for an owner that is up: nothing would repair it there, and
 * the owner's older value would shadow it once its lease is renewed. A refusal of the resend
 * within --moved-wait-ms of the first refusal parks it again (the new owner may fence for a
 * moment: its lease names a version it has not received yet); one after that window is passed
 * to the client. */
bool failover_is_moved(const char *reply, size_t n);
/* f got such a reply from `from` (taken out of its queues and counted as answered): park it.
 * False when it cannot be (no --moved-wait-ms, its client has gone): the caller completes it
 * with the reply. */
bool failover_park(struct upnode *from, struct frag *f, const char *reply, size_t n);
/* Send again the parked fragments whose topology is now older than the worker's, and, with
 * `expired`, fall back for those parked --moved-wait-ms (at the worker's tick). */
void failover_unpark(struct rworker *w, bool expired);
/* At the worker's exit, once its clients are destroyed: drop them all. */
void failover_unpark_all(struct rworker *w);

#endif
