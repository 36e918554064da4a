/* evict.c — the eviction policies of a pool: what a new item's state is, what a read records,
 * and, when a victim segment (the oldest of a queue) is processed, which of its live items stay
 * (reinserted at the head, FIFO-reinsertion) and which go. The state of one item is the byte
 * it->clock:
 *
 *   lru     bit 0: referenced since the item last came up (CLOCK, the classic approximation of
 *           LRU). A hit writes the byte only when the bit is clear; a victim with the bit set
 *           stays and loses it.
 *   lfu     an 8-bit logarithmic access counter (Redis's scheme): new items start at
 *           LFU_INIT; a hit increments it with probability 1 / ((c - LFU_INIT) * LFU_LOG_FACTOR
 *           + 1), so 255 stands for about a million hits; it loses one per LFU_DECAY_SECONDS of
 *           idleness (from atime). A victim stays if its decayed counter is above the pool's
 *           floor: LFU_INIT at first (read at least once), raised while victims are mostly kept
 *           (so that eviction always makes progress) and lowered again when they are not.
 *   s3fifo  S3-FIFO (Yang et al., SOSP 2023): bits 0-1 a saturating 2-bit frequency. New items
 *           enter the small queue (its own head segment); a victim of the small queue read at
 *           least once since admission moves to main at frequency 0, any other is evicted and
 *           its key remembered in the pool's ghost set. A new key found in the ghost goes to
 *           main directly if its record is small for the pool (size-aware: s3_ghost_admit),
 *           else to the small queue again. Main is CLOCK: a victim read since it last came up
 *           stays, one frequency fewer. The small queue is kept to about S3_SMALL_PERCENT of the
 *           pool's segments.
 *
 * Everything here runs under the pool lock, except seg_bump (shard lock of the item), which
 * touches only it->clock, with atomics. */
#include "node/seg_int.h"

#include "common/clock.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <xxhash.h>

#define LFU_INIT 5             /* a new item's counter: it is not evicted before a second look */
#define LFU_LOG_FACTOR 10
#define LFU_DECAY_SECONDS 60
#define LFU_KEPT_HIGH 900      /* of 1024: victims mostly kept, raise the floor */
#define LFU_KEPT_LOW 256       /* of 1024: victims mostly evicted, lower it */
#define S3_FREQ 0x03           /* it->clock: 2-bit frequency */
#define S3_SMALL_PERCENT 3     /* small queue's share of a pool's sealed segments (at least 1) */
#define S3_LOW_STEP_SHIFT 8    /* the tercile estimate moves 1/256 (up) or 2/256 (down) a record */
#define GHOST_BYTES_PER_ENTRY 128 /* one ghost entry per this many bytes of capacity */
#define GHOST_MIN 1024u
#define GHOST_MAX (1u << 24)

#define LOAD SEG_LOAD
#define STORE SEG_STORE

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

/* 8 bits of the hash above those that pick the entry (bits 16..39 at most), never 0 (empty).
 * A key never evicted matches a full entry with probability about 1/255: a false readmission
 * to main for 0.4% of new keys, where 2-byte entries (1/32768) took twice the memory and 4-byte
 * ones four times: -m holds the ghost, 2.6 bytes per item at -m 64 with 16-bit entries. What a
 * ghost remembers is its number of entries, which stays. */
static inline ghost_fp_t ghost_fp(uint64_t hv)
{
    ghost_fp_t f = (ghost_fp_t)(hv >> 56);
    return f ? f : 1;
}

/* Bytes of a ghost of n entries: whole pages, its own mapping. */
static inline size_t ghost_map_bytes(uint32_t n)
{
    return ((size_t)n * sizeof(ghost_fp_t) + 4095) & ~(size_t)4095;
}

/* All callers hold the pool lock, which also guards a resize (evict_pool_prepare). The first
 * put makes the ghost count in the log's ghost_bytes, which -m covers (seg_withhold): until a
 * pool evicts from its small queue its ghost is never written, and its mapping's pages are
 * not resident, so it costs no memory before the pool is full. */
static void ghost_put(struct seg_pool *pl, uint64_t hv)
{
    ghost_fp_t *g = pl->ghost;
    if (!g) return;
    if (!pl->ghost_used) {
        pl->ghost_used = true;
        __atomic_fetch_add(&pl->segs->ghost_bytes, ghost_map_bytes(pl->ghost_mask + 1),
                           __ATOMIC_RELAXED);
        seg_ghost_grew(pl->segs);
    }
    g[(hv >> 16) & pl->ghost_mask] = ghost_fp(hv);
}

