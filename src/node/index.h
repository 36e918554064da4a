/* index.h — the store's hash index: INDEX_SHARDS shards, each with its own mutex, its own
 * open-addressing table of 8-byte slots and its own counters. Items carry no link field for it.
 *
 * A table is an array of buckets of INDEX_BUCKET_SLOTS (8) slots, one 64-byte cache line each.
 * Slot layout:
 *   bits 63..51  tag: hash bits 10..22 (see index_tag)
 *   bits 50..48  bucket bits: the bucket's overflow count is slot 0's share | slot 1's << 3,
 *                its reach (index_reach) is slot 2's; slots 3-7 leave them 0
 *   bits 47..45  displacement: how many buckets past its home the entry sits, 7 meaning "7 or more"
 *   bits 44..0   item address >> 2; 0 in an empty slot (whose tag and displacement are 0 too)
 * An x86-64 user-space address fits in 47 bits and a struct item is 4-byte aligned, so 45 bits
 * hold it (index_insert aborts on an address that does not fit). The overflow bits belong to the
 * bucket, not to the entry in the slot: they stay when an entry comes or goes.
 *
 * Bucketized linear probing: an entry lives in the first bucket from its home (index_home) that
 * had a free slot when it was inserted, and every bucket it passed over counts it in its
 * overflow count (6 bits, sticky at 63: a saturated count is never decremented, which only makes
 * probes go on longer). A lookup compares the 8 tags of a bucket (tags first: only a slot whose
 * tag matches is followed to the item to compare the key, so a miss touches item memory with
 * probability ~ slots compared / 8192), and goes on to the next bucket only while it is within
 * the home bucket's reach (the farthest any entry of that home sits, 3 bits) and this one's
 * overflow count is not 0, so a miss usually ends in its home bucket or the next one. Removal
 * moves back an entry
 * that had passed over the freed bucket (no tombstones), so entries stay as near their home as
 * the load alone makes them; the displacement tells which entries may move without reading them.
 *
 * Three hash bit ranges, disjoint for every table size, so shard, home bucket and tag are
 * independent: low INDEX_SHARD_BITS bits pick the shard, the next 13 bits are the tag, and the
 * top 32 bits pick the home bucket inside the shard by a multiply-shift range reduction
 * (index_home), so a table can have any number of buckets; probing wraps from the last to the
 * first.
 *
 * A shard's table grows alone, by INDEX_GROW_NUM/INDEX_GROW_DEN (1.125x, rounded up to whole
 * buckets or pages), when its load would pass INDEX_LOAD_NUM/INDEX_LOAD_DEN, so a resize pauses
 * only the keys of that shard and the load stays between about 0.8 and 0.9 once a shard holds a
 * few hundred
 * items (index.c says why those numbers). Every function here except index_create,
 * index_destroy and index_buckets expects the shard's lock to be held by the caller. */
#ifndef SHOAL_NODE_INDEX_H
#define SHOAL_NODE_INDEX_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "node/store.h"

#define INDEX_SHARD_BITS 7
#define INDEX_SHARDS (1u << INDEX_SHARD_BITS)
#define INDEX_SLOTS_MAX ((uint32_t)1 << 31) /* per shard; 2^41 slots in all is beyond any -m */
#define INDEX_BUCKET_SLOTS 8 /* slots per bucket: one 64-byte line */
#define INDEX_LOAD_NUM 9     /* grow when a shard's load would pass 9/10 */
#define INDEX_LOAD_DEN 10
#define INDEX_GROW_NUM 9 /* by 9/8 */
#define INDEX_GROW_DEN 8
#define INDEX_ADDR_BITS 47 /* item addresses are below 2^47 (x86-64 user space) */
#define INDEX_ADDR_SHIFT 2 /* and multiples of 4 */
#define INDEX_PTR_BITS (INDEX_ADDR_BITS - INDEX_ADDR_SHIFT)
#define INDEX_PTR_MASK (((uint64_t)1 << INDEX_PTR_BITS) - 1)
#define INDEX_DISP_SHIFT INDEX_PTR_BITS
#define INDEX_DISP_MAX 7u /* saturated: the home must be found by rehashing */
#define INDEX_DISP_MASK ((uint64_t)INDEX_DISP_MAX << INDEX_DISP_SHIFT)
#define INDEX_OVF_SHIFT 48
#define INDEX_OVF_MASK ((uint64_t)7 << INDEX_OVF_SHIFT)
#define INDEX_OVF_MAX 63u /* sticky */
#define INDEX_TAG_SHIFT 51
#define INDEX_TAG_BITS 13
#define INDEX_TAG_MASK ((((uint64_t)1 << INDEX_TAG_BITS) - 1) << INDEX_TAG_SHIFT)

