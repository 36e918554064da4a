/* dellog.h — the router's recent-deletes log, replayed to a promoted slot's new primary
 * (FAILOVER.md C6; docs/router.md, "Promotions").
 *
 * Replication is asynchronous: a delete the old primary took may not have reached its replica
 * when the primary died, and once the replica is promoted it would serve the deleted value
 * until its TTL. So every worker remembers the deletes (`delete`, `md`: the clients' and the
 * invalidator's passing through) of keys of pools whose slot maps name replicas, with their
 * slot and time, in a ring of its own (no lock, no shared line on the request path;
 * --replay-log-bytes split over the workers, the oldest forgotten first). When a newly applied
 * topology promotes slots (promote_diff against the one it replaces, reload.c), each worker
 * sends the deletes of the last --replay-window-s seconds of those slots again, as `md`, to
 * the slots' owners in the new table (pipelined per node like any request), counted in
 * replayed_deletes, with one log line. Only those the new primary may lack: the applier of
 * the topology asks it up to when it applied the dead primary's stream (replaycut.h) and the
 * replay starts there less --replay-margin-ms. */
#ifndef SHOAL_ROUTER_DELLOG_H
#define SHOAL_ROUTER_DELLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/slot.h"

struct router;
struct rworker;
struct upnode;

struct dellog {
    uint8_t *buf;       /* a ring of entries: {u64 ms, u16 slot, u8 nkey, key} */
    size_t cap, head, used;
};

/* One promotion: the slots a published version promoted (router.promo, reload.c), each with
 * the oldest time (the workers' CLOCK_MONOTONIC ms) of the deletes it needs again: group[s] is
 * 0 for a slot not promoted, else 1 + an index into since[] (one entry per new primary and
 * dead primary pair; 0 = the whole window). */
#define DELLOG_PROMOS 8
#define DELLOG_GROUPS 64
struct dellog_promo {
    uint64_t seq, version;
    uint8_t group[SLOT_COUNT];
    uint64_t since[DELLOG_GROUPS];
};

void dellog_init(struct dellog *l, size_t cap);
void dellog_free(struct dellog *l);
/* Remember a delete of `key` (decoded bytes) routed now by worker w, if its pool has replicas. */
void dellog_note(struct rworker *w, const char *key, size_t nkey);
/* Record that version `version`, just published, promoted the `n` slots (reload.c; not a
 * worker); slot slots[i] needs the deletes logged at or after since[group[i]] (worker clock
 * ms; 0: the whole window), group[i] < ngroups < DELLOG_GROUPS (else, or group NULL: the
 * whole window). */
void dellog_promoted(struct router *r, uint64_t version, const uint16_t *slots, size_t n,
                     const uint8_t *group, const uint64_t *since, size_t ngroups);
/* At the start of a batch: replay to their new primaries the recent deletes of slots promoted
 * by versions this worker has adopted and not yet replayed for (cheap when none: one load). */
void dellog_sync(struct rworker *w);

/* A catch-up (catchup.h): send the deletes this worker logged at or after `since` (within the
 * window) of keys whose owner in its table is `owner` to their slots' replicas (copies-2
 * namespaces; a replica marked down is skipped), as quiet batches tagged REPL_CATCHUP, counted
 * in w->catchup_inflight until answered. Returns the deletes sent; *batches the batches. */
uint64_t dellog_catchup(struct rworker *w, struct upnode *owner, uint64_t since,
                        uint32_t *batches);

/* Ring internals, for unit tests: append an entry, and walk the live ones oldest first. */
void dellog_put(struct dellog *l, uint64_t ms, uint16_t slot, const char *key, size_t nkey);
/* Calls fn for each entry at or after since_ms, oldest first. */
void dellog_each(const struct dellog *l, uint64_t since_ms,
                 void (*fn)(void *ctx, uint64_t ms, uint16_t slot, const char *key, size_t nkey),
                 void *ctx);
/* Where a promoted slot's replay starts: its group's need (0: unknown) but never before the
 * window's start `floor`. */
uint64_t dellog_cutoff(uint64_t floor, uint64_t since);

#endif
