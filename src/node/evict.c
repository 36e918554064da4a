/* evict.c — the eviction policies of a pool: which item of a full class goes to make room, and
 * what a read records. The state of one item is the byte it->clock:
 *
 *   lru     bit 0: referenced since the hand last passed (CLOCK, the classic approximation of
 *           LRU). A hit writes the byte only when the bit is clear.
 *   lfu     an 8-bit logarithmic access counter (Redis's scheme): new items start at
 *           LFU_INIT; a hit increments it with probability 1 / ((c - LFU_INIT) * LFU_LOG_FACTOR
 *           + 1), so 255 stands for about a million hits; it loses one per LFU_DECAY_SECONDS of
 *           idleness (from atime). The hand samples LFU_SAMPLE items and evicts the least used.
 *   s3fifo  S3-FIFO (Yang et al., SOSP 2023): bits 0-1 a saturating 2-bit frequency, bit 7
 *           "in the small queue". New items enter the small queue (a per-class FIFO ring of
 *           chunk pointers, ~10% of the class); at its head an item read at least once since
 *           admission is promoted to main in place (the bit cleared), any other is evicted and
 *           its key remembered in the pool's ghost set. A new key found in the ghost skips the
 *           small queue. Main is a CLOCK over the class whose hand gives a read item another
 *           turn and decrements its frequency. Items never move: the queues are flags and a ring.
 *
 * For every policy an expired or flushed item met by the hand goes first, whatever its state.
 * Everything here runs under the class lock, except evict_bump (shard lock of the item), which
 * touches only it->clock, with atomics. */
#include "node/slab_int.h"

#include "common/clock.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define EVICT_TURNS 2          /* a hand gives up after this many revolutions of the class */
#define LFU_INIT 5             /* a new item's counter: it is not evicted before a second look */
#define LFU_LOG_FACTOR 10
#define LFU_DECAY_SECONDS 60
#define LFU_SAMPLE 5
#define LFU_RANDOM_DRAWS 64    /* rounds of random samples before falling back to the hand */
#define S3_SMALL 0x80          /* it->clock: in the small queue */
#define S3_FREQ 0x03           /* it->clock: 2-bit frequency */
#define S3_SMALL_PERCENT 10    /* small queue's share of a class's chunks */
#define GHOST_BYTES_PER_ENTRY 128 /* one ghost entry per this many bytes of capacity */
#define GHOST_MIN 1024u
#define GHOST_MAX (1u << 24)

#define LOAD SLAB_LOAD
#define STORE SLAB_STORE