/* True (and forgotten) if hv was evicted from the small queue lately. Direct-mapped: a newer
 * eviction overwrites an older one, so the set remembers roughly the last `size` keys. */
static bool ghost_take(struct seg_pool *pl, uint64_t hv)
{
    ghost_fp_t *g = pl->ghost;
    if (!g || !pl->ghost_used) return false;
    ghost_fp_t *e = &g[(hv >> 16) & pl->ghost_mask];
    if (*e != ghost_fp(hv)) return false;
    *e = 0;
    return true;
}

/* Drop pl's ghost (pool lock held). */
static void ghost_drop(struct seg_pool *pl)
{
    if (!pl->ghost) return;
    size_t bytes = ghost_map_bytes(pl->ghost_mask + 1);
    munmap(pl->ghost, bytes);
    if (pl->ghost_used) __atomic_fetch_sub(&pl->segs->ghost_bytes, bytes, __ATOMIC_RELAXED);
    pl->ghost = NULL;
    pl->ghost_used = false;
}

/* Replace pl's ghost (pool lock held) with an empty one of n entries; false when out of memory
 * (the old one stays). What the old one remembered is dropped: it is a hint. */
static bool ghost_resize(struct seg_pool *pl, uint32_t n)
{
    void *g = mmap(NULL, ghost_map_bytes(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (g == MAP_FAILED) return false;
    ghost_drop(pl);
    pl->ghost = g;
    pl->ghost_mask = n - 1;
    return true;
}

int evict_pool_prepare(struct seg_pool *pl, enum seg_policy policy, uint64_t capacity)
{
    pl->lfu_floor = LFU_INIT;
    if (policy != SEG_POLICY_S3FIFO) return 0; /* a ghost is kept for a change back */
    uint64_t want = capacity / GHOST_BYTES_PER_ENTRY;
    uint32_t n = GHOST_MIN;
    while (n < want && n < GHOST_MAX) n <<= 1;
    /* sized again when the quota changes: a raised quota gets a ghost to match */
    if (pl->ghost && pl->ghost_mask + 1 == n) return 0;
    return ghost_resize(pl, n) ? 0 : -1;
}

void evict_pool_free(struct seg_pool *pl) { ghost_drop(pl); }

void evict_forget(struct seg_pool *pl, struct item *it)
{
    if (LOAD(&pl->policy) == SEG_POLICY_S3FIFO) ghost_put(pl, XXH3_64bits(item_key(it), it->nkey));
}

/* ---- admission and reads ------------------------------------------------------------------ */

/* Does a key of a `len`-byte record, back from the ghost, go straight to main? Always when the
 * record is no larger than the pool's lower tercile of new records (size_low, before this one,
 * with 1/64 to spare so that a load of one size is never turned away), else with the
 * probability (that size / len)^4. A cache is judged by its hits, and a large item takes the
 * room of several small ones as likely to be asked for again: a large one goes through the small
 * queue again (promoted if it is read there), so main holds more, smaller items. A quantile, not
 * the mean: a few huge values must not make every ordinary one look small; the lower tercile,
 * not the median: with two sizes half and half the median is anywhere between them. Measured
 * (docs/benchmarks.md, session 7): at -m 8 this took the zipf miss ratio from 26% to 23.4% and
 * the items held from 12,300 to 17,000. */
static bool s3_ghost_admit(uint32_t len, uint64_t low)
{
    uint64_t t = low + (low >> 6), l16 = (uint64_t)len << 4;
    if (low == 0 || l16 <= t) return true;
    uint64_t r = (t << 10) / l16; /* (t / len) in 1/1024, < 1024 */
    r = r * r >> 10;
    r = r * r >> 10; /* ^4 */
    return (rng_next() & 1023) < r;
}

int evict_admit(struct seg_pool *pl, struct item *it, uint64_t hv)
{
    switch (LOAD(&pl->policy)) {
    case SEG_POLICY_LFU:
        it->clock = LFU_INIT;
        return Q_MAIN;
    case SEG_POLICY_S3FIFO: {
        it->clock = 0;
        uint32_t len = (uint32_t)seg_item_size(it);
        /* Streaming lower tercile in 1/16 bytes (pool lock held): one step up for a larger new
         * record, two down for a smaller one, so it settles where a third are smaller. */
        uint32_t low = pl->size_low, l16 = len < (1u << 27) ? len << 4 : 1u << 31;
        uint32_t step = (low >> S3_LOW_STEP_SHIFT) + 1;
        if (low == 0) pl->size_low = l16;
        else if (l16 > low) pl->size_low = low + step;
        else if (l16 < low) pl->size_low = low - 2 * step;
        /* A key back from the ghost goes to main only once main has begun (with items promoted
         * by reads): before that, as in a fill that reads nothing, main's head would be a whole
         * segment holding the few keys ghost matches sent there, never filled and never a
         * victim (victims are sealed segments), one segment of -m lost (bench-memory). */
        bool main_begun = pl->q[Q_MAIN].cur != SEG_NONE || pl->q[Q_MAIN].head != SEG_NONE;
        return main_begun && ghost_take(pl, hv) && s3_ghost_admit(len, low) ? Q_MAIN : Q_SMALL;
    }
    default:
        it->clock = 0;
        return Q_MAIN;
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

void seg_bump(struct segs *s, struct item *it, uint32_t now)
{
    const struct seg_pool *pl = s->pools[it->nsid % STORE_NS_MAX];
    uint8_t policy = pl ? LOAD(&pl->policy) : SEG_POLICY_LRU;
    uint8_t v = LOAD(&it->clock);
    switch (policy) {
    case SEG_POLICY_LFU: {
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
    case SEG_POLICY_S3FIFO:
        while ((v & S3_FREQ) < S3_FREQ &&
               !__atomic_compare_exchange_n(&it->clock, &v, (uint8_t)(v + 1), false,
                                            __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
        break;
    default:
        if (!(v & 1)) STORE(&it->clock, 1);
        break;
    }
}

/* ---- victims (pool lock held) ------------------------------------------------------------- */

int evict_victim_queue(struct seg_pool *pl)
{
    if (LOAD(&pl->policy) != SEG_POLICY_S3FIFO) return Q_MAIN;
    uint32_t n = LOAD(&pl->nsegs);
    uint32_t target = n * S3_SMALL_PERCENT / 100;
    if (target == 0) target = 1;
    if (pl->q[Q_SMALL].len >= target || pl->q[Q_MAIN].head == SEG_NONE) return Q_SMALL;
    return Q_MAIN;
}

bool evict_keep(struct seg_pool *pl, int q, struct item *it, uint32_t now, int *to)
{
    uint8_t v = LOAD(&it->clock);
    *to = Q_MAIN;
    switch (LOAD(&pl->policy)) {
    case SEG_POLICY_LFU:
        return lfu_decayed(it, now) > pl->lfu_floor;
    case SEG_POLICY_S3FIFO:
        if (!(v & S3_FREQ)) return false;
        /* from small: promoted at frequency 0; in main: another turn, one frequency fewer.
         * A concurrent seg_bump may be adding one: keep its increment. */
        if (q == Q_SMALL) __atomic_fetch_and(&it->clock, (uint8_t)~S3_FREQ, __ATOMIC_RELAXED);
        else __atomic_fetch_sub(&it->clock, 1, __ATOMIC_RELAXED);
        return true;
    default:
        if (!(v & 1)) return false;
        __atomic_fetch_and(&it->clock, (uint8_t)~1, __ATOMIC_RELAXED);
        return true;
    }
}

void evict_victim_done(struct seg_pool *pl, uint64_t kept, uint64_t seen)
{
    if (LOAD(&pl->policy) != SEG_POLICY_LFU || seen == 0) return;
    /* moving average (weight 1/16) of the share of victims' bytes kept */
    uint32_t share = (uint32_t)(kept * 1024 / seen);
    pl->lfu_kept = pl->lfu_kept - pl->lfu_kept / 16 + share / 16;
    if (pl->lfu_kept > LFU_KEPT_HIGH && pl->lfu_floor < 254) {
        pl->lfu_floor++;
        pl->lfu_kept = 512;
    } else if (pl->lfu_kept < LFU_KEPT_LOW && pl->lfu_floor > LFU_INIT) {
        pl->lfu_floor--;
        pl->lfu_kept = 512;
    }
}
