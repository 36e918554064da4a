/* index.c — sharded hash index of items (see index.h). */
#include "node/index.h"
#include "node/lock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Grow when items exceed buckets * 3/2: short chains without doubling memory too early. */
static inline bool index_overloaded(const struct index_shard *sh)
{
    uint64_t nb = (uint64_t)1 << sh->power;
    return sh->curr_items > nb + nb / 2;
}

static inline size_t index_bucket(uint64_t hv, uint32_t power)
{
    /* High bits: the low ones already chose the shard. */
    return power ? (size_t)(hv >> (64 - power)) : 0;
}


int index_create(struct index **out, unsigned hash_power, int nclasses, char *err, size_t errlen)
{
    *out = NULL;
    struct index *ix = calloc(1, sizeof *ix);
    if (!ix) goto oom;
    ix->nclasses = nclasses;
    if (posix_memalign((void **)&ix->shards, 64, INDEX_SHARDS * sizeof *ix->shards)) {
        ix->shards = NULL;
        goto oom;
    }
    memset(ix->shards, 0, INDEX_SHARDS * sizeof *ix->shards);
    ix->cls_items = calloc((size_t)INDEX_SHARDS * (size_t)(nclasses + 1), sizeof(uint32_t));
    if (!ix->cls_items) goto oom;
    ix->ns = calloc(STORE_NS_MAX, sizeof *ix->ns);
    if (!ix->ns) goto oom;

    uint32_t power = hash_power > INDEX_SHARD_BITS ? hash_power - INDEX_SHARD_BITS : 0;
    if (power > INDEX_POWER_MAX) power = INDEX_POWER_MAX;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        struct index_shard *sh = &ix->shards[i];
        sh->power = power;
        sh->ns = ix->ns;
        sh->cls_items = ix->cls_items + (size_t)i * (size_t)(nclasses + 1);
        sh->buckets = calloc((size_t)1 << power, sizeof *sh->buckets);
        if (!sh->buckets || lock_init(&sh->lock)) {
            free(sh->buckets);
            sh->buckets = NULL;
            /* shards before i are complete; index_destroy frees exactly those */
            for (unsigned j = 0; j < i; j++) {
                free(ix->shards[j].buckets);
                pthread_mutex_destroy(&ix->shards[j].lock);
            }
            free(ix->shards);
            ix->shards = NULL;
            goto oom;
        }
    }
    *out = ix;
    return 0;
oom:
    snprintf(err, errlen, "out of memory creating the hash index");
    if (ix) {
        free(ix->shards);
        free(ix->cls_items);
        free(ix->ns);
        free(ix);
    }
    return -1;
}

void index_destroy(struct index **ixp)
{
    struct index *ix = *ixp;
    if (!ix) return;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        free(ix->shards[i].buckets);
        pthread_mutex_destroy(&ix->shards[i].lock);
    }
    free(ix->shards);
    free(ix->cls_items);
    free(ix->ns);
    free(ix);
    *ixp = NULL;
}

struct item *index_find(struct index_shard *sh, uint64_t hv, const char *key, size_t nkey)
{
    struct item *it = sh->buckets[index_bucket(hv, sh->power)];
    for (; it; it = it->hnext)
        if (it->nkey == nkey && memcmp(it->data, key, nkey) == 0) return it;
    return NULL;
}

/* Double the shard's table. Items do not keep their hash (it would cost 8 bytes each), so each
 * key is hashed again; that is paid once per doubling, amortised over the inserts that led to it. */
static void index_grow(struct index_shard *sh)
{
    if (sh->power >= INDEX_POWER_MAX) return;
    uint32_t np = sh->power + 1;
    struct item **nb = calloc((size_t)1 << np, sizeof *nb);
    if (!nb) return;
    size_t old = (size_t)1 << sh->power;
    for (size_t b = 0; b < old; b++) {
        struct item *it = sh->buckets[b];
        while (it) {
            struct item *next = it->hnext;
            size_t i = index_bucket(index_hash(it->data, it->nkey), np);
            it->hnext = nb[i];
            nb[i] = it;
            it = next;
        }
    }
    free(sh->buckets);
    sh->buckets = nb;
    sh->power = np;
    sh->expansions++;
}

static inline void index_count(struct index_shard *sh, const struct item *it, int sign)
{
    struct index_ns *ns = &sh->ns[it->nsid];
    uint64_t bytes = index_item_bytes(it);
    if (sign > 0) {
        sh->curr_items++;
        sh->bytes += bytes;
        sh->cls_items[it->clsid]++;
        __atomic_fetch_add(&ns->items, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&ns->bytes, bytes, __ATOMIC_RELAXED);
    } else {
        sh->curr_items--;
        sh->bytes -= bytes;
        sh->cls_items[it->clsid]--;
        __atomic_fetch_sub(&ns->items, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&ns->bytes, bytes, __ATOMIC_RELAXED);
    }
}

void index_insert(struct index_shard *sh, uint64_t hv, struct item *it)
{
    struct item **b = &sh->buckets[index_bucket(hv, sh->power)];
    it->hnext = *b;
    *b = it;
    index_count(sh, it, 1);
    if (index_overloaded(sh)) index_grow(sh);
}

/* The link that points at `it`, or NULL. */
static struct item **index_slot(struct index_shard *sh, uint64_t hv, const struct item *it)
{
    struct item **pp = &sh->buckets[index_bucket(hv, sh->power)];
    while (*pp && *pp != it) pp = &(*pp)->hnext;
    return *pp ? pp : NULL;
}

bool index_remove(struct index_shard *sh, uint64_t hv, struct item *it)
{
    struct item **pp = index_slot(sh, hv, it);
    if (!pp) return false;
    *pp = it->hnext;
    it->hnext = NULL;
    index_count(sh, it, -1);
    return true;
}

bool index_swap(struct index_shard *sh, uint64_t hv, struct item *old, struct item *it)
{
    struct item **pp = index_slot(sh, hv, old);
    if (!pp) return false;
    it->hnext = old->hnext;
    *pp = it;
    old->hnext = NULL;
    index_count(sh, old, -1);
    index_count(sh, it, 1);
    return true;
}

uint64_t index_buckets(struct index *ix)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        struct index_shard *sh = &ix->shards[i];
        pthread_mutex_lock(&sh->lock);
        n += (uint64_t)1 << sh->power;
        pthread_mutex_unlock(&sh->lock);
    }
    return n;
}
