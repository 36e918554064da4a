/* seg.c — the segmented log's arena, free segments, pools (one per namespace: quota, policy,
 * queues) and the allocation path: bump allocation at a pool's head, runs for large items,
 * freeing by marking records dead (see seg.h). Making room is seg_reclaim.c's.
 *
 * Record states, read by walkers through iflags (acquire loads):
 *   ITEM_LINKED     in the index (set and cleared by store.c under the shard lock);
 *   ITEM_SEG_DEAD   freed: the bytes are the log's;
 *   neither         in flight (allocated, not linked yet: its segment is pinned) or being
 *                   unlinked and freed by the holder of its shard lock.
 * A segment's records run from its start to its write offset; a record's length follows from
 * nkey, nbytes and ITEM_FLAGS, which seg_alloc writes under the pool lock and nobody changes.
 *
 * Quotas: a pool with a quota owns at most quota_segs segments and is guaranteed that many:
 * pools without a quota take a free segment only while more remain than the quota'd pools are
 * still owed. So while the quotas add up to no more than the memory, filling one pool never
 * evicts another pool's items. */
#include "node/seg_int.h"
#include "node/lock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/log.h"

#define SEG_GROWTH 1.08
#define SEG_FINE_STEP 8u   /* small buckets every 8 bytes up to SEG_FINE_MAX (as the old classes) */
#define SEG_FINE_MAX 256u
#define SEG_MIN_SHIFT 16 /* 64 KiB */
#define SEG_SMALL_SHIFT 17 /* 128 KiB */
#define SEG_MAX_SIZE (1u << 20)
/* Segment size: memory / SEG_PER_MEMORY rounded down to a power of two, at most 1 MiB and at
 * least 128 KiB, but never fewer than SEG_PER_MEMORY_MIN segments (so 64 KiB below -m 8): -m 8
 * and -m 16 have 128 KiB segments, -m 64 256 KiB, -m 256 and up 1 MiB. A namespace's quota is
 * whole segments and its s3fifo queues each keep a half-written head and at least one sealed
 * segment, so finer segments serve small quotas: an 8 MiB namespace of a -m 64 node has 32
 * segments, not 8 (1 MiB segments missed 24.8% where memcached -m 8 missed 23.7%; see
 * docs/benchmarks.md). Items larger than a segment take runs of segments, which below 90% live
 * must always find room (seg_run.c): 256 per -m evicted at -m 64 and in a 16 MB quota until a
 * run could begin after the end of another and a quota'd pool made its runs of its own
 * segments. */
#define SEG_PER_MEMORY 256u
#define SEG_PER_MEMORY_MIN 64u
#define POOL_MIN_SEGS 4     /* a pool without a quota may always own this many segments: with
                               fewer, each new head would evict the one just filled */

#define LOAD SEG_LOAD
#define STORE SEG_STORE

/* ---- creation ---------------------------------------------------------------------------- */

static int bucket_search(const struct segs *s, size_t total);

/* Fill s->size[1..] with bucket sizes: every SEG_FINE_STEP bytes from SEG_CHUNK_MIN to
 * SEG_FINE_MAX, then growing by SEG_GROWTH (rounded to SEG_ALIGN), and last one for item_max. */
static int seg_build_buckets(struct segs *s, uint64_t item_max)
{
    const uint64_t r = SEG_ALIGN - 1;
    uint64_t maxc = (item_max + r) & ~r;
    if (maxc < SEG_CHUNK_MIN) maxc = SEG_CHUNK_MIN;
    int n = 0;
    uint64_t sz = SEG_CHUNK_MIN;
    for (;;) {
        if (sz > maxc) sz = maxc;
        if (n == SEG_CLASS_MAX) return -1;
        s->size[++n] = (uint32_t)sz;
        if (sz == maxc) break;
        uint64_t next = sz < SEG_FINE_MAX ? sz + SEG_FINE_STEP
                                          : ((uint64_t)((double)sz * SEG_GROWTH) + r) & ~r;
        sz = next > sz ? next : sz + SEG_ALIGN;
    }
    s->nbuckets = n;
    for (uint32_t k = 0; k <= SEG_BUCKET_DIRECT / SEG_ALIGN; k++)
        s->direct[k] = (uint8_t)bucket_search(s, k * SEG_ALIGN);
    return 0;
}

