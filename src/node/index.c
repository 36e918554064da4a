/* index.c — the sharded hash index of items (see index.h): one table per shard of 8-slot buckets
 * (a cache line each), bucketized linear probing with 13-bit tags, per-bucket overflow counts
 * and reaches that end a miss at its home bucket or soon after, removal that moves displaced
 * entries back, and tables of any whole number of buckets grown by 9/8 at load 0.9.
 *
 * Why buckets. The slot-level linear probing this replaces kept its load under 3/4 and doubled:
 * 10.7 bytes per item at the threshold, 21.3 after a doubling, 15.4 on average over item counts
 * spread evenly on a log scale. At a high load a slot-level probe is long and of variable length
 * (at 0.8, 3 slots for a hit and 13 for a miss). Here a lookup reads one line and compares its 8
 * tags in a loop of fixed length; it goes on to the next bucket only if entries overflowed the
 * home one.
 *
 * Why 0.9 and 9/8. The index is counted in -m, so its bytes per item are items lost: growing by
 * 5/4 at 0.8 kept the load between 0.64 and 0.8 (11.2 bytes per item on average, 10.8 in the -m
 * 64 benchmark); by 9/8 at 0.9 it stays between 0.8 and 0.9 (9.5 on average, test_growth). What
 * made 0.8 the limit before was misses: they went on while the overflow count of the bucket in
 * hand was not 0, which at 0.9 is most buckets (5.8 buckets read per miss under churn, against
 * 1.9 at 0.8). Two bounds end them sooner now: the home bucket's reach (3 bits: how far past it
 * its farthest entry sits, kept exact on insert, removal and moves back; saturated at 7 only while
 * an entry sits that far), and its overflow count compared with the entries seen so far that
 * passed over it (their displacement fields say which). Simulated with churn at 0.9, a hit reads
 * 1.45 buckets and a miss 3.4 (1.95 on average between 0.8 and 0.9: test_growth). The price is
 * rehashing: each item is rehashed about 8 times (1/(1.125-1)) on its way to a table's final
 * size, paid on inserts while the cache fills, never on lookups; growing prefetches the items it
 * rehashes. bench_index at 400,000 items (base 5/4 at 0.8 against this, best of 3 rounds on a
 * busy machine): insert 267 -> 349 ns, hit 62 -> 47-74, miss 30-43 -> 57-63, remove 106 -> 184.
 *
 * Removal. Without moving entries back, a table under churn (a full cache evicting) drifts:
 * entries stay far from homes that have room again and the overflow counts stay up (simulated at
 * 0.8: misses read 15 buckets instead of 2). So when the freed bucket's overflow count is not 0,
 * an entry from a later bucket whose probe passed over it moves into the hole, and so on from
 * the bucket it left; which entries may move is told by their displacement field, so only a
 * saturated one (7 buckets or more: about 1 entry in 500 at 0.8, more at 0.9) costs a read of
 * its item.
 *
 * Full table: a probe stops after visiting every bucket once, so it ends even with every slot
 * full. When a shard's growth fails (no memory, or INDEX_SLOTS_MAX reached) it keeps accepting
 * items up to nslots, then index_insert returns false and the store answers as for a failed
 * allocation. Growth is retried on every insert past the limit, so it recovers once memory is
 * back.
 *
 * Memory: 8 bytes per slot, counted inside -m (the store withholds segments of item memory for
 * it: seg_withhold). A table below a page comes from malloc; from a page on, tables are whole
 * pages, each its own mapping, unmapped when outgrown: in malloc, outgrown tables stayed
 * resident as free chunks that the next shards to grow only partly reused (1.4 MB of the 6.1 MB
 * the workers' arenas held at -m 64 full). That is why there are 128 shards, not 1024: at -m 64
 * (about 400,000 items) a shard's table is 6-8 pages, fine enough for the 9/8 steps (one page),
 * where 1024 shards' 1-2 pages would step by 2x. */
#include "node/index.h"
#include "node/lock.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define B INDEX_BUCKET_SLOTS

