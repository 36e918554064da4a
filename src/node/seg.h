/* seg.h — item memory for the store as a segmented log: one reservation cut into segments of
 * SEG bytes (a power of two chosen from the memory limit), segments handed to pools (one per
 * namespace, each with a quota and an eviction policy). A pool appends items at its head
 * segment with a bump pointer; a freed item only marks its record dead. Space comes back by
 * cleaning (compacting a segment's live items) while the pool holds less than 90% live bytes,
 * and by eviction (the oldest segment, item by item, by the pool's policy: evict.c) once it
 * holds more. Items larger than a segment take a run of contiguous segments.
 *
 * The log knows the item header (record lengths, iflags, the policy byte it->clock) but nothing
 * of the index: whenever a linked item must move or go it asks a visitor callback, supplied by
 * store.c, which try-locks the item's shard.
 *
 * Size classes survive only as reporting buckets: an item's class is the bucket of its record
 * size in the class table (memcached's growth, for `stats items|slabs`, `me`, dumps).
 *
 * Locks: one mutex per pool (its segments' states, heads and queues) and a leaf mutex for the
 * free segments. A pool lock is never held while blocking on a shard lock or on another pool's
 * lock. Also declares the sweeper (sweeper.c), the background walker over the segments. */
#ifndef SHOAL_NODE_SEG_H
#define SHOAL_NODE_SEG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/store.h"

#define SEG_CHUNK_MIN 24u /* the smallest record: a 22-byte header and a 1-byte key */
#define SEG_CLASS_MAX 255 /* a class id fits a uint8_t; 0 means "no class" */
#define SEG_NONE UINT32_MAX
#define SEG_ALIGN 4u      /* records are 4-byte aligned */

/* Private iflags bit: the record is dead (freed); its bytes are the log's to reuse. A record
 * with neither ITEM_LINKED nor ITEM_SEG_DEAD is in flight (allocated, not linked yet) or being
 * unlinked and freed by the holder of its shard lock: nobody else may touch it. */
#define ITEM_SEG_DEAD 0x80

/* Why a visitor is called. */
enum seg_visit {
    SEG_VISIT_MOVE,  /* copy the item to `dst` and point the index there, if you can; an expired
                        or flushed item is unlinked instead (SEG_GONE) */
    SEG_VISIT_EVICT, /* the policy chose it as a victim: unlink it if you can */
    SEG_VISIT_SWEEP, /* background pass: unlink it only if it is expired or flushed */
    SEG_VISIT_PEEK,  /* no locks, no change: say SEG_DEAD if it looks expired or flushed */
};

/* Eviction policies of a pool (see evict.c). */
enum seg_policy {
    SEG_POLICY_LRU,    /* CLOCK by FIFO-reinsertion: one reference bit */
    SEG_POLICY_LFU,    /* 8-bit logarithmic counter decayed by idle time */
    SEG_POLICY_S3FIFO, /* small FIFO + main CLOCK with 2-bit counters + ghost keys (SOSP'23) */
};

/* Visitor results, or-ed together. */
enum {
    SEG_KEEP = 0,            /* stays linked where it is */
    SEG_BUSY = 1,            /* its shard is locked elsewhere; another try may succeed */
    SEG_PINNED = 2,          /* the allocating caller may hold a pointer to it: never take it */
    SEG_GONE = 4,            /* unlinked from the index: the record is the log's again */
    SEG_GONE_EXPIRED = 8,    /* with SEG_GONE: it was already expired or flushed */
    SEG_GONE_UNFETCHED = 16, /* with SEG_GONE: it was never read */
    SEG_DEAD = 32,           /* PEEK: expired or flushed (a guess, re-checked when taken) */
    SEG_MOVED = 64,          /* MOVE: it now lives at dst, the index points there */
    SEG_MISSED = 128,        /* SWEEP, with SEG_BUSY: an item that had to go was skipped, so
                                this pass does not count as a clean one (sweeper_clean_passes) */
};

/* Called with the record's pool lock held, for a record whose ITEM_LINKED bit was seen set
 * (acquire load). It must never block on a shard lock. For MOVE, `dst` is below `it` in the same
 * segment or in another segment; the regions may overlap only when dst + sizeof(struct item)
 * <= it. On SEG_GONE it has removed the item from the index and cleared ITEM_LINKED; the log
 * then marks the record dead itself. */
typedef int (*seg_visit_fn)(void *ctx, struct item *it, enum seg_visit why, struct item *dst);

