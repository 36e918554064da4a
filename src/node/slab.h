/* slab.h — item memory for the store: one reservation cut into pages, pages handed to pools
 * (one per namespace, each with a quota and an eviction policy) and within a pool to size
 * classes, classes cut into fixed-size chunks; eviction inside a class by the pool's policy
 * (evict.c) and page moves between classes and pools. Also declares the sweeper (sweeper.c), the
 * background walker over slab pages.
 *
 * The slab layer knows the item header (it reads iflags, and the CLOCK bit through its visitor)
 * but nothing of the index: whenever it needs a linked item gone it asks a visitor callback,
 * supplied by store.c, which try-locks the item's shard and unlinks it.
 *
 * Locks: one mutex per (pool, class), and pool_lock for pool page counts and the free pages.
 * A class lock is never held while blocking on a shard lock, no code holds two class locks at
 * once, and pool_lock is a leaf (taken under a class lock, nothing taken under it). */
#ifndef SHOAL_NODE_SLAB_H
#define SHOAL_NODE_SLAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/store.h"

#define SLAB_CHUNK_MIN 28u
#define SLAB_PAGE_MIN (1u << 20)
#define SLAB_CLASS_MAX 255 /* clsid is a uint8_t; 0 means "no class" */
#define SLAB_NONE UINT32_MAX

/* Private iflags bit: the chunk is free (on its class free list, or freed inside a page that is
 * being moved). A carved chunk with neither ITEM_LINKED nor ITEM_SLAB_FREE belongs to a caller of
 * slab_alloc that has not linked or freed it yet ("in flight"). */
#define ITEM_SLAB_FREE 0x80

/* Why a visitor is called. */
enum slab_visit {
    SLAB_VISIT_EVICT, /* the policy chose it as a victim: take the item if you can */
    SLAB_VISIT_STEAL, /* a page is being emptied for another class: take the item if you can */
    SLAB_VISIT_SWEEP, /* background pass: take the item only if it is expired or flushed */
    SLAB_VISIT_PEEK,  /* no locks, no change: say SLAB_DEAD if it looks expired or flushed */
};

/* Eviction policies of a pool (see evict.c). */
enum slab_policy {
    SLAB_POLICY_LRU,    /* CLOCK: one reference bit, cleared by the hand */
    SLAB_POLICY_LFU,    /* 8-bit logarithmic counter decayed by idle time; sampled eviction */
    SLAB_POLICY_S3FIFO, /* small FIFO + main CLOCK with 2-bit counters + ghost keys (SOSP'23) */
};

/* Visitor results, or-ed together. */
enum {
    SLAB_KEEP = 0,            /* stays linked */
    SLAB_BUSY = 1,            /* its shard is locked elsewhere; another try may succeed */
    SLAB_PINNED = 2,          /* the allocating caller may hold a pointer to it: never take it */
    SLAB_GONE = 4,            /* unlinked from the index; its chunk is the slab's again */
    SLAB_GONE_EXPIRED = 8,    /* with SLAB_GONE: it was already expired or flushed */
    SLAB_GONE_UNFETCHED = 16, /* with SLAB_GONE: it was never read */
    SLAB_DEAD = 32,           /* PEEK: expired or flushed (a guess, re-checked when taken) */
};

/* Called with the item's class lock held, for a chunk whose ITEM_LINKED bit was seen set
 * (acquire load, so its key is readable). It must never block on a shard lock. On SLAB_GONE it
 * has removed the item from the index and cleared ITEM_LINKED; the slab then reuses or frees the
 * chunk itself (the visitor must not call slab_free). */
typedef int (*slab_visit_fn)(void *ctx, struct item *it, enum slab_visit why);

/* Counters kept per class under its lock. */
struct slab_counters {
    uint64_t evictions;
    uint64_t evicted_unfetched;
    uint64_t expired_unfetched;
    uint64_t reclaimed;
    uint64_t sweeper_reclaimed;
    uint64_t pages_moved; /* pages this class received from another class */
    uint64_t alloc_failures;
    uint64_t pages_trimmed; /* pages given back because the pool was over its quota */
    uint64_t double_frees;  /* chunks freed twice (a bug; refused) */
};

struct slab_class_info {
    uint32_t chunk_size;
    uint32_t chunks_per_page;
    uint32_t pages;
    uint64_t carved; /* chunks cut from the class's pages so far */
    uint64_t nfree;  /* of those, on the free list */
    uint32_t oldest_atime; /* smallest atime seen near the CLOCK hand (sampled), 0 if none */
    struct slab_counters c;
};

struct slab;

/* Reserve `memory` bytes (mmap, no reserve: RSS grows as pages are touched) and build the class
 * table for items up to `item_max` bytes. Returns 0, or -1 with a message in err. */
int slab_create(struct slab **out, uint64_t memory, uint64_t item_max, char *err, size_t errlen);
/* Ask the kernel to back item memory with transparent huge pages (2 MiB): a lookup then rarely
 * misses the TLB, which is most of a hit's cost in a VM. Returns madvise's result. */
int slab_advise_huge(struct slab *s);
/* Unmap everything; items become invalid. Sets *sp to NULL. */
void slab_destroy(struct slab **sp);