/* Slot value of an entry, without displacement or bucket bits. */
static inline uint64_t index_slot_make(uint64_t hv, const struct item *it)
{
    return index_tag(hv) | (uint64_t)(uintptr_t)it >> INDEX_ADDR_SHIFT;
}

static inline size_t index_disp_field(uint64_t s)
{
    return (size_t)(s >> INDEX_DISP_SHIFT) & INDEX_DISP_MAX;
}

/* Write entry `e` (its displacement set to d, saturated) into slot *p, keeping the slot's bucket
 * bits. */
static inline void index_put(uint64_t *p, uint64_t e, size_t d)
{
    uint64_t f = d < INDEX_DISP_MAX ? d : INDEX_DISP_MAX;
    *p = (*p & INDEX_OVF_MASK) | (e & (INDEX_TAG_MASK | INDEX_PTR_MASK)) | f << INDEX_DISP_SHIFT;
}

static inline void index_clear(uint64_t *p) { *p &= INDEX_OVF_MASK; }

static inline bool index_full(uint64_t s) { return (s & INDEX_PTR_MASK) != 0; }

static inline size_t index_next(size_t b, size_t nb) { return b + 1 == nb ? 0 : b + 1; }

/* Bit j set for each slot j of the bucket whose tag and address bits, masked with `mask`, equal
 * `want`. Branch-free over the 8 slots, so a probe's cost does not depend on where in the
 * bucket its entry is (a data-dependent loop exit mispredicts about once per lookup). */
static inline unsigned index_match(const uint64_t *k, uint64_t mask, uint64_t want)
{
    unsigned m = 0;
    for (unsigned j = 0; j < B; j++) m |= (unsigned)((k[j] & mask) == want) << j;
    return m;
}

static void index_ovf_set(uint64_t *bucket, unsigned c)
{
    bucket[0] = (bucket[0] & ~INDEX_OVF_MASK) | (uint64_t)(c & 7) << INDEX_OVF_SHIFT;
    bucket[1] = (bucket[1] & ~INDEX_OVF_MASK) | (uint64_t)(c >> 3) << INDEX_OVF_SHIFT;
}

static void index_reach_set(uint64_t *bucket, unsigned r)
{
    bucket[2] = (bucket[2] & ~INDEX_OVF_MASK) | (uint64_t)r << INDEX_OVF_SHIFT;
}

/* An entry of home bucket `home` now sits d buckets past it. */
static void index_reach_raise(uint64_t *t, size_t home, size_t d)
{
    uint64_t *h = t + home * B;
    unsigned r = d < INDEX_DISP_MAX ? (unsigned)d : INDEX_DISP_MAX;
    if (r > index_reach(h)) index_reach_set(h, r);
}

/* The home bucket of the entry `s` in bucket b, from its displacement field, or when that is
 * saturated from its key (a read of the item and a rehash). */
static size_t index_home_of(size_t nb, size_t b, uint64_t s)
{
    size_t d = index_disp_field(s);
    if (d == INDEX_DISP_MAX) {
        const struct item *e = index_slot_item(s);
        return index_home(index_hash(e->data, e->nkey), nb);
    }
    return b >= d ? b - d : b + nb - d;
}

/* An entry of home bucket `home` that sat d buckets past it left or moved nearer: if it was the
 * farthest, find the farthest now. Below INDEX_DISP_MAX the displacement fields of the buckets
 * within the old reach tell exactly. A saturated reach stays while another entry of that home
 * sits INDEX_DISP_MAX or more buckets past it: those are looked for among the saturated entries
 * of the buckets from there on that the run of overflow counts reaches (each such entry is a read
 * of its item; few are saturated, and this runs only when the farthest entry of a home goes). */