/* Counters kept per pool and reporting bucket, under the pool lock. */
struct seg_counters {
    uint64_t evictions;
    uint64_t evicted_unfetched;
    uint64_t expired_unfetched;
    uint64_t reclaimed;
    uint64_t sweeper_reclaimed;
    uint64_t segs_cleaned;  /* segments compacted to make room (in the bucket 0 slot) */
    uint64_t alloc_failures;
    uint64_t segs_trimmed;  /* segments given back because the pool was over its quota */
    uint64_t double_frees;  /* records freed twice (a bug; refused) */
};

struct seg_bucket_info {
    uint32_t size;         /* the bucket's upper record size */
    uint32_t oldest_atime; /* smallest atime among its items in the pools' oldest segments */
    struct seg_counters c;
};

struct segs;

/* Reserve `memory` bytes (mmap, no reserve: RSS grows as segments are touched) and build the
 * bucket table for items up to `item_max` bytes. Returns 0, or -1 with a message in err. */
int seg_create(struct segs **out, uint64_t memory, uint64_t item_max, char *err, size_t errlen);
/* Ask the kernel to back item memory with transparent huge pages. Returns madvise's result. */
int seg_advise_huge(struct segs *s);
/* Unmap everything; items become invalid. Sets *sp to NULL. */
void seg_destroy(struct segs **sp);

int seg_bucket_count(const struct segs *s);
/* Smallest bucket holding records of `total` bytes, or 0 if none does. */
int seg_bucket_for(const struct segs *s, size_t total);
uint32_t seg_bucket_size(const struct segs *s, int id);
/* Bytes of one segment (a power of two). */
uint32_t seg_size(const struct segs *s);
uint32_t seg_count(const struct segs *s);
/* Segments owned by pools now. */
uint32_t seg_used(const struct segs *s);
/* Segments withheld from the pools for the index and the ghosts (seg_withhold). */
uint32_t seg_held(const struct segs *s);
/* Segments items may not use: those withheld, or the target when it is ahead (seg_set_reserve). */
uint32_t seg_reserved(const struct segs *s);
/* Bytes of all pools' s3fifo ghost arrays. */
uint64_t seg_ghost_bytes(const struct segs *s);

/* -m bounds the index and the ghosts as well as items: keep as many whole segments out of the
 * pools as `index_bytes` plus the ghosts take (rounded up; at most half of them), their pages
 * given back to the kernel (MADV_DONTNEED) so that their share of RSS really goes. Takes free
 * segments that quotas are not owed; when there are none, a pool without a quota gives one back
 * (compacting while below 90% live, as for a lowered quota, else evicting its oldest). Does at
 * most `max` segments' work. No lock held. Returns the segments withheld now. */
uint32_t seg_withhold(struct segs *s, uint64_t index_bytes, uint32_t max, seg_visit_fn fn,
                      void *ctx);
/* Set the target of seg_withhold (segments for `index_bytes` plus the ghosts) at once, without
 * moving anything: from then on pools without a quota leave free segments that the target lacks
 * alone (so they stay untouched until withheld). Cheap; any thread. Returns the target. */
uint32_t seg_set_reserve(struct segs *s, uint64_t index_bytes);

/* Bytes a record of nkey, nbytes and (with_flags) client flags takes in the log. */
static inline size_t seg_record_size(size_t nkey, size_t nbytes, bool with_flags)
{
    size_t n = ITEM_HEADER + nkey + nbytes + (with_flags ? 4 : 0);
    return (n + SEG_ALIGN - 1) & ~(size_t)(SEG_ALIGN - 1);
}
static inline size_t seg_item_size(const struct item *it)
{
    return seg_record_size(it->nkey, it->nbytes, (it->iflags & ITEM_FLAGS) != 0);
}

/* A record for an item of pool `nsid` with nkey, nbytes and iflags (0 or ITEM_FLAGS) set, its
 * nsid set and `clock` set by the pool's policy, every other byte unspecified; or NULL when
 * nothing could be freed (counted in alloc_failures). The record is pinned (in flight) until
 * seg_linked or seg_free. `hv` is the key's hash (the s3fifo ghost check). `fn`/`ctx` move and
 * unlink other items. Takes pool locks; the caller may hold one shard lock. */
struct item *seg_alloc(struct segs *s, uint16_t nsid, uint8_t nkey, uint32_t nbytes,
                       uint8_t iflags, uint64_t hv, seg_visit_fn fn, void *ctx);
/* The in-flight record `it` was linked (ITEM_LINKED set): unpin its segment. */
void seg_linked(struct segs *s, struct item *it);
/* Mark a record that is not linked dead. `inflight`: it was never linked (unpin). Lock-free. */
void seg_free(struct segs *s, struct item *it, bool inflight);

