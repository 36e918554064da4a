/* seg_reclaim.c — making room in the segmented log (see seg.h): cleaning, eviction, taking
 * segments from pools beyond their guarantee, trimming pools over a lowered quota, and clearing
 * windows of contiguous segments for large items (runs).
 *
 * Cleaning and eviction work on one victim segment at a time, in place: its records are walked
 * from the start; a live item the victim keeps (every one when cleaning, those the policy keeps
 * when evicting) is moved by the store's visitor into the destination queue's head while that
 * has room, otherwise slid down to the lowest free offset of the victim itself. Dead records and
 * evicted items leave room behind. The victim then becomes the destination queue's head with
 * its kept items at its start, or, emptied, the head the allocation asked for. So a cleaned or
 * evicted segment re-enters its queue as the newest (FIFO-reinsertion, i.e. CLOCK), and no free
 * segment is needed to make room.
 *
 * A record the victim cannot move (its shard is busy, the allocating caller holds it, it is
 * being freed right now) stays where it is; the gap before it becomes one dead filler record, so
 * the segment stays walkable from its start. */
#include "node/seg_int.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define LOAD SEG_LOAD
#define STORE SEG_STORE


#define CLEAN_MIN_DEAD_SHIFT 4 /* cleaning a segment must free at least 1/16 of it */
#define VICTIM_SKIP 8           /* pinned segments skipped at a queue's head before giving up */
#define RUN_WINDOW_TRIES 6      /* windows tried for one run (the last one evicting) */
#define RUN_BUSY_ROUNDS 200     /* retries of a busy item while clearing a window */
#define RUN_SLIDES_MAX 16       /* runs slid down for one nested window */
#define WINDOW_DEST_TRIES 32    /* segments cleaned for one item moved out of a window */

/* Live bytes of pool pl (lock held): its heads and queues. */
static uint64_t pool_live(struct segs *s, struct seg_pool *pl)
{
    uint64_t live = 0;
    for (int q = 0; q < Q_COUNT; q++) {
        if (pl->q[q].cur != SEG_NONE) live += LOAD(&s->meta[pl->q[q].cur].live);
        for (uint32_t i = pl->q[q].head; i != SEG_NONE; i = s->meta[i].next)
            live += LOAD(&s->meta[i].live);
    }
    return live;
}

bool seg_pool_roomy(struct segs *s, struct seg_pool *pl)
{
    uint64_t segs = LOAD(&pl->quota_segs);
    if (segs == 0 || LOAD(&pl->nsegs) > segs) segs = LOAD(&pl->nsegs);
    /* -m bounds the index and the ghosts too (seg_withhold): the 90% rule is of -m, so what is
     * withheld for them counts as room of a pool sharing what quotas leave */
    if (!LOAD(&pl->quota_segs)) segs += LOAD(&s->held);
    return pool_live(s, pl) * 10 < segs * s->seg_size * 9;
}

void seg_put_filler(char *at, uint32_t len)
{
    struct item *f = (struct item *)at;
    f->nkey = 0;
    f->nbytes = len - (uint32_t)ITEM_HEADER;
    __atomic_store_n(&f->iflags, (uint8_t)ITEM_SEG_DEAD, __ATOMIC_RELEASE);
}

/* The queue a victim's kept items go to: s3fifo's small queue promotes what it keeps. */
static inline int victim_dest(int q, bool evict) { return evict && q == Q_SMALL ? Q_MAIN : q; }

/* Run v's item is gone: the segment holding its end (if it shares it) starts at 0 again, the end
 * covered by a dead record (pool lock held). */
static void run_tail_fix(struct segs *s, uint32_t v)
{
    struct seg_meta *m = &s->meta[v];
    if (!m->shares_tail) return;
    m->shares_tail = 0;
    struct seg_meta *t = &s->meta[v + m->nrun];
    seg_put_filler(seg_base(s, v + m->nrun), t->start);
    t->start = 0;
    t->run_of = SEG_NONE;
    STORE(&t->gen, t->gen + 1);
}

/* Free a run whose item is gone (pool lock held). */
static void run_release(struct segs *s, struct seg_pool *pl, uint32_t v)
{
    seg_q_remove(s, pl, v);
    run_tail_fix(s, v);
    seg_release(s, pl, v, s->meta[v].nrun);
}

/* Evict or keep the item of run v (pool lock held). Returns true if the run was freed. */
static bool process_run(struct segs *s, struct seg_pool *pl, uint32_t v, bool evict, bool drop,
                        seg_visit_fn fn, void *ctx)
{
    struct seg_meta *m = &s->meta[v];
    struct item *it = (struct item *)seg_base(s, v);
    if (LOAD(&m->pins)) return false;
    uint8_t f = rec_state(it);
    if ((f & ITEM_LINKED) && evict) {
        int to = Q_MAIN;
        if (!drop && evict_keep(pl, m->queue, it, clock_now(), &to)) {
            seg_q_remove(s, pl, v);
            seg_q_push(s, pl, to, v); /* reinserted without a copy */
            return false;
        }
        uint32_t len = (uint32_t)seg_item_size(it);
        int r = fn(ctx, it, SEG_VISIT_EVICT, NULL);
        if (r & SEG_GONE) {
            seg_count_gone(pl, it, SEG_VISIT_EVICT, r);
            if (!(r & SEG_GONE_EXPIRED) && m->queue == Q_SMALL) evict_forget(pl, it);
            seg_kill(s, it, len);
        }
    }
    if (LOAD(&m->live) != 0 || LOAD(&m->pins) != 0) return false;
    run_release(s, pl, v);
    return true;
}

/* Make segment v (sealed, its records compacted below woff) queue q's head. */
static void become_head(struct segs *s, struct seg_pool *pl, int q, uint32_t v)
{
    seg_seal_head(s, pl, q);
    struct seg_meta *m = &s->meta[v];
    m->queue = (uint8_t)q;
    STORE(&m->state, (uint8_t)SS_HEAD);
    pl->q[q].cur = v;
}