static void index_reach_drop(uint64_t *t, size_t nb, size_t home, size_t d)
{
    uint64_t *h = t + home * B;
    unsigned r = index_reach(h);
    if (r == 0 || d < r) return;
    if (r == INDEX_DISP_MAX) {
        size_t b = (home + INDEX_DISP_MAX - 1) % nb;
        for (size_t step = INDEX_DISP_MAX; step < nb && index_ovf(t + b * B); step++) {
            b = index_next(b, nb);
            const uint64_t *k = t + b * B;
            for (unsigned j = 0; j < B; j++)
                if (index_full(k[j]) && index_disp_field(k[j]) == INDEX_DISP_MAX &&
                    index_home_of(nb, b, k[j]) == home)
                    return; /* still one that far */
        }
        r = INDEX_DISP_MAX - 1;
    }
    unsigned nr = 0;
    for (size_t step = r, b = (home + r) % nb; step > 0 && !nr; step--, b = b ? b - 1 : nb - 1) {
        const uint64_t *k = t + b * B;
        for (unsigned j = 0; j < B; j++)
            if (index_full(k[j]) && index_disp_field(k[j]) == step) nr = (unsigned)step;
    }
    index_reach_set(h, nr);
}

static void index_ovf_inc(uint64_t *bucket)
{
    unsigned c = index_ovf(bucket);
    if (c < INDEX_OVF_MAX) index_ovf_set(bucket, c + 1);
}

static void index_ovf_dec(uint64_t *bucket)
{
    unsigned c = index_ovf(bucket);
    if (c < INDEX_OVF_MAX) index_ovf_set(bucket, c - 1); /* a saturated count stays */
}

/* Is a table of `bytes` a mapping of its own (else malloc'd)? Allocation and free must agree. */
static inline bool index_table_paged(size_t bytes)
{
    return bytes >= INDEX_PAGED_SLOTS * sizeof(uint64_t) && bytes % 4096 == 0;
}

void *index_table_alloc(size_t nmemb, size_t size)
{
    size_t bytes = nmemb * size;
    if (size && bytes / size != nmemb) return NULL;
    if (index_table_paged(bytes)) {
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return m == MAP_FAILED ? NULL : m;
    }
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p) memset(p, 0, bytes);
    return p;
}

void index_table_free(void *p, size_t bytes)
{
    if (index_table_paged(bytes)) munmap(p, bytes);
    else free(p);
}

/* index_match(k, INDEX_TAG_MASK, tag) for a lookup, where it matters most: fewer instructions
 * per lookup leave room for more lookups in flight at once, each waiting on a cache miss. With
 * SSE2 (every x86-64), the tags sit in the high 32-bit halves of the slots: gather the eight
 * halves into two vectors, mask, compare, and take the sign bits. */
static inline unsigned index_tag_match(const uint64_t *k, uint64_t tag)
{
#ifdef __SSE2__
    _Static_assert(INDEX_TAG_SHIFT >= 32, "the tag lies in a slot's high half");
    const __m128i *v = (const __m128i *)k; /* 16-byte aligned: malloc's least alignment */
    __m128 h0 = _mm_shuffle_ps(_mm_castsi128_ps(_mm_load_si128(v)),
                               _mm_castsi128_ps(_mm_load_si128(v + 1)), _MM_SHUFFLE(3, 1, 3, 1));
    __m128 h1 = _mm_shuffle_ps(_mm_castsi128_ps(_mm_load_si128(v + 2)),
                               _mm_castsi128_ps(_mm_load_si128(v + 3)), _MM_SHUFFLE(3, 1, 3, 1));
    __m128i mask = _mm_set1_epi32((int)(uint32_t)(INDEX_TAG_MASK >> 32));
    __m128i want = _mm_set1_epi32((int)(uint32_t)(tag >> 32));
    __m128i e0 = _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(h0), mask), want);
    __m128i e1 = _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(h1), mask), want);
    return (unsigned)_mm_movemask_ps(_mm_castsi128_ps(e0)) |
           (unsigned)_mm_movemask_ps(_mm_castsi128_ps(e1)) << 4;
#else
    return index_match(k, INDEX_TAG_MASK, tag);
#endif
}

/* index_match(k, INDEX_TAG_MASK | INDEX_PTR_MASK, want): the bucket's slots holding entry
 * `want` (tag | address), or with want = 0 its empty slots (an empty slot's tag is 0 too).
 * SSE2 as in index_tag_match: both 32-bit halves must match, the high one under the mask. */
