/* seg_int.h — the segmented log's private structures, shared by seg.c (arena, pools, allocation),
 * seg_reclaim.c (cleaning, eviction, trimming), seg_run.c (runs of segments), seg_walk.c
 * (walkers, figures) and evict.c (policies). Nothing else includes it.
 *
 * A segment is free, a pool's head (being appended to), sealed (in one of its pool's FIFO
 * queues, in seal order), the start of a run (one item larger than a segment over `nrun`
 * contiguous segments, queued like a sealed segment) or the rest of a run. The segment after a
 * run may hold the end of the run's item in [0, start) and records of its own from `start` on
 * (the run "shares its tail"): it is a head or sealed like any other, but is never freed while
 * start > 0; when the run's item goes, a dead filler record covers [0, start) and start is 0.
 * Segments being worked on by a cleaner with the pool lock released are BUSY.
 * seg_run.c places runs; seg_reclaim.c cleans and evicts; both use the helpers declared below. */
#ifndef SHOAL_NODE_SEG_INT_H
#define SHOAL_NODE_SEG_INT_H

#include <pthread.h>

#include "node/seg.h"

#define SEG_BUCKET_DIRECT 8192u /* records up to this size find their bucket in a table */

/* SS_HELD: withheld from the pools for the index and the ghost (seg_withhold), pages dropped. */
enum seg_state { SS_FREE, SS_HEAD, SS_SEALED, SS_RUN, SS_RUN_TAIL, SS_BUSY, SS_HELD };

/* Queues of a pool: every policy uses Q_MAIN; s3fifo adds Q_SMALL for new items. */
enum { Q_MAIN, Q_SMALL, Q_COUNT };

struct seg_meta {
    uint32_t woff;  /* bytes written from the segment start (pool lock) */
    uint32_t live;  /* bytes of records not dead (atomic) */
    uint32_t pins;  /* records in flight (atomic) */
    uint32_t gen;   /* bumped when records move or the segment is reused (pool lock) */
    uint32_t prev, next; /* the pool queue, oldest first */
    uint32_t nrun;  /* SS_RUN: segments in the run (without a shared tail segment) */
    uint32_t start; /* offset of the first record: the end of the run before it, or 0 */
    uint32_t sealed_at; /* the pool's seal_seq when it was last sealed */
    uint32_t run_of;    /* start > 0: the run whose item ends here */
    uint16_t nsid;  /* owning pool, while not free (relaxed atomic for walkers) */
    uint8_t state;  /* enum seg_state (relaxed atomic for walkers) */
    uint8_t queue;  /* Q_MAIN or Q_SMALL */
    uint8_t shares_tail; /* SS_RUN: the item ends in segment start + nrun, which holds records */
    uint8_t touched; /* taken by a pool since its pages were last dropped (free_lock) */
};

struct seg_queue {
    uint32_t head, tail; /* oldest, newest sealed segment (or run) */
    uint32_t len;        /* segments in the queue (a run counts its nrun) */
    uint32_t cur;        /* the head segment being appended to, or SEG_NONE */
};

typedef uint8_t ghost_fp_t; /* an s3fifo ghost entry (evict.c) */

struct seg_pool {
    pthread_mutex_t lock;
    struct segs *segs;
    uint16_t id;
    uint8_t policy;       /* enum seg_policy; relaxed atomic, read on every hit */
    uint8_t lfu_floor;    /* lfu: counters at or below it are evicted */
    uint32_t lfu_kept;    /* lfu: kept share of victims' bytes, 1/1024 units, moving average */
    uint32_t clean_skip;  /* the last cleaning victim that freed too little: not chosen next */
    uint32_t seal_seq;    /* seals so far (pool lock) */
    uint32_t nsegs;       /* segments owned (free_lock; read relaxed elsewhere) */
    uint32_t quota_segs;  /* 0: no quota of its own (free_lock; read relaxed elsewhere) */
    struct seg_queue q[Q_COUNT];
    ghost_fp_t *ghost;    /* s3fifo: fingerprints of keys recently evicted from the small queue */
    uint32_t ghost_mask;
    uint32_t size_low;    /* s3fifo: estimated lower tercile of new records' sizes, 1/16 B */
    bool ghost_used;      /* written at least once: counted in segs->ghost_bytes (evict.c) */
    struct seg_counters *bk; /* per bucket, [0..nbuckets] */
} __attribute__((aligned(64)));

struct segs {
    char *base;
    size_t mapped;
    uint32_t seg_size;
    unsigned seg_shift;
    uint32_t nsegs;
    uint32_t item_max;
    int nbuckets;
    uint32_t size[SEG_CLASS_MAX + 1];
    /* bucket of a record of n <= SEG_BUCKET_DIRECT bytes: direct[(n + 3) / 4] (every command
     * counts per class, so this is on the hot path) */
    uint8_t direct[SEG_BUCKET_DIRECT / SEG_ALIGN + 1];
    struct seg_meta *meta;