int slab_class_count(const struct slab *s);
/* Smallest class whose chunks hold `total` bytes, or 0 if none does. */
int slab_class_for(const struct slab *s, size_t total);
uint32_t slab_chunk_size(const struct slab *s, int clsid);
/* Size class of the chunk `it` (its page's). */
int slab_chunk_class(const struct slab *s, const struct item *it);
/* Does `p` point at the start of a carved chunk of its page's current class (page not being
 * moved)? No lock: a guess that keeps a pointer kept since (the transient list) from reading
 * across chunk bounds; a chunk that passes may still be free or hold another item. */
bool slab_chunk_plausible(const struct slab *s, const void *p);
uint32_t slab_page_size(const struct slab *s);
uint32_t slab_pages_total(const struct slab *s);
/* Pages handed out from the unassigned pool so far (they never go back to it). */
uint32_t slab_pages_used(const struct slab *s);

/* A chunk of class `clsid` in pool `nsid` with iflags 0, `clock` set by the pool's policy and
 * every other byte unspecified, or NULL when nothing could be freed (counted in
 * alloc_failures). `hv` is the key's hash (the s3fifo ghost check). Order: free list, current
 * page, a free page (while the pool is under its quota, or, without a quota, while pages remain
 * beyond what quota'd pools are still owed), a page from a pool over its guarantee (when this
 * one is under its quota), eviction in the class by the pool's policy, a page from another class
 * of the pool, and last (pools without a quota) a page from another pool. `fn`/`ctx` unlink
 * victims. Takes and releases class locks; the caller may hold one shard lock. */
struct item *slab_alloc(struct slab *s, uint16_t nsid, int clsid, uint64_t hv, slab_visit_fn fn,
                        void *ctx);
/* Give back a chunk that is not linked. Takes its class lock. */
void slab_free(struct slab *s, struct item *it);

/* Set pool `nsid`'s quota (bytes, rounded down to whole pages, at least one; 0 = none: it shares
 * what quotas leave) and policy. Creates the pool if needed. A pool over its new quota gives
 * pages back over the next slab_trim calls. Returns 0, or -1 when out of memory. */
int slab_pool_configure(struct slab *s, uint16_t nsid, uint64_t quota, enum slab_policy policy);
/* Pages pool `nsid` owns now (0 for a pool never used). */
uint32_t slab_pool_pages(struct slab *s, uint16_t nsid);
/* Policy of pool `nsid` (LRU for a pool never configured). Lock-free. */
enum slab_policy slab_pool_policy(struct slab *s, uint16_t nsid);
/* Give back up to `max` pages of pools over their quota to the free pages. No lock held.
 * Returns the pages given back. */
uint32_t slab_trim(struct slab *s, uint32_t max, slab_visit_fn fn, void *ctx);
/* A read of `it` (shard lock held): update its policy state (evict.c). */
void slab_bump(struct slab *s, struct item *it, uint32_t now);

/* Visit up to `max` chunks of page `page` from chunk index `from`, calling fn (with
 * SLAB_VISIT_SWEEP) on linked ones and freeing those it takes. Returns the index to continue
 * from, or SLAB_NONE when the page is done (or unassigned, or moving). */
uint32_t slab_walk_page(struct slab *s, uint32_t page, uint32_t from, uint32_t max,
                        slab_visit_fn fn, void *ctx);

/* Read-only walk for key dumps: call fn on each chunk of page `page` from index `from` (at most
 * `max` chunks) whose ITEM_LINKED bit is set, with the page's class lock held, so the item's key
 * and size stay put while fn reads them (its other fields may change: read them relaxed). A page
 * of another class than `clsid` (0: any) is skipped. fn must not block or take a lock. Returns
 * the index to continue from, or SLAB_NONE when the page is done (or skipped). */
uint32_t slab_peek_page(struct slab *s, uint32_t page, uint32_t from, uint32_t max, int clsid,
                        void (*fn)(void *ctx, struct item *it, int clsid), void *ctx);

/* Add every class's counters into *out. */
void slab_sum_counters(struct slab *s, struct slab_counters *out);
/* Figures of one class summed over pools; false if clsid is out of range. */
bool slab_class_info(struct slab *s, int clsid, struct slab_class_info *out);

/* The sweeper: a thread that every `interval_ms` walks the assigned pages (all of them, or a
 * 256 MiB slice of a larger store, resuming where the last tick stopped) and lets `fn` (with
 * SLAB_VISIT_SWEEP) reclaim expired and flushed items; it also trims pools over their quota. */
struct sweeper;
/* Start the thread. `tick`, if not NULL, is called with `ctx` about every second whatever the
 * interval (the store's transient item reaper). Returns 0, or -1 with a message in err. */
int sweeper_create(struct sweeper **out, struct slab *s, slab_visit_fn fn, void (*tick)(void *),
                   void *ctx, uint32_t interval_ms, char *err, size_t errlen);
/* Stop the thread (promptly, even mid-pass) and free it. Sets *swp to NULL. */
void sweeper_destroy(struct sweeper **swp);

#endif