static inline unsigned index_entry_match(const uint64_t *k, uint64_t want)
{
#ifdef __SSE2__
    const uint64_t m = INDEX_TAG_MASK | INDEX_PTR_MASK;
    _Static_assert((uint32_t)(INDEX_TAG_MASK | INDEX_PTR_MASK) == UINT32_MAX,
                   "the low half is all address");
    const __m128i *v = (const __m128i *)k;
    __m128 a = _mm_castsi128_ps(_mm_load_si128(v)), b = _mm_castsi128_ps(_mm_load_si128(v + 1));
    __m128 c = _mm_castsi128_ps(_mm_load_si128(v + 2)), d = _mm_castsi128_ps(_mm_load_si128(v + 3));
    __m128i lo0 = _mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    __m128i hi0 = _mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    __m128i lo1 = _mm_castps_si128(_mm_shuffle_ps(c, d, _MM_SHUFFLE(2, 0, 2, 0)));
    __m128i hi1 = _mm_castps_si128(_mm_shuffle_ps(c, d, _MM_SHUFFLE(3, 1, 3, 1)));
    __m128i hmask = _mm_set1_epi32((int)(uint32_t)(m >> 32));
    __m128i wlo = _mm_set1_epi32((int)(uint32_t)want), whi = _mm_set1_epi32((int)(uint32_t)(want >> 32));
    __m128i e0 = _mm_and_si128(_mm_cmpeq_epi32(lo0, wlo),
                               _mm_cmpeq_epi32(_mm_and_si128(hi0, hmask), whi));
    __m128i e1 = _mm_and_si128(_mm_cmpeq_epi32(lo1, wlo),
                               _mm_cmpeq_epi32(_mm_and_si128(hi1, hmask), whi));
    return (unsigned)_mm_movemask_ps(_mm_castsi128_ps(e0)) |
           (unsigned)_mm_movemask_ps(_mm_castsi128_ps(e1)) << 4;
#else
    return index_match(k, INDEX_TAG_MASK | INDEX_PTR_MASK, want);
#endif
}

/* Put entry `e` in the first bucket from `home` with a free slot (there is one), counting it in
 * the overflow count of every full bucket it passes. */
