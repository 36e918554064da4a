/* index.c — the sharded hash index of items (see index.h): one open-addressing table per shard,
 * linear probing, 16-bit tags and 4-bit displacements beside item addresses, backward-shift
 * deletion.
 *
 * Load limit 3/4. Linear probing at load a costs about (1 + 1/(1-a))/2 probes for a hit and
 * (1 + 1/(1-a)^2)/2 for a miss: at 3/4 that is 2.5 and 8.5 slots, i.e. one or two cache lines of
 * the table, and thanks to the tags almost never a look at an item. Above ~0.8 the miss cost
 * climbs steeply (13 slots at 0.8, 50 at 0.9), a removal walks the rest of its run, which grows
 * the same way, and more displacements reach 15 (where a removal must rehash a key); below 3/4,
 * memory rises for little gain.
 *
 * Memory (outside -m, like memcached's hash table): 8 bytes per slot, so 8 / 0.75 = 10.7 bytes
 * per item at the growth threshold and 21.3 just after a doubling; 15.4 averaged over item
 * counts spread evenly on a log scale. The chained index it replaces cost an 8-byte bucket per
 * 1.5 items plus the 8-byte `hnext` in every item: 5.3 + 8 = 13.3 bytes per item at its
 * threshold, 18.7 after doubling, 15.7 on the same average, the 8 in the item counted inside -m.
 * So the total stays about the same while the item header can lose 8 bytes.
 *
 * Full table: one slot always stays empty, so a probe always ends at an empty slot. When a
 * shard's doubling fails (no memory, or INDEX_POWER_MAX reached) it keeps accepting items up to
 * 2^power - 1, then index_insert returns false and the store answers as for a failed allocation.
 * Doubling is retried on every insert past the limit, so it recovers once memory is back. */
#include "node/index.h"
#include "node/lock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t index_tag(uint64_t hv)
{
    return (hv >> INDEX_SHARD_BITS) & (((uint64_t)1 << INDEX_TAG_BITS) - 1);
}

/* Slot value with displacement 0 (index_place sets it). */
static inline uint64_t index_slot_make(uint64_t hv, const struct item *it)
{
    return index_tag(hv) << INDEX_TAG_SHIFT | (uint64_t)(uintptr_t)it >> INDEX_ADDR_SHIFT;
}

/* `s` with its displacement field set to `d` (saturated at INDEX_DISP_MAX). */
static inline uint64_t index_with_disp(uint64_t s, size_t d)
{
    uint64_t f = d < INDEX_DISP_MAX ? d : INDEX_DISP_MAX;
    return (s & ~INDEX_DISP_MASK) | f << INDEX_DISP_SHIFT;
}

/* The home slot of a hash in a table of 2^power slots: the high bits, since the low ones chose
 * the shard and the middle ones are the tag. */
static inline size_t index_home(uint64_t hv, uint32_t power)
{
    return power ? (size_t)(hv >> (64 - power)) : 0;
}

static inline size_t index_mask(const struct index_shard *sh)
{
    return ((size_t)1 << sh->power) - 1;
}

/* Put slot value `s` in the first empty slot from its home on (there is one). */
static inline void index_place(uint64_t *t, size_t mask, size_t home, uint64_t s)
{
    size_t i = home;
    while (t[i]) i = (i + 1) & mask;
    t[i] = index_with_disp(s, (i - home) & mask);
}