/* Clean (evict false) or evict from victim v of pool pl (lock held; sealed, not pinned), as the
 * file comment says. `drop`: keep nothing (a segment given away). `want`: the queue whose head
 * the caller needs. Returns the room left in the victim (its unused end counts: a segment sealed
 * early is worth cleaning for it alone). On return the victim is a head, or free when `release`
 * and it was emptied. */
static uint32_t process(struct segs *s, struct seg_pool *pl, uint32_t v, bool evict, bool drop,
                        int want, bool release, seg_visit_fn fn, void *ctx)
{
    struct seg_meta *m = &s->meta[v];
    int q = m->queue, dq = victim_dest(q, evict);
    seg_q_remove(s, pl, v);
    STORE(&m->state, (uint8_t)SS_BUSY);
    char *base = seg_base(s, v);
    uint32_t end = m->woff, r = m->start, w = m->start, now = clock_now();
    uint64_t kept = 0, seen = 0;
    while (r < end) {
        struct item *it = (struct item *)(base + r);
        uint32_t len = (uint32_t)seg_item_size(it), next = r + len;
        uint8_t f = rec_state(it);
        if (f & ITEM_SEG_DEAD) {
            r = next;
            continue;
        }
        bool fixed = true; /* stays where it is */
        if (f & ITEM_LINKED) {
            seen += len;
            int to = dq;
            bool keep = !drop && (!evict || evict_keep(pl, q, it, now, &to));
            if (!keep) {
                int rv = fn(ctx, it, SEG_VISIT_EVICT, NULL);
                if (rv & SEG_GONE) {
                    seg_count_gone(pl, it, SEG_VISIT_EVICT, rv);
                    if (!(rv & SEG_GONE_EXPIRED) && q == Q_SMALL) evict_forget(pl, it);
                    seg_kill(s, it, len);
                    fixed = false;
                }
            } else {
                uint32_t h = pl->q[dq].cur;
                bool away = h != SEG_NONE && s->meta[h].woff + len <= s->seg_size;
                struct item *dst = away ? (struct item *)(seg_base(s, h) + s->meta[h].woff)
                                        : (struct item *)(base + w);
                if (!away && w + sizeof(struct item) > r && w != r) dst = NULL; /* too close */
                int rv = dst == it ? SEG_MOVED : dst ? fn(ctx, it, SEG_VISIT_MOVE, dst) : 0;
                if (rv & SEG_MOVED) {
                    kept += len;
                    if (away) {
                        s->meta[h].woff += len;
                        __atomic_fetch_add(&s->meta[h].live, len, __ATOMIC_RELAXED);
                        __atomic_fetch_sub(&m->live, len, __ATOMIC_RELAXED);
                        fixed = false;
                    } else {
                        w += len;
                        r = next;
                        continue;
                    }
                } else if (rv & SEG_GONE) {
                    seg_count_gone(pl, it, SEG_VISIT_MOVE, rv);
                    seg_kill(s, it, len);
                    fixed = false;
                }
            }
        }
        if (fixed) {
            if (w < r) seg_put_filler(base + w, r - w);
            w = next;
        }
        r = next;
    }
    m->woff = w;
    STORE(&m->gen, m->gen + 1);
    if (evict) evict_victim_done(pl, kept, seen);
    else pl->bk[0].segs_cleaned++;
    bool empty = w == m->start;
    if (empty && m->start == 0 && release && LOAD(&m->live) == 0) {
        seg_release(s, pl, v, 1);
    } else if (empty && pl->q[want].cur == SEG_NONE) {
        m->queue = (uint8_t)want;
        STORE(&m->state, (uint8_t)SS_HEAD);
        pl->q[want].cur = v;
    } else {
        /* The head with more room stays: a victim left with less (the end of a run in it, items
         * that could not move) is sealed again instead, so that room only grows over successive
         * victims (an item of nearly a segment needs almost all of one). */
        int tq = empty ? want : dq;
        uint32_t h = pl->q[tq].cur;
        if (h != SEG_NONE && s->seg_size - s->meta[h].woff > s->seg_size - w) {
            m->sealed_at = ++pl->seal_seq;
            STORE(&m->state, (uint8_t)SS_SEALED);
            seg_q_push(s, pl, tq, v);
        } else {
            become_head(s, pl, tq, v);
        }
    }
    return s->seg_size - w;
}

/* Segments [lo, hi) kept out of a search (lo == hi: none). */
struct seg_span {
    uint32_t lo, hi;
};
#define NO_SPAN ((struct seg_span){0, 0})

static inline bool in_span(struct seg_span x, uint32_t i) { return i >= x.lo && i < x.hi; }

/* The sealed segment of pl with the most dead bytes, if cleaning it frees at least `need` and
 * 1/16 of a segment, other than `skip` and those in spans a and b, and whose room once emptied
 * (the segment less the end of a run it holds) is at least `cap`; a run whose item is gone wins
 * at once. SEG_NONE if none. */
static uint32_t clean_candidate_in(struct segs *s, struct seg_pool *pl, uint32_t need,
                                   uint32_t cap, uint32_t skip, struct seg_span a,
                                   struct seg_span b, uint32_t since)
{
    uint32_t best = SEG_NONE, most = 0;
    uint32_t min = s->seg_size >> CLEAN_MIN_DEAD_SHIFT;
    if (min < need) min = need;
    for (int q = 0; q < Q_COUNT; q++)
        for (uint32_t i = pl->q[q].head; i != SEG_NONE; i = s->meta[i].next) {
            struct seg_meta *m = &s->meta[i];
            if (LOAD(&m->pins) || i == skip || in_span(a, i) || in_span(b, i)) continue;
            if ((int32_t)(m->sealed_at - since) > 0) continue; /* sealed since `since` */
            uint32_t live = LOAD(&m->live);
            if (m->state == SS_RUN) {
                if (live == 0) return i;
                continue;
            }
            if (s->seg_size - m->start < cap) continue;
            uint32_t dead = s->seg_size - m->start - live;
            if (dead >= min && dead > most) {
                most = dead;
                best = i;
            }
        }
    return best;
}