int seg_create(struct segs **out, uint64_t memory, uint64_t item_max, char *err, size_t errlen)
{
    *out = NULL;
    if (item_max > memory / 2) {
        snprintf(err, errlen,
                 "item_max (%llu bytes) must be at most half the memory limit (%llu bytes); "
                 "lower -I or raise -m",
                 (unsigned long long)item_max, (unsigned long long)memory);
        return -1;
    }
    if (item_max > (1ull << 30)) {
        snprintf(err, errlen, "item_max %llu is too large; use -I 1g or less",
                 (unsigned long long)item_max);
        return -1;
    }
    unsigned shift = SEG_MIN_SHIFT;
    while ((1ull << (shift + 1)) <= memory / SEG_PER_MEMORY && (1u << (shift + 1)) <= SEG_MAX_SIZE)
        shift++;
    while (shift < SEG_SMALL_SHIFT && (1ull << (shift + 1)) <= memory / SEG_PER_MEMORY_MIN)
        shift++;
    uint64_t seg = 1ull << shift;
    uint64_t n = memory / seg;
    if (n < 2 || n >= SEG_NONE) {
        snprintf(err, errlen, "memory limit (%llu bytes) must hold at least 2 segments of %llu "
                 "bytes; raise -m", (unsigned long long)memory, (unsigned long long)seg);
        return -1;
    }
    struct segs *s;
    if (posix_memalign((void **)&s, 64, sizeof *s)) goto oom;
    memset(s, 0, sizeof *s);
    s->seg_size = (uint32_t)seg;
    s->seg_shift = shift;
    s->nsegs = (uint32_t)n;
    s->item_max = (uint32_t)item_max;
    s->mapped = (size_t)(n * seg);
    s->meta = calloc(n, sizeof *s->meta);
    s->freemap = calloc((n + 63) / 64, sizeof *s->freemap);
    if (!s->meta || !s->freemap || lock_init(&s->free_lock)) {
        free(s->meta);
        free(s->freemap);
        free(s);
        goto oom;
    }
    for (uint64_t i = 0; i < n; i++) {
        s->meta[i].prev = s->meta[i].next = SEG_NONE;
        s->freemap[i / 64] |= 1ull << (i % 64);
    }
    s->nfree = (uint32_t)n;
    if (seg_build_buckets(s, item_max)) {
        snprintf(err, errlen, "cannot build size buckets for item_max %llu",
                 (unsigned long long)item_max);
        goto fail;
    }
    /* NORESERVE: the limit may exceed free RAM plus swap; only touched pages cost anything. */
    void *base = mmap(NULL, s->mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "cannot reserve %zu bytes of item memory", s->mapped);
        goto fail;
    }
    s->base = base;
    *out = s;
    return 0;
fail:
    pthread_mutex_destroy(&s->free_lock);
    free(s->meta);
    free(s->freemap);
    free(s);
    return -1;
oom:
    snprintf(err, errlen, "out of memory creating the item memory");
    return -1;
}

int seg_advise_huge(struct segs *s)
{
    s->huge = true;
    return madvise(s->base, s->mapped, MADV_HUGEPAGE);
}

/* Drop the pages of withheld segment i. Not huge any more first: khugepaged would otherwise
 * collapse the range back into a huge page with the segment beside it, zeros and all, and make
 * it resident again. */
static void drop_pages(struct segs *s, uint32_t i)
{
    if (s->huge) madvise(seg_base(s, i), s->seg_size, MADV_NOHUGEPAGE);
    madvise(seg_base(s, i), s->seg_size, MADV_DONTNEED);
}

void seg_destroy(struct segs **sp)
{
    struct segs *s = *sp;
    if (!s) return;
    munmap(s->base, s->mapped);
    for (int i = 0; i < STORE_NS_MAX; i++) {
        struct seg_pool *pl = s->pools[i];
        if (!pl) continue;
        evict_pool_free(pl);
        free(pl->bk);
        pthread_mutex_destroy(&pl->lock);
        free(pl);
    }
    pthread_mutex_destroy(&s->free_lock);
    free(s->meta);
    free(s->freemap);
    free(s);
    *sp = NULL;
}

int seg_bucket_count(const struct segs *s) { return s->nbuckets; }

/* Bucket of `total` bytes by binary search. */
static int bucket_search(const struct segs *s, size_t total)
{
    if (total > s->size[s->nbuckets]) return 0;
    int lo = 1, hi = s->nbuckets;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->size[mid] >= total) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

