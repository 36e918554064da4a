/* seg_run.c — runs of contiguous segments for items larger than a segment (see seg_int.h):
 * finding or clearing a window of segments for a new run, moving the live items and runs out of it (into
 * their pools' heads, or to free segments or a nested window elsewhere), sliding runs down to
 * make a plain window, and the run's shared tail segment.
 *
 * A window is cleared segment by segment under each owner's lock (never two pool locks at once);
 * what it takes becomes the asking pool's, BUSY until the run is placed. */
#include "node/seg_int.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define LOAD SEG_LOAD
#define STORE SEG_STORE

#define RUN_WINDOW_TRIES 6      /* windows tried for one run (the last one evicting) */
#define RUN_BUSY_ROUNDS 200     /* retries of a busy item while clearing a window */
#define RUN_SLIDES_MAX 16       /* runs slid down for one nested window */
#define WINDOW_DEST_TRIES 32    /* segments cleaned for one item moved out of a window */

/* ---- runs --------------------------------------------------------------------------------- */

/* A window being cleared: its segments `w`, the window `x` it makes room for when nested (a run
 * found in x moves to w; NO_SPAN at depth 0) and the depth. `evict`: an item that finds no room
 * elsewhere is evicted; otherwise the window fails and the next one is tried. Only the last
 * window tried at depth 0 evicts (unless `keep`); a nested window holds no run and never
 * evicts. `own`: only segments `to` owns already (a head emptied for a store the pool may not
 * take a free segment for: its quota, or what quota'd pools are owed); with `fill`, also free
 * segments while `to` owns fewer than its quota (a quota'd pool's run). `len`: at depth 0, the
 * bytes of the new run's item: the window may then begin mid-segment, right after the end of
 * another run of `to` in that run's last segment (`tail`), which it keeps (see tail_room).
 *
 * Progress: one allocation has SEG_RUN_STEPS steps for all the windows it clears (nested ones
 * included), a step being a segment emptied (or tried) for a window or a run slid down. Without
 * that bound the retries multiplied (windows tried, times busy rounds, times a nested window
 * cleared for each, times runs slid for it, times the allocation's own retries). Spent, the
 * calls fail at once and the allocation evicts instead. */
struct window {
    struct seg_span w, x;
    int depth;
    bool evict, keep, own, fill, tail;
    uint32_t len;
    uint32_t *steps; /* the allocation's steps left (SEG_RUN_STEPS), shared with nested windows */
};

static uint32_t clear_window(struct segs *s, struct seg_pool *to, uint32_t n, struct window *wd,
                             seg_visit_fn fn, void *ctx);

/* Take one of the allocation's steps; false when none is left. */
static bool spend(uint32_t *steps)
{
    if (*steps == 0) return false;
    --*steps;
    return true;
}

/* Free segments an `own` window may take for `to`: while it owns fewer than its quota, if `fill`. */
static uint32_t own_free(const struct seg_pool *to, bool fill)
{
    uint32_t n = LOAD(&to->nsegs), q = LOAD(&to->quota_segs);
    return fill && q > n ? q - n : 0;
}

/* May a window from `lo` clearing for pool `to` take segment i (read without locks: a guess,
 * re-checked under the owner's lock)? `plain`: not if it is a run; `own`: only if `to` owns it
 * or, `free` (counted down) allowing, it is free. */
