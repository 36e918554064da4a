/* store.h — the node's storage engine: item memory, the hash index, eviction and expiry.
 *
 * The engine knows nothing of the wire protocol. It owns:
 *  - item memory: a segmented log in one reservation of `memory_limit` bytes (seg.h): items
 *    are appended to segments, freed items leave dead bytes that cleaning reclaims; RSS grows
 *    only as segments are first used;
 *  - the index: a hash table split into shards, each with its own lock and its own table that
 *    doubles independently, so growth pauses one small shard, never the whole node;
 *  - namespaces' memory: each namespace has its own pool of segments, up to its quota, with its
 *    own eviction policy (lru, lfu, s3fifo); a pool below 90% live bytes cleans, a fuller one
 *    evicts from its oldest segment;
 *  - expiry: lazily on lookup, and by a background sweeper thread.
 *
 * Locking: every index operation needs the key's shard lock (store_lock/store_unlock). The order
 * is shard lock, then pool lock; code holding a pool lock only ever try-locks a shard. So a
 * caller may call store_alloc() and store_free() with zero or one shard lock held. Items move
 * (cleaning) only under their shard lock: a pointer to an item is good while that lock is held. */
#ifndef SHOAL_NODE_STORE_H
#define SHOAL_NODE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"

/* iflags bits, changed only with the item's shard lock held. */
enum {
    ITEM_LINKED = 1 << 0,  /* in the index */
    ITEM_FETCHED = 1 << 1, /* read at least once since stored (mg h, me fetch, *_unfetched) */
    ITEM_STALE = 1 << 2,   /* marked stale by md I or ms I: served with X */
    ITEM_TOKEN = 1 << 3,   /* a win (W) was handed out: later readers get Z */
    ITEM_HOLD = 1 << 4,    /* a delete hold-off tombstone (empty); its exptime ends the hold */
    ITEM_FLAGS = 1 << 5,   /* client flags are stored, after the value; set at allocation only */
    ITEM_KEY_BINARY = 1 << 6, /* stored by ms with b: meta replies echo its key in base64, as
                                 memcached does; set before linking only */
};

/* One cached item: a 22-byte header (ITEM_HEADER), then key bytes, value bytes and, only when
 * they are not 0, 4 bytes of client flags, in one record of the log. Records are 4-byte aligned,
 * so no field needs more: the CAS is two parts (item_cas/item_set_cas), 48 bits in all (-m holds
 * every byte of the header: 2 of 24 were the CAS's top 16 bits, which a counter starting at 1
 * reaches after 2^48 stores). sizeof(struct item) is 24 with padding: the record's key starts at
 * data, offset 22. The size class and the hash chain are not stored: the class is the bucket of
 * the record's size, and the index keeps its slots. Times are on the store clock (clock_now():
 * seconds since start); exptime 0 = never. */
struct item {
    uint32_t cas_lo; /* CAS unique, low 32 of 48 bits; also the lease token */
    uint32_t exptime;
    uint32_t atime;  /* last access or store, store clock */
    uint32_t nbytes; /* value length, without \r\n */
    uint16_t cas_hi; /* CAS, high 16 of 48 bits */
    uint8_t nkey;
    uint8_t iflags;
    uint8_t clock; /* eviction policy state (see node/evict.c); relaxed atomics, no lock */
    uint8_t nsid;  /* namespace id (see node/ns.h); set by store_alloc */
    char data[];   /* key, value, [flags] */
};
#define ITEM_HEADER offsetof(struct item, data)
_Static_assert(offsetof(struct item, data) == 22, "the item header is 22 bytes");
_Static_assert(_Alignof(struct item) == 4, "items live in 4-byte aligned chunks");
/* The largest CAS an item keeps (48 bits): `ms ... E` tokens above it are refused. */
#define STORE_CAS_MAX ((UINT64_C(1) << 48) - 1)