int index_create(struct index **out, unsigned hash_power, char *err, size_t errlen)
{
    *out = NULL;
    struct index *ix = calloc(1, sizeof *ix);
    if (!ix) goto oom;
    if (posix_memalign((void **)&ix->shards, 64, INDEX_SHARDS * sizeof *ix->shards)) {
        ix->shards = NULL;
        goto oom;
    }
    memset(ix->shards, 0, INDEX_SHARDS * sizeof *ix->shards);
    ix->ns = calloc(STORE_NS_MAX, sizeof *ix->ns);
    if (!ix->ns) goto oom;

    uint32_t power = hash_power > INDEX_SHARD_BITS ? hash_power - INDEX_SHARD_BITS : 0;
    if (power > INDEX_POWER_MAX) power = INDEX_POWER_MAX;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        struct index_shard *sh = &ix->shards[i];
        sh->power = power;
        sh->ns = ix->ns;
        sh->alloc = calloc;
        sh->slots = calloc((size_t)1 << power, sizeof *sh->slots);
        if (!sh->slots || lock_init(&sh->lock)) {
            free(sh->slots);
            sh->slots = NULL;
            /* shards before i are complete; free exactly those */
            for (unsigned j = 0; j < i; j++) {
                free(ix->shards[j].slots);
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
        free(ix->shards[i].slots);
        pthread_mutex_destroy(&ix->shards[i].lock);
    }
    free(ix->shards);
    free(ix->ns);
    free(ix);
    *ixp = NULL;
}

struct item *index_find(struct index_shard *sh, uint64_t hv, const char *key, size_t nkey)
{
    const uint64_t *t = sh->slots;
    size_t mask = index_mask(sh);
    size_t i = index_home(hv, sh->power);
    uint64_t tag = index_tag(hv);
    for (;;) {
        uint64_t s = t[i];
        if (!s) return NULL;
        if (s >> INDEX_TAG_SHIFT == tag) {
            struct item *it = index_slot_item(s);
            if (it->nkey == nkey && memcmp(it->data, key, nkey) == 0) return it;
        }
        i = (i + 1) & mask;
    }
}

struct item *index_find_cas(struct index_shard *sh, uint64_t hv, uint64_t cas)
{
    const uint64_t *t = sh->slots;
    size_t mask = index_mask(sh);
    uint64_t tag = index_tag(hv);
    for (size_t i = index_home(hv, sh->power); t[i]; i = (i + 1) & mask) {
        if (t[i] >> INDEX_TAG_SHIFT != tag) continue;
        struct item *it = index_slot_item(t[i]);
        if (item_cas(it) == cas) return it;
    }
    return NULL;
}

/* Double the shard's table. Items do not keep their hash (it would cost 8 bytes each), so each
 * key is hashed again; that is paid once per doubling, amortised over the inserts that led to it.
 * A slot's tag does not depend on the table size, so the slot value moves as it is. Returns
 * false, leaving the table as it was, when the new one cannot be had. */
static bool index_grow(struct index_shard *sh)
{
    if (sh->power >= INDEX_POWER_MAX) return false;
    uint32_t np = sh->power + 1;
    uint64_t *nt = sh->alloc((size_t)1 << np, sizeof *nt);
    if (!nt) return false;
    size_t nmask = ((size_t)1 << np) - 1;
    size_t old = (size_t)1 << sh->power;
    for (size_t i = 0; i < old; i++) {
        uint64_t s = sh->slots[i];
        if (!s) continue;
        const struct item *it = index_slot_item(s);
        index_place(nt, nmask, index_home(index_hash(it->data, it->nkey), np), s);
    }
    free(sh->slots);
    sh->slots = nt;
    sh->power = np;
    sh->expansions++;
    return true;
}

static inline void index_count(struct index_shard *sh, const struct item *it, int sign)
{
    struct index_ns *ns = &sh->ns[it->nsid];
    uint64_t bytes = index_item_bytes(it);
    if (sign > 0) {
        sh->curr_items++;
        sh->bytes += bytes;
        __atomic_fetch_add(&ns->items, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&ns->bytes, bytes, __ATOMIC_RELAXED);
    } else {
        sh->curr_items--;
        sh->bytes -= bytes;
        __atomic_fetch_sub(&ns->items, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&ns->bytes, bytes, __ATOMIC_RELAXED);
    }
}

/* True if the slot layout cannot hold this address (above 2^47 or not 4-aligned). */
static inline bool index_bad_address(const struct item *it)
{
    uint64_t a = (uint64_t)(uintptr_t)it;
    return __builtin_expect((a >> INDEX_ADDR_BITS) | (a & ((1u << INDEX_ADDR_SHIFT) - 1)), 0);
}

static void index_bad_pointer(const struct item *it)
{
    fprintf(stderr, "index: item address %p is not 4-aligned below 2^%d\n", (const void *)it,
            INDEX_ADDR_BITS);
    abort();
}

bool index_insert(struct index_shard *sh, uint64_t hv, struct item *it)
{
    if (index_bad_address(it)) index_bad_pointer(it);
    uint64_t n = (uint64_t)1 << sh->power;
    if ((sh->curr_items + 1) * 4 > n * 3 && index_grow(sh)) n <<= 1;
    if (sh->curr_items + 1 >= n) return false; /* the last empty slot ends every probe */
    index_place(sh->slots, index_mask(sh), index_home(hv, sh->power), index_slot_make(hv, it));
    index_count(sh, it, 1);
    return true;
}

/* Index of the slot holding `it`, or SIZE_MAX. Compares whole slot values: no item is read. */
static size_t index_locate(const struct index_shard *sh, uint64_t hv, const struct item *it)
{
    const uint64_t *t = sh->slots;
    size_t mask = index_mask(sh);
    uint64_t want = index_slot_make(hv, it);
    for (size_t i = index_home(hv, sh->power);; i = (i + 1) & mask) {
        if ((t[i] & ~INDEX_DISP_MASK) == want) return i;
        if (!t[i]) return SIZE_MAX;
    }
}

/* Empty slot `hole` and close the gap: walk the rest of the run and move back every entry whose
 * home is not between the hole and its place (cyclically), so that each entry stays reachable
 * from its home through full slots. The home is the slot's place minus its displacement; only a
 * saturated displacement costs a read of the item and a rehash of its key. */
static void index_delete_at(struct index_shard *sh, size_t hole)
{
    uint64_t *t = sh->slots;
    size_t mask = index_mask(sh);
    for (size_t k = (hole + 1) & mask; t[k]; k = (k + 1) & mask) {
        uint64_t s = t[k];
        size_t d = (size_t)(s >> INDEX_DISP_SHIFT) & INDEX_DISP_MAX;
        if (d == 0) continue; /* at home: stays */
        if (d == INDEX_DISP_MAX) {
            const struct item *e = index_slot_item(s);
            d = (k - index_home(index_hash(e->data, e->nkey), sh->power)) & mask;
        }
        /* movable iff its home is not cyclically in (hole, k], i.e. d >= dist(hole, k) */
        size_t gap = (k - hole) & mask;
        if (d >= gap) {
            t[hole] = index_with_disp(s, d - gap);
            hole = k;
        }
    }
    t[hole] = 0;
}

bool index_remove(struct index_shard *sh, uint64_t hv, struct item *it)
{
    size_t i = index_locate(sh, hv, it);
    if (i == SIZE_MAX) return false;
    index_delete_at(sh, i);
    index_count(sh, it, -1);
    return true;
}

bool index_swap(struct index_shard *sh, uint64_t hv, struct item *old, struct item *it)
{
    if (index_bad_address(it)) index_bad_pointer(it);
    size_t i = index_locate(sh, hv, old);
    if (i == SIZE_MAX) return false;
    sh->slots[i] = index_slot_make(hv, it) | (sh->slots[i] & INDEX_DISP_MASK);
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
