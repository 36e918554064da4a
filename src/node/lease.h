/* lease.h — per-key lease memory: when a key may next hand out a win (W), and which win is still
 * being filled.
 *
 * The item carries the lease itself (ITEM_TOKEN, the CAS as token), but a delete takes the item
 * away, and with it any memory that a win was handed out. Two namespace settings need that
 * memory to outlive the item:
 *  - lease_period: after a win, the key hands out no other win for this long, deleted or not
 *    (Facebook's "one token per key per 10 seconds");
 *  - lease_ttl: a win is "in flight" until its holder fills (any ms with the win's CAS, stored
 *    or refused) or lease_ttl passes; meanwhile no second win is handed out, so a delete that
 *    voids a fill does not start a second database load beside the first.
 *
 * The table is a fixed array of small buckets keyed by the key's 64-bit hash, sized at start
 * (--lease-keys); an entry is free again once both windows are over. When a bucket has no free
 * entry the one whose windows end first is replaced (counted by the caller: a key may then win
 * early). Bucket locks are striped mutexes held for a few loads and stores; callers also hold
 * the key's shard lock, which is what makes check-then-record atomic for one key. */
#ifndef SHOAL_NODE_LEASE_H
#define SHOAL_NODE_LEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lease_table;

/* A table remembering about `keys` keys (rounded up to a power of two, at least 64). Returns
 * NULL when out of memory. */
struct lease_table *lease_table_create(size_t keys);
/* Free the table; sets *t to NULL. */
void lease_table_destroy(struct lease_table **t);

/* Milliseconds on a monotonic clock; the time base of every call below. */
uint64_t lease_now_ms(void);

/* May the key of hash `hv` hand out a win at `now`? No while a recorded win's period has not
 * passed, nor while it is in flight. When it may not and `until` is not NULL, *until is the
 * time the blocking window ends. */
bool lease_may_win(struct lease_table *t, uint64_t hv, uint64_t now, uint64_t *until);

/* Record a win with token `token` (the CAS the holder will fill with): no other win before
 * now + period_ms, nor before the holder fills or now + inflight_ms passes. Returns false when
 * a still-blocking entry of another key had to be replaced to make room. */
bool lease_record_win(struct lease_table *t, uint64_t hv, uint64_t token, uint64_t now,
                      uint64_t period_ms, uint64_t inflight_ms);

/* The holder of the win `token` tried its fill (stored or refused): the win is no longer in
 * flight. The period, if any, still runs. No effect for any other token. */
void lease_filled(struct lease_table *t, uint64_t hv, uint64_t token);

#endif