static uint32_t clean_candidate(struct segs *s, struct seg_pool *pl, uint32_t need,
                                uint32_t skip)
{
    return clean_candidate_in(s, pl, need, 0, skip, NO_SPAN, NO_SPAN, pl->seal_seq);
}

/* The oldest unpinned victim of queue q (SEG_NONE if none near its head). */
static uint32_t oldest(struct segs *s, struct seg_pool *pl, int q)
{
    uint32_t i = pl->q[q].head;
    for (int k = 0; i != SEG_NONE && k < VICTIM_SKIP; k++, i = s->meta[i].next)
        if (LOAD(&s->meta[i].pins) == 0) return i;
    return SEG_NONE;
}

/* Evict from the oldest victim of pl (lock held). `drop`: keep nothing, `release`: free the
 * emptied victim. Returns true if something was freed or a victim was recycled. */
static bool evict_one(struct segs *s, struct seg_pool *pl, int want, bool drop, bool release,
                      seg_visit_fn fn, void *ctx)
{
    int vq = evict_victim_queue(pl);
    uint32_t v = oldest(s, pl, vq);
    if (v == SEG_NONE) v = oldest(s, pl, 1 - vq);
    if (v == SEG_NONE) return false;
    if (s->meta[v].state == SS_RUN) {
        process_run(s, pl, v, true, drop, fn, ctx);
        return true;
    }
    process(s, pl, v, true, drop, want, release, fn, ctx);
    return true;
}

/* Pages beyond what the pool is guaranteed: all of them without a quota. */
static inline uint32_t pool_excess(const struct seg_pool *pl)
{
    uint32_t n = LOAD(&pl->nsegs), q = LOAD(&pl->quota_segs);
    return n > q ? n - q : 0;
}

/* Have the pool (other than `to`) with the most segments beyond its guarantee give one back to
 * the free segments. No pool lock held. Returns true if one was given. */
static bool steal_from_pools(struct segs *s, struct seg_pool *to, seg_visit_fn fn, void *ctx)
{
    struct seg_pool *best = NULL;
    uint32_t most = 0;
    for (int i = 0; i < STORE_NS_MAX; i++) {
        struct seg_pool *pl = seg_pool_at(s, (uint16_t)i);
        if (!pl || pl == to) continue;
        uint32_t ex = pool_excess(pl);
        if (ex > most) {
            most = ex;
            best = pl;
        }
    }
    if (!best) return false;
    pthread_mutex_lock(&best->lock);
    uint32_t before = LOAD(&best->nsegs);
    evict_one(s, best, Q_MAIN, true, true, fn, ctx);
    bool gave = LOAD(&best->nsegs) < before;
    pthread_mutex_unlock(&best->lock);
    return gave;
}

static bool head_from_window(struct segs *s, struct seg_pool *pl, int q, seg_visit_fn fn,
                             void *ctx);

bool seg_reclaim(struct segs *s, struct seg_pool *pl, int q, uint32_t need, bool hard,
                 uint32_t since, seg_visit_fn fn, void *ctx)
{
    /* Under its quota with no free segment left (quotas raised after others filled memory):
     * take back what is owed from pools beyond their guarantee before touching our items. */
    uint32_t quota = LOAD(&pl->quota_segs);
    if (quota && LOAD(&pl->nsegs) < quota && LOAD(&s->nfree) == 0) {
        pthread_mutex_unlock(&pl->lock);
        bool gave = steal_from_pools(s, pl, fn, ctx);
        pthread_mutex_lock(&pl->lock);
        if (gave) return true;
    }
    if (seg_pool_roomy(s, pl)) {
        /* The victim's items first fill what is left of the head, then it becomes the head:
         * room accumulates over successive victims until the item fits. A victim whose dead
         * bytes sit before an item that cannot move (the caller's own, a busy one) may free
         * nothing: the next look passes it over. */
        uint32_t v = clean_candidate_in(s, pl, 0, need, pl->clean_skip, NO_SPAN, NO_SPAN, since);
        /* No victim can reach the room (an item of nearly a segment, the dead bytes all in
         * segments holding the end of a run): empty one plain segment elsewhere for the head,
         * as a window of one, its items moved into the heads. */
        if (v == SEG_NONE && need > s->seg_size / 2 && head_from_window(s, pl, q, fn, ctx))
            return true;
        if (v == SEG_NONE)
            v = clean_candidate_in(s, pl, 0, 0, pl->clean_skip, NO_SPAN, NO_SPAN, since);
        if (v != SEG_NONE) {
            if (s->meta[v].state == SS_RUN) {
                run_release(s, pl, v);
                return true;
            }
            if (process(s, pl, v, false, false, q, false, fn, ctx) > 0) return true;
            pl->clean_skip = v;
        }
    }
    if (evict_one(s, pl, q, hard, false, fn, ctx)) return true;
    /* Nothing of our own to evict (a pool whose segments are all heads or pinned): a pool
     * without a quota takes from the others. */
    if (quota == 0) {
        pthread_mutex_unlock(&pl->lock);
        bool gave = steal_from_pools(s, pl, fn, ctx);
        pthread_mutex_lock(&pl->lock);
        if (gave) return true;
    }
    /* Its only victim is the full head itself (a one-segment quota, the smallest allowed, or
     * every sealed segment pinned): seal it, so that the next round evicts from it. Without
     * this such a namespace refused every store once the rest of memory was in use. */
    uint32_t h = pl->q[q].cur;
    if (h == SEG_NONE || LOAD(&s->meta[h].pins) != 0) return false;
    seg_seal_head(s, pl, q);
    return true;
}

