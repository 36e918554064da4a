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
 * replayed_deletes, with one log line. */
#ifndef SHOAL_ROUTER_DELLOG_H
#define SHOAL_ROUTER_DELLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/slot.h"

struct router;
struct rworker;

struct dellog {
    uint8_t *buf;       /* a ring of entries: {u64 ms, u16 slot, u8 nkey, key} */
    size_t cap, head, used;
};

/* One promotion: the slots a published version promoted (router.promo, reload.c). */
#define DELLOG_PROMOS 8
struct dellog_promo {
    uint64_t seq, version;
    uint8_t slots[SLOT_COUNT / 8];
};

void dellog_init(struct dellog *l, size_t cap);
void dellog_free(struct dellog *l);
/* Remember a delete of `key` (decoded bytes) routed now by worker w, if its pool has replicas. */
void dellog_note(struct rworker *w, const char *key, size_t nkey);
/* Record that version `version`, just published, promoted the `n` slots (reload.c; not a
 * worker). */
void dellog_promoted(struct router *r, uint64_t version, const uint16_t *slots, size_t n);
/* At the start of a batch: replay to their new primaries the recent deletes of slots promoted
 * by versions this worker has adopted and not yet replayed for (cheap when none: one load). */
void dellog_sync(struct rworker *w);

/* Ring internals, for unit tests: append an entry, and walk the live ones oldest first. */
void dellog_put(struct dellog *l, uint64_t ms, uint16_t slot, const char *key, size_t nkey);
/* Calls fn for each entry at or after since_ms, oldest first. */
void dellog_each(const struct dellog *l, uint64_t since_ms,
                 void (*fn)(void *ctx, uint16_t slot, const char *key, size_t nkey), void *ctx);

#endif