static void index_place(uint64_t *t, size_t nb, size_t home, uint64_t e)
{
    for (size_t b = home, d = 0;; b = index_next(b, nb), d++) {
        uint64_t *k = t + b * B;
        unsigned free_slots = index_entry_match(k, 0);
        if (free_slots) {
            index_put(&k[__builtin_ctz(free_slots)], e, d);
            if (d) index_reach_raise(t, home, d);
            return;
        }
        index_ovf_inc(k);
    }
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
    if (power > 31) power = 31;
    uint32_t nslots = (uint32_t)1 << power; /* <= INDEX_SLOTS_MAX */
    if (nslots < INDEX_BUCKET_SLOTS) nslots = INDEX_BUCKET_SLOTS;
    ix->first_bytes = (size_t)INDEX_SHARDS * nslots * sizeof(uint64_t);
    void *first = mmap(NULL, ix->first_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
    if (first == MAP_FAILED) goto oom;
    ix->first = first;
    ix->first_left = INDEX_SHARDS;
    ix->slots_total = (uint64_t)INDEX_SHARDS * nslots;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        struct index_shard *sh = &ix->shards[i];
        sh->nslots = nslots;
        sh->ns = ix->ns;
        sh->alloc = index_table_alloc;
        sh->owner = ix;
        sh->in_first = true;
        sh->slots = ix->first + (size_t)i * nslots;
        if (lock_init(&sh->lock)) {
            for (unsigned j = 0; j < i; j++) pthread_mutex_destroy(&ix->shards[j].lock);
            munmap(ix->first, ix->first_bytes);
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

/* Let go of a shard's table: free it, or if it is its part of the first mapping, unmap the
 * mapping once no shard uses it any more. */
static void index_table_drop(struct index_shard *sh)
{
    if (!sh->in_first) {
        index_table_free(sh->slots, (size_t)sh->nslots * sizeof *sh->slots);
        return;
    }
    sh->in_first = false;
    struct index *ix = sh->owner;
    if (__atomic_sub_fetch(&ix->first_left, 1, __ATOMIC_ACQ_REL) == 0)
        munmap(ix->first, ix->first_bytes);
}

void index_destroy(struct index **ixp)
{
    struct index *ix = *ixp;
    if (!ix) return;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        index_table_drop(&ix->shards[i]);
        pthread_mutex_destroy(&ix->shards[i].lock);
    }
    free(ix->shards);
    free(ix->ns);
    free(ix);
    *ixp = NULL;
}

/* Entries of bucket k that passed over the bucket `step` (1..INDEX_DISP_MAX) before it: those
 * displaced by `step` or more. Their displacement field tells exactly, a saturated one too
 * (7 means 7 or more, >= step). Beyond INDEX_DISP_MAX a saturated field cannot tell without
 * rehashing, so none is counted: a count that falls short only makes a probe go on. */
static inline unsigned index_passed(const uint64_t *k, size_t step)
{
    if (step > INDEX_DISP_MAX) return 0;
#ifdef __SSE2__
    /* as index_tag_match: the fields sit in the slots' high halves */
    _Static_assert(INDEX_DISP_SHIFT >= 32, "the displacement lies in a slot's high half");
    const __m128i *v = (const __m128i *)k;
    __m128 h0 = _mm_shuffle_ps(_mm_castsi128_ps(_mm_load_si128(v)),
                               _mm_castsi128_ps(_mm_load_si128(v + 1)), _MM_SHUFFLE(3, 1, 3, 1));
    __m128 h1 = _mm_shuffle_ps(_mm_castsi128_ps(_mm_load_si128(v + 2)),
                               _mm_castsi128_ps(_mm_load_si128(v + 3)), _MM_SHUFFLE(3, 1, 3, 1));
    __m128i mask = _mm_set1_epi32((int)(uint32_t)(INDEX_DISP_MASK >> 32));
    __m128i below = _mm_set1_epi32((int)(uint32_t)(((uint64_t)step << INDEX_DISP_SHIFT) >> 32) - 1);
    __m128i e0 = _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(h0), mask), below);
    __m128i e1 = _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(h1), mask), below);
    return (unsigned)__builtin_popcount((unsigned)_mm_movemask_ps(_mm_castsi128_ps(e0)) |
                                        (unsigned)_mm_movemask_ps(_mm_castsi128_ps(e1)) << 4);
#else
    unsigned n = 0;
    for (unsigned j = 0; j < B; j++) n += index_disp_field(k[j]) >= step;
    return n;
#endif
}

/* The first item of hv's probe sequence (tags first) that `match` accepts, or NULL. Inlined into
 * each caller with its own match, so the key compare of a lookup costs no call.
 *
 * A probe past the home bucket h ends at the first bucket whose overflow count is 0, or as soon
 * as it has seen as many entries that passed over h as h's overflow count says there are: the
 * key, if present past h, is one of them, and each was compared (it has the key's tag or not).
 * The second rule is what lets the load go to 0.9: there most buckets overflow, and a miss
 * would otherwise run on to the end of the cluster (5.7 buckets at 0.9, simulated). */
static inline struct item *index_probe(const struct index_shard *sh, uint64_t hv,
                                       bool (*match)(const struct item *, const void *),
                                       const void *arg)
{
    const uint64_t *t = sh->slots;
    size_t nb = sh->nslots / B;
    size_t b = index_home(hv, nb);
    uint64_t tag = index_tag(hv);
    unsigned over = 0, seen = 0; /* entries that passed over the home bucket: all, seen so far */
    size_t reach = index_reach(t + b * B);
    if (reach == INDEX_DISP_MAX) reach = nb;
    for (size_t step = 0; step < nb; step++, b = index_next(b, nb)) {
        const uint64_t *k = t + b * B;
        for (unsigned m = index_tag_match(k, tag); m; m &= m - 1) {
            uint64_t s = k[__builtin_ctz(m)];
            if (!index_full(s)) continue; /* an empty slot has tag 0 */
            struct item *it = index_slot_item(s);
            if (match(it, arg)) return it;
        }
        unsigned o = index_ovf(k);
        if (!o || step >= reach) break;
        if (step == 0) {
            over = o < INDEX_OVF_MAX ? o : UINT_MAX; /* a sticky count tells nothing */
        } else {
            seen += index_passed(k, step);
            if (seen >= over) break;
        }
    }
    return NULL;
}