bool seg_shrink(struct segs *s, struct seg_pool *pl, seg_visit_fn fn, void *ctx)
{
    uint32_t before = LOAD(&pl->nsegs);
    if (!evict_one(s, pl, Q_MAIN, true, true, fn, ctx)) {
        /* only heads left: seal them so that the next round can give them back */
        bool any = false;
        for (int q = 0; q < Q_COUNT; q++) {
            any |= pl->q[q].cur != SEG_NONE;
            seg_seal_head(s, pl, q);
        }
        return any;
    }
    uint32_t gone = before - LOAD(&pl->nsegs);
    pl->bk[0].segs_trimmed += gone;
    return gone > 0;
}

bool seg_give_back(struct segs *s, struct seg_pool *pl, seg_visit_fn fn, void *ctx)
{
    uint32_t before = LOAD(&pl->nsegs);
    if (seg_consolidate(s, pl, fn, ctx)) return true;
    /* full: evict by the policy (a referenced item stays, moved forward) until a victim empties */
    for (uint32_t k = 0; k < before + 8 && LOAD(&pl->nsegs) >= before; k++)
        if (!evict_one(s, pl, Q_MAIN, false, true, fn, ctx)) break;
    return LOAD(&pl->nsegs) < before || seg_shrink(s, pl, fn, ctx);
}

bool seg_reuse_dead(struct segs *s, struct seg_pool *pl, int q, uint32_t since, seg_visit_fn fn,
                    void *ctx)
{
    uint32_t v = clean_candidate_in(s, pl, s->seg_size / 4 * 3, 0, pl->clean_skip, NO_SPAN,
                                    NO_SPAN, since);
    if (v == SEG_NONE) return false;
    if (s->meta[v].state == SS_RUN) {
        run_release(s, pl, v);
        return true;
    }
    if (process(s, pl, v, false, false, q, false, fn, ctx) > 0) return true;
    pl->clean_skip = v;
    return false;
}

bool seg_consolidate(struct segs *s, struct seg_pool *pl, seg_visit_fn fn, void *ctx)
{
    uint32_t before = LOAD(&pl->nsegs), skip = SEG_NONE;
    for (int k = 0; k < 16 && LOAD(&pl->nsegs) >= before; k++) {
        if (!seg_pool_roomy(s, pl)) return false;
        uint32_t v = clean_candidate(s, pl, 0, skip);
        if (v == SEG_NONE) return false;
        if (s->meta[v].state == SS_RUN) {
            run_release(s, pl, v);
            continue;
        }
        if (process(s, pl, v, false, false, s->meta[v].queue, true, fn, ctx) == 0) skip = v;
    }
    return LOAD(&pl->nsegs) < before;
}

uint32_t seg_trim(struct segs *s, uint32_t max, seg_visit_fn fn, void *ctx)
{
    uint32_t done = 0;
    for (int i = 0; i < STORE_NS_MAX && done < max; i++) {
        struct seg_pool *pl = seg_pool_at(s, (uint16_t)i);
        if (!pl) continue;
        while (done < max && LOAD(&pl->quota_segs) && pool_excess(pl) > 0) {
            pthread_mutex_lock(&pl->lock);
            uint32_t before = LOAD(&pl->nsegs);
            /* Moving live items together first: evicting (seg_shrink drops whole segments,
             * sealing the heads once only heads are left) is for a pool whose live bytes do not
             * fit. Before, lowering a quota evicted the items just stored into a pool holding
             * far less than its new quota. */
            bool ok = seg_consolidate(s, pl, fn, ctx) || seg_shrink(s, pl, fn, ctx);
            uint32_t after = LOAD(&pl->nsegs);
            pthread_mutex_unlock(&pl->lock);
            if (!ok) break; /* busy items: the next tick tries again */
            done += before > after ? before - after : 0;
        }
    }
    return done;
}

uint32_t seg_reserve(struct segs *s, uint32_t max, seg_visit_fn fn, void *ctx)
{
    uint32_t done = 0;
    for (int i = 0; i < STORE_NS_MAX && done < max; i++) {
        struct seg_pool *pl = seg_pool_at(s, (uint16_t)i);
        if (!pl || LOAD(&pl->nsegs) == 0) continue;
        pthread_mutex_lock(&pl->lock);
        /* Only a pool that will clean inline soon: no free segment it may take, room in it. */
        for (int q = 0; q < Q_COUNT && done < max; q++) {
            uint32_t h = pl->q[q].cur;
            if (h == SEG_NONE || s->meta[h].woff * 16 < s->seg_size * 15) continue;
            if (LOAD(&s->nfree) > 1 || !seg_pool_roomy(s, pl)) continue;
            uint32_t v = clean_candidate(s, pl, s->seg_size / 2, pl->clean_skip);
            if (v == SEG_NONE || s->meta[v].state == SS_RUN) continue;
            process(s, pl, v, false, false, q, false, fn, ctx);
            done++;
        }
        pthread_mutex_unlock(&pl->lock);
    }
    return done;
}

/* ---- runs --------------------------------------------------------------------------------- */

/* A window being cleared: its segments `w`, the window `x` it makes room for when nested (a run
 * found in x moves to w; NO_SPAN at depth 0) and the depth. `evict`: an item that finds no room
 * elsewhere is evicted; otherwise the window fails and the next one is tried. Only the last
 * window tried at depth 0 evicts (unless `keep`); a nested window holds no run and never
 * evicts. `own`: only segments `to` owns already (a head emptied for a store the pool may not
 * take a free segment for: its quota, or what quota'd pools are owed). */
struct window {
    struct seg_span w, x;
    int depth;
    bool evict, keep, own;
};

static uint32_t clear_window(struct segs *s, struct seg_pool *to, uint32_t n, struct window *wd,
                             seg_visit_fn fn, void *ctx);

