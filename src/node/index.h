/* index.h — the store's hash index: INDEX_SHARDS shards, each with its own mutex, its own
 * chained bucket array (items linked through item->hnext) and its own counters.
 *
 * A shard's table doubles alone when its load passes 1.5, so a resize pauses only the keys of
 * that shard. The shard is picked by the low bits of the key's hash, the bucket inside the shard
 * by the high bits, so the two choices stay independent as tables grow.
 *
 * Every function here expects the shard's lock to be held by the caller. */
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
#define INDEX_POWER_MAX 31 /* per shard; 2^41 buckets in all is far beyond any memory limit */

/* Counters live beside the lock that guards them, so the hot path writes no shared line. */
/* Per-namespace counters, shared by all shards: relaxed atomic adds on link and unlink only. */
struct index_ns {
    uint64_t items, bytes, evictions, expired;
};

struct index_shard {
    pthread_mutex_t lock;
    struct index_ns *ns;  /* the index's per-namespace counters */
    struct item **buckets;
    uint32_t power;       /* log2 of this shard's bucket count */
    uint32_t *cls_items;  /* linked items per size class, indexed by clsid */
    uint64_t curr_items;  /* linked items; also the load that triggers doubling */
    uint64_t bytes;       /* header + key + value of linked items */
    uint64_t total_items; /* links and replaces (kept by store.c) */
    uint64_t expired_unfetched; /* lazily expired on lookup, never read (kept by store.c) */
    uint64_t expansions;
} __attribute__((aligned(64)));

struct index {
    struct index_shard *shards; /* INDEX_SHARDS of them */
    struct index_ns *ns;        /* STORE_NS_MAX of them */
    uint32_t *cls_items;        /* one block for every shard's per-class counts */
    int nclasses;
};

static inline uint64_t index_hash(const char *key, size_t nkey) { return XXH3_64bits(key, nkey); }

static inline struct index_shard *index_shard_of(struct index *ix, uint64_t hv)
{
    return &ix->shards[hv & (INDEX_SHARDS - 1)];
}

static inline uint32_t index_item_bytes(const struct item *it)
{
    return (uint32_t)sizeof(struct item) + it->nkey + it->nbytes;
}

/* Build the shards with 2^hash_power buckets in all (at least one per shard), counting items
 * for class ids 1..nclasses. Returns 0, or -1 with a message in err. */
int index_create(struct index **out, unsigned hash_power, int nclasses, char *err, size_t errlen);
/* Free the tables (not the items). Sets *ixp to NULL. */
void index_destroy(struct index **ixp);

/* The item with this key, or NULL. */
struct item *index_find(struct index_shard *sh, uint64_t hv, const char *key, size_t nkey);
/* Add `it` (key absent) and count it; may double the shard's table. Never fails: if the bigger
 * table cannot be allocated the shard keeps its chains longer. */
void index_insert(struct index_shard *sh, uint64_t hv, struct item *it);
/* Remove `it` and uncount it. Returns false if it was not in the shard. */
bool index_remove(struct index_shard *sh, uint64_t hv, struct item *it);
/* Put `it` where `old` is (same key), adjusting counts. Returns false if `old` was not found. */
bool index_swap(struct index_shard *sh, uint64_t hv, struct item *old, struct item *it);

/* Total buckets over all shards (takes each shard lock in turn; call with none held). */
uint64_t index_buckets(struct index *ix);

#endif