static bool window_ok(struct segs *s, const struct seg_pool *to, uint32_t lo, uint32_t i,
                      bool plain, bool own, uint32_t *free, uint64_t *cost)
{
    struct seg_meta *m = &s->meta[i];
    uint8_t st = LOAD(&m->state);
    if (st == SS_FREE) {
        if (!own) return true;
        if (*free == 0) return false;
        --*free;
        return true;
    }
    if (own && LOAD(&m->nsid) != to->id) return false;
    if ((st != SS_SEALED && st != SS_RUN) || LOAD(&m->pins)) return false;
    /* a segment holding the end of a run is cleared only after that run, in the same window;
     * a run beginning after the end of another stays (it moves only with that one) */
    if (LOAD(&m->start) && (m->run_of == SEG_NONE || m->run_of < lo || st == SS_RUN))
        return false;
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

/* Room after the end of a run in segment i, if a new run of `to` may begin there: i is `to`'s
 * sealed segment holding the end of one of its runs (so it is never freed while that run lives,
 * and what is after the end is reached only by cleaning). 0 if not. Without locks: a guess. */
static uint32_t tail_room(struct segs *s, const struct seg_pool *to, uint32_t i)
{
    struct seg_meta *m = &s->meta[i];
    uint32_t start = LOAD(&m->start);
    if (!start || LOAD(&m->state) != SS_SEALED || LOAD(&m->nsid) != to->id || LOAD(&m->pins))
        return 0;
    return s->seg_size - start;
}

/* Cost of clearing segments [k, end) for a window from lo (window_ok's); false if it may not.
 * `free`: as window_ok's. */
static bool window_cost(struct segs *s, const struct seg_pool *to, uint32_t lo, uint32_t k,
                        uint32_t end, bool plain, bool own, uint32_t free, uint64_t *cost)
{
    while (k < end) {
        if (!window_ok(s, to, lo, k, plain, own, &free, cost)) return false;
        k += LOAD(&s->meta[k].state) == SS_RUN ? s->meta[k].nrun : 1; /* a run sticking out of
                                                                       the window goes whole */
    }
    return true;
}

/* The window of n segments with the fewest live bytes that may be cleared for `to`, other than
 * those from the `nskip` starts in `skip` and any overlapping x; `plain`: one holding no run.
 * With `len` (a run's item), also windows beginning after the end of a run (tail_room), as many
 * segments as the item then needs: *nw is the chosen window's length, *tail its kind. `own`,
 * `fill`: as struct window's. */
static uint32_t cheapest_window(struct segs *s, const struct seg_pool *to, uint32_t n,
                                const uint32_t *skip, int nskip, struct seg_span x, bool plain,
                                bool own, bool fill, uint32_t len, uint32_t *nw, bool *tail)
{
    uint32_t free = own_free(to, fill);
    uint32_t best = SEG_NONE;
    uint64_t low = UINT64_MAX;
    *nw = n;
    *tail = false;
    for (uint32_t i = 0; i < s->nsegs; i++) {
        bool skipped = false;
        for (int j = 0; j < nskip; j++) skipped |= skip[j] == i;
        if (skipped) continue;
        uint64_t cost = 0;
        if (i + n <= s->nsegs && !(i < x.hi && i + n > x.lo) &&
            window_cost(s, to, i, i, i + n, plain, own, free, &cost) && cost < low) {
            low = cost;
            best = i;
            *nw = n;
            *tail = false;
        }
        uint32_t room = len ? tail_room(s, to, i) : 0;
        if (!room) continue;
        uint32_t m = 1 + ((len - room + s->seg_size - 1) >> s->seg_shift);
        cost = LOAD(&s->meta[i].live) + 1;
        if (i + m <= s->nsegs && !(i < x.hi && i + m > x.lo) &&
            window_cost(s, to, i, i + 1, i + m, plain, own, free, &cost) && cost < low) {
            low = cost;
            best = i;
            *nw = m;
            *tail = true;
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
        uint32_t v = seg_clean_candidate_in(s, ow, 0, len, SEG_NONE, wd->w, wd->x, since);
        if (v == SEG_NONE && wd->depth == 0 && len > s->seg_size / 2 && !emptied) {
            /* No victim can reach the room (the dead bytes all in segments holding a run's
             * end): empty one plain segment outside the window for the head, as a nested
             * window of one (it evicts nothing). */
            struct window in = {.x = wd->w, .depth = 1, .own = true, .steps = wd->steps};
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
            seg_run_release(s, ow, v);
            continue;
        }
        if (seg_process(s, ow, v, false, false, q, false, fn, ctx) == 0) return NULL;
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
        struct window in = {.x = wd->w, .depth = 1, .own = wd->own, .fill = wd->fill,
                            .steps = wd->steps};
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
        for (uint32_t r = m->start; r < m->woff;) {
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
    if (LOAD(&m->state) == SS_FREE)
        return (!wd->own || own_free(to, wd->fill)) && take_this_free(s, to, k) ? 1 : 0;
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
            if (st == SS_RUN) seg_run_tail_fix(s, k);
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

/* Clear what follows the end of a run in segment k, the first of tail window wd, for `to` (its
 * owner), which keeps it, BUSY, for the new run to begin at its start. False on failure (the
 * segment is back in its queue). No pool lock held. */
static bool window_take_tail(struct segs *s, struct seg_pool *to, uint32_t k,
                             const struct window *wd, seg_visit_fn fn, void *ctx)
{
    struct seg_meta *m = &s->meta[k];
    pthread_mutex_lock(&to->lock);
    /* The window was chosen from a guess at the end's offset, read without locks: the segment
     * may hold the end of another run since, further on, and the item would then reach past
     * the window (into segments others own: a run placed over another). */
    uint64_t reach = (uint64_t)(wd->w.hi - wd->w.lo) << s->seg_shift;
    bool ok = LOAD(&m->state) == SS_SEALED && LOAD(&m->nsid) == to->id && !LOAD(&m->pins) &&
              m->start != 0 && m->start + (uint64_t)wd->len <= reach;
    if (ok) {
        int q = m->queue;
        seg_q_remove(s, to, k);
        STORE(&m->state, (uint8_t)SS_BUSY);
        ok = window_empty_one(s, to, k, wd, fn, ctx);
        if (ok) {
            m->woff = m->start;
            STORE(&m->gen, m->gen + 1);
            to->bk[0].segs_cleaned++;
        } else {
            STORE(&m->state, (uint8_t)SS_SEALED);
            seg_q_push(s, to, q, k);
        }
    }
    pthread_mutex_unlock(&to->lock);
    return ok;
}

/* Give back the first segment of a tail window that failed or went unused (taken by
 * window_take_tail): sealed again, in queue q. No pool lock held. */
static void untake_tail(struct segs *s, struct seg_pool *to, uint32_t k)
{
    pthread_mutex_lock(&to->lock);
    struct seg_meta *m = &s->meta[k];
    m->sealed_at = ++to->seal_seq;
    STORE(&m->state, (uint8_t)SS_SEALED);
    seg_q_push(s, to, m->queue, k);
    pthread_mutex_unlock(&to->lock);
}

/* Slide run v of pool pl (lock held) down into segment v - 1, which pl has just cleared and
 * owns (BUSY): the item moves down one segment (an overlapping move, which the visitor
 * allows), so the run no longer reaches the segment that shared its end (now a plain segment)
 * or frees its top segment. Returns true when it moved. */
static bool run_slide_down(struct segs *s, struct seg_pool *pl, uint32_t v, seg_visit_fn fn,
                           void *ctx)
{
    struct seg_meta *m = &s->meta[v], *d = &s->meta[v - 1];
    if (LOAD(&m->state) != SS_RUN || LOAD(&m->nsid) != pl->id || LOAD(&m->pins) || m->start)
        return false;
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
    seg_run_tail_fix(s, v); /* the end it shared is below that segment now */
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
static bool slide_a_run(struct segs *s, struct seg_span x, uint32_t *steps, seg_visit_fn fn,
                        void *ctx)
{
    for (uint32_t j = 1; j < s->nsegs && *steps; j++) {
        struct seg_meta *m = &s->meta[j];
        if (LOAD(&m->state) != SS_RUN || LOAD(&m->pins) || LOAD(&m->start)) continue;
        uint32_t end = j + m->nrun + m->shares_tail;
        if (in_span(x, j - 1) || (j < x.hi && end > x.lo)) continue;
        struct seg_pool *rp = seg_pool_at(s, LOAD(&m->nsid));
        uint64_t cost = 0;
        uint32_t free = 0;
        if (!rp || !seg_pool_roomy(s, rp) ||
            !window_ok(s, rp, j - 1, j - 1, true, false, &free, &cost))
            continue;
        struct window below = {.w = {j - 1, j}, .x = x, .depth = 1, .steps = steps};
        if (!spend(steps)) break;
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

/* Clear the cheapest window of n segments for `to` (wd->x, wd->depth and wd->len set; wd->w and
 * wd->tail set here: with wd->len the window may be a tail window of n + 1), trying a few. No
 * pool lock held. Returns its first segment, its segments `to`'s and BUSY, or SEG_NONE. */
static uint32_t clear_window(struct segs *s, struct seg_pool *to, uint32_t n, struct window *wd,
                             seg_visit_fn fn, void *ctx)
{
    uint32_t skip[RUN_WINDOW_TRIES];
    int nskip = 0;
    bool *mine = calloc(n + 1, sizeof *mine);
    if (!mine) return SEG_NONE;
    uint32_t got_lo = SEG_NONE;
    int slides = 0;
    for (int t = 0; t < RUN_WINDOW_TRIES && got_lo == SEG_NONE && *wd->steps; t++) {
        /* At depth 0 the windows are tried without evicting first (an item of nearly a segment
         * or a run may find no room from one window and fit from another); the last try takes
         * the cheapest window again, partly emptied by then, and evicts what finds no room. */
        bool may_evict = wd->depth == 0 && !wd->keep, last = may_evict && t == RUN_WINDOW_TRIES - 1;
        wd->evict = last;
        uint32_t nw;
        bool tail;
        uint32_t lo = cheapest_window(s, to, n, skip, last ? 0 : nskip, wd->x, wd->depth > 0,
                                      wd->own, wd->fill, wd->len, &nw, &tail);
        /* A nested window finding no plain one slides runs down until there is (bounded) */
        while (lo == SEG_NONE && wd->depth > 0 && slides < RUN_SLIDES_MAX &&
               slide_a_run(s, wd->x, wd->steps, fn, ctx)) {
            slides++;
            lo = cheapest_window(s, to, n, skip, nskip, wd->x, true, wd->own, wd->fill, 0, &nw,
                                 &tail);
        }
        if (lo == SEG_NONE && may_evict && !last) {
            t = RUN_WINDOW_TRIES - 2; /* no untried window left: the evicting try */
            continue;
        }
        if (lo == SEG_NONE) break;
        wd->w = (struct seg_span){lo, lo + nw};
        wd->tail = tail;
        /* The window's free segments first, so that no head of a pool emptying the rest of the
         * window lands in it. */
        memset(mine, 0, (n + 1) * sizeof *mine);
        for (uint32_t k = lo; k < lo + nw; k++)
            if ((!wd->own || own_free(to, wd->fill)) && LOAD(&s->meta[k].state) == SS_FREE)
                mine[k - lo] = take_this_free(s, to, k);
        uint32_t k = lo, beyond = lo + nw;
        bool ok = true;
        if (tail) {
            ok = mine[0] = spend(wd->steps) && window_take_tail(s, to, lo, wd, fn, ctx);
            k++;
        }
        while (ok && k < lo + nw) {
            if (mine[k - lo]) {
                k++;
                continue;
            }
            uint32_t got = spend(wd->steps) ? window_take(s, to, k, wd, fn, ctx) : 0;
            ok = got != 0;
            for (uint32_t j = k; ok && j < k + got; j++)
                if (j < lo + nw) mine[j - lo] = true;
            if (k + got > beyond) beyond = k + got;
            k += got;
        }
        if (beyond > lo + nw) seg_release(s, to, lo + nw, beyond - (lo + nw)); /* a run's rest */
        if (!ok)
            for (uint32_t j = lo; j < lo + nw; j++) {
                if (!mine[j - lo]) continue;
                if (tail && j == lo) untake_tail(s, to, j);
                else seg_release(s, to, j, 1);
            }
        if (ok) got_lo = lo;
        skip[nskip++] = lo;
    }
    free(mine);
    return got_lo;
}

uint32_t seg_make_run(struct segs *s, struct seg_pool *pl, uint32_t len, bool own, uint32_t *nw,
                      uint32_t *steps, seg_visit_fn fn, void *ctx)
{
    uint32_t n = (len + s->seg_size - 1) >> s->seg_shift;
    *nw = n;
    /* Runs whose items are gone are otherwise freed only when cleaning meets them. */
    for (int q = 0; q < Q_COUNT; q++)
        for (uint32_t i = pl->q[q].head, next; i != SEG_NONE; i = next) {
            next = s->meta[i].next;
            if (s->meta[i].state == SS_RUN && !LOAD(&s->meta[i].live) && !LOAD(&s->meta[i].pins))
                seg_run_release(s, pl, i);
        }
    uint32_t got = own ? SEG_NONE : seg_take_run(s, pl, n);
    if (got != SEG_NONE) return got;
    if (*steps == 0) return SEG_NONE;
    struct window wd = {.x = NO_SPAN, .depth = 0, .len = len, .keep = own, .own = own,
                        .fill = own, .steps = steps};
    pthread_mutex_unlock(&pl->lock);
    uint32_t lo = clear_window(s, pl, n, &wd, fn, ctx);
    pthread_mutex_lock(&pl->lock);
    if (lo != SEG_NONE) *nw = wd.w.hi - wd.w.lo;
    return lo;
}

/* Clear a window of one segment without evicting (pool pl's lock held, released meanwhile) and
 * make it queue q's head. True when it did. */
bool seg_head_from_window(struct segs *s, struct seg_pool *pl, int q, uint32_t *steps,
                          seg_visit_fn fn, void *ctx)
{
    if (*steps == 0) return false;
    struct window wd = {.x = NO_SPAN, .depth = 0, .keep = true, .own = true, .steps = steps};
    pthread_mutex_unlock(&pl->lock);
    uint32_t f = clear_window(s, pl, 1, &wd, fn, ctx);
    pthread_mutex_lock(&pl->lock);
    if (f == SEG_NONE) return false;
    seg_seal_head(s, pl, q);
    seg_install_head(s, pl, q, f);
    return true;
}
