/* index.h — the store's hash index: INDEX_SHARDS shards, each with its own mutex, its own
 * open-addressing table of 8-byte slots and its own counters. Items carry no link field for it.
 *
 * Slot layout, 0 being an empty slot:
 *   bits 63..48  tag: hash bits 10..25 (see index_tag)
 *   bits 47..45  displacement: distance from the entry's home slot, 7 meaning "7 or more"
 *   bits 44..0   item address >> 2
 * An x86-64 user-space address fits in 47 bits and a struct item is 4-byte aligned, so 45 bits
 * hold it (index_insert aborts on an address that does not fit). The displacement gives a
 * removal each following entry's home without reading its item; only at 7 is the key rehashed
 * (at load 3/4, about 1 entry in 20 of a long run).
 *
 * A lookup walks the run of full slots from the key's home slot (linear probing) and compares tags first;
 * only a slot whose tag matches is followed to the item to compare the key, so a miss touches
 * item memory with probability ~ probes / 65536. Removal shifts the rest of the run back
 * (no tombstones), so runs stay as short as the load alone makes them.
 *
 * Three hash bit ranges, disjoint for every table size, so shard, home slot and tag are
 * independent: low INDEX_SHARD_BITS bits pick the shard, the next 16 bits are the tag, and the
 * top `power` bits (power <= INDEX_POWER_MAX) pick the home slot inside the shard.
 *
 * A shard's table doubles alone when its load would pass 3/4, so a resize pauses only the keys of
 * that shard. Every function here except index_create, index_destroy and index_buckets expects
 * the shard's lock to be held by the caller. */
#ifndef SHOAL_NODE_INDEX_H
#define SHOAL_NODE_INDEX_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "node/store.h"

#define INDEX_SHARD_BITS 10
#define INDEX_SHARDS (1u << INDEX_SHARD_BITS)
#define INDEX_POWER_MAX 31 /* per shard; 2^41 slots in all is far beyond any memory limit */
#define INDEX_ADDR_BITS 47 /* item addresses are below 2^47 (x86-64 user space) */
#define INDEX_ADDR_SHIFT 2 /* and multiples of 4 */
#define INDEX_PTR_BITS (INDEX_ADDR_BITS - INDEX_ADDR_SHIFT)
#define INDEX_PTR_MASK (((uint64_t)1 << INDEX_PTR_BITS) - 1)
#define INDEX_DISP_SHIFT INDEX_PTR_BITS
#define INDEX_DISP_MAX 7u /* saturated: the home must be found by rehashing */
#define INDEX_DISP_MASK ((uint64_t)INDEX_DISP_MAX << INDEX_DISP_SHIFT)
#define INDEX_TAG_SHIFT 48
#define INDEX_TAG_BITS 16

_Static_assert(INDEX_SHARD_BITS + INDEX_TAG_BITS <= 64 - INDEX_POWER_MAX,
               "tag bits must not overlap the slot-selection bits of the largest table");
_Static_assert(INDEX_DISP_SHIFT + 3 == INDEX_TAG_SHIFT && INDEX_TAG_SHIFT + INDEX_TAG_BITS == 64,
               "a slot is one 64-bit word: tag, displacement, address");
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
    uint64_t *slots;      /* 2^power slots: tag | displacement | address >> 3; 0 = empty */
    uint32_t power;       /* log2 of this shard's slot count */
    uint64_t curr_items;  /* linked items = full slots; also the load that triggers doubling */
    uint64_t bytes;       /* header + key + value of linked items */
    uint64_t total_items; /* links and replaces (kept by store.c) */
    uint64_t expired_unfetched; /* lazily expired on lookup, never read (kept by store.c) */
    uint64_t expansions;
    /* Allocates a zeroed table (calloc by default; whatever it returns is released with free).
     * Tests replace it to make doubling fail. */
    void *(*alloc)(size_t nmemb, size_t size);
} __attribute__((aligned(64)));

struct index {
    struct index_shard *shards; /* INDEX_SHARDS of them */
    struct index_ns *ns;        /* STORE_NS_MAX of them */
};

static inline uint64_t index_hash(const char *key, size_t nkey) { return XXH3_64bits(key, nkey); }

static inline struct index_shard *index_shard_of(struct index *ix, uint64_t hv)
{
    return &ix->shards[hv & (INDEX_SHARDS - 1)];
}

/* The item a full slot points at. */
static inline struct item *index_slot_item(uint64_t s)
{
    return (struct item *)(uintptr_t)((s & INDEX_PTR_MASK) << INDEX_ADDR_SHIFT);
}

static inline uint32_t index_item_bytes(const struct item *it)
{
    return (uint32_t)sizeof(struct item) + it->nkey + it->nbytes +
           ((it->iflags & ITEM_FLAGS) ? (uint32_t)sizeof(uint32_t) : 0);
}

/* Build the shards with 2^hash_power slots in all (at least one per shard). Returns 0, or -1
 * with a message in err. */
int index_create(struct index **out, unsigned hash_power, char *err, size_t errlen);
/* Free the tables (not the items). Sets *ixp to NULL. */
void index_destroy(struct index **ixp);

/* The item with this key, or NULL. */
struct item *index_find(struct index_shard *sh, uint64_t hv, const char *key, size_t nkey);
/* The item whose key hashes to hv with CAS `cas`, or NULL: finds an item remembered by (hash,
 * CAS) wherever it has moved since (the store's transient list). */
struct item *index_find_cas(struct index_shard *sh, uint64_t hv, uint64_t cas);
/* Add `it` (key absent) and count it; may double the shard's table first. If the bigger table
 * cannot be allocated the shard runs at a higher load. Returns false, changing nothing, only when
 * the table is full: one slot is always kept empty so that every probe ends, so this happens when
 * the shard holds 2^power - 1 items and doubling failed. The caller still owns `it` then and
 * should treat it as an allocation failure. */
bool index_insert(struct index_shard *sh, uint64_t hv, struct item *it);
/* Remove `it` and uncount it. Returns false if it was not in the shard. May rehash the key of an
 * item after it in its probe run (one displaced by 15 or more), so those must be intact. */
bool index_remove(struct index_shard *sh, uint64_t hv, struct item *it);
/* Put `it` where `old` is (same key), adjusting counts. Returns false if `old` was not found.
 * Never needs a free slot, so it cannot fail for want of room. */
bool index_swap(struct index_shard *sh, uint64_t hv, struct item *old, struct item *it);

/* Total slots over all shards (takes each shard lock in turn; call with none held). */
uint64_t index_buckets(struct index *ix);

#endif
