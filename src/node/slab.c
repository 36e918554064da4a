/* slab.c — page reservation, size classes, chunk allocation, CLOCK eviction and page moves
 * between classes (see slab.h).
 *
 * Chunk states, read by walkers through iflags (acquire loads; every state change is made under
 * the chunk's class lock, except ITEM_LINKED, which store.c sets and clears under the shard lock):
 *   ITEM_LINKED     in the index;
 *   ITEM_SLAB_FREE  on the class free list, or freed inside a page being moved;
 *   neither         "in flight": handed out by slab_alloc, not yet linked or freed, or unlinked
 *                   and about to be freed.
 * Only chunks below a page's `carved` count exist; the rest of the page is untouched memory (or
 * stale bytes of a previous class), which no walker reads. */
#include "node/slab.h"
#include "node/lock.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SLAB_GROWTH 1.08
#define SLAB_FINE_MAX 256u     /* classes every 8 bytes up to this size */
#define SLAB_CLOCK_TURNS 2     /* a CLOCK walk gives up after this many revolutions */
#define SLAB_STEAL_DONORS 3    /* classes tried for one page move */
#define SLAB_STEAL_PAGES 4     /* pages of one donor tried */
#define SLAB_STEAL_ROUNDS 2000 /* lock releases while waiting for busy shards, per page */
#define SLAB_OLDEST_SAMPLE 256 /* chunks looked at for a class's oldest_age */

struct slab_page {
    uint32_t next, prev; /* the owning class's page list, in order of arrival */
    uint32_t carved;     /* chunks cut so far (owner's lock) */
    uint8_t clsid;       /* owner, 0 when unassigned; read without a lock by the sweeper */
    uint8_t moving;      /* being emptied for another class; chunks freed here stay out of lists */
};

struct slab_class {
    pthread_mutex_t lock;
    uint32_t size;
    uint32_t perpage;
    struct item *free; /* chained through hnext */
    uint64_t nfree;
    uint64_t carved;   /* sum of its pages' carved counts */
    uint32_t npages;   /* written under the lock, read without it when choosing a donor */
    uint32_t head, tail;
    uint32_t cur;      /* page still being carved, or SLAB_NONE */
    uint32_t hand_page, hand_idx; /* CLOCK hand */
    struct slab_counters c;
} __attribute__((aligned(64)));

struct slab {
    char *base;
    size_t mapped;
    uint32_t page_size;
    unsigned page_shift;
    uint32_t npages;
    uint32_t next_page; /* pages [next_page, npages) are unassigned; atomic */
    int nclasses;
    struct slab_page *pages;
    struct slab_class cls[SLAB_CLASS_MAX + 1]; /* [0] unused */
};

#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

static inline struct item *slab_chunk(const struct slab *s, uint32_t page, uint32_t i,
                                      uint32_t size)
{
    return (struct item *)(s->base + ((size_t)page << s->page_shift) + (size_t)i * size);
}

static inline uint32_t slab_page_of(const struct slab *s, const struct item *it)
{
    return (uint32_t)(((const char *)it - s->base) >> s->page_shift);
}

static inline uint8_t chunk_state(struct item *it)
{
    return __atomic_load_n(&it->iflags, __ATOMIC_ACQUIRE);
}


/* ---- creation ---------------------------------------------------------------------------- */

/* Fill s->cls[1..] with chunk sizes: every 8 bytes from SLAB_CHUNK_MIN to SLAB_FINE_MAX, where
 * most small items fall and a step of 8 wastes at most 7 bytes, then growing by SLAB_GROWTH
 * (rounded to 8), and last a class for the largest item. */