_Static_assert(INDEX_SHARD_BITS + INDEX_TAG_BITS <= 32,
               "shard and tag bits must not overlap the 32 bits that choose the home slot");
_Static_assert(INDEX_DISP_SHIFT + 3 == INDEX_OVF_SHIFT && INDEX_OVF_SHIFT + 3 == INDEX_TAG_SHIFT &&
                   INDEX_TAG_SHIFT + INDEX_TAG_BITS == 64,
               "a slot is one 64-bit word: tag, overflow share, displacement, address");
_Static_assert(sizeof(void *) == 8, "the slot layout assumes 64-bit pointers");
_Static_assert(_Alignof(struct item) >= 1 << INDEX_ADDR_SHIFT, "items must be 4-byte aligned");

/* Counters live beside the lock that guards them, so the hot path writes no shared line. */
/* Per-namespace counters, shared by all shards: relaxed atomic adds on link and unlink only. */
struct index_ns {
    uint64_t items, bytes, evictions, expired;
};

struct index_shard {
    pthread_mutex_t lock;
    struct index_ns *ns;  /* the index's per-namespace counters */
    uint64_t *slots;      /* nslots slots, nslots / 8 buckets (layout above) */
    uint32_t nslots;      /* this shard's slot count: a multiple of 8, up to INDEX_SLOTS_MAX */
    uint64_t curr_items;  /* linked items = full slots; also the load that triggers growth */
    uint64_t bytes;       /* header + key + value of linked items */
    uint64_t total_items; /* links and replaces (kept by store.c) */
    uint64_t expired_unfetched; /* lazily expired on lookup, never read (kept by store.c) */
    uint64_t expansions;
    uint64_t shrinks;     /* tables halved after most items left (index_remove) */
    /* Allocates a zeroed table (index_table_alloc by default: 64-byte aligned, so a bucket is
     * one cache line; released by index_table_free). Tests replace it to make growth fail. */
    void *(*alloc)(size_t nmemb, size_t size);
    struct index *owner;
    bool in_first; /* slots is this shard's part of owner->first */
} __attribute__((aligned(64)));

struct index {
    struct index_shard *shards; /* INDEX_SHARDS of them */
    struct index_ns *ns;        /* STORE_NS_MAX of them */
    /* The first tables of all shards, one anonymous mapping: its pages are resident only once
     * used (an idle node pays nothing for them), and it is unmapped whole when the last shard
     * has grown out of it, so it leaves no holes in the malloc heap. */
    uint64_t *first;
    size_t first_bytes;
    uint32_t first_left; /* shards whose table is still in `first` (atomic) */
    uint64_t slots_total; /* slots of all shards' tables (atomic): hash_bytes / 8, lock-free */
};

static inline uint64_t index_hash(const char *key, size_t nkey) { return XXH3_64bits(key, nkey); }

static inline struct index_shard *index_shard_of(struct index *ix, uint64_t hv)
{
    return &ix->shards[hv & (INDEX_SHARDS - 1)];
}

/* The home bucket of hash hv in a table of nb buckets: (top 32 bits of hv) * nb / 2^32, a fair
 * map onto 0..nb-1 without a division. */
static inline size_t index_home(uint64_t hv, size_t nb)
{
    return (size_t)(((hv >> 32) * (uint64_t)nb) >> 32);
}

/* The tag of hash hv, in place in a slot. */
static inline uint64_t index_tag(uint64_t hv)
{
    return (hv >> INDEX_SHARD_BITS << INDEX_TAG_SHIFT) & INDEX_TAG_MASK;
}

#define INDEX_PAGE_SLOTS 512u  /* slots in a 4 KiB page */
#define INDEX_PAGED_SLOTS 2048u /* tables this big (16 KiB) or bigger are whole pages */

/* The slot count a table of n slots grows to: n * 9/8 rounded up to whole buckets; from
 * INDEX_PAGED_SLOTS on, to the nearest whole page, at least one page more (a page is 1/4 of the
 * smallest such table or less: a step is 1.25 at 4 pages, 1.125 at 8, between 1.09 and 1.17
 * beyond). At most INDEX_SLOTS_MAX
 * (then equal to n: it cannot grow). */
static inline uint32_t index_grown_size(uint32_t n)
{
    uint64_t g = (uint64_t)n * INDEX_GROW_NUM / INDEX_GROW_DEN + INDEX_BUCKET_SLOTS - 1;
    g &= ~(uint64_t)(INDEX_BUCKET_SLOTS - 1); /* > n for every n >= 1 */
    if (g >= INDEX_PAGED_SLOTS) {
        const uint64_t p = INDEX_PAGE_SLOTS;
        uint64_t pages = ((uint64_t)n * INDEX_GROW_NUM / INDEX_GROW_DEN + p / 2) / p;
        if (pages * p <= n) pages = n / p + 1;
        g = pages * p;
    }
    return g > INDEX_SLOTS_MAX ? (n < INDEX_SLOTS_MAX ? INDEX_SLOTS_MAX : n) : (uint32_t)g;
}