static inline uint64_t item_cas(const struct item *it)
{
    return (uint64_t)it->cas_hi << 32 | it->cas_lo;
}
static inline void item_set_cas(struct item *it, uint64_t v)
{
    it->cas_lo = (uint32_t)v;
    it->cas_hi = (uint16_t)(v >> 32);
}

/* Namespaces the engine keeps figures for (ids 0..STORE_NS_MAX-1). */
#define STORE_NS_MAX 256

/* Per-namespace engine figures (store_ns_stats). memory: bytes of segments it owns. */
struct store_ns_stats {
    uint64_t items, bytes, memory, evictions, expired;
};

/* Eviction policies (see node/evict.c). */
enum store_policy { STORE_POLICY_LRU, STORE_POLICY_LFU, STORE_POLICY_S3FIFO };

static inline char *item_key(struct item *it) { return it->data; }

/* Client flags: 0 unless stored (ITEM_FLAGS), then 4 bytes after the value (unaligned). */
static inline uint32_t item_flags(const struct item *it)
{
    uint32_t f = 0;
    if (it->iflags & ITEM_FLAGS) __builtin_memcpy(&f, it->data + it->nkey + it->nbytes, 4);
    return f;
}

/* Change iflags of a linked item (shard lock held). The store, as an atomic store, because the
 * log's walkers read iflags without the shard lock. */
static inline void item_set_iflags(struct item *it, uint8_t v)
{
    __atomic_store_n(&it->iflags, v, __ATOMIC_RELAXED);
}
static inline char *item_value(struct item *it) { return it->data + it->nkey; }

#define STORE_OPTIONS(X)                                                                         \
    X(memory_mb, UINT, 64, 1, 1 << 20, "item memory limit in megabytes (-m)")                    \
    X(item_max, SIZE, 1 << 20, 1024, 1 << 30, "largest item accepted, in bytes (-I)")            \
    X(hash_power, UINT, 16, 8, 30, "initial total hash buckets, as a power of two")              \
    X(sweep_interval_ms, UINT, 1000, 10, 60000, "how often the sweeper reclaims expired items") \
    X(huge_pages, UINT, 1, 0, 1, "1: back item memory with transparent huge pages (madvise)")

/* Engine counters. Summed over shards and classes by store_stats(). */
#define STORE_METRICS(X)                                                                         \
    X(curr_items, GAUGE, "items stored now")                                                     \
    X(total_items, COUNTER, "items stored since start")                                          \
    X(bytes, GAUGE, "bytes used by stored items (header, key and value)")                        \
    X(evictions, COUNTER, "live items removed to make room")                                     \
    X(evicted_unfetched, COUNTER, "evicted items that were never read")                          \
    X(expired_unfetched, COUNTER, "expired items reclaimed that were never read")                \
    X(reclaimed, COUNTER, "times memory of an expired item was reused")                          \
    X(sweeper_reclaimed, COUNTER, "expired items freed by the background sweeper")              \
    X(transient_reclaimed, COUNTER, "short-TTL items freed within a second of expiry")          \
    X(slab_pages_moved, COUNTER, "log segments cleaned (live items compacted) to make room")     \
    X(slab_pages_trimmed, COUNTER, "log segments given back by namespaces over their quota")      \
    X(hash_bytes, GAUGE, "bytes used by hash tables")                                            \
    X(ghost_bytes, GAUGE, "bytes used by the s3fifo ghosts (evicted keys' fingerprints)")        \
    X(reserved_bytes, GAUGE, "bytes of -m withheld from items for hash tables and ghosts")       \
    X(hash_power_level, GAUGE, "log2 of total hash buckets")                                     \
    X(hash_expansions, COUNTER, "shard table doublings")                                         \
    X(alloc_failures, COUNTER, "allocations that found nothing to evict")

struct store_options {
#define X(name, type, def, lo, hi, help) uint64_t name;
    STORE_OPTIONS(X)
#undef X
};

struct store_stats {
#define X(name, kind, help) uint64_t name;
    STORE_METRICS(X)
#undef X
    uint64_t limit_maxbytes;
    uint32_t page_size;
    uint32_t pages_total;
    uint32_t pages_used;
};