int seg_bucket_for(const struct segs *s, size_t total)
{
    if (total <= SEG_BUCKET_DIRECT) return s->direct[(total + SEG_ALIGN - 1) / SEG_ALIGN];
    return bucket_search(s, total);
}

uint32_t seg_bucket_size(const struct segs *s, int id)
{
    return id >= 1 && id <= s->nbuckets ? s->size[id] : 0;
}

uint32_t seg_size(const struct segs *s) { return s->seg_size; }
uint32_t seg_count(const struct segs *s) { return s->nsegs; }
uint32_t seg_used(const struct segs *s)
{
    return s->nsegs - LOAD(&s->nfree) - LOAD(&s->held);
}
uint32_t seg_held(const struct segs *s) { return LOAD(&s->held); }
uint32_t seg_reserved(const struct segs *s)
{
    uint32_t held = LOAD(&s->held), want = LOAD(&s->held_want);
    return held > want ? held : want;
}
uint64_t seg_ghost_bytes(const struct segs *s) { return LOAD(&s->ghost_bytes); }
void seg_ghost_grew(struct segs *s) { seg_set_reserve(s, LOAD(&s->index_bytes)); }

/* ---- pools -------------------------------------------------------------------------------- */

/* Pool `nsid`, created (no quota, LRU) on first use; NULL only when out of memory. */
static struct seg_pool *pool_get(struct segs *s, uint16_t nsid)
{
    struct seg_pool *pl = seg_pool_at(s, nsid);
    if (__builtin_expect(pl != NULL, 1)) return pl;
    pthread_mutex_lock(&s->free_lock);
    pl = s->pools[nsid];
    if (!pl && posix_memalign((void **)&pl, 64, sizeof *pl) == 0) {
        memset(pl, 0, sizeof *pl);
        pl->id = nsid;
        pl->segs = s;
        pl->clean_skip = SEG_NONE;
        for (int q = 0; q < Q_COUNT; q++)
            pl->q[q].head = pl->q[q].tail = pl->q[q].cur = SEG_NONE;
        pl->bk = calloc((size_t)s->nbuckets + 1, sizeof *pl->bk);
        if (!pl->bk || lock_init(&pl->lock)) {
            free(pl->bk);
            free(pl);
            pl = NULL;
        } else {
            evict_pool_prepare(pl, SEG_POLICY_LRU, 0);
            __atomic_store_n(&s->pools[nsid], pl, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&s->free_lock);
    return pl;
}

/* Segments the quota'd pools are still owed (free_lock held). */
static uint64_t pool_owed(const struct segs *s)
{
    uint64_t owed = 0;
    for (int i = 0; i < STORE_NS_MAX; i++) {
        const struct seg_pool *pl = s->pools[i];
        if (pl && pl->quota_segs > pl->nsegs) owed += pl->quota_segs - pl->nsegs;
    }
    return owed;
}

/* May pool pl take `n` more free segments (free_lock held)? */
static bool pool_may_take(const struct segs *s, const struct seg_pool *pl, uint32_t n, bool force)
{
    if (s->nfree < n) return false;
    if (force) return true;
    if (pl->quota_segs) return pl->nsegs + n <= pl->quota_segs;
    if (pl->nsegs + n <= POOL_MIN_SEGS) return true;
    uint32_t want = LOAD(&s->held_want), short_by = want > s->held ? want - s->held : 0;
    return s->nfree - n >= pool_owed(s) + short_by;
}

static void take_bits(struct segs *s, struct seg_pool *pl, uint32_t i, uint32_t n)
{
    for (uint32_t k = i; k < i + n; k++) {
        s->freemap[k / 64] &= ~(1ull << (k % 64));
        struct seg_meta *m = &s->meta[k];
        m->woff = 0;
        STORE(&m->live, 0);
        STORE(&m->pins, 0);
        m->prev = m->next = SEG_NONE;
        m->nrun = 0;
        m->start = 0;
        m->shares_tail = 0;
        m->touched = 1;
        STORE(&m->nsid, pl->id);
        STORE(&m->state, (uint8_t)SS_BUSY);
    }
    s->nfree -= n;
    STORE(&pl->nsegs, pl->nsegs + n);
}

uint32_t seg_take_free(struct segs *s, struct seg_pool *pl, bool force)
{
    uint32_t got = SEG_NONE;
    pthread_mutex_lock(&s->free_lock);
    if (pool_may_take(s, pl, 1, force)) {
        uint32_t words = (s->nsegs + 63) / 64;
        for (uint32_t w = s->free_hint; w < words; w++) {
            if (!s->freemap[w]) continue;
            got = w * 64 + (uint32_t)__builtin_ctzll(s->freemap[w]);
            s->free_hint = w;
            break;
        }
        if (got != SEG_NONE) take_bits(s, pl, got, 1);
    }
    pthread_mutex_unlock(&s->free_lock);
    return got;
}

/* n contiguous free segments for pl, if its quota allows (free_lock taken here). Runs are looked
 * for from the top of the arena down and single segments from the bottom up, so that runs and
 * heads do not interleave and leave contiguous room for the next runs. */
static uint32_t take_free_run(struct segs *s, struct seg_pool *pl, uint32_t n, bool force)
{
    uint32_t got = SEG_NONE;
    pthread_mutex_lock(&s->free_lock);
    if (pool_may_take(s, pl, n, force)) {
        uint32_t len = 0;
        for (uint32_t i = s->nsegs; i-- > 0;) {
            if (!(s->freemap[i / 64] & (1ull << (i % 64)))) {
                len = 0;
                continue;
            }
            if (++len == n) {
                got = i;
                break;
            }
        }
        if (got != SEG_NONE) take_bits(s, pl, got, n);
    }
    pthread_mutex_unlock(&s->free_lock);
    return got;
}

uint32_t seg_take_run(struct segs *s, struct seg_pool *pl, uint32_t n)
{
    return take_free_run(s, pl, n, false);
}

void seg_release(struct segs *s, struct seg_pool *pl, uint32_t i, uint32_t n)
{
    pthread_mutex_lock(&s->free_lock);
    for (uint32_t k = i; k < i + n; k++) {
        struct seg_meta *m = &s->meta[k];
        STORE(&m->state, (uint8_t)SS_FREE);
        STORE(&m->gen, m->gen + 1);
        m->prev = m->next = SEG_NONE;
        m->woff = 0;
        m->start = 0;
        m->shares_tail = 0;
        s->freemap[k / 64] |= 1ull << (k % 64);
    }
    if (i / 64 < s->free_hint) s->free_hint = i / 64;
    s->nfree += n;
    if (pl) STORE(&pl->nsegs, pl->nsegs - n);
    pthread_mutex_unlock(&s->free_lock);
}

int seg_pool_configure(struct segs *s, uint16_t nsid, uint64_t quota, enum seg_policy policy)
{
    struct seg_pool *pl = pool_get(s, nsid % STORE_NS_MAX);
    if (!pl) return -1;
    uint64_t q = quota ? quota / s->seg_size : 0;
    if (quota && q == 0) q = 1;
    if (q > s->nsegs) q = s->nsegs;
    pthread_mutex_lock(&pl->lock);
    pthread_mutex_lock(&s->free_lock);
    STORE(&pl->quota_segs, (uint32_t)q);
    pthread_mutex_unlock(&s->free_lock);
    /* Policy state first, so that an item admitted under the new policy finds it. */
    int rc = evict_pool_prepare(pl, policy, q ? q * s->seg_size : s->mapped);
    __atomic_store_n(&pl->policy, (uint8_t)policy, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pl->lock);
    return rc;
}

uint32_t seg_pool_segs(struct segs *s, uint16_t nsid)
{
    struct seg_pool *pl = seg_pool_at(s, nsid);
    return pl ? LOAD(&pl->nsegs) : 0;
}

enum seg_policy seg_pool_policy(struct segs *s, uint16_t nsid)
{
    struct seg_pool *pl = seg_pool_at(s, nsid);
    return pl ? (enum seg_policy)__atomic_load_n(&pl->policy, __ATOMIC_ACQUIRE) : SEG_POLICY_LRU;
}

/* ---- queues (pool lock held) -------------------------------------------------------------- */

void seg_q_push(struct segs *s, struct seg_pool *pl, int q, uint32_t i)
{
    struct seg_queue *qu = &pl->q[q];
    struct seg_meta *m = &s->meta[i];
    m->queue = (uint8_t)q;
    m->next = SEG_NONE;
    m->prev = qu->tail;
    if (qu->tail != SEG_NONE) s->meta[qu->tail].next = i;
    else qu->head = i;
    qu->tail = i;
    qu->len += m->nrun ? m->nrun : 1;
}

void seg_q_remove(struct segs *s, struct seg_pool *pl, uint32_t i)
{
    struct seg_meta *m = &s->meta[i];
    struct seg_queue *qu = &pl->q[m->queue];
    if (m->prev != SEG_NONE) s->meta[m->prev].next = m->next;
    else qu->head = m->next;
    if (m->next != SEG_NONE) s->meta[m->next].prev = m->prev;
    else qu->tail = m->prev;
    m->prev = m->next = SEG_NONE;
    qu->len -= m->nrun ? m->nrun : 1;
}

void seg_seal_head(struct segs *s, struct seg_pool *pl, int q)
{
    uint32_t i = pl->q[q].cur;
    if (i == SEG_NONE) return;
    pl->q[q].cur = SEG_NONE;
    s->meta[i].sealed_at = ++pl->seal_seq;
    STORE(&s->meta[i].state, (uint8_t)SS_SEALED);
    seg_q_push(s, pl, q, i);
}

/* ---- allocation --------------------------------------------------------------------------- */

/* Write a new record's header at `it` in segment i (pool lock held): what a walker needs to step
 * over it (nkey, nbytes, ITEM_FLAGS) before anyone else can see it. */
static struct item *place(struct segs *s, struct seg_pool *pl, uint32_t i, uint32_t len,
                          uint8_t nkey, uint32_t nbytes, uint8_t iflags, uint64_t hv)
{
    struct seg_meta *m = &s->meta[i];
    struct item *it = (struct item *)(seg_base(s, i) + m->woff);
    it->nkey = nkey;
    it->nbytes = nbytes;
    it->nsid = (uint8_t)pl->id;
    __atomic_store_n(&it->iflags, iflags, __ATOMIC_RELAXED);
    m->woff += len;
    __atomic_fetch_add(&m->live, len, __ATOMIC_RELAXED);
    __atomic_fetch_add(&m->pins, 1, __ATOMIC_RELAXED);
    (void)hv;
    return it;
}

void seg_install_head(struct segs *s, struct seg_pool *pl, int q, uint32_t i)
{
    struct seg_meta *m = &s->meta[i];
    m->woff = m->start = 0;
    m->queue = (uint8_t)q;
    STORE(&m->gen, m->gen + 1);
    STORE(&m->state, (uint8_t)SS_HEAD);
    pl->q[q].cur = i;
}

/* A run of n >= 2 segments holding one record of len bytes, queued in q. Pool lock held. When
 * at least a header's worth of the item is in its last segment, that segment becomes q's head
 * from the item's end on: the rest of a run is log space, not waste. */
static struct item *alloc_run(struct segs *s, struct seg_pool *pl, int q, uint32_t len,
                              uint8_t nkey, uint32_t nbytes, uint8_t iflags, uint64_t hv,
                              seg_visit_fn fn, void *ctx)
{
    uint32_t n = (len + s->seg_size - 1) >> s->seg_shift, nw = n, i = SEG_NONE;
    uint32_t steps = SEG_RUN_STEPS;
    /* A quota'd pool that would go beyond its quota and is below 90% live makes the run of its
     * own segments: a window of them is cleared into its heads (cleaning the rest), nothing
     * evicted. Giving segments back first and taking others instead evicted: the segments given
     * back are seldom contiguous, so the window cleared then holds items it cannot move. */
    if (pl->quota_segs && LOAD(&pl->nsegs) + n > pl->quota_segs && seg_pool_roomy(s, pl))
        i = seg_make_run(s, pl, len, true, &nw, &steps, fn, ctx);
    /* Else it first gives back what the run would take beyond its quota: by cleaning while it
     * is below 90% live, by eviction only when the item would take it to 90% of its quota or
     * more (not seg_pool_roomy, which beyond the quota measures against the segments owned:
     * the pool would grow without bound). Below 90% a window of its own segments can
     * still fail (each one tried holds a run with nowhere to go: a 16 MB quota is 64 segments
     * at -m 64, scattered among the default pool's, and a 1 MB item needs 4 in a row), and
     * evicting then broke the rule (1-2 items in 3 of 30 loaded runs of test_memory_rules's 16 MB
     * namespace): the run is made below from free or other pools' segments instead, the pool
     * goes beyond its quota for a while and cleaning gives the excess back (seg_trim). */
    for (uint32_t k = 0; i == SEG_NONE && k < 2 * s->nsegs && pl->quota_segs; k++)
        if (LOAD(&pl->nsegs) + n <= pl->quota_segs ||
            (!seg_consolidate(s, pl, fn, ctx) &&
             (seg_pool_fits_quota(s, pl, len) || !seg_shrink(s, pl, fn, ctx))))
            break;
    if (i == SEG_NONE) i = take_free_run(s, pl, n, false);
    if (i == SEG_NONE) i = seg_make_run(s, pl, len, false, &nw, &steps, fn, ctx);
    if (i == SEG_NONE) i = take_free_run(s, pl, nw = n, true);
    /* Last resort, so that a store that fits never fails: give back the pool's oldest segments
     * (evicting) until n contiguous ones are free. */
    for (uint32_t k = 0; i == SEG_NONE && k < 2 * s->nsegs; k++) {
        if (!seg_shrink(s, pl, fn, ctx)) break;
        i = take_free_run(s, pl, nw = n, true);
    }
    if (i == SEG_NONE) return NULL;
    struct seg_meta *m = &s->meta[i];
    /* A run may begin after the end of another run in that run's last segment (seg_make_run's
     * tail window), which then holds the end of the one and the start of the other. That run
     * may have gone meanwhile (start 0 again): then the window has one segment too many. */
    uint32_t off = m->start;
    n = (off + len + s->seg_size - 1) >> s->seg_shift;
    if (nw > n) seg_release(s, pl, i + n, nw - n);
    STORE(&m->gen, m->gen + 1);
    m->woff = off;
    uint32_t last = i + n - 1, end = off + len - (n - 1) * s->seg_size;
    /* The old head is sealed: its unused room is dead bytes cleaning reclaims, where a run's
     * unused end would stay lost until the run goes. */
    bool share = end >= sizeof(struct item) && s->seg_size - end >= SEG_ALIGN * 8;
    m->nrun = share ? n - 1 : n;
    m->shares_tail = share;
    for (uint32_t k = i + 1; k < i + m->nrun; k++) STORE(&s->meta[k].state, (uint8_t)SS_RUN_TAIL);
    struct item *it = place(s, pl, i, len, nkey, nbytes, iflags, hv);
    STORE(&m->state, (uint8_t)SS_RUN);
    seg_q_push(s, pl, q, i);
    if (share) {
        struct seg_meta *t = &s->meta[last];
        seg_seal_head(s, pl, q);
        t->start = t->woff = end;
        t->run_of = i;
        t->queue = (uint8_t)q;
        STORE(&t->gen, t->gen + 1);
        STORE(&t->state, (uint8_t)SS_HEAD);
        pl->q[q].cur = last;
    }
    return it;
}

static uint32_t hold_one(struct segs *s);

/* Withhold what the target lacks now, from pool pl (lock held, no quota) if no segment is free:
 * the index or a ghost grew while the pool was full, and without this the pool would go on
 * using the index's share until the sweeper's next tick. A segment or two per allocation. */
static void withhold_now(struct segs *s, struct seg_pool *pl, seg_visit_fn fn, void *ctx)
{
    for (int k = 0; k < 2 && LOAD(&s->held) < LOAD(&s->held_want); k++) {
        pthread_mutex_lock(&s->free_lock);
        uint32_t got = s->held < s->held_want ? hold_one(s) : SEG_NONE;
        pthread_mutex_unlock(&s->free_lock);
        if (got != SEG_NONE) {
            drop_pages(s, got);
            continue;
        }
        if (LOAD(&pl->nsegs) <= POOL_MIN_SEGS || !seg_give_back(s, pl, fn, ctx)) return;
    }
}

struct item *seg_alloc(struct segs *s, uint16_t nsid, uint8_t nkey, uint32_t nbytes,
                       uint8_t iflags, uint64_t hv, seg_visit_fn fn, void *ctx)
{
    struct seg_pool *pl = pool_get(s, nsid % STORE_NS_MAX);
    if (!pl) pl = pool_get(s, 0); /* out of memory for a new pool: account to default */
    if (!pl) return NULL;
    uint32_t len = (uint32_t)seg_record_size(nkey, nbytes, iflags & ITEM_FLAGS);
    struct item tmp = {.nkey = nkey, .nbytes = nbytes, .iflags = iflags};
    pthread_mutex_lock(&pl->lock);
    if (__builtin_expect(LOAD(&s->held) < LOAD(&s->held_want), 0) && !LOAD(&pl->quota_segs))
        withhold_now(s, pl, fn, ctx);
    int q = evict_admit(pl, &tmp, hv);
    struct item *it = NULL;
    uint32_t since = pl->seal_seq, steps = SEG_RUN_STEPS;
    if (len > s->seg_size) {
        it = alloc_run(s, pl, q, len, nkey, nbytes, iflags, hv, fn, ctx);
    } else {
        for (int tries = 0;; tries++) {
            uint32_t cur = pl->q[q].cur;
            if (cur != SEG_NONE && s->meta[cur].woff + len <= s->seg_size) {
                it = place(s, pl, cur, len, nkey, nbytes, iflags, hv);
                break;
            }
            /* A segment mostly dead is reused before a free one is touched: overwrites in a
             * roomy store would otherwise walk the log through all of -m, faulting in fresh
             * pages (RSS up to -m for a small live set) where a free list reuses chunks. */
            if (seg_reuse_dead(s, pl, q, since, fn, ctx)) continue;
            uint32_t f = seg_take_free(s, pl, false);
            /* The head stays while room is made: a victim's items fill the rest of it first.
             * Past a full turn of the pool's segments without room (every victim kept its items,
             * or they were busy), victims keep nothing: an allocation always ends. */
            uint32_t turn = LOAD(&pl->nsegs) + 8;
            if (f == SEG_NONE && (uint32_t)tries < 2 * turn &&
                seg_reclaim(s, pl, q, len, (uint32_t)tries >= turn, since, &steps, fn, ctx))
                continue;
            /* Last resort, so that a store that fits never fails: a segment owed to a quota'd
             * pool (which takes it back later, as we are then beyond our guarantee). */
            if (f == SEG_NONE) f = seg_take_free(s, pl, true);
            if (f == SEG_NONE) break;
            seg_seal_head(s, pl, q);
            seg_install_head(s, pl, q, f);
        }
    }
    if (it) {
        it->clock = tmp.clock;
    } else {
        pl->bk[seg_bucket_for(s, len)].alloc_failures++;
    }
    pthread_mutex_unlock(&pl->lock);
    return it;
}

void seg_linked(struct segs *s, struct item *it)
{
    __atomic_fetch_sub(&s->meta[seg_of(s, it)].pins, 1, __ATOMIC_RELEASE);
}

void seg_kill(struct segs *s, struct item *it, uint32_t len)
{
    uint8_t f = rec_state(it);
    __atomic_store_n(&it->iflags, (uint8_t)((f & ~ITEM_LINKED) | ITEM_SEG_DEAD), __ATOMIC_RELEASE);
    __atomic_fetch_sub(&s->meta[seg_of(s, it)].live, len, __ATOMIC_RELAXED);
}

void seg_free(struct segs *s, struct item *it, bool inflight)
{
    uint8_t f = rec_state(it);
    struct seg_meta *m = &s->meta[seg_of(s, it)];
    if (f & (ITEM_SEG_DEAD | ITEM_LINKED)) {
        /* Freed twice, or freed while linked: a bug. Never let it corrupt the counts; say so,
         * and stop a sanitizer build at once so that tests find it. */
        struct seg_pool *pl = seg_pool_at(s, LOAD(&m->nsid));
        if (pl) __atomic_fetch_add(&pl->bk[0].double_frees, 1, __ATOMIC_RELAXED);
        log_error("seg: record %p freed twice", (void *)it);
#ifdef __SANITIZE_ADDRESS__
        abort();
#endif
        return;
    }
    uint32_t len = (uint32_t)seg_item_size(it);
    __atomic_store_n(&it->iflags, (uint8_t)(f | ITEM_SEG_DEAD), __ATOMIC_RELEASE);
    __atomic_fetch_sub(&m->live, len, __ATOMIC_RELAXED);
    if (inflight) __atomic_fetch_sub(&m->pins, 1, __ATOMIC_RELEASE);
}

void seg_count_gone(struct seg_pool *pl, const struct item *it, enum seg_visit why, int r)
{
    struct seg_counters *c = &pl->bk[seg_bucket_for(pl->segs, seg_item_size(it))];
    if (r & SEG_GONE_EXPIRED) {
        if (why == SEG_VISIT_SWEEP) c->sweeper_reclaimed++;
        else c->reclaimed++;
        if (r & SEG_GONE_UNFETCHED) c->expired_unfetched++;
    } else {
        c->evictions++;
        if (r & SEG_GONE_UNFETCHED) c->evicted_unfetched++;
    }
}

/* ---- withheld segments: -m's share of the index and the ghosts ------------------------------- */

/* Take one free segment out of circulation (free_lock held), if one is not owed to a quota:
 * the highest one whose pages a pool has used (so that dropping them lowers RSS), else the
 * highest (heads are taken from the bottom, so the pools' segments stay together at -m's start
 * and a store's layout does not depend on what was withheld). */
static uint32_t hold_one(struct segs *s)
{
    if (s->nfree <= pool_owed(s)) return SEG_NONE;
    uint32_t got = SEG_NONE;
    for (uint32_t w = (s->nsegs + 63) / 64; w-- > 0 && (got == SEG_NONE || !s->meta[got].touched);) {
        for (uint64_t bits = s->freemap[w]; bits; bits &= ~(1ull << (63 - __builtin_clzll(bits)))) {
            uint32_t i = w * 64 + 63 - (uint32_t)__builtin_clzll(bits);
            if (got == SEG_NONE) got = i;
            if (s->meta[i].touched) {
                got = i;
                break;
            }
        }
    }
    if (got == SEG_NONE) return SEG_NONE;
    s->freemap[got / 64] &= ~(1ull << (got % 64));
    s->nfree--;
    struct seg_meta *m = &s->meta[got];
    m->woff = m->start = 0;
    m->prev = m->next = SEG_NONE;
    m->touched = 0;
    STORE(&m->state, (uint8_t)SS_HELD);
    STORE(&s->held, s->held + 1);
    return got;
}

/* Give one withheld segment back to the free map (free_lock held). */
static void unhold_one(struct segs *s)
{
    for (uint32_t i = s->nsegs; i-- > 0;) {
        if (LOAD(&s->meta[i].state) != SS_HELD) continue;
        if (s->huge) madvise(seg_base(s, i), s->seg_size, MADV_HUGEPAGE);
        STORE(&s->meta[i].state, (uint8_t)SS_FREE);
        s->freemap[i / 64] |= 1ull << (i % 64);
        if (i / 64 < s->free_hint) s->free_hint = i / 64;
        s->nfree++;
        STORE(&s->held, s->held - 1);
        return;
    }
}

uint32_t seg_set_reserve(struct segs *s, uint64_t index_bytes)
{
    STORE(&s->index_bytes, index_bytes);
    uint64_t bytes = index_bytes + LOAD(&s->ghost_bytes);
    /* whole segments, rounded up but for an eighth of one: -m holds them within 1/8 segment
     * (128 KiB from -m 64 up), and a small index (a few KiB at -m 8) takes none of -m's 64 */
    uint64_t want = (bytes + s->seg_size - s->seg_size / 8) >> s->seg_shift;
    if (want > s->nsegs / 2) want = s->nsegs / 2;
    STORE(&s->held_want, (uint32_t)want);
    /* what is no longer needed goes back at once (no pages to drop: the next user faults them) */
    if (LOAD(&s->held) > want) {
        pthread_mutex_lock(&s->free_lock);
        while (s->held > LOAD(&s->held_want)) unhold_one(s);
        pthread_mutex_unlock(&s->free_lock);
    }
    return (uint32_t)want;
}

uint32_t seg_withhold(struct segs *s, uint64_t index_bytes, uint32_t max, seg_visit_fn fn,
                      void *ctx)
{
    uint32_t want = seg_set_reserve(s, index_bytes);
    for (uint32_t done = 0; done < max; done++) {
        pthread_mutex_lock(&s->free_lock);
        uint32_t held = s->held, got = SEG_NONE;
        if (held > want) unhold_one(s);
        else if (held < want) got = hold_one(s);
        pthread_mutex_unlock(&s->free_lock);
        if (held == want) break;
        if (got != SEG_NONE) {
            drop_pages(s, got); /* what the index and ghosts use instead */
            continue;
        }
        if (held > want) continue;
        /* No free segment: the pool without a quota owning the most gives one back. */
        struct seg_pool *best = NULL;
        for (int i = 0; i < STORE_NS_MAX; i++) {
            struct seg_pool *pl = seg_pool_at(s, (uint16_t)i);
            if (pl && !LOAD(&pl->quota_segs) && (!best || LOAD(&pl->nsegs) > LOAD(&best->nsegs)))
                best = pl;
        }
        if (!best || LOAD(&best->nsegs) <= POOL_MIN_SEGS) break;
        pthread_mutex_lock(&best->lock);
        bool gave = seg_give_back(s, best, fn, ctx);
        pthread_mutex_unlock(&best->lock);
        if (!gave) break; /* busy items: the next tick tries again */
    }
    return LOAD(&s->held);
}
