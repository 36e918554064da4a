/* seg_walk.c — walking the segmented log record by record for the sweeper and key dumps, and
 * the per-bucket figures behind `stats items` and `stats slabs` (see seg.h).
 *
 * A walker holds the owning pool's lock for one batch of records, so that nothing moves or
 * reuses the segment meanwhile; between batches it keeps (segment, offset, generation). If the
 * generation changed (records moved, or the segment reused) the sweeper gives up on the segment
 * (its next pass comes back to it), a dump walks it again from its start (seg_peek). */
#include "node/seg_int.h"

#include <string.h>

#define LOAD SEG_LOAD
#define STORE SEG_STORE

#define OLDEST_SAMPLE 256 /* records looked at in a queue's oldest segment for oldest_atime */

/* Lock the pool owning segment pos->seg if it holds records and is the one the walk began on.
 * Returns the pool, locked, or NULL (the walk of this segment is over). */
static struct seg_pool *walk_lock(struct segs *s, struct seg_pos *pos, bool restart)
{
    if (pos->seg >= s->nsegs) return NULL;
    struct seg_meta *m = &s->meta[pos->seg];
    uint8_t st = LOAD(&m->state);
    pos->busy = false;
    if (restart && st == SS_BUSY) {
        /* being emptied, its pool's lock let go (window_empty_one): what it holds may stay if
         * that fails, so a dump comes back rather than passing it */
        pos->busy = true;
        return NULL;
    }
    if (st != SS_HEAD && st != SS_SEALED && st != SS_RUN) return NULL;
    uint16_t nsid = LOAD(&m->nsid);
    struct seg_pool *pl = seg_pool_at(s, nsid);
    if (!pl) return NULL;
    pthread_mutex_lock(&pl->lock);
    st = LOAD(&m->state);
    bool ok = (st == SS_HEAD || st == SS_SEALED || st == SS_RUN) && LOAD(&m->nsid) == nsid;
    if (ok && pos->off == 0) {
        pos->gen = m->gen;
        pos->off = m->start; /* before it: the end of the run before this segment */
    } else if (ok && pos->gen != m->gen) {
        /* records moved under us: offsets no longer fall on record starts */
        ok = restart && pos->restarts < SEG_WALK_RESTARTS;
        if (ok) {
            pos->restarts++;
            pos->gen = m->gen;
            pos->off = m->start;
        }
    }
    if (!ok) {
        pthread_mutex_unlock(&pl->lock);
        return NULL;
    }
    return pl;
}

/* One batch of a walk: up to `max` records of segment pos->seg from pos->off, calling `each`
 * on the linked ones with the pool's lock held, and advancing pos. Returns whether records
 * remain in the segment. */
static bool walk_batch(struct segs *s, struct seg_pos *pos, uint32_t max,
                       void (*each)(struct segs *, struct seg_pool *, struct item *, uint32_t,
                                    void *),
                       void *arg, bool restart)
{
    struct seg_pool *pl = walk_lock(s, pos, restart);
    if (!pl) return false;
    struct seg_meta *m = &s->meta[pos->seg];
    char *base = seg_base(s, pos->seg);
    uint32_t off = pos->off;
    for (uint32_t k = 0; k < max && off < m->woff; k++) {
        struct item *it = (struct item *)(base + off);
        uint32_t len = (uint32_t)seg_item_size(it);
        off += len;
        if (rec_state(it) & ITEM_LINKED) each(s, pl, it, len, arg);
    }
    pos->off = off;
    bool more = off < m->woff;
    pthread_mutex_unlock(&pl->lock);
    return more;
}

struct sweep_arg {
    seg_visit_fn fn;
    void *ctx;
    bool *missed;
};

static void sweep_one(struct segs *s, struct seg_pool *pl, struct item *it, uint32_t len,
                      void *arg)
{
    const struct sweep_arg *a = arg;
    int r = a->fn(a->ctx, it, SEG_VISIT_SWEEP, NULL);
    if (r & SEG_MISSED) *a->missed = true;
    if (!(r & SEG_GONE)) return;
    seg_count_gone(pl, it, SEG_VISIT_SWEEP, r);
    seg_kill(s, it, len);
}

