/* repl.h — node-to-node asynchronous replication (issue 15, FAILOVER.md C2).
 *
 * Roles: each slot of the topology in use is, for this node, primary (the range's "node" is
 * its --advertise), replica (its "replica" is), or neither; repl_roles_* take them from the
 * control follower. The data path reads one byte per slot (relaxed atomic loads, no pointer to
 * reclaim), so asking "does this key stream?" costs a compare for keys of namespaces with one
 * copy and a CRC16 plus a byte load for the others.
 *
 * As primary (repl_primary.c): every change to a slot that has a replica, in a namespace with
 * "copies": 2, is appended by the worker that made it, under the key's shard lock (so the
 * stream orders a key's changes as the store did), to the backlog (repl_backlog.h); one sender
 * thread per replica connects to the replica's data port and streams it, or a snapshot first.
 * As replica (repl_replica.c): a connection that opens with the replication handshake leaves
 * the worker for an applier thread. Wire: repl_wire.h, docs/protocol.md "Replication".
 * Figures and the admin endpoints: repl.c. */
#ifndef SHOAL_NODE_REPL_H
#define SHOAL_NODE_REPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"
#include "common/slot.h"

struct buf;
struct conn;
struct item;
struct node;
struct ns;
struct proto_req;

/* Per-slot role bits (struct repl_pub.role). */
enum {
    REPL_ROLE_PRIMARY = 1,     /* the range's node is this node */
    REPL_ROLE_REPLICA = 2,     /* the range's replica is this node */
    REPL_ROLE_STREAMS = 4,     /* primary of a range with a replica: its changes stream */
    REPL_ROLE_FENCED = 8,      /* a handoff fences its writes (SERVER_ERROR slot moving) */
};

/* The part of the replication state the data path reads inline. */
struct repl_pub {
    uint8_t role[SLOT_COUNT]; /* relaxed atomic bytes */
    uint64_t nfenced;         /* slots with REPL_ROLE_FENCED; 0 on the common path */
    uint64_t fence_refusals;
};

/* Figures (`stats repl`, /metrics as shoal_node_repl_<name>, GET /v1/replication). */
#define REPL_METRICS(X)                                                                          \
    X(offset, GAUGE, "stream bytes produced as primary since start")                             \
    X(backlog_bytes, GAUGE, "bytes of the stream the backlog holds now")                         \
    X(replicas, GAUGE, "replicas this node streams to")                                          \
    X(replicas_online, GAUGE, "of them, connected and past their full sync")                     \
    X(lag_bytes, GAUGE, "largest stream bytes a replica has not acknowledged")                   \
    X(lag_ms, GAUGE, "longest time a replica has been behind, milliseconds")                     \
    X(full_resyncs, COUNTER, "replica connections that began with a full sync (snapshot)")       \
    X(partial_resyncs, COUNTER, "replica connections that resumed from their acked offset")       \
    X(snapshot_items, COUNTER, "items sent in full syncs")                                       \
    X(snapshot_moves, COUNTER, "items cleaning moved during a full sync, logged for its replicas") \
    X(backlog_oversize, COUNTER, "changes larger than the backlog (every replica resyncs)")       \
    X(stream_errors, COUNTER, "replica connections lost or refused (primary side)")              \
    X(primaries, GAUGE, "primaries streaming to this node now")                                  \
    X(applied_records, COUNTER, "stream and snapshot records applied as replica")                \
    X(applied_bytes, COUNTER, "stream bytes applied as replica")                                 \
    X(full_syncs_applied, COUNTER, "full syncs received as replica")                             \
    X(records_skipped, COUNTER, "records for slots this node does not replicate from that peer")  \
    X(handshakes_refused, COUNTER, "replication handshakes refused (not a primary of ours)")     \
    X(protocol_errors, COUNTER, "replication connections closed on a malformed line or frame")  \
    X(fenced_slots, GAUGE, "slots whose writes a handoff fences now")                            \
    X(fence_refusals, COUNTER, "writes refused with SERVER_ERROR slot moving")

struct repl_metrics {
    REPL_METRICS(METRIC_FIELD)
};
const struct metric_desc *repl_metric_table(size_t *n);

/* Made with the control follower (NULL without --control); its advertise address is set once
 * the node listens (it needs the port), before the first document. repl_stop ends every
 * thread (senders, appliers) before the store goes. */
struct repl *repl_create(struct node *n, char *err, size_t errlen);
void repl_set_advertise(struct repl *r, const char *advertise);
void repl_stop(struct repl *r);
void repl_free(struct repl **r);
/* Answer every handoff still waiting (503, its fence lifted) and wait for their threads: at
 * shutdown, before the admin listener stops (it may not stop with a request held). NULL: none. */
void repl_handoffs_end(struct repl *r);

/* Roles from a topology document (control.c): begin, one call per range of the pools that list
 * this node, commit. A change between primary and replica drops nothing (control.c's slot
 * drops count both as owned). */
struct repl_plan;
struct repl_plan *repl_plan_begin(struct repl *r);
void repl_plan_range(struct repl_plan *p, unsigned from, unsigned to, const char *node,
                     const char *replica);
void repl_plan_commit(struct repl *r, struct repl_plan *p); /* frees p; NULL: nothing */
void repl_plan_free(struct repl_plan *p);                  /* a plan not committed */

/* A slot's role bits (REPL_ROLE_*; 0 before the first document) and, when `peer` is not NULL,
 * its peer's address: the replica where this node is primary, the primary where it is replica
 * ("" when none). Any thread; the data path reads struct repl_pub.role[] directly. Fencing code
 * elsewhere (leases) asks REPL_ROLE_STREAMS: "primary of a range that has a replica". */
uint8_t repl_slot_role(struct repl *r, unsigned slot, char *peer, size_t peercap);

/* --- data path (workers), under the key's shard lock; repl_hook.h says when to call --- */
bool repl_slot_streams(const struct repl_pub *p, const char *key, size_t nkey);
void repl_log_item(struct node *n, const struct item *it);
void repl_log_del(struct node *n, const char *key, size_t nkey);
void repl_log_touch(struct node *n, const char *key, size_t nkey, uint32_t exptime);
/* flush_all (delay seconds, 0: now) and flush_ns of a replicated namespace: every replica. */
void repl_log_flush(struct node *n, uint32_t delay);
void repl_log_flush_ns(struct node *n, const struct ns *ns);

/* A handoff fence: answers `SERVER_ERROR slot moving` for a write to a fenced slot and returns
 * true. Only the command path calls it (cmd.c); reads are never fenced. */
bool repl_fence_refuse(struct conn *c, const struct proto_req *req);

/* Replica side: a data connection whose input opens with REPL_HELLO is handed over (the worker
 * never blocks on it): `fd` (a dup, now the applier's) and the bytes already read. */
void repl_adopt(struct node *n, int fd, const char *pre, size_t npre);

/* Figures: `stats repl` lines, /metrics text, GET /v1/replication's JSON. */
void repl_stats_text(struct repl *r, struct buf *out);
void repl_metrics_prom(struct repl *r, struct buf *out);
/* Admin route for /v1/replication[/handoff] (node_admin.c registers it, holding requests). */
int repl_admin_route(void *ctx, const char *method, const char *rest, const char *body, size_t len,
                     struct buf *out);

#endif