/* Set pool `nsid`'s quota (bytes, rounded down to whole segments, at least one; 0 = none: it
 * shares what quotas leave) and policy. Creates the pool if needed. A pool over its new quota
 * gives segments back over the next seg_trim calls. Returns 0, or -1 when out of memory. */
int seg_pool_configure(struct segs *s, uint16_t nsid, uint64_t quota, enum seg_policy policy);
/* Segments pool `nsid` owns now (0 for a pool never used). */
uint32_t seg_pool_segs(struct segs *s, uint16_t nsid);
/* Policy of pool `nsid` (LRU for a pool never configured). Lock-free. */
enum seg_policy seg_pool_policy(struct segs *s, uint16_t nsid);
/* Give back up to `max` segments of pools over their quota: by consolidating, and by evicting
 * only a pool whose live bytes are at 90% of its quota or more (below, the excess stays until
 * dead bytes appear). No lock held. Returns how many. */
uint32_t seg_trim(struct segs *s, uint32_t max, seg_visit_fn fn, void *ctx);
/* Background reserve: clean segments of pools that are out of free segments but hold less
 * than 90% live bytes, so that stores rarely clean inline. Returns segments cleaned. */
uint32_t seg_reserve(struct segs *s, uint32_t max, seg_visit_fn fn, void *ctx);
/* A read of `it` (shard lock held): update its policy state (evict.c). */
void seg_bump(struct segs *s, struct item *it, uint32_t now);

/* A walk position inside one segment (walkers hold no lock between steps). */
struct seg_pos {
    uint32_t seg, off, gen;
    uint32_t restarts; /* seg_peek: times the segment was walked again from its start */
    bool busy;         /* seg_peek: the segment is being emptied (SS_BUSY): come back later */
};
#define SEG_WALK_RESTARTS 8 /* then a peek gives the segment up, as seg_walk does at once */
#define SEG_WALK_WAITS 4096 /* times a dump comes back to a busy segment before passing it */
/* Visit up to `max` records of segment pos->seg from pos->off, calling fn (SEG_VISIT_SWEEP) on
 * linked ones; sets *missed if a visit said SEG_MISSED (left alone otherwise). Returns true while
 * the segment has more; false when it is done, not owned, or was compacted or reused since the
 * last step. */
bool seg_walk(struct segs *s, struct seg_pos *pos, uint32_t max, seg_visit_fn fn, void *ctx,
              bool *missed);
/* Read-only walk for key dumps: as seg_walk, calling fn on linked records (of bucket `clsid`,
 * 0: any) with the pool lock held, so the item's key and size stay put while fn reads them; but
 * a segment compacted or reused since the last step is walked again from its start (up to
 * SEG_WALK_RESTARTS times), since the items that stayed in it would be missed otherwise; one
 * found busy (being emptied with its pool's lock let go: seg_run.c's windows) returns false with
 * pos->busy set and pos unchanged, to be asked again later. */
bool seg_peek(struct segs *s, struct seg_pos *pos, uint32_t max, int clsid,
              void (*fn)(void *ctx, struct item *it, int clsid), void *ctx);

void seg_sum_counters(struct segs *s, struct seg_counters *out);
/* Figures of one bucket summed over pools; false if id is out of range. */
bool seg_bucket_info(struct segs *s, int id, struct seg_bucket_info *out);

/* The sweeper: a thread that every `interval_ms` walks the owned segments (all of them, or a
 * 256 MiB slice of a larger store) and lets `fn` (SEG_VISIT_SWEEP) reclaim expired and flushed
 * items; it also trims pools over their quota and keeps the background reserve. */
struct sweeper;
/* Start the thread. `tick`, if not NULL, is called with `ctx` about every second whatever the
 * interval (the store's transient item reaper). Returns 0, or -1 with a message in err. */
int sweeper_create(struct sweeper **out, struct segs *s, seg_visit_fn fn, void (*tick)(void *),
                   void *ctx, uint32_t interval_ms, char *err, size_t errlen);
/* Stop the thread (promptly, even mid-pass) and free it. Sets *swp to NULL. */
void sweeper_destroy(struct sweeper **swp);
/* Full walks over every segment finished so far. */
uint64_t sweeper_passes(const struct sweeper *sw);
/* Full walks finished in which no visit said SEG_MISSED (the store's slot drops wait for these:
 * a pass that skipped a dropped item must not end the drop). */
uint64_t sweeper_clean_passes(const struct sweeper *sw);

#endif