bool seg_walk(struct segs *s, struct seg_pos *pos, uint32_t max, seg_visit_fn fn, void *ctx,
              bool *missed)
{
    struct sweep_arg a = {fn, ctx, missed};
    return walk_batch(s, pos, max, sweep_one, &a, false);
}

struct peek_arg {
    int clsid;
    void (*fn)(void *ctx, struct item *it, int clsid);
    void *ctx;
};

static void peek_one(struct segs *s, struct seg_pool *pl, struct item *it, uint32_t len,
                     void *arg)
{
    (void)pl;
    const struct peek_arg *a = arg;
    int b = seg_bucket_for(s, len);
    if (a->clsid == 0 || b == a->clsid) a->fn(a->ctx, it, b);
}

bool seg_peek(struct segs *s, struct seg_pos *pos, uint32_t max, int clsid,
              void (*fn)(void *ctx, struct item *it, int clsid), void *ctx)
{
    struct peek_arg a = {clsid, fn, ctx};
    return walk_batch(s, pos, max, peek_one, &a, true);
}

static void counters_add(struct seg_counters *out, const struct seg_counters *c)
{
    out->evictions += c->evictions;
    out->evicted_unfetched += c->evicted_unfetched;
    out->expired_unfetched += c->expired_unfetched;
    out->reclaimed += c->reclaimed;
    out->sweeper_reclaimed += c->sweeper_reclaimed;
    out->segs_cleaned += c->segs_cleaned;
    out->alloc_failures += c->alloc_failures;
    out->segs_trimmed += c->segs_trimmed;
    out->double_frees += LOAD(&c->double_frees);
}

void seg_sum_counters(struct segs *s, struct seg_counters *out)
{
    for (int p = 0; p < STORE_NS_MAX; p++) {
        struct seg_pool *pl = seg_pool_at(s, (uint16_t)p);
        if (!pl) continue;
        pthread_mutex_lock(&pl->lock);
        for (int i = 0; i <= s->nbuckets; i++) counters_add(out, &pl->bk[i]);
        pthread_mutex_unlock(&pl->lock);
    }
}

/* Smallest atime of linked items of bucket id among the first records of segment i. */
static uint32_t oldest_in(struct segs *s, uint32_t i, int id, uint32_t low)
{
    if (i == SEG_NONE) return low;
    struct seg_meta *m = &s->meta[i];
    char *base = seg_base(s, i);
    uint32_t off = m->start;
    for (int k = 0; k < OLDEST_SAMPLE && off < m->woff; k++) {
        struct item *it = (struct item *)(base + off);
        uint32_t len = (uint32_t)seg_item_size(it);
        off += len;
        if (!(rec_state(it) & ITEM_LINKED) || seg_bucket_for(s, len) != id) continue;
        uint32_t at = LOAD(&it->atime);
        if (!low || at < low) low = at;
    }
    return low;
}

bool seg_bucket_info(struct segs *s, int id, struct seg_bucket_info *out)
{
    if (id < 1 || id > s->nbuckets) return false;
    memset(out, 0, sizeof *out);
    out->size = s->size[id];
    for (int p = 0; p < STORE_NS_MAX; p++) {
        struct seg_pool *pl = seg_pool_at(s, (uint16_t)p);
        if (!pl) continue;
        pthread_mutex_lock(&pl->lock);
        counters_add(&out->c, &pl->bk[id]);
        /* The oldest segments of the queues are the next victims: their oldest access stands
         * in for the tail age of an LRU. */
        for (int q = 0; q < Q_COUNT; q++)
            out->oldest_atime = oldest_in(s, pl->q[q].head, id, out->oldest_atime);
        pthread_mutex_unlock(&pl->lock);
    }
    return true;
}