static inline uint64_t rng_next(void)
{
    static __thread uint64_t x;
    if (!x) x = (uint64_t)(uintptr_t)&x | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

/* ---- ghost: fingerprints of recently evicted keys ----------------------------------------- */

static inline uint32_t ghost_fp(uint64_t hv) { return (uint32_t)(hv >> 32) | 1u; }

static void ghost_put(struct slab_pool *pl, uint64_t hv)
{
    uint32_t *g = __atomic_load_n(&pl->ghost, __ATOMIC_ACQUIRE);
    if (g) STORE(&g[(hv >> 16) & pl->ghost_mask], ghost_fp(hv));
}

/* True (and forgotten) if hv was evicted from the small queue lately. Direct-mapped: a newer
 * eviction overwrites an older one, so the set remembers roughly the last `size` keys. */
static bool ghost_take(struct slab_pool *pl, uint64_t hv)
{
    uint32_t *g = __atomic_load_n(&pl->ghost, __ATOMIC_ACQUIRE);
    if (!g) return false;
    uint32_t *e = &g[(hv >> 16) & pl->ghost_mask];
    if (LOAD(e) != ghost_fp(hv)) return false;
    STORE(e, 0);
    return true;
}

int evict_pool_prepare(struct slab_pool *pl, enum slab_policy policy, uint64_t capacity)
{
    if (policy != SLAB_POLICY_S3FIFO || pl->ghost) return 0;
    uint64_t want = capacity / GHOST_BYTES_PER_ENTRY;
    uint32_t n = GHOST_MIN;
    while (n < want && n < GHOST_MAX) n <<= 1;
    uint32_t *g = calloc(n, sizeof *g);
    if (!g) return -1;
    pl->ghost_mask = n - 1;
    /* Readers load the pointer with acquire, so they see the mask; it is never freed before
     * the pool (a policy change away from s3fifo keeps it for a change back). */
    __atomic_store_n(&pl->ghost, g, __ATOMIC_RELEASE);
    return 0;
}

void evict_pool_free(struct slab_pool *pl)
{
    free(pl->ghost);
    pl->ghost = NULL;
}

/* ---- s3fifo's small queue (class lock held) ----------------------------------------------- */

static inline uint32_t ring_len(const struct evict_ring *r) { return r->tail - r->head; }

/* Give ring r room for `want` entries (a power of two, at least its length), keeping order.
 * False if out of memory. */
static bool ring_resize(struct evict_ring *r, uint32_t want)
{
    struct item **n = malloc((size_t)want * sizeof *n);
    if (!n) return false;
    uint32_t len = ring_len(r);
    for (uint32_t i = 0; i < len; i++) n[i] = r->slot[(r->head + i) & (r->cap - 1)];
    free(r->slot);
    r->slot = n;
    r->cap = want;
    r->head = 0;
    r->tail = len;
    return true;
}

/* Target length of the small queue of class c. */
static inline uint32_t small_target(const struct slab_class *c)
{
    uint64_t t = (uint64_t)c->npages * c->perpage * S3_SMALL_PERCENT / 100;
    return t ? (uint32_t)t : 1;
}

void evict_class_grew(struct slab_pool *pl, struct slab_class *c)
{
    if (LOAD(&pl->policy) != SLAB_POLICY_S3FIFO) return;
    /* Twice the target: entries of freed or promoted chunks linger until they come up. */
    uint32_t want = 64;
    while (want < 2 * small_target(c)) want <<= 1;
    if (c->small.cap < want) ring_resize(&c->small, want);
}

/* Largest ring class c may have: every chunk it could hold (rounded up to a power of two). While a
 * class fills, nothing is evicted and every new item stays in the small queue, as in S3-FIFO;
 * the bound only stops a churn of overwrites in a roomy class from growing it forever. */
static uint32_t ring_bound(const struct slab_class *c)
{
    uint64_t chunks = (uint64_t)c->npages * c->perpage, b = 64;
    while (b < chunks && b < (1u << 31)) b <<= 1;
    return (uint32_t)b;
}

/* Is ring entry `it` a queued item of class c? A chunk may have been freed, reused by main,
 * promoted, or its page moved to another class (then `it` need not even be a chunk start). */
static inline bool ring_entry_live(const struct slab_pool *pl, const struct slab_class *c,
                                   struct item *it)
{
    return slab_chunk_of_class(pl->slab, c, it) && (slab_chunk_state(it) & ITEM_LINKED) &&
           (LOAD(&it->clock) & S3_SMALL);
}

/* Drop entries of chunks no longer in the small queue. */
static void ring_compact(const struct slab_pool *pl, struct slab_class *c)
{
    struct evict_ring *r = &c->small;
    uint32_t len = r->tail - r->head, out = r->head;
    for (uint32_t i = 0; i < len; i++) {
        struct item *it = r->slot[(r->head + i) & (r->cap - 1)];
        if (ring_entry_live(pl, c, it)) r->slot[out++ & (r->cap - 1)] = it;
    }
    r->tail = out;
}

void evict_class_free(struct slab_class *c)
{
    free(c->small.slot);
    memset(&c->small, 0, sizeof c->small);
    free(c->pagev);
    c->pagev = NULL;
    c->npagev = c->capv = 0;
}

/* Clear bits of it->clock; a concurrent evict_bump may be adding frequency. */
static inline void clock_clear(struct item *it, uint8_t bits)
{
    __atomic_fetch_and(&it->clock, (uint8_t)~bits, __ATOMIC_RELAXED);
}

static struct item *ring_pop(struct evict_ring *r)
{
    if (ring_len(r) == 0) return NULL;
    return r->slot[r->head++ & (r->cap - 1)];
}

/* Queue a new chunk of class c. A full ring grows (up to ring_bound), then sheds stale entries,
 * and only then promotes its oldest entries to main to make room. */
static void ring_push(const struct slab_pool *pl, struct slab_class *c, struct item *it)
{
    struct evict_ring *r = &c->small;
    if (r->cap == 0) return; /* no ring (out of memory): the item lives in main from the start */
    if (ring_len(r) == r->cap && !(r->cap < ring_bound(c) && ring_resize(r, r->cap * 2))) {
        ring_compact(pl, c);
        /* Still mostly full (a roomy class where overwrites reuse chunks still queued, so
         * their entries look live): promote the oldest to main until half is free, so that a
         * push costs O(1) amortised, never a scan of the ring each. */
        while (ring_len(r) > r->cap / 2) {
            struct item *old = ring_pop(r);
            if (ring_entry_live(pl, c, old)) clock_clear(old, S3_SMALL);
        }
    }
    r->slot[r->tail++ & (r->cap - 1)] = it;
}

/* ---- admission and reads ------------------------------------------------------------------ */

void evict_admit(struct slab_pool *pl, struct slab_class *c, struct item *it, uint64_t hv)
{
    switch (__atomic_load_n(&pl->policy, __ATOMIC_ACQUIRE)) {
    case SLAB_POLICY_LFU:
        STORE(&it->clock, LFU_INIT);
        break;
    case SLAB_POLICY_S3FIFO:
        if (ghost_take(pl, hv)) {
            STORE(&it->clock, 0);
            break;
        }
        if (c->small.cap == 0) evict_class_grew(pl, c);
        STORE(&it->clock, c->small.cap ? S3_SMALL : 0);
        ring_push(pl, c, it);
        break;
    default:
        STORE(&it->clock, 0);
        break;
    }
}

/* LFU counter of it, less one per LFU_DECAY_SECONDS idle. */
static inline uint8_t lfu_decayed(const struct item *it, uint32_t now)
{
    uint8_t c = LOAD(&it->clock);
    uint32_t at = LOAD(&it->atime);
    uint32_t d = now > at ? (now - at) / LFU_DECAY_SECONDS : 0;
    return d >= c ? 0 : (uint8_t)(c - d);
}

void slab_bump(struct slab *s, struct item *it, uint32_t now)
{
    const struct slab_pool *pl = s->pools[it->nsid % STORE_NS_MAX];
    uint8_t policy = pl ? LOAD(&pl->policy) : SLAB_POLICY_LRU;
    uint8_t v = LOAD(&it->clock);
    switch (policy) {
    case SLAB_POLICY_LFU: {
        /* Write only on a change: a hot item's counter is high and rarely moves. */
        uint8_t c = lfu_decayed(it, now);
        if (c < 255) {
            uint32_t base = c > LFU_INIT ? c - LFU_INIT : 0;
            uint64_t r = rng_next() % ((uint64_t)base * LFU_LOG_FACTOR + 1);
            if (r == 0) c++;
        }
        if (c != v) STORE(&it->clock, c);
        break;
    }
    case SLAB_POLICY_S3FIFO:
        while ((v & S3_FREQ) < S3_FREQ &&
               !__atomic_compare_exchange_n(&it->clock, &v, (uint8_t)(v + 1), false,
                                            __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
        break;
    default:
        if (!v) STORE(&it->clock, 1);
        break;
    }
}

/* ---- victims (class lock held) ------------------------------------------------------------ */

/* Offer `it` to the visitor as a victim. Returns it (in flight, counted) or NULL. */
static struct item *take(struct slab_class *c, struct item *it, slab_visit_fn fn, void *ctx)
{
    int r = fn(ctx, it, SLAB_VISIT_EVICT);
    if (!(r & SLAB_GONE)) return NULL;
    slab_count_gone(c, SLAB_VISIT_EVICT, r);
    return it;
}

static inline bool looks_dead(struct item *it, slab_visit_fn fn, void *ctx)
{
    return fn(ctx, it, SLAB_VISIT_PEEK) & SLAB_DEAD;
}

/* What a hand does with a linked item it passes. */
enum hand_verdict { HAND_SKIP, HAND_TAKE };

/* The next linked chunk under class c's hand, advancing it; NULL after `*budget` chunks. */
static struct item *hand_next(struct slab *s, struct slab_class *c, uint64_t *budget)
{
    uint32_t p = c->hand_page, i = c->hand_idx;
    if (p == SLAB_NONE) {
        p = c->head;
        i = 0;
    }
    struct item *got = NULL;
    while (*budget > 0) {
        if (i >= s->pages[p].carved) {
            p = slab_class_page_next(s, c, p);
            i = 0;
            continue;
        }
        struct item *it = slab_chunk(s, p, i++, c->size);
        (*budget)--;
        if (slab_chunk_state(it) & ITEM_LINKED) {
            got = it;
            break;
        }
    }
    c->hand_page = p;
    c->hand_idx = i;
    return got;
}

/* CLOCK (lru), and s3fifo's main queue when `s3` is set. */
static struct item *evict_clock(struct slab *s, struct slab_class *c, bool s3, slab_visit_fn fn,
                                void *ctx)
{
    uint64_t budget = EVICT_TURNS * c->carved;
    struct item *it;
    while ((it = hand_next(s, c, &budget)) != NULL) {
        uint8_t v = LOAD(&it->clock);
        enum hand_verdict d = HAND_TAKE;
        if (s3 && (v & S3_SMALL) && ring_len(&c->small) > 0) {
            d = HAND_SKIP; /* the small queue's, not ours */
        } else if (s3 && (v & S3_SMALL)) {
            /* An empty queue cannot hold it: the bit is left from another policy's state. */
            clock_clear(it, S3_SMALL);
            if (v & S3_FREQ && !looks_dead(it, fn, ctx)) {
                __atomic_fetch_sub(&it->clock, 1, __ATOMIC_RELAXED);
                d = HAND_SKIP;
            }
        } else if (v && !looks_dead(it, fn, ctx)) {
            d = HAND_SKIP; /* referenced: another turn, one reference fewer */
            if (s3) __atomic_fetch_sub(&it->clock, 1, __ATOMIC_RELAXED);
            else STORE(&it->clock, 0);
        }
        if (d == HAND_TAKE && (it = take(c, it, fn, ctx)) != NULL) return it;
    }
    return NULL;
}

/* A linked chunk of class c picked at random, or NULL (the pick was free or in flight). Random,
 * not consecutive: items stored together (a batch of hot keys) must not share samples. */
static struct item *random_chunk(struct slab *s, struct slab_class *c)
{
    if (c->npagev == 0) return NULL;
    uint64_t r = rng_next();
    uint32_t p = c->pagev[(uint32_t)r % c->npagev];
    uint32_t n = s->pages[p].carved;
    if (n == 0) return NULL;
    struct item *it = slab_chunk(s, p, (uint32_t)(r >> 32) % n, c->size);
    return slab_chunk_state(it) & ITEM_LINKED ? it : NULL;
}

/* Sampled LFU (as Redis does it): among LFU_SAMPLE random items, the one with the lowest decayed
 * count; after many empty draws (a sparse class) the hand walks in order instead. */
static struct item *evict_lfu(struct slab *s, struct slab_class *c, slab_visit_fn fn, void *ctx)
{
    uint64_t budget = EVICT_TURNS * c->carved;
    uint32_t now = clock_now();
    for (uint32_t draws = 0;; draws++) {
        struct item *best = NULL;
        uint8_t low = 0;
        for (int k = 0; k < LFU_SAMPLE; k++) {
            struct item *it = draws < LFU_RANDOM_DRAWS ? random_chunk(s, c)
                                                       : hand_next(s, c, &budget);
            if (!it) {
                if (draws < LFU_RANDOM_DRAWS) continue;
                break;
            }
            if (looks_dead(it, fn, ctx)) {
                if ((it = take(c, it, fn, ctx)) != NULL) return it;
                continue;
            }
            uint8_t v = lfu_decayed(it, now);
            if (!best || v < low) {
                best = it;
                low = v;
            }
        }
        if (!best) {
            if (draws < LFU_RANDOM_DRAWS) continue;
            return NULL;
        }
        if ((best = take(c, best, fn, ctx)) != NULL) return best;
    }
}

/* S3-FIFO's small queue: evict its oldest unread item (remembering the key), promoting read
 * ones to main on the way. */
static struct item *evict_small(struct slab_pool *pl, struct slab_class *c, slab_visit_fn fn,
                                void *ctx)
{
    struct evict_ring *r = &c->small;
    uint32_t busy = 0, n = ring_len(r);
    for (uint32_t k = 0; k < n; k++) {
        struct item *it = ring_pop(r);
        if (!it) break;
        if (!ring_entry_live(pl, c, it)) continue; /* stale */
        uint8_t v = LOAD(&it->clock);
        bool dead = looks_dead(it, fn, ctx);
        if ((v & S3_FREQ) && !dead) {
            clock_clear(it, S3_SMALL | S3_FREQ); /* promoted: main starts it at frequency 0 */
            continue;
        }
        uint64_t hv = XXH3_64bits(item_key(it), it->nkey); /* before the chunk is reused */
        int rv = fn(ctx, it, SLAB_VISIT_EVICT);
        if (rv & SLAB_GONE) {
            slab_count_gone(c, SLAB_VISIT_EVICT, rv);
            if (!(rv & SLAB_GONE_EXPIRED)) ghost_put(pl, hv);
            return it;
        }
        /* Its shard is busy: back in the queue, and try the next one. */
        r->slot[r->tail++ & (r->cap - 1)] = it;
        if (++busy > 64) break;
    }
    return NULL;
}

/* After a class's warm-up the small queue keeps to its share: give back a ring that is mostly
 * empty (a quarter used, twice what the target needs). */
static void ring_shrink(struct slab_class *c)
{
    struct evict_ring *r = &c->small;
    uint32_t want = 64;
    while (want < 2 * small_target(c)) want <<= 1;
    if (r->cap > want && ring_len(r) <= r->cap / 4) ring_resize(r, r->cap / 2);
}

struct item *evict_run(struct slab *s, struct slab_pool *pl, struct slab_class *c,
                       slab_visit_fn fn, void *ctx)
{
    if (c->carved == 0 || c->head == SLAB_NONE) return NULL;
    struct item *it;
    switch (LOAD(&pl->policy)) {
    case SLAB_POLICY_LFU:
        return evict_lfu(s, c, fn, ctx);
    case SLAB_POLICY_S3FIFO:
        if (ring_len(&c->small) >= small_target(c) && (it = evict_small(pl, c, fn, ctx))) {
            ring_shrink(c);
            return it;
        }
        if ((it = evict_clock(s, c, true, fn, ctx))) return it;
        return evict_small(pl, c, fn, ctx);
    default:
        return evict_clock(s, c, false, fn, ctx);
    }
}