/* May a window from `lo` clearing for pool `to` take segment i (read without locks: a guess,
 * re-checked under the owner's lock)? `plain`: not if it is a run; `own`: only if `to` owns it. */
static bool window_ok(struct segs *s, const struct seg_pool *to, uint32_t lo, uint32_t i,
                      bool plain, bool own, uint64_t *cost)
{
    struct seg_meta *m = &s->meta[i];
    uint8_t st = LOAD(&m->state);
    if (st == SS_FREE) return !own;
    if (own && LOAD(&m->nsid) != to->id) return false;
    if ((st != SS_SEALED && st != SS_RUN) || LOAD(&m->pins)) return false;
    /* a segment holding the end of a run is cleared only after that run, in the same window */
    if (LOAD(&m->start) && (m->run_of == SEG_NONE || m->run_of < lo)) return false;
    const struct seg_pool *ow = seg_pool_at(s, LOAD(&m->nsid));
    if (!ow) return false;
    if (ow != to && LOAD(&ow->quota_segs) && pool_excess(ow) == 0) return false;
    if (st == SS_RUN) {
        if (i + m->nrun > s->nsegs) return false;
        if (LOAD(&m->live) == 0) { /* its item is gone: nothing to move */
            *cost += 1;
            return true;
        }
        if (plain) return false;
        /* a run's item moves to free segments elsewhere (or to a window cleared for it), and
         * is evicted when there are none: a window of movable records costs far less */
        *cost += (uint64_t)LOAD(&m->live) * 64 + 1;
        return true;
    }
    *cost += LOAD(&m->live) + 1;
    return true;
}

/* The window of n segments with the fewest live bytes that may be cleared for `to`, other than
 * those from the `nskip` starts in `skip` and any overlapping x; `plain`: one holding no run. */
static uint32_t cheapest_window(struct segs *s, const struct seg_pool *to, uint32_t n,
                                const uint32_t *skip, int nskip, struct seg_span x, bool plain,
                                bool own)
{
    uint32_t best = SEG_NONE;
    uint64_t low = UINT64_MAX;
    for (uint32_t i = 0; i + n <= s->nsegs; i++) {
        bool skipped = false;
        for (int j = 0; j < nskip; j++) skipped |= skip[j] == i;
        if (skipped || (i < x.hi && i + n > x.lo)) continue;
        uint64_t cost = 0;
        uint32_t k = i;
        bool ok = true;
        while (ok && k < i + n) {
            ok = window_ok(s, to, i, k, plain, own, &cost);
            if (ok) k += LOAD(&s->meta[k].state) == SS_RUN ? s->meta[k].nrun : 1;
        }
        /* a run sticking out of the window is cleared whole */
        if (ok && cost < low) {
            low = cost;
            best = i;
        }
    }
    return best;
}

/* Room for `len` bytes at the head of pool ow's queue q (lock held) for an item moved out of a
 * window being cleared: the head as it is, a free segment the pool may take, or segments
 * outside the windows cleaned into the head (room accumulates over successive victims: an item
 * of nearly a segment may take many). NULL when none (the item is evicted). */
static struct item *window_dest(struct segs *s, struct seg_pool *ow, int q, uint32_t len,
                                const struct window *wd, seg_visit_fn fn, void *ctx)
{
    uint32_t since = ow->seal_seq; /* a victim cleaned here is not cleaned again here */
    bool emptied = false;
    for (int tries = 0; tries < WINDOW_DEST_TRIES; tries++) {
        uint32_t h = ow->q[q].cur;
        if (h != SEG_NONE && !in_span(wd->w, h) && !in_span(wd->x, h) &&
            s->meta[h].woff + len <= s->seg_size)
            return (struct item *)(seg_base(s, h) + s->meta[h].woff);
        uint32_t f = seg_take_free(s, ow, false);
        if (f != SEG_NONE) {
            seg_seal_head(s, ow, q);
            seg_install_head(s, ow, q, f);
            continue;
        }
        if (!seg_pool_roomy(s, ow)) return NULL;
        uint32_t v = clean_candidate_in(s, ow, 0, len, SEG_NONE, wd->w, wd->x, since);
        if (v == SEG_NONE && wd->depth == 0 && len > s->seg_size / 2 && !emptied) {
            /* No victim can reach the room (the dead bytes all in segments holding a run's
             * end): empty one plain segment outside the window for the head, as a nested
             * window of one (it evicts nothing). */
            struct window in = {.x = wd->w, .depth = 1, .own = true};
            emptied = true;
            pthread_mutex_unlock(&ow->lock);
            uint32_t e = clear_window(s, ow, 1, &in, fn, ctx);
            pthread_mutex_lock(&ow->lock);
            if (e != SEG_NONE) {
                seg_seal_head(s, ow, q);
                seg_install_head(s, ow, q, e);
                continue;
            }
        }
        if (v == SEG_NONE) return NULL;
        if (s->meta[v].state == SS_RUN) {
            run_release(s, ow, v);
            continue;
        }
        if (process(s, ow, v, false, false, q, false, fn, ctx) == 0) return NULL;
    }
    return NULL;
}

/* The item of len bytes now fills the n segments from i (pool lock held; i's other fields set):
 * when at least a header's worth of it is in the last segment and room is left after it, that
 * segment holds its end and is sealed into queue q from there (log space for cleaning, as
 * alloc_run's heads), and the run is n - 1 segments sharing its tail. Sets nrun and the tails'
 * states; the caller then marks i SS_RUN and queues it. */