struct probe_key {
    const char *key;
    size_t nkey;
};

static bool match_key(const struct item *it, const void *arg)
{
    const struct probe_key *k = arg;
    return it->nkey == k->nkey && memcmp(it->data, k->key, k->nkey) == 0;
}

struct probe_cas {
    uint64_t hv, cas;
};

/* The CAS and the whole hash: a tag is only 13 bits, and `ms ... E` can give two keys one CAS. */
static bool match_cas(const struct item *it, const void *arg)
{
    const struct probe_cas *p = arg;
    return item_cas(it) == p->cas && index_hash(it->data, it->nkey) == p->hv;
}

struct item *index_find(struct index_shard *sh, uint64_t hv, const char *key, size_t nkey)
{
    const struct probe_key k = {key, nkey};
    return index_probe(sh, hv, match_key, &k);
}

struct item *index_find_cas(struct index_shard *sh, uint64_t hv, uint64_t cas)
{
    const struct probe_cas p = {hv, cas};
    return index_probe(sh, hv, match_cas, &p);
}

/* Rebuild the shard's table at nn slots (bigger: index_grown_size; smaller: index_shrunk_size).
 * Items do not keep their hash (it would cost 8 bytes each), so each key is hashed again: paid
 * once per resize, amortised over the inserts or removals that led to it, with the item a few
 * slots ahead prefetched since each is a likely cache miss. A slot's tag does not depend on the
 * table size, so the entry moves as it is. Returns false, leaving the table as it was, when the
 * new one cannot be had. */
static bool index_resize(struct index_shard *sh, uint32_t nn)
{
    enum { AHEAD = 8 };
    if (nn == sh->nslots || nn < sh->curr_items) return false;
    uint64_t *nt = sh->alloc(nn, sizeof *nt);
    if (!nt) return false;
    const uint64_t *t = sh->slots;
    size_t old = sh->nslots, nb = nn / B;
    for (size_t i = 0; i < old; i++) {
        if (i + AHEAD < old && index_full(t[i + AHEAD]))
            __builtin_prefetch(index_slot_item(t[i + AHEAD]));
        uint64_t s = t[i];
        if (!index_full(s)) continue;
        const struct item *it = index_slot_item(s);
        index_place(nt, nb, index_home(index_hash(it->data, it->nkey), nb), s);
    }
    index_table_drop(sh);
    __atomic_fetch_add(&sh->owner->slots_total, (uint64_t)nn - old, __ATOMIC_RELAXED);
    sh->slots = nt;
    sh->nslots = nn;
    return true;
}

static bool index_grow(struct index_shard *sh)
{
    if (!index_resize(sh, index_grown_size(sh->nslots))) return false;
    sh->expansions++;
    return true;
}

/* A shard whose load fell below 1/INDEX_SHRINK_BELOW halves its table (to 2/INDEX_SHRINK_BELOW
 * load, far from the growth threshold, so a shard near it does not flap): -m holds the index
 * (seg_withhold), and a working set of small items replaced by large ones would otherwise keep
 * the tables it needed, in memory items could use. */
static void index_maybe_shrink(struct index_shard *sh)
{
    if (sh->nslots <= INDEX_BUCKET_SLOTS || sh->curr_items * INDEX_SHRINK_BELOW >= sh->nslots)
        return;
    if (index_resize(sh, index_shrunk_size(sh->nslots))) sh->shrinks++;
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
    if ((sh->curr_items + 1) * INDEX_LOAD_DEN > (uint64_t)sh->nslots * INDEX_LOAD_NUM)
        index_grow(sh);
    if (sh->curr_items >= sh->nslots) return false;
    size_t nb = sh->nslots / B;
    index_place(sh->slots, nb, index_home(hv, nb), index_slot_make(hv, it));
    index_count(sh, it, 1);
    return true;
}

/* Index of the slot holding `it`, or SIZE_MAX; *dist gets its bucket's distance from the home.
 * Compares tag and address: no item is read. */