/* Per size class figures for `stats slabs` and `stats items`. */
struct store_class_stats {
    uint32_t chunk_size;
    uint32_t chunks_per_page;
    uint32_t total_pages;
    uint64_t total_chunks;
    uint64_t used_chunks;
    uint64_t free_chunks;
    uint64_t curr_items;
    uint64_t evictions;
    uint64_t evicted_unfetched;
    uint64_t expired_unfetched;
    uint64_t reclaimed;
    uint32_t oldest_age; /* seconds since the least recently stored linked item was accessed */
    uint64_t mem_requested;     /* header, key, value and flags bytes of its linked items */
    uint64_t sweeper_reclaimed; /* expired items the sweeper freed (memcached's crawler_reclaimed) */
    uint64_t alloc_failures;    /* allocations that found nothing to evict (outofmemory) */
};

struct store;

/* Fill `o` with the defaults of STORE_OPTIONS. */
void store_options_default(struct store_options *o);

/* Create the engine and start its sweeper thread. Returns 0, or -1 with a message in `err`
 * naming the bad option (e.g. item_max larger than half the memory). */
int store_create(struct store **out, const struct store_options *o, char *err, size_t errlen);
/* Stop the sweeper and free everything. Sets *st to NULL. */
void store_destroy(struct store **st);

/* 64-bit hash of a key (xxh3); selects shard and bucket. */
uint64_t store_hash(const char *key, size_t nkey);
void store_lock(struct store *st, uint64_t hv);
void store_unlock(struct store *st, uint64_t hv);

/* Bytes the record of an item of this key, value length and client flags takes in the log (a
 * multiple of 4), or 0 when it exceeds item_max. Callers answer "SERVER_ERROR object too large
 * for cache" on 0. */
size_t store_item_size(const struct store *st, size_t nkey, size_t nbytes, uint32_t flags);

/* Allocate an unlinked item of namespace `nsid` (from its pool) for `key` with room for
 * `nbytes` of value and client flags `flags` (fixed for the item's life); key, nkey, nbytes,
 * flags and nsid are set, every other field is zero (iflags: ITEM_FLAGS if flags != 0). Cleans
 * or evicts when needed. Returns NULL when the size exceeds item_max or nothing could be
 * evicted (counted in alloc_failures). The caller owns the
 * item until it links it or frees it. May be called with zero or one shard lock held; with one
 * held, items of that shard other than the one with this same key may be moved or evicted
 * during the call (cleaning), so keep no pointer to them across it. */
struct item *store_alloc(struct store *st, uint16_t nsid, const char *key, size_t nkey,
                         size_t nbytes, uint32_t flags);
/* Size class of an item (the bucket of its record size), for `me` and stats. */
int store_item_class(const struct store *st, const struct item *it);
/* Return the memory of an item from store_alloc that was never linked. */
void store_free(struct store *st, struct item *it);

enum store_miss {
    STORE_HIT,
    STORE_MISS_ABSENT,
    STORE_MISS_EXPIRED,
    STORE_MISS_FLUSHED,
    STORE_MISS_HELD, /* a delete hold-off tombstone is in place: the key reads as absent */
    STORE_MISS_DROPPED, /* its slot was dropped after it was stored (store_drop_slots) */
};

/* Look a key up. Shard lock of `hv` held. Returns the live item or NULL; an expired or
 * flushed item found on the way is unlinked and freed, and *why (if not NULL) says which. A
 * hold-off tombstone is not returned (STORE_MISS_HELD) and stays in place. */
struct item *store_find(struct store *st, uint64_t hv, const char *key, size_t nkey, uint32_t now,
                        enum store_miss *why);
/* As store_find, but a hold-off tombstone is returned too (for stores and hold-off deletes). */
struct item *store_find_raw(struct store *st, uint64_t hv, const char *key, size_t nkey,
                            uint32_t now, enum store_miss *why);