static void run_set_tail(struct segs *s, struct seg_pool *pl, uint32_t i, uint32_t n,
                         uint32_t len, int q)
{
    struct seg_meta *m = &s->meta[i];
    uint32_t end = len - (n - 1) * s->seg_size;
    bool share = end >= sizeof(struct item) && s->seg_size - end >= SEG_ALIGN * 8;
    m->nrun = share ? n - 1 : n;
    m->shares_tail = share;
    for (uint32_t k = i + 1; k < i + m->nrun; k++) STORE(&s->meta[k].state, (uint8_t)SS_RUN_TAIL);
    if (!share) return;
    uint32_t last = i + n - 1;
    struct seg_meta *t = &s->meta[last];
    t->start = t->woff = end;
    t->run_of = i;
    t->nrun = 0;
    t->shares_tail = 0;
    t->prev = t->next = SEG_NONE;
    STORE(&t->live, 0);
    STORE(&t->gen, t->gen + 1);
    t->sealed_at = ++pl->seal_seq;
    STORE(&t->state, (uint8_t)SS_SEALED);
    seg_q_push(s, pl, q, last);
}

/* Move the item `it` of a run in a window being cleared (pool ow's lock held, may be released
 * and retaken) to contiguous free segments elsewhere (the window's own free segments are
 * already taken), queued in q. When the free segments are all apart and the pool is below 90%
 * live, a window of plain segments is cleared for it first (depth 0 only: the nesting stops
 * there). Returns the visitor's answer (SEG_MOVED when it moved), or 0 when there is no room. */
static int window_move_run(struct segs *s, struct seg_pool *ow, int q, struct item *it,
                           uint32_t len, const struct window *wd, seg_visit_fn fn, void *ctx)
{
    uint32_t n = (len + s->seg_size - 1) >> s->seg_shift;
    uint32_t t = seg_take_run(s, ow, n);
    if (t == SEG_NONE && wd->depth == 0 && seg_pool_roomy(s, ow)) {
        struct window in = {.x = wd->w, .depth = 1};
        pthread_mutex_unlock(&ow->lock);
        t = clear_window(s, ow, n, &in, fn, ctx);
        pthread_mutex_lock(&ow->lock);
        if (t != SEG_NONE && !(rec_state(it) & ITEM_LINKED)) {
            seg_release(s, ow, t, n);
            return SEG_BUSY; /* freed meanwhile: the next look finds it dead */
        }
    }
    if (t == SEG_NONE) return 0;
    int rv = fn(ctx, it, SEG_VISIT_MOVE, (struct item *)seg_base(s, t));
    if (!(rv & SEG_MOVED)) {
        seg_release(s, ow, t, n);
        return rv ? rv : SEG_BUSY;
    }
    struct seg_meta *m = &s->meta[t];
    m->woff = len;
    m->start = 0;
    STORE(&m->gen, m->gen + 1);
    run_set_tail(s, ow, t, n, len, q);
    __atomic_fetch_add(&m->live, len, __ATOMIC_RELAXED);
    STORE(&m->state, (uint8_t)SS_RUN);
    seg_q_push(s, ow, q, t);
    seg_kill(s, it, len);
    return rv;
}

/* Empty segment i (its owner's lock held, state BUSY, unpinned): move its live items to its
 * pool's heads (never into the windows) and a run's item to free segments elsewhere; evict what
 * finds no room (a nested window gives up instead). Returns true when it is empty. */
static bool window_empty_one(struct segs *s, struct seg_pool *ow, uint32_t i,
                             const struct window *wd, seg_visit_fn fn, void *ctx)
{
    struct seg_meta *m = &s->meta[i];
    char *base = seg_base(s, i);
    bool run = m->nrun != 0;
    for (int round = 0; round < RUN_BUSY_ROUNDS; round++) {
        bool pending = false, pinned = false;
        for (uint32_t r = 0; r < m->woff;) {
            struct item *it = (struct item *)(base + r);
            uint32_t len = (uint32_t)seg_item_size(it);
            uint8_t f = rec_state(it);
            r += len;
            if (f & ITEM_SEG_DEAD) continue;
            if (!(f & ITEM_LINKED)) {
                pending = true;
                continue;
            }
            if (run) {
                int rv = window_move_run(s, ow, m->queue, it, len, wd, fn, ctx);
                if (rv & SEG_MOVED) continue;
                if (rv & (SEG_BUSY | SEG_PINNED)) {
                    pending = true;
                    pinned |= (rv & SEG_PINNED) != 0;
                    continue;
                }
                if (rv & SEG_GONE) {
                    seg_count_gone(ow, it, SEG_VISIT_MOVE, rv);
                    seg_kill(s, it, len);
                    continue;
                }
            }
            struct item *dst = run ? NULL : window_dest(s, ow, m->queue, len, wd, fn, ctx);
            if (!dst && !wd->evict) return false;
            int rv;
            if (dst) {
                uint32_t h = seg_of(s, dst);
                rv = fn(ctx, it, SEG_VISIT_MOVE, dst);
                if (rv & SEG_MOVED) {
                    s->meta[h].woff += len;
                    __atomic_fetch_add(&s->meta[h].live, len, __ATOMIC_RELAXED);
                    seg_kill(s, it, len);
                    continue;
                }
            } else {
                rv = fn(ctx, it, SEG_VISIT_EVICT, NULL);
            }
            if (rv & SEG_GONE) {
                seg_count_gone(ow, it, SEG_VISIT_EVICT, rv);
                seg_kill(s, it, len);
            } else {
                pending = true;
                pinned |= (rv & SEG_PINNED) != 0;
            }
        }
        if (!pending && LOAD(&m->live) == 0 && LOAD(&m->pins) == 0) return true;
        if (pinned) return false; /* held by our own caller: waiting cannot help */
        /* The shard holders we wait for may be waiting for this very lock. */
        pthread_mutex_unlock(&ow->lock);
        sched_yield();
        pthread_mutex_lock(&ow->lock);
    }
    return false;
}
/* Take free segment i for pool `to` if it is still free (free_lock taken here). */
static bool take_this_free(struct segs *s, struct seg_pool *to, uint32_t i)
{
    pthread_mutex_lock(&s->free_lock);
    bool ok = (s->freemap[i / 64] >> (i % 64)) & 1;
    if (ok) {
        s->freemap[i / 64] &= ~(1ull << (i % 64));
        s->nfree--;
        struct seg_meta *m = &s->meta[i];
        m->woff = m->start = 0;
        m->nrun = 0;
        m->shares_tail = 0;
        m->prev = m->next = SEG_NONE;
        STORE(&m->live, 0);
        STORE(&m->pins, 0);
        m->touched = 1;
        STORE(&m->nsid, to->id);
        STORE(&m->state, (uint8_t)SS_BUSY);
        STORE(&to->nsegs, to->nsegs + 1);
    }
    pthread_mutex_unlock(&s->free_lock);
    return ok;
}