static size_t index_locate(const struct index_shard *sh, uint64_t hv, const struct item *it,
                           size_t *dist)
{
    const uint64_t *t = sh->slots;
    size_t nb = sh->nslots / B;
    uint64_t want = index_slot_make(hv, it);
    size_t b = index_home(hv, nb);
    for (size_t step = 0; step < nb; step++, b = index_next(b, nb)) {
        const uint64_t *k = t + b * B;
        unsigned m = index_entry_match(k, want);
        if (m) {
            *dist = step;
            return b * B + (size_t)__builtin_ctz(m);
        }
        if (!index_ovf(k)) break;
    }
    return SIZE_MAX;
}

/* The true displacement of the entry `s` in bucket b: its field, or when that is
 * saturated, the distance from its key's home (a read of the item and a rehash). */
static size_t index_disp_of(const struct index_shard *sh, size_t b, uint64_t s)
{
    size_t d = index_disp_field(s);
    if (d < INDEX_DISP_MAX) return d;
    size_t nb = sh->nslots / B;
    const struct item *e = index_slot_item(s);
    size_t home = index_home(index_hash(e->data, e->nkey), nb);
    return b >= home ? b - home : b + nb - home;
}

/* Slot `hole` of bucket x was just emptied. While x has entries overflowing past it, move one of
 * them back into the hole: in the first bucket after x holding any whose displacement reaches
 * back to x, the one displaced most; the hole is then where it was. A bucket with an overflow count of 0 ends the search: no
 * entry beyond it passed over x. */
static void index_fill_hole(struct index_shard *sh, size_t x, size_t hole)
{
    uint64_t *t = sh->slots;
    size_t nb = sh->nslots / B;
    while (index_ovf(t + x * B)) {
        size_t k = x, from = SIZE_MAX, d = 0, gap = 0;
        for (size_t step = 1; step < nb && from == SIZE_MAX; step++) {
            k = index_next(k, nb);
            const uint64_t *kb = t + k * B;
            for (size_t j = 0; j < B; j++) { /* the one furthest from home: its path shrinks most */
                uint64_t s = kb[j];
                if (!index_full(s)) continue;
                size_t f = index_disp_field(s); /* exact below 7: reaches back to x iff >= step */
                if ((f < step && f < INDEX_DISP_MAX) || (from != SIZE_MAX && f <= d)) continue;
                size_t fd = index_disp_of(sh, k, s);
                if (fd < step || (from != SIZE_MAX && fd <= d)) continue;
                from = k * B + j;
                gap = step;
                d = fd;
            }
            if (from == SIZE_MAX && !index_ovf(kb)) return;
        }
        if (from == SIZE_MAX) return; /* only a saturated count said there was one */
        index_put(&t[hole], t[from], d - gap);
        index_clear(&t[from]);
        for (size_t i = 0, b = x; i < gap; i++, b = index_next(b, nb)) index_ovf_dec(t + b * B);
        index_reach_drop(t, nb, k >= d ? k - d : k + nb - d, d);
        x = k;
        hole = from;
    }
}

bool index_remove(struct index_shard *sh, uint64_t hv, struct item *it)
{
    size_t d;
    size_t i = index_locate(sh, hv, it, &d);
    if (i == SIZE_MAX) return false;
    size_t nb = sh->nslots / B;
    for (size_t n = 0, b = index_home(hv, nb); n < d; n++, b = index_next(b, nb))
        index_ovf_dec(sh->slots + b * B);
    index_clear(&sh->slots[i]);
    index_fill_hole(sh, i / B, i);
    index_reach_drop(sh->slots, nb, index_home(hv, nb), d);
    index_count(sh, it, -1);
    index_maybe_shrink(sh);
    return true;
}

bool index_swap(struct index_shard *sh, uint64_t hv, struct item *old, struct item *it)
{
    if (index_bad_address(it)) index_bad_pointer(it);
    size_t d;
    size_t i = index_locate(sh, hv, old, &d);
    if (i == SIZE_MAX) return false;
    index_put(&sh->slots[i], index_slot_make(hv, it), d);
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
        n += sh->nslots;
        pthread_mutex_unlock(&sh->lock);
    }
    return n;
}