/* Stale grace (stale-while-revalidate of expired items): an item of namespace `nsid` that has
 * expired stays in the index `secs` more seconds instead of being reclaimed, so a lease-aware
 * reader can be served its old value marked stale while one client refills it. Tombstones,
 * empty items and items already marked ITEM_STALE get no grace. store_find and store_find_raw
 * still treat such an item as expired (and reclaim it); only lookups with STORE_FIND_GRACE see
 * it, and the sweeper leaves it alone until the grace ends. Eviction takes it like any expired
 * item. `secs` 0 (the default) turns grace off. */
void store_set_grace(struct store *st, uint16_t nsid, uint32_t secs);

enum {
    STORE_FIND_HELD = 1 << 0,  /* return a hold-off tombstone (as store_find_raw) */
    STORE_FIND_GRACE = 1 << 1, /* return an expired item within its grace, *why EXPIRED */
};
/* store_find with options: an item returned with *why == STORE_MISS_EXPIRED is one in its
 * grace. The caller must treat it as expired (never serve it as fresh) and may replace, unlink
 * or leave it, but must not link another item of the same key beside it. */
struct item *store_find_ex(struct store *st, uint64_t hv, const char *key, size_t nkey,
                           uint32_t now, enum store_miss *why, unsigned opts);
/* Insert `it`, which must not be in the index and whose key must be absent. Shard lock held.
 * Sets it->atime = now; gives it a fresh CAS unless it->cas is already non-zero. Returns false,
 * changing nothing, when the key's index shard is full and cannot grow (no memory for a bigger
 * table): the caller still owns `it`, frees it and answers as for a failed store_alloc. */
bool store_link(struct store *st, uint64_t hv, struct item *it, uint32_t now);
/* Put `it` in place of the linked `old` (same key) and free `old`. Shard lock held. CAS rule as
 * store_link. */
void store_replace(struct store *st, uint64_t hv, struct item *old, struct item *it, uint32_t now);
/* Remove a linked item and free it. Shard lock held. */
void store_unlink(struct store *st, uint64_t hv, struct item *it);

/* Mark an access: the policy's state (only if it changes), ITEM_FETCHED, atime only if it
 * moved. Shard lock held. */
void store_bump(struct store *st, struct item *it, uint32_t now);

/* A new CAS value, unique and increasing across the node. */
uint64_t store_next_cas(struct store *st);

/* flush_all: with delay 0, every item stored before now is invalid at once; with a delay, items
 * not stored or touched after `when` (store clock) are invalid from `when` on. */
void store_flush(struct store *st, uint32_t when, uint32_t now);
/* flush_ns: every item of namespace `nsid` stored before now is invalid at once (O(1): a stamp
 * compared on every lookup and by the sweeper, which reclaims them; flush_all's rule). Items
 * stored later in the same second live. */
void store_flush_ns(struct store *st, uint16_t nsid, uint32_t now);

/* Slot drops (shoal-node --control, node/slots.h): every item whose key is in one of the `n`
 * slots listed (common/slot.h's slot_of_key) and that was stored or touched before now is dead
 * at once for lookups, and reclaimed by the sweeper. Flush_all's rule per slot: an item with
 * atime before the drop's second, or in it with a smaller CAS, is dead. Lookups compute a
 * key's slot only while a drop is pending: from the call until the sweeper has walked all
 * memory twice since (then none of those items is left). 0, or -1 when the watermark table
 * (192 KiB, allocated at the first drop) cannot be. Call from one thread at a time. */
int store_drop_slots(struct store *st, const uint16_t *slots, size_t n, uint32_t now);
/* Items removed because their slot was dropped, since start. */
uint64_t store_dropped_items(const struct store *st);
/* Whether a drop is still pending (lookups check slots). */
bool store_drop_pending(const struct store *st);