static int slab_build_classes(struct slab *s, uint64_t item_max)
{
    uint64_t maxc = (item_max + 7) & ~(uint64_t)7;
    if (maxc > s->page_size) maxc = s->page_size;
    if (maxc < SLAB_CHUNK_MIN) maxc = SLAB_CHUNK_MIN;
    int n = 0;
    uint64_t sz = SLAB_CHUNK_MIN;
    for (;;) {
        if (sz > maxc) sz = maxc;
        if (n == SLAB_CLASS_MAX) return -1;
        struct slab_class *c = &s->cls[++n];
        c->size = (uint32_t)sz;
        c->perpage = (uint32_t)(s->page_size / sz);
        if (sz == maxc) break;
        uint64_t next = sz < SLAB_FINE_MAX ? sz + 8 : ((uint64_t)((double)sz * SLAB_GROWTH) + 7) & ~7ull;
        sz = next > sz ? next : sz + 8;
    }
    s->nclasses = n;
    for (int i = 1; i <= n; i++) {
        struct slab_class *c = &s->cls[i];
        c->head = c->tail = c->cur = c->hand_page = SLAB_NONE;
        if (lock_init(&c->lock)) {
            for (int j = 1; j < i; j++) pthread_mutex_destroy(&s->cls[j].lock);
            s->nclasses = 0;
            return -1;
        }
    }
    return 0;
}

int slab_create(struct slab **out, uint64_t memory, uint64_t item_max, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t page = SLAB_PAGE_MIN;
    unsigned shift = 20;
    while (page < item_max) {
        page <<= 1;
        shift++;
    }
    if (page > (1ull << 31)) {
        snprintf(err, errlen, "item_max %llu is too large; use -I 1g or less",
                 (unsigned long long)item_max);
        return -1;
    }
    if (item_max > memory / 2) {
        snprintf(err, errlen,
                 "item_max (%llu bytes) must be at most half the memory limit (%llu bytes); "
                 "lower -I or raise -m",
                 (unsigned long long)item_max, (unsigned long long)memory);
        return -1;
    }
    uint64_t npages = memory / page;
    if (npages < 2 || npages >= SLAB_NONE) {
        snprintf(err, errlen,
                 "memory limit (%llu bytes) must hold at least 2 slab pages of %llu bytes; "
                 "raise -m or lower -I",
                 (unsigned long long)memory, (unsigned long long)page);
        return -1;
    }
    struct slab *s;
    if (posix_memalign((void **)&s, 64, sizeof *s)) goto oom;
    memset(s, 0, sizeof *s);
    s->page_size = (uint32_t)page;
    s->page_shift = shift;
    s->npages = (uint32_t)npages;
    s->mapped = (size_t)(npages * page);
    s->pages = calloc(npages, sizeof *s->pages);
    if (!s->pages) {
        free(s);
        goto oom;
    }
    for (uint64_t i = 0; i < npages; i++) s->pages[i].next = s->pages[i].prev = SLAB_NONE;
    if (slab_build_classes(s, item_max)) {
        free(s->pages);
        free(s);
        snprintf(err, errlen, "cannot build size classes for item_max %llu",
                 (unsigned long long)item_max);
        return -1;
    }
    /* NORESERVE: the limit may exceed free RAM plus swap; only touched pages cost anything. */
    void *base = mmap(NULL, s->mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        for (int i = 1; i <= s->nclasses; i++) pthread_mutex_destroy(&s->cls[i].lock);
        snprintf(err, errlen, "cannot reserve %zu bytes of item memory", s->mapped);
        free(s->pages);
        free(s);
        return -1;
    }
    s->base = base;
    *out = s;
    return 0;
oom:
    snprintf(err, errlen, "out of memory creating the slab allocator");
    return -1;
}

int slab_advise_huge(struct slab *s)
{
    return madvise(s->base, s->mapped, MADV_HUGEPAGE);
}

void slab_destroy(struct slab **sp)
{
    struct slab *s = *sp;
    if (!s) return;
    munmap(s->base, s->mapped);
    for (int i = 1; i <= s->nclasses; i++) pthread_mutex_destroy(&s->cls[i].lock);
    free(s->pages);
    free(s);
    *sp = NULL;
}

int slab_class_count(const struct slab *s) { return s->nclasses; }

int slab_class_for(const struct slab *s, size_t total)
{
    if (total > s->cls[s->nclasses].size) return 0;
    int lo = 1, hi = s->nclasses;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->cls[mid].size >= total) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

uint32_t slab_chunk_size(const struct slab *s, int clsid)
{
    return clsid >= 1 && clsid <= s->nclasses ? s->cls[clsid].size : 0;
}