/* Move `n` emptied segments from i (pool ow's) to pool `to`, still BUSY. */
static void transfer(struct segs *s, struct seg_pool *ow, struct seg_pool *to, uint32_t i,
                     uint32_t n)
{
    pthread_mutex_lock(&s->free_lock);
    for (uint32_t k = i; k < i + n; k++) {
        struct seg_meta *m = &s->meta[k];
        m->woff = m->start = 0;
        m->nrun = 0;
        m->shares_tail = 0;
        m->prev = m->next = SEG_NONE;
        STORE(&m->gen, m->gen + 1);
        STORE(&m->nsid, to->id);
        STORE(&m->state, (uint8_t)SS_BUSY);
    }
    STORE(&ow->nsegs, ow->nsegs - n);
    STORE(&to->nsegs, to->nsegs + n);
    pthread_mutex_unlock(&s->free_lock);
}

/* Clear segment k of window wd for `to`: take it if free, or empty it under its owner's lock and
 * take it over. Returns the segments taken from k on (a run may reach past the window), or 0 on
 * failure. No pool lock held. */
static uint32_t window_take(struct segs *s, struct seg_pool *to, uint32_t k,
                            const struct window *wd, seg_visit_fn fn, void *ctx)
{
    struct seg_meta *m = &s->meta[k];
    if (LOAD(&m->state) == SS_FREE) return !wd->own && take_this_free(s, to, k) ? 1 : 0;
    struct seg_pool *ow = seg_pool_at(s, LOAD(&m->nsid));
    if (!ow || (wd->own && ow != to)) return 0;
    pthread_mutex_lock(&ow->lock);
    uint8_t st = LOAD(&m->state);
    uint32_t got = 0;
    if ((st == SS_SEALED || st == SS_RUN) && LOAD(&m->nsid) == ow->id && !LOAD(&m->pins) &&
        m->start == 0) {
        uint32_t n = st == SS_RUN ? m->nrun : 1;
        int q = m->queue;
        seg_q_remove(s, ow, k);
        STORE(&m->state, (uint8_t)SS_BUSY);
        if (window_empty_one(s, ow, k, wd, fn, ctx)) {
            if (st == SS_RUN) run_tail_fix(s, k);
            ow->bk[0].segs_cleaned += n;
            transfer(s, ow, to, k, n);
            got = n;
        } else {
            STORE(&m->state, st);
            seg_q_push(s, ow, q, k);
        }
    }
    pthread_mutex_unlock(&ow->lock);
    return got;
}

/* Slide run v of pool pl (lock held) down into segment v - 1, which pl has just cleared and
 * owns (BUSY): the item moves down one segment (an overlapping move, which the visitor
 * allows), so the run no longer reaches the segment that shared its end (now a plain segment)
 * or frees its top segment. Returns true when it moved. */
static bool run_slide_down(struct segs *s, struct seg_pool *pl, uint32_t v, seg_visit_fn fn,
                           void *ctx)
{
    struct seg_meta *m = &s->meta[v], *d = &s->meta[v - 1];
    if (LOAD(&m->state) != SS_RUN || LOAD(&m->nsid) != pl->id || LOAD(&m->pins)) return false;
    struct item *it = (struct item *)seg_base(s, v);
    if (!(rec_state(it) & ITEM_LINKED)) return false;
    uint32_t len = (uint32_t)seg_item_size(it);
    int rv = fn(ctx, it, SEG_VISIT_MOVE, (struct item *)seg_base(s, v - 1));
    if (!(rv & SEG_MOVED)) {
        if (rv & SEG_GONE) {
            seg_count_gone(pl, it, SEG_VISIT_MOVE, rv);
            seg_kill(s, it, len); /* the dead run goes at the next cleaning */
        }
        return false;
    }
    /* The old header's bytes are the item's now: no seg_kill, counts moved by hand. */
    uint32_t old = m->nrun, n = (len + s->seg_size - 1) >> s->seg_shift;
    bool shared = m->shares_tail;
    int q = m->queue;
    seg_q_remove(s, pl, v);
    run_tail_fix(s, v); /* the end it shared is below that segment now */
    __atomic_fetch_sub(&m->live, len, __ATOMIC_RELAXED);
    m->nrun = 0;
    m->woff = 0;
    STORE(&m->gen, m->gen + 1);
    d->woff = len;
    d->start = 0;
    STORE(&d->gen, d->gen + 1);
    __atomic_fetch_add(&d->live, len, __ATOMIC_RELAXED);
    run_set_tail(s, pl, v - 1, n, len, q);
    STORE(&d->state, (uint8_t)SS_RUN);
    seg_q_push(s, pl, q, v - 1);
    if (!shared) seg_release(s, pl, v + old - 1, 1); /* its top segment held only the end */
    return true;
}

/* Consolidate one step, for a nested window that found no plain window outside x: the lowest
 * run outside x whose segment below is free or plain (outside x) has that segment cleared and
 * slides down into it. No pool lock held. Returns true when a run moved. */