/* Sum the counters. Takes every shard and class lock in turn: call with no shard lock held. */
void store_stats(struct store *st, struct store_stats *out);
/* Give namespace `nsid` a quota in bytes (0: none; it shares what quotas leave) and a policy.
 * Creates its pool if needed; a pool over a lowered quota shrinks within a sweep interval or
 * two (without evicting while its live bytes stay below 90% of the quota: what moving items
 * together cannot give back then waits for dead bytes). Returns 0, or -1 when out of memory. */
int store_ns_configure(struct store *st, uint16_t nsid, uint64_t quota, enum store_policy policy);
/* Size of a log segment: quotas are whole segments, so a quota must be 0 or at least this. */
uint32_t store_page_size(const struct store *st);
/* Segments pools own now (item memory in use, in pages of store_page_size bytes). */
uint32_t store_pages_used(const struct store *st);
/* The item memory limit (-m) in bytes. */
uint64_t store_memory(const struct store *st);
/* Figures of the items tagged with namespace `nsid` (item->nsid). Lock-free reads. */
void store_ns_stats(struct store *st, uint16_t nsid, struct store_ns_stats *out);
/* Chunk size of the smallest class. */
uint32_t store_class_chunk_min(const struct store *st);
/* Number of size classes; class ids run from 1 to the returned value. */
int store_class_count(const struct store *st);
/* Figures of one class; returns false for an id out of range. No shard lock held (as above).
 * oldest_age is sampled in the pools' oldest segments, so it is an estimate. Classes are
 * reporting buckets: used_chunks = curr_items, total_pages the segments' worth of its items
 * rounded up (at least 1 once it held an item), total_chunks those pages' chunks. */
bool store_class_stats(struct store *st, int clsid, struct store_class_stats *out);

/* Key dumps (`lru_crawler metadump`, `stats cachedump`): a walk over item memory in segment
 * order, in bounded steps, safe beside concurrent writes. Not a snapshot: an item stored during
 * the walk may be missed, and one moved by cleaning may be missed (moved behind the walk) or
 * seen twice, as with memcached's crawler. A segment compacted or reused under the walk is walked
 * again from its start (up to SEG_WALK_RESTARTS times), and one being emptied is come back to
 * (a step ends early, up to SEG_WALK_WAITS times), so items that stayed in it are not lost;
 * a walker that must see every item watches the moves (store_watch_moves). */
struct store_cursor {
    uint32_t page, idx, gen; /* segment, byte offset in it, its generation; start all at 0 */
    uint32_t restarts;       /* times this segment was walked again */
    uint32_t waits;          /* times it was found busy (being emptied) */
};
/* Records looked at per pool-lock hold. */
#define STORE_DUMP_BATCH 256
/* Called for each live item (not expired, flushed or a hold-off tombstone) with a pool lock
 * held: copy what is needed, do not block or lock. Fields other than key, nkey and nbytes may
 * change meanwhile; read them relaxed. */
typedef void (*store_dump_fn)(void *ctx, const struct item *it, int clsid);
/* Look at up to `budget` records (a segment ending early costs a batch) from the cursor and
 * advance it, calling fn on the live items of class `clsid` (0: all). Returns false when the walk
 * has finished. No shard lock may be held. */
bool store_dump_step(struct store *st, struct store_cursor *cur, int clsid, uint32_t budget,
                     store_dump_fn fn, void *ctx);

/* Told of a live item (not expired, flushed or a hold-off tombstone) cleaning has just moved to
 * `it`, with its shard lock and its pool's lock held: as store_dump_fn, copy, never block. */
typedef void (*store_move_fn)(void *ctx, const struct item *it);
/* Set the mover's hook once, before any store_watch_moves. */
void store_set_move_hook(struct store *st, store_move_fn fn, void *ctx);
/* Count one watcher in (on) or out: while any is in, every move is told to the hook, so a dump
 * walk begun after its watch was counted in misses nothing moved: each item is read by the walk,
 * or told to the hook after the walk began (docs/protocol.md, "Replication between nodes").
 * Nothing is told, and a move costs one relaxed load, while no watcher is in. */
void store_watch_moves(struct store *st, bool on);

#endif