    pthread_mutex_t free_lock; /* the free map, pool segment counts, quotas, pools[] creation */
    uint64_t *freemap;         /* bit set: segment free */
    uint32_t nfree;
    uint32_t free_hint;        /* lowest word that may have a free bit */
    /* Segments withheld from the pools so that -m also bounds the index and the ghosts
     * (seg_withhold): `held` are out of the free map in state SS_HELD, `held_want` is the
     * target; while held < held_want, pools without a quota leave the difference free. */
    uint32_t held, held_want;
    uint64_t ghost_bytes;      /* all pools' ghost arrays in use (atomic) */
    bool huge;                 /* item memory advised MADV_HUGEPAGE (seg_advise_huge) */
    uint64_t index_bytes;      /* the index's bytes at the last seg_set_reserve (atomic) */
    struct seg_pool *pools[STORE_NS_MAX];
};

#define SEG_LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define SEG_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

static inline char *seg_base(const struct segs *s, uint32_t i)
{
    return s->base + ((size_t)i << s->seg_shift);
}
static inline uint32_t seg_of(const struct segs *s, const void *p)
{
    return (uint32_t)(((const char *)p - s->base) >> s->seg_shift);
}
static inline uint8_t rec_state(struct item *it)
{
    return __atomic_load_n(&it->iflags, __ATOMIC_ACQUIRE);
}
static inline struct seg_pool *seg_pool_at(struct segs *s, uint16_t nsid)
{
    return __atomic_load_n(&s->pools[nsid % STORE_NS_MAX], __ATOMIC_ACQUIRE);
}

/* Segments [lo, hi) kept out of a search (lo == hi: none). */
struct seg_span {
    uint32_t lo, hi;
};
#define NO_SPAN ((struct seg_span){0, 0})

static inline bool in_span(struct seg_span x, uint32_t i) { return i >= x.lo && i < x.hi; }

/* Pages beyond what the pool is guaranteed: all of them without a quota. */
static inline uint32_t pool_excess(const struct seg_pool *pl)
{
    uint32_t n = SEG_LOAD(&pl->nsegs), q = SEG_LOAD(&pl->quota_segs);
    return n > q ? n - q : 0;
}

/* seg.c: queue operations (pool lock held). */
void seg_q_push(struct segs *s, struct seg_pool *pl, int q, uint32_t i);
void seg_q_remove(struct segs *s, struct seg_pool *pl, uint32_t i);
/* seg.c: make free segment i (just taken for pl) queue q's head (its old head stays: seal it
 * first). */
void seg_install_head(struct segs *s, struct seg_pool *pl, int q, uint32_t i);
/* seg.c: seal queue q's head segment into its FIFO. */
void seg_seal_head(struct segs *s, struct seg_pool *pl, int q);
/* seg.c: free map (takes free_lock). Take one free segment for pl (force: ignore quotas and
 * what others are owed), or SEG_NONE. */
uint32_t seg_take_free(struct segs *s, struct seg_pool *pl, bool force);
/* seg.c: n contiguous free segments for pl (quotas as seg_take_free), or SEG_NONE. */
uint32_t seg_take_run(struct segs *s, struct seg_pool *pl, uint32_t n);
/* seg.c: give `n` segments from `i` (owned by pl, or by nobody when pl is NULL) to the free map. */
void seg_release(struct segs *s, struct seg_pool *pl, uint32_t i, uint32_t n);
/* seg.c: count a record given up by a visitor in pl's bucket counters (pool lock held). */
void seg_count_gone(struct seg_pool *pl, const struct item *it, enum seg_visit why, int r);
/* seg.c: ghost_bytes changed: withhold for it (pool lock held allowed). */
void seg_ghost_grew(struct segs *s);
/* seg.c: mark a record dead and uncount its bytes. */
void seg_kill(struct segs *s, struct item *it, uint32_t len);

/* Steps one allocation may spend clearing windows (seg_make_run, seg_head_from_window, and the
 * windows nested in them): a segment emptied or tried for a window, or a run slid down, is one.
 * The calls fail once none is left, so that an allocation always ends (seg_run.c). In
 * test_seg_stress most calls spend under 64, and about 1 in 1,000 allocations that clear
 * windows spends them all (then evicts). */
#define SEG_RUN_STEPS 1024u

/* seg_reclaim.c: make room in pool pl (lock held) so that queue q's head can take `need` bytes:
 * clean, evict or take a segment from elsewhere; `hard`: a victim keeps nothing. Segments
 * sealed after seal_seq `since` (during this allocation) are not cleaned again: their dead bytes
 * are what the head just lacked, and two of them would trade it back and forth. Returns false
 * when nothing could be done. `steps`: the allocation's budget (SEG_RUN_STEPS). */
bool seg_reclaim(struct segs *s, struct seg_pool *pl, int q, uint32_t need, bool hard,
                 uint32_t since, uint32_t *steps, seg_visit_fn fn, void *ctx);
/* seg_run.c: contiguous segments for a run of pool pl (lock held, may be released and retaken)
 * holding an item of `len` bytes, clearing the cheapest window when no free one exists. Returns
 * its first segment, or SEG_NONE; *nw: the segments taken. The item begins at the first one's
 * `start`: 0, or the end of another run of pl in its last segment (a tail window). `own`: only
 * of segments pl owns, and evicting nothing (SEG_NONE if that cannot be done). */