uint32_t slab_page_size(const struct slab *s) { return s->page_size; }
uint32_t slab_pages_total(const struct slab *s) { return s->npages; }
uint32_t slab_pages_used(const struct slab *s)
{
    return __atomic_load_n(&s->next_page, __ATOMIC_RELAXED);
}

/* ---- page lists (class lock held) --------------------------------------------------------- */

static uint32_t slab_pool_take(struct slab *s)
{
    uint32_t n = __atomic_load_n(&s->next_page, __ATOMIC_RELAXED);
    while (n < s->npages)
        if (__atomic_compare_exchange_n(&s->next_page, &n, n + 1, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return n;
    return SLAB_NONE;
}

/* Append page p to class c's list and make c its owner. */
static void class_page_add(struct slab *s, struct slab_class *c, int clsid, uint32_t p)
{
    struct slab_page *pg = &s->pages[p];
    pg->next = SLAB_NONE;
    pg->prev = c->tail;
    if (c->tail != SLAB_NONE) s->pages[c->tail].next = p;
    else c->head = p;
    c->tail = p;
    STORE(&pg->clsid, (uint8_t)clsid);
    STORE(&pg->moving, 0);
    STORE(&c->npages, c->npages + 1);
    c->carved += pg->carved;
}

/* Take page p out of class c for a move: off the list, its free chunks off the free list, and
 * marked moving so that chunks freed in it later stay out of the free list. */
static void class_page_detach(struct slab *s, struct slab_class *c, uint32_t p)
{
    struct slab_page *pg = &s->pages[p];
    if (c->hand_page == p) {
        c->hand_page = pg->next;
        c->hand_idx = 0;
    }
    if (pg->prev != SLAB_NONE) s->pages[pg->prev].next = pg->next;
    else c->head = pg->next;
    if (pg->next != SLAB_NONE) s->pages[pg->next].prev = pg->prev;
    else c->tail = pg->prev;
    pg->next = pg->prev = SLAB_NONE;
    if (c->cur == p) c->cur = SLAB_NONE;
    STORE(&c->npages, c->npages - 1);
    c->carved -= pg->carved;
    STORE(&pg->moving, 1);

    const char *lo = s->base + ((size_t)p << s->page_shift);
    const char *hi = lo + s->page_size;
    for (struct item **pp = &c->free; *pp;) {
        const char *ch = (const char *)*pp;
        if (ch >= lo && ch < hi) {
            *pp = (*pp)->hnext;
            c->nfree--;
        } else {
            pp = &(*pp)->hnext;
        }
    }
}

/* Undo class_page_detach after a failed move: the page rejoins the class, its free chunks the
 * free list. */
static void class_page_restore(struct slab *s, struct slab_class *c, int clsid, uint32_t p)
{
    struct slab_page *pg = &s->pages[p];
    class_page_add(s, c, clsid, p);
    for (uint32_t i = 0; i < pg->carved; i++) {
        struct item *it = slab_chunk(s, p, i, c->size);
        if (chunk_state(it) & ITEM_SLAB_FREE) {
            it->hnext = c->free;
            c->free = it;
            c->nfree++;
        }
    }
    if (c->cur == SLAB_NONE && pg->carved < c->perpage) c->cur = p;
}

/* Next page of c after p, wrapping to the head. */
static inline uint32_t class_page_next(const struct slab *s, const struct slab_class *c,
                                       uint32_t p)
{
    uint32_t n = s->pages[p].next;
    return n != SLAB_NONE ? n : c->head;
}

/* ---- allocation --------------------------------------------------------------------------- */

static struct item *class_carve(struct slab *s, struct slab_class *c)
{
    struct slab_page *pg = &s->pages[c->cur];
    struct item *it = slab_chunk(s, c->cur, pg->carved, c->size);
    pg->carved++;
    c->carved++;
    if (pg->carved == c->perpage) c->cur = SLAB_NONE;
    return it;
}

/* A chunk without evicting: free list, current page, then a page from the pool. */
static struct item *class_take_local(struct slab *s, struct slab_class *c, int clsid)
{
    if (c->free) {
        struct item *it = c->free;
        c->free = it->hnext;
        c->nfree--;
        return it;
    }
    if (c->cur == SLAB_NONE) {
        uint32_t p = slab_pool_take(s);
        if (p == SLAB_NONE) return NULL;
        s->pages[p].carved = 0;
        class_page_add(s, c, clsid, p);
        c->cur = p;
    }
    return class_carve(s, c);
}

static void class_count_gone(struct slab_class *c, enum slab_visit why, int r)
{
    bool unfetched = r & SLAB_GONE_UNFETCHED;
    if (why == SLAB_VISIT_SWEEP) {
        c->c.sweeper_reclaimed++;
        if (unfetched) c->c.expired_unfetched++;
    } else if (r & SLAB_GONE_EXPIRED) {
        c->c.reclaimed++;
        if (unfetched) c->c.expired_unfetched++;
    } else {
        c->c.evictions++;
        if (unfetched) c->c.evicted_unfetched++;
    }
}

/* Run the CLOCK hand over the class's carved chunks until the visitor gives one up, at most
 * SLAB_CLOCK_TURNS revolutions. Returns the chunk (now in flight) or NULL. */
static struct item *class_evict(struct slab *s, struct slab_class *c, slab_visit_fn fn, void *ctx)
{
    if (c->carved == 0 || c->head == SLAB_NONE) return NULL;
    uint64_t limit = SLAB_CLOCK_TURNS * c->carved;
    uint32_t p = c->hand_page, i = c->hand_idx;
    if (p == SLAB_NONE) {
        p = c->head;
        i = 0;
    }
    struct item *got = NULL;
    for (uint64_t n = 0; n < limit;) {
        if (i >= s->pages[p].carved) {
            p = class_page_next(s, c, p);
            i = 0;
            continue;
        }
        struct item *it = slab_chunk(s, p, i++, c->size);
        n++;
        if (!(chunk_state(it) & ITEM_LINKED)) continue;
        int r = fn(ctx, it, SLAB_VISIT_EVICT);
        if (r & SLAB_GONE) {
            class_count_gone(c, SLAB_VISIT_EVICT, r);
            got = it;
            break;
        }
    }
    c->hand_page = p;
    c->hand_idx = i;
    return got;
}

/* Does page p hold a chunk that is neither linked nor free (a caller's, or one being freed)? */
static bool page_has_inflight(const struct slab *s, const struct slab_class *c, uint32_t p)
{
    uint32_t n = s->pages[p].carved;
    for (uint32_t i = 0; i < n; i++)
        if (!(chunk_state(slab_chunk(s, p, i, c->size)) & (ITEM_LINKED | ITEM_SLAB_FREE)))
            return true;
    return false;
}

/* Empty page p of donor class c (its lock held on entry and on return; released meanwhile while
 * waiting for busy shards). Returns 0 with the page detached, moving and all its chunks free, or
 * -1 with the page given back to the class. */
static int page_drain(struct slab *s, struct slab_class *c, int clsid, uint32_t p,
                      slab_visit_fn fn, void *ctx)
{
    class_page_detach(s, c, p);
    for (unsigned round = 0;; round++) {
        bool pending = false;
        uint32_t n = s->pages[p].carved;
        for (uint32_t i = 0; i < n; i++) {
            struct item *it = slab_chunk(s, p, i, c->size);
            uint8_t f = chunk_state(it);
            if (f & ITEM_SLAB_FREE) continue;
            if (!(f & ITEM_LINKED)) {
                pending = true; /* unlinked by its owner, its slab_free is waiting for our lock */
                continue;
            }
            int r = fn(ctx, it, SLAB_VISIT_STEAL);
            if (r & SLAB_GONE) {
                class_count_gone(c, SLAB_VISIT_STEAL, r);
                __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
            } else if (r & SLAB_PINNED) {
                class_page_restore(s, c, clsid, p);
                return -1;
            } else {
                pending = true;
            }
        }
        if (!pending) return 0;
        if (round >= SLAB_STEAL_ROUNDS) {
            class_page_restore(s, c, clsid, p);
            return -1;
        }
        /* The shard holders we wait for may be waiting for this very lock (to free a chunk). */
        pthread_mutex_unlock(&c->lock);
        sched_yield();
        pthread_mutex_lock(&c->lock);
    }
}

/* Empty one page of class d for someone else. Returns the page (detached, moving) or SLAB_NONE. */
static uint32_t donor_give_page(struct slab *s, int d, slab_visit_fn fn, void *ctx)
{
    struct slab_class *c = &s->cls[d];
    uint32_t cand[SLAB_STEAL_PAGES];
    int ncand = 0;
    pthread_mutex_lock(&c->lock);
    /* Start at the CLOCK hand: the pages it is about to sweep hold the coldest items. */
    uint32_t p = c->hand_page != SLAB_NONE ? c->hand_page : c->head;
    for (uint32_t start = p; p != SLAB_NONE && ncand < SLAB_STEAL_PAGES;) {
        cand[ncand++] = p;
        p = class_page_next(s, c, p);
        if (p == start) break;
    }
    uint32_t got = SLAB_NONE;
    for (int k = 0; k < ncand && got == SLAB_NONE; k++) {
        p = cand[k];
        /* An earlier failed attempt released the lock: the page may have moved meanwhile. */
        if (LOAD(&s->pages[p].clsid) != d || LOAD(&s->pages[p].moving)) continue;
        if (page_has_inflight(s, c, p)) continue;
        if (page_drain(s, c, d, p, fn, ctx) == 0) got = p;
    }
    pthread_mutex_unlock(&c->lock);
    return got;
}

/* Take a page from the class with the most pages (other than clsid) and empty it. Called with
 * no class lock held. Returns the page, belonging to no class, or SLAB_NONE. */
static uint32_t slab_steal_page(struct slab *s, int clsid, slab_visit_fn fn, void *ctx)
{
    int tried[SLAB_STEAL_DONORS];
    for (int ntried = 0; ntried < SLAB_STEAL_DONORS; ntried++) {
        int best = 0;
        uint32_t most = 0;
        for (int k = 1; k <= s->nclasses; k++) {
            if (k == clsid) continue;
            bool skip = false;
            for (int t = 0; t < ntried; t++) skip |= tried[t] == k;
            uint32_t np = LOAD(&s->cls[k].npages);
            if (!skip && np > most) {
                most = np;
                best = k;
            }
        }
        if (!best) return SLAB_NONE;
        tried[ntried] = best;
        uint32_t p = donor_give_page(s, best, fn, ctx);
        if (p != SLAB_NONE) return p;
    }
    return SLAB_NONE;
}

/* Give an emptied page to class c (its lock held) and count the move. */
static void class_adopt_moved(struct slab *s, struct slab_class *c, int clsid, uint32_t p)
{
    struct slab_page *pg = &s->pages[p];
    pg->carved = 0;
    class_page_add(s, c, clsid, p);
    c->c.pages_moved++;
    if (c->cur == SLAB_NONE) {
        c->cur = p;
        return;
    }
    /* Another thread gave the class a page meanwhile; only one page is carved lazily. */
    for (uint32_t i = 0; i < c->perpage; i++) {
        struct item *it = slab_chunk(s, p, i, c->size);
        __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
        it->hnext = c->free;
        c->free = it;
    }
    pg->carved = c->perpage;
    c->carved += c->perpage;
    c->nfree += c->perpage;
}

struct item *slab_alloc(struct slab *s, int clsid, slab_visit_fn fn, void *ctx)
{
    struct slab_class *c = &s->cls[clsid];
    pthread_mutex_lock(&c->lock);
    struct item *it = class_take_local(s, c, clsid);
    if (!it) it = class_evict(s, c, fn, ctx);
    if (!it) {
        /* Release our lock first: holding two class locks could deadlock two movers. */
        pthread_mutex_unlock(&c->lock);
        uint32_t p = slab_steal_page(s, clsid, fn, ctx);
        pthread_mutex_lock(&c->lock);
        if (p != SLAB_NONE) class_adopt_moved(s, c, clsid, p);
        it = class_take_local(s, c, clsid);
    }
    if (it) {
        /* Before unlocking: a walker must never see stale flags of a previous life (or of a
         * previous class's layout) on a chunk that is now ours. */
        __atomic_store_n(&it->iflags, 0, __ATOMIC_RELAXED);
    } else {
        c->c.alloc_failures++;
    }
    pthread_mutex_unlock(&c->lock);
    return it;
}

void slab_free(struct slab *s, struct item *it)
{
    struct slab_class *c = &s->cls[it->clsid];
    pthread_mutex_lock(&c->lock);
    __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
    /* In a page being moved the mover collects it; everywhere else it is reusable at once. */
    if (!s->pages[slab_page_of(s, it)].moving) {
        it->hnext = c->free;
        c->free = it;
        c->nfree++;
    }
    pthread_mutex_unlock(&c->lock);
}

/* ---- walking, stats ----------------------------------------------------------------------- */

uint32_t slab_walk_page(struct slab *s, uint32_t page, uint32_t from, uint32_t max,
                        slab_visit_fn fn, void *ctx)
{
    if (page >= slab_pages_used(s)) return SLAB_NONE;
    int clsid = LOAD(&s->pages[page].clsid);
    if (clsid == 0) return SLAB_NONE;
    struct slab_class *c = &s->cls[clsid];
    pthread_mutex_lock(&c->lock);
    /* Ownership changes only through `moving`, set under the owner's lock: re-check under it. */
    if (LOAD(&s->pages[page].clsid) != clsid || LOAD(&s->pages[page].moving)) {
        pthread_mutex_unlock(&c->lock);
        return SLAB_NONE;
    }
    uint32_t n = s->pages[page].carved;
    uint32_t end = from + max < n ? from + max : n;
    for (uint32_t i = from; i < end; i++) {
        struct item *it = slab_chunk(s, page, i, c->size);
        if (!(chunk_state(it) & ITEM_LINKED)) continue;
        int r = fn(ctx, it, SLAB_VISIT_SWEEP);
        if (!(r & SLAB_GONE)) continue;
        class_count_gone(c, SLAB_VISIT_SWEEP, r);
        __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
        it->hnext = c->free;
        c->free = it;
        c->nfree++;
    }
    pthread_mutex_unlock(&c->lock);
    return end < n ? end : SLAB_NONE;
}

void slab_sum_counters(struct slab *s, struct slab_counters *out)
{
    for (int i = 1; i <= s->nclasses; i++) {
        struct slab_class *c = &s->cls[i];
        pthread_mutex_lock(&c->lock);
        out->evictions += c->c.evictions;
        out->evicted_unfetched += c->c.evicted_unfetched;
        out->expired_unfetched += c->c.expired_unfetched;
        out->reclaimed += c->c.reclaimed;
        out->sweeper_reclaimed += c->c.sweeper_reclaimed;
        out->pages_moved += c->c.pages_moved;
        out->alloc_failures += c->c.alloc_failures;
        pthread_mutex_unlock(&c->lock);
    }
}

bool slab_class_info(struct slab *s, int clsid, struct slab_class_info *out)
{
    if (clsid < 1 || clsid > s->nclasses) return false;
    struct slab_class *c = &s->cls[clsid];
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->lock);
    out->chunk_size = c->size;
    out->chunks_per_page = c->perpage;
    out->pages = c->npages;
    out->carved = c->carved;
    out->nfree = c->nfree;
    out->c = c->c;
    /* CLOCK keeps no age order; the chunks just ahead of the hand are the next to go, so the
     * oldest access among a sample of them stands in for the tail age of an LRU. */
    uint32_t p = c->hand_page != SLAB_NONE ? c->hand_page : c->head;
    uint32_t i = c->hand_page != SLAB_NONE ? c->hand_idx : 0;
    for (uint32_t seen = 0; p != SLAB_NONE && seen < SLAB_OLDEST_SAMPLE && c->carved;) {
        if (i >= s->pages[p].carved) {
            p = class_page_next(s, c, p);
            i = 0;
            continue;
        }
        struct item *it = slab_chunk(s, p, i++, c->size);
        seen++;
        if (!(chunk_state(it) & ITEM_LINKED)) continue;
        uint32_t at = LOAD(&it->atime);
        if (!out->oldest_atime || at < out->oldest_atime) out->oldest_atime = at;
    }
    pthread_mutex_unlock(&c->lock);
    return true;
}