#define INDEX_SHRINK_BELOW 5u /* a table below 1/5 load is halved */

/* The slot count a table of n slots shrinks to: half, rounded up to whole buckets, or from
 * INDEX_PAGED_SLOTS on to whole pages; at least one bucket. */
static inline uint32_t index_shrunk_size(uint32_t n)
{
    uint32_t g = (n / 2 + INDEX_BUCKET_SLOTS - 1) & ~(uint32_t)(INDEX_BUCKET_SLOTS - 1);
    if (g >= INDEX_PAGED_SLOTS) g = (g + INDEX_PAGE_SLOTS - 1) & ~(INDEX_PAGE_SLOTS - 1);
    return g < INDEX_BUCKET_SLOTS ? INDEX_BUCKET_SLOTS : g;
}

/* A bucket's overflow count: entries stored past it whose home is at or before it (sticky at
 * INDEX_OVF_MAX). */
static inline unsigned index_ovf(const uint64_t *bucket)
{
    return (unsigned)((bucket[0] >> INDEX_OVF_SHIFT) & 7) |
           (unsigned)((bucket[1] >> INDEX_OVF_SHIFT) & 7) << 3;
}

/* A bucket's reach: how many buckets past it the farthest entry whose home it is sits
 * (INDEX_DISP_MAX: that many or more). Kept in slot 2's
 * share bits, which the overflow count leaves free. */
static inline unsigned index_reach(const uint64_t *bucket)
{
    return (unsigned)((bucket[2] >> INDEX_OVF_SHIFT) & 7);
}

/* The item a full slot points at. */
static inline struct item *index_slot_item(uint64_t s)
{
    return (struct item *)(uintptr_t)((s & INDEX_PTR_MASK) << INDEX_ADDR_SHIFT);
}

static inline uint32_t index_item_bytes(const struct item *it)
{
    return (uint32_t)ITEM_HEADER + it->nkey + it->nbytes +
           ((it->iflags & ITEM_FLAGS) ? (uint32_t)sizeof(uint32_t) : 0);
}

/* Build the shards with 2^hash_power slots in all (at least one bucket per shard). Returns 0, or
 * -1 with a message in err. */
int index_create(struct index **out, unsigned hash_power, char *err, size_t errlen);
/* Free the tables (not the items). Sets *ixp to NULL. */
void index_destroy(struct index **ixp);

/* The item with this key, or NULL. */
struct item *index_find(struct index_shard *sh, uint64_t hv, const char *key, size_t nkey);
/* The item whose key hashes to hv (the whole 64-bit hash, checked) with CAS `cas`, or NULL:
 * finds an item remembered by (hash, CAS) wherever it has moved since (the store's transient
 * list). Another key given the same CAS (`ms ... E`) is never returned for it. */
struct item *index_find_cas(struct index_shard *sh, uint64_t hv, uint64_t cas);
/* Add `it` (key absent) and count it; may grow the shard's table first. If the bigger table
 * cannot be allocated the shard runs at a higher load. Returns false, changing nothing, only when
 * every slot is full and growing failed. The caller still owns `it` then and should treat it as
 * an allocation failure. */
bool index_insert(struct index_shard *sh, uint64_t hv, struct item *it);
/* Remove `it` and uncount it. Returns false if it was not in the shard. May rehash the key of an
 * item in a later bucket (one displaced by 7 buckets or more), and, when the shard's load falls
 * below 1/5, every key of the shard (its table is halved), so those must be intact. */
bool index_remove(struct index_shard *sh, uint64_t hv, struct item *it);
/* Put `it` where `old` is (same key), adjusting counts. Returns false if `old` was not found.
 * Never needs a free slot, so it cannot fail for want of room. */
bool index_swap(struct index_shard *sh, uint64_t hv, struct item *old, struct item *it);

/* The default table allocator: zeroed, 64-byte aligned; a table of whole 4 KiB pages is a
 * mapping of its own, so that its pages go back to the kernel when it is outgrown (outgrown
 * tables in malloc's heap stayed resident as free chunks: 1.4 MB at -m 64). */
void *index_table_alloc(size_t nmemb, size_t size);
/* Release a table of `bytes` bytes from index_table_alloc. */
void index_table_free(void *p, size_t bytes);

/* Total slots over all shards (takes each shard lock in turn; call with none held). */
uint64_t index_buckets(struct index *ix);
/* Bytes of all shards' tables now, without locks (a relaxed read: may lag a growth in flight). */
static inline uint64_t index_table_bytes(const struct index *ix)
{
    return __atomic_load_n(&ix->slots_total, __ATOMIC_RELAXED) * sizeof(uint64_t);
}

#endif