static bool slide_a_run(struct segs *s, struct seg_span x, seg_visit_fn fn, void *ctx)
{
    for (uint32_t j = 1; j < s->nsegs; j++) {
        struct seg_meta *m = &s->meta[j];
        if (LOAD(&m->state) != SS_RUN || LOAD(&m->pins)) continue;
        uint32_t end = j + m->nrun + m->shares_tail;
        if (in_span(x, j - 1) || (j < x.hi && end > x.lo)) continue;
        struct seg_pool *rp = seg_pool_at(s, LOAD(&m->nsid));
        uint64_t cost = 0;
        if (!rp || !seg_pool_roomy(s, rp) || !window_ok(s, rp, j - 1, j - 1, true, false, &cost))
            continue;
        struct window below = {.w = {j - 1, j}, .x = x, .depth = 1};
        uint32_t got = window_take(s, rp, j - 1, &below, fn, ctx);
        if (got == 0) continue;
        pthread_mutex_lock(&rp->lock);
        bool moved = got == 1 && run_slide_down(s, rp, j, fn, ctx);
        pthread_mutex_unlock(&rp->lock);
        if (moved) return true;
        seg_release(s, rp, j - 1, got);
    }
    return false;
}

/* Clear the cheapest window of n segments for `to` (wd->x and wd->depth set; wd->w set here),
 * trying a few. No pool lock held. Returns its first segment, its segments `to`'s and BUSY, or
 * SEG_NONE. */
static uint32_t clear_window(struct segs *s, struct seg_pool *to, uint32_t n, struct window *wd,
                             seg_visit_fn fn, void *ctx)
{
    uint32_t skip[RUN_WINDOW_TRIES];
    int nskip = 0;
    bool *mine = calloc(n, sizeof *mine);
    if (!mine) return SEG_NONE;
    uint32_t got_lo = SEG_NONE;
    int slides = 0;
    for (int t = 0; t < RUN_WINDOW_TRIES && got_lo == SEG_NONE; t++) {
        /* At depth 0 the windows are tried without evicting first (an item of nearly a segment
         * or a run may find no room from one window and fit from another); the last try takes
         * the cheapest window again, partly emptied by then, and evicts what finds no room. */
        bool may_evict = wd->depth == 0 && !wd->keep, last = may_evict && t == RUN_WINDOW_TRIES - 1;
        wd->evict = last;
        uint32_t lo = cheapest_window(s, to, n, skip, last ? 0 : nskip, wd->x, wd->depth > 0,
                                      wd->own);
        /* A nested window finding no plain one slides runs down until there is (bounded) */
        while (lo == SEG_NONE && wd->depth > 0 && slides < RUN_SLIDES_MAX &&
               slide_a_run(s, wd->x, fn, ctx)) {
            slides++;
            lo = cheapest_window(s, to, n, skip, nskip, wd->x, true, wd->own);
        }
        if (lo == SEG_NONE && may_evict && !last) {
            t = RUN_WINDOW_TRIES - 2; /* no untried window left: the evicting try */
            continue;
        }
        if (lo == SEG_NONE) break;
        wd->w = (struct seg_span){lo, lo + n};
        /* The window's free segments first, so that no head of a pool emptying the rest of the
         * window lands in it. */
        memset(mine, 0, n * sizeof *mine);
        for (uint32_t k = lo; k < lo + n; k++)
            if (!wd->own && LOAD(&s->meta[k].state) == SS_FREE)
                mine[k - lo] = take_this_free(s, to, k);
        uint32_t k = lo, beyond = lo + n;
        bool ok = true;
        while (ok && k < lo + n) {
            if (mine[k - lo]) {
                k++;
                continue;
            }
            uint32_t got = window_take(s, to, k, wd, fn, ctx);
            ok = got != 0;
            for (uint32_t j = k; ok && j < k + got; j++)
                if (j < lo + n) mine[j - lo] = true;
            if (k + got > beyond) beyond = k + got;
            k += got;
        }
        if (beyond > lo + n) seg_release(s, to, lo + n, beyond - (lo + n)); /* a run's rest */
        if (!ok)
            for (uint32_t j = lo; j < lo + n; j++)
                if (mine[j - lo]) seg_release(s, to, j, 1);
        if (ok) got_lo = lo;
        skip[nskip++] = lo;
    }
    free(mine);
    return got_lo;
}

uint32_t seg_make_run(struct segs *s, struct seg_pool *pl, uint32_t n, seg_visit_fn fn,
                      void *ctx)
{
    /* Runs whose items are gone are otherwise freed only when cleaning meets them. */
    for (int q = 0; q < Q_COUNT; q++)
        for (uint32_t i = pl->q[q].head, next; i != SEG_NONE; i = next) {
            next = s->meta[i].next;
            if (s->meta[i].state == SS_RUN && !LOAD(&s->meta[i].live) && !LOAD(&s->meta[i].pins))
                run_release(s, pl, i);
        }
    uint32_t got = seg_take_run(s, pl, n);
    if (got != SEG_NONE) return got;
    struct window wd = {.x = NO_SPAN, .depth = 0};
    pthread_mutex_unlock(&pl->lock);
    uint32_t lo = clear_window(s, pl, n, &wd, fn, ctx);
    pthread_mutex_lock(&pl->lock);
    return lo;
}

/* Clear a window of one segment without evicting (pool pl's lock held, released meanwhile) and
 * make it queue q's head. True when it did. */
static bool head_from_window(struct segs *s, struct seg_pool *pl, int q, seg_visit_fn fn,
                             void *ctx)
{
    struct window wd = {.x = NO_SPAN, .depth = 0, .keep = true, .own = true};
    pthread_mutex_unlock(&pl->lock);
    uint32_t f = clear_window(s, pl, 1, &wd, fn, ctx);
    pthread_mutex_lock(&pl->lock);
    if (f == SEG_NONE) return false;
    seg_seal_head(s, pl, q);
    seg_install_head(s, pl, q, f);
    return true;
}