uint32_t seg_make_run(struct segs *s, struct seg_pool *pl, uint32_t len, bool own, uint32_t *nw,
                      uint32_t *steps, seg_visit_fn fn, void *ctx);
/* seg_reclaim.c: give back at least one segment of pool pl (lock held) without evicting, by
 * moving live items of the segments with the most dead bytes into its heads; only while the
 * pool is below 90% live. False when that freed nothing. */
bool seg_consolidate(struct segs *s, struct seg_pool *pl, seg_visit_fn fn, void *ctx);
/* seg_reclaim.c: give at least one segment of pool pl (lock held) back to the free segments:
 * by consolidating while below 90% live, else by evicting as the policy chooses (victims keep
 * what it keeps), seg_shrink as a last resort. False when nothing could be given. */
bool seg_give_back(struct segs *s, struct seg_pool *pl, seg_visit_fn fn, void *ctx);
/* seg_reclaim.c: give one segment (or run) of pool pl (lock held) back to the free segments,
 * evicting what it holds. False when nothing could be given. */
bool seg_shrink(struct segs *s, struct seg_pool *pl, seg_visit_fn fn, void *ctx);
/* seg_reclaim.c: write a dead record covering [at, at + len) (len a multiple of 4, >= 24). */
void seg_put_filler(char *at, uint32_t len);
/* seg_reclaim.c: clean a sealed segment of pool pl (lock held) at least 3/4 dead (not sealed
 * after `since`) into queue q's head, or free a run whose item is gone. False if none. */
bool seg_reuse_dead(struct segs *s, struct seg_pool *pl, int q, uint32_t since, seg_visit_fn fn,
                    void *ctx);
/* seg_reclaim.c: is pool pl (lock held) below 90% live bytes of what it may own? */
bool seg_pool_roomy(struct segs *s, struct seg_pool *pl);
/* seg_reclaim.c: would quota'd pool pl (lock held) stay below 90% of its quota with `more` live
 * bytes? (seg_pool_roomy measures against the segments owned, beyond the quota too.) */
bool seg_pool_fits_quota(struct segs *s, struct seg_pool *pl, uint64_t more);
/* seg_reclaim.c: run v's item is gone: the segment holding its end (if it shares it) starts at 0
 * again, the end covered by a dead record (pool lock held). */
void seg_run_tail_fix(struct segs *s, uint32_t v);
/* seg_reclaim.c: free a run whose item is gone (pool lock held). */
void seg_run_release(struct segs *s, struct seg_pool *pl, uint32_t v);
/* seg_reclaim.c: clean (evict false) or evict from victim v of pool pl (lock held; sealed, not
 * pinned). `drop`: keep nothing; `want`: the queue whose head the caller needs; `release`: free
 * the victim if emptied. Returns the room left in the victim. */
uint32_t seg_process(struct segs *s, struct seg_pool *pl, uint32_t v, bool evict, bool drop,
                     int want, bool release, seg_visit_fn fn, void *ctx);
/* seg_reclaim.c: the sealed segment of pl with the most dead bytes, if cleaning it frees at least
 * `need` and 1/16 of a segment, other than `skip` and those in spans a and b, whose room once
 * emptied is at least `cap`, not sealed after `since`; a run whose item is gone wins at once.
 * SEG_NONE if none. */
uint32_t seg_clean_candidate_in(struct segs *s, struct seg_pool *pl, uint32_t need, uint32_t cap,
                                uint32_t skip, struct seg_span a, struct seg_span b,
                                uint32_t since);
/* seg_run.c: clear a window of one segment without evicting (pool pl's lock held, released
 * meanwhile) and make it queue q's head. True when it did. */
bool seg_head_from_window(struct segs *s, struct seg_pool *pl, int q, uint32_t *steps,
                          seg_visit_fn fn, void *ctx);

/* evict.c: policy state of a new item of pool pl; returns the queue it goes to (s3fifo). */
int evict_admit(struct seg_pool *pl, struct item *it, uint64_t hv);
/* evict.c: a live item of a victim segment of queue q: true to keep it (its state is updated:
 * a CLOCK bit cleared, a counter decremented), false to evict it. *to: the queue it stays in. */
bool evict_keep(struct seg_pool *pl, int q, struct item *it, uint32_t now, int *to);
/* evict.c: after one victim segment: `kept` of `seen` live bytes were kept (lfu's floor). */
void evict_victim_done(struct seg_pool *pl, uint64_t kept, uint64_t seen);
/* evict.c: remember an evicted key (s3fifo's ghost). */
void evict_forget(struct seg_pool *pl, struct item *it);
/* evict.c: which queue the next victim comes from. */
int evict_victim_queue(struct seg_pool *pl);
int evict_pool_prepare(struct seg_pool *pl, enum seg_policy policy, uint64_t capacity);
void evict_pool_free(struct seg_pool *pl);


#endif
