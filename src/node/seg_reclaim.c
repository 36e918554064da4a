/* seg_reclaim.c — making room in the segmented log (see seg.h): cleaning, eviction, taking
 * segments from pools beyond their guarantee and trimming pools over a lowered quota.
 *
 * Cleaning and eviction work on one victim segment at a time, in place: its records are walked
 * from the start; a live item the victim keeps (every one when cleaning, those the policy keeps
 * when evicting) is moved by the store's visitor into the destination queue's head while that
 * has room, otherwise slid down to the lowest free offset of the victim itself. Dead records and
 * evicted items leave room behind. The victim then becomes the destination queue's head with
 * its kept items at its start, or, emptied, the head the allocation asked for. So a cleaned or
 * evicted segment re-enters its queue as the newest (FIFO-reinsertion, i.e. CLOCK), and no free
 * segment is needed to make room. Runs of contiguous segments for large items are seg_run.c's.
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
#define CLEAN_FULL_DEAD_SHIFT 3 /* in a full pool, a segment at least 1/8 dead is cleaned */
#define VICTIM_SKIP 8           /* pinned segments skipped at a queue's head before giving up */

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

bool seg_pool_fits_quota(struct segs *s, struct seg_pool *pl, uint64_t more)
{
    uint64_t quota = LOAD(&pl->quota_segs);
    return (pool_live(s, pl) + more) * 10 < quota * s->seg_size * 9;
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

void seg_run_tail_fix(struct segs *s, uint32_t v)
{
    struct seg_meta *m = &s->meta[v];
    if (!m->shares_tail) return;
    m->shares_tail = 0;
    struct seg_meta *t = &s->meta[v + m->nrun];
    seg_put_filler(seg_base(s, v + m->nrun), t->start);
    /* a run beginning after the end keeps its offset: the end becomes a dead prefix */
    if (!t->nrun) t->start = 0;
    t->run_of = SEG_NONE;
    STORE(&t->gen, t->gen + 1);
}

void seg_run_release(struct segs *s, struct seg_pool *pl, uint32_t v)
{
    struct seg_meta *m = &s->meta[v];
    seg_q_remove(s, pl, v);
    seg_run_tail_fix(s, v);
    if (!m->start || m->run_of == SEG_NONE) {
        seg_release(s, pl, v, m->nrun);
        return;
    }
    /* It began after the end of another run, which is still there: its first segment stays,
     * a sealed segment holding that end. */
    if (m->nrun > 1) seg_release(s, pl, v + 1, m->nrun - 1);
    m->nrun = 0;
    m->woff = m->start;
    STORE(&m->gen, m->gen + 1);
    m->sealed_at = ++pl->seal_seq;
    STORE(&m->state, (uint8_t)SS_SEALED);
    seg_q_push(s, pl, m->queue, v);
}

/* Evict or keep the item of run v (pool lock held). Returns true if the run was freed. */
static bool process_run(struct segs *s, struct seg_pool *pl, uint32_t v, bool evict, bool drop,
                        seg_visit_fn fn, void *ctx)
{
    struct seg_meta *m = &s->meta[v];
    struct item *it = (struct item *)(seg_base(s, v) + m->start);
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
    seg_run_release(s, pl, v);
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
uint32_t seg_process(struct segs *s, struct seg_pool *pl, uint32_t v, bool evict, bool drop,
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

/* The sealed segment of pl with the most dead bytes, if cleaning it frees at least `need` and
 * 1/16 of a segment, other than `skip` and those in spans a and b, and whose room once emptied
 * (the segment less the end of a run it holds) is at least `cap`; a run whose item is gone wins
 * at once. SEG_NONE if none. */
uint32_t seg_clean_candidate_in(struct segs *s, struct seg_pool *pl, uint32_t need,
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
    return seg_clean_candidate_in(s, pl, need, 0, skip, NO_SPAN, NO_SPAN, pl->seal_seq);
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
    seg_process(s, pl, v, true, drop, want, release, fn, ctx);
    return true;
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

bool seg_reclaim(struct segs *s, struct seg_pool *pl, int q, uint32_t need, bool hard,
                 uint32_t since, uint32_t *steps, seg_visit_fn fn, void *ctx)
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
        uint32_t v =
            seg_clean_candidate_in(s, pl, 0, need, pl->clean_skip, NO_SPAN, NO_SPAN, since);
        /* No victim can reach the room (an item of nearly a segment, the dead bytes all in
         * segments holding the end of a run): empty one plain segment elsewhere for the head,
         * as a window of one, its items moved into the heads. */
        if (v == SEG_NONE && need > s->seg_size / 2 && seg_head_from_window(s, pl, q, steps, fn, ctx))
            return true;
        if (v == SEG_NONE)
            v = seg_clean_candidate_in(s, pl, 0, 0, pl->clean_skip, NO_SPAN, NO_SPAN, since);
        if (v != SEG_NONE) {
            if (s->meta[v].state == SS_RUN) {
                seg_run_release(s, pl, v);
                return true;
            }
            if (seg_process(s, pl, v, false, false, q, false, fn, ctx) > 0) return true;
            pl->clean_skip = v;
        }
    }
    /* Full (90% live or more): evict, unless a sealed segment holds a gap worth cleaning. An
     * item that could not move or go while its victim was evicted (its shard locked by a get
     * whose thread was descheduled: on 2 busy vCPUs a few hundred times in some runs, none in
     * others) leaves the bytes freed before it dead, 20-40 KB on average at -m 8, until that
     * segment is a victim again a whole turn of the queue later: such runs ended with 4-6% of
     * a full -m 8 pool dead and 10-20% fewer items, missing 24.0-24.6% against 23.6%. Cleaning
     * that segment now costs a copy of what it keeps instead of evicting. */
    if (!hard) {
        uint32_t v = seg_clean_candidate_in(s, pl, s->seg_size >> CLEAN_FULL_DEAD_SHIFT, 0,
                                            pl->clean_skip, NO_SPAN, NO_SPAN, since);
        if (v != SEG_NONE) {
            if (s->meta[v].state == SS_RUN) {
                seg_run_release(s, pl, v);
                return true;
            }
            if (seg_process(s, pl, v, false, false, q, false, fn, ctx) > 0) return true;
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
    uint32_t v = seg_clean_candidate_in(s, pl, s->seg_size / 4 * 3, 0, pl->clean_skip, NO_SPAN,
                                    NO_SPAN, since);
    if (v == SEG_NONE) return false;
    if (s->meta[v].state == SS_RUN) {
        seg_run_release(s, pl, v);
        return true;
    }
    if (seg_process(s, pl, v, false, false, q, false, fn, ctx) > 0) return true;
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
            seg_run_release(s, pl, v);
            continue;
        }
        if (seg_process(s, pl, v, false, false, s->meta[v].queue, true, fn, ctx) == 0) skip = v;
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
             * far less than its new quota. A pool whose live bytes stay below 90% of the quota
             * is not shrunk at all (the rule of no eviction below 90%): what cleaning cannot give
             * back yet (runs' unused ends, heads, busy items) stays beyond the quota until dead
             * bytes appear; allocation takes nothing beyond it then unless the item still fits
             * below 90% (alloc_run), so the excess stays bounded by that fragmentation. */
            bool ok = seg_consolidate(s, pl, fn, ctx) ||
                      (!seg_pool_fits_quota(s, pl, 0) && seg_shrink(s, pl, fn, ctx));
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
            seg_process(s, pl, v, false, false, q, false, fn, ctx);
            done++;
        }
        pthread_mutex_unlock(&pl->lock);
    }
    return done;
}
