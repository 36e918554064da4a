/* slab.c — page reservation, pools (one per namespace: quota, policy), size classes, chunk
 * allocation and page moves between classes and pools (see slab.h). Victim choice inside a
 * class is evict.c's.
 *
 * Chunk states, read by walkers through iflags (acquire loads; every state change is made under
 * the chunk's class lock, except ITEM_LINKED, which store.c sets and clears under the shard lock):
 *   ITEM_LINKED     in the index;
 *   ITEM_SLAB_FREE  on the class free list, or freed inside a page being moved;
 *   neither         "in flight": handed out by slab_alloc, not yet linked or freed, or unlinked
 *                   and about to be freed.
 * Only chunks below a page's `carved` count exist; the rest of the page is untouched memory (or
 * stale bytes of a previous owner), which no walker reads.
 *
 * Quotas: a pool with a quota owns at most quota_pages pages and is guaranteed that many: pools
 * without a quota take a free page only while more remain than the quota'd pools are still owed.
 * So while the quotas add up to no more than the memory, filling one pool never evicts another
 * pool's items. */
#include "node/slab_int.h"
#include "node/lock.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/log.h"

#define SLAB_GROWTH 1.08
#define SLAB_ALIGN 4u          /* chunk sizes are multiples of this: items are 4-byte aligned */
#define SLAB_FINE_STEP 8u      /* small classes every 8 bytes: 4 would double their number, and
                                  every class costs a partly used page per namespace */
#define SLAB_FINE_MAX 256u     /* fine steps up to this size */
#define SLAB_STEAL_DONORS 3    /* classes tried for one page move */
#define SLAB_STEAL_PAGES 4     /* pages of one donor tried */
#define SLAB_STEAL_ROUNDS 2000 /* lock releases while waiting for busy shards, per page */
#define SLAB_OLDEST_SAMPLE 256 /* chunks looked at for a class's oldest_age */

#define LOAD SLAB_LOAD
#define STORE SLAB_STORE

/* ---- creation ---------------------------------------------------------------------------- */

/* Fill s->size/perpage[1..] with chunk sizes: every SLAB_FINE_STEP bytes from SLAB_CHUNK_MIN
 * (28: so sizes fall on 4 mod 8, and the common 30-byte key + 100-byte value item of 154 bytes
 * fits 156 exactly) to SLAB_FINE_MAX, then growing by SLAB_GROWTH (rounded to SLAB_ALIGN), and
 * last a class for the largest item. */
static int slab_build_classes(struct slab *s, uint64_t item_max)
{
    const uint64_t r = SLAB_ALIGN - 1;
    uint64_t maxc = (item_max + r) & ~r;
    if (maxc > s->page_size) maxc = s->page_size;
    if (maxc < SLAB_CHUNK_MIN) maxc = SLAB_CHUNK_MIN;
    int n = 0;
    uint64_t sz = SLAB_CHUNK_MIN;
    for (;;) {
        if (sz > maxc) sz = maxc;
        if (n == SLAB_CLASS_MAX) return -1;
        n++;
        s->size[n] = (uint32_t)sz;
        s->perpage[n] = (uint32_t)(s->page_size / sz);
        if (sz == maxc) break;
        uint64_t next = sz < SLAB_FINE_MAX ? sz + SLAB_FINE_STEP
                                           : ((uint64_t)((double)sz * SLAB_GROWTH) + r) & ~r;
        sz = next > sz ? next : sz + SLAB_ALIGN;
    }
    s->nclasses = n;
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
    s->free_stack = calloc(npages, sizeof *s->free_stack);
    if (!s->pages || !s->free_stack || lock_init(&s->pool_lock)) {
        free(s->pages);
        free(s->free_stack);
        free(s);
        goto oom;
    }
    for (uint64_t i = 0; i < npages; i++) s->pages[i].next = s->pages[i].prev = SLAB_NONE;
    if (slab_build_classes(s, item_max)) {
        snprintf(err, errlen, "cannot build size classes for item_max %llu",
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
    pthread_mutex_destroy(&s->pool_lock);
    free(s->pages);
    free(s->free_stack);
    free(s);
    return -1;
oom:
    snprintf(err, errlen, "out of memory creating the slab allocator");
    return -1;
}

int slab_advise_huge(struct slab *s)
{
    return madvise(s->base, s->mapped, MADV_HUGEPAGE);
}

static void pool_destroy(struct slab *s, struct slab_pool *pl)
{
    for (int i = 1; i <= s->nclasses; i++) {
        evict_class_free(&pl->cls[i]);
        pthread_mutex_destroy(&pl->cls[i].lock);
    }
    evict_pool_free(pl);
    free(pl);
}

void slab_destroy(struct slab **sp)
{
    struct slab *s = *sp;
    if (!s) return;
    munmap(s->base, s->mapped);
    for (int i = 0; i < STORE_NS_MAX; i++)
        if (s->pools[i]) pool_destroy(s, s->pools[i]);
    pthread_mutex_destroy(&s->pool_lock);
    free(s->pages);
    free(s->free_stack);
    free(s);
    *sp = NULL;
}

int slab_class_count(const struct slab *s) { return s->nclasses; }

int slab_class_for(const struct slab *s, size_t total)
{
    if (total > s->size[s->nclasses]) return 0;
    int lo = 1, hi = s->nclasses;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (s->size[mid] >= total) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

uint32_t slab_chunk_size(const struct slab *s, int clsid)
{
    return clsid >= 1 && clsid <= s->nclasses ? s->size[clsid] : 0;
}

/* Byte offset of `it` in page p, and the page's current class id (0: none, or moving). */
static inline uint8_t chunk_page_class(const struct slab *s, const void *it, uint32_t *page,
                                       size_t *off)
{
    if ((const char *)it < s->base || (const char *)it >= s->base + s->mapped) return 0;
    uint32_t p = (uint32_t)(((const char *)it - s->base) >> s->page_shift);
    const struct slab_page *pg = &s->pages[p];
    if (LOAD(&pg->moving)) return 0;
    *page = p;
    *off = (size_t)((const char *)it - (s->base + ((size_t)p << s->page_shift)));
    return LOAD(&pg->clsid);
}

bool slab_chunk_of_class(const struct slab *s, const struct slab_class *c, const struct item *it)
{
    uint32_t p;
    size_t off;
    uint8_t cls = chunk_page_class(s, it, &p, &off);
    if (cls == 0) return false;
    const struct slab_pool *pl = s->pools[LOAD(&s->pages[p].nsid)];
    if (pl == NULL || &pl->cls[cls] != c) return false;
    return off % c->size == 0 && off / c->size < s->pages[p].carved;
}

bool slab_chunk_plausible(const struct slab *s, const void *it)
{
    uint32_t p;
    size_t off;
    uint8_t cls = chunk_page_class(s, it, &p, &off);
    if (cls == 0) return false;
    return off % s->size[cls] == 0 && off / s->size[cls] < LOAD(&s->pages[p].carved);
}

int slab_chunk_class(const struct slab *s, const struct item *it)
{
    return LOAD(&s->pages[slab_page_of(s, it)].clsid);
}

uint32_t slab_page_size(const struct slab *s) { return s->page_size; }
uint32_t slab_pages_total(const struct slab *s) { return s->npages; }
uint32_t slab_pages_used(const struct slab *s)
{
    return __atomic_load_n(&s->next_page, __ATOMIC_RELAXED);
}

/* ---- pools -------------------------------------------------------------------------------- */

/* Pool `nsid`, created (no quota, LRU) on first use; NULL only when out of memory. */
static struct slab_pool *pool_get(struct slab *s, uint16_t nsid)
{
    struct slab_pool *pl = __atomic_load_n(&s->pools[nsid], __ATOMIC_ACQUIRE);
    if (__builtin_expect(pl != NULL, 1)) return pl;
    pthread_mutex_lock(&s->pool_lock);
    pl = s->pools[nsid];
    if (!pl && posix_memalign((void **)&pl, 64,
                              sizeof *pl + (size_t)(s->nclasses + 1) * sizeof pl->cls[0]) == 0) {
        memset(pl, 0, sizeof *pl + (size_t)(s->nclasses + 1) * sizeof pl->cls[0]);
        pl->id = nsid;
        pl->slab = s;
        int i;
        for (i = 1; i <= s->nclasses; i++) {
            struct slab_class *c = &pl->cls[i];
            c->size = s->size[i];
            c->perpage = s->perpage[i];
            c->head = c->tail = c->cur = c->hand_page = SLAB_NONE;
            if (lock_init(&c->lock)) break;
        }
        if (i <= s->nclasses) {
            while (--i >= 1) pthread_mutex_destroy(&pl->cls[i].lock);
            free(pl);
            pl = NULL;
        } else {
            __atomic_store_n(&s->pools[nsid], pl, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&s->pool_lock);
    return pl;
}

/* Pages the quota'd pools are still owed (pool_lock held). */
static uint64_t pool_owed(const struct slab *s)
{
    uint64_t owed = 0;
    for (int i = 0; i < STORE_NS_MAX; i++) {
        const struct slab_pool *pl = s->pools[i];
        if (pl && pl->quota_pages > pl->npages) owed += pl->quota_pages - pl->npages;
    }
    return owed;
}

/* Pages beyond what the pool is guaranteed: all of them without a quota. */
static inline uint32_t pool_excess(const struct slab_pool *pl)
{
    uint32_t n = LOAD(&pl->npages), q = LOAD(&pl->quota_pages);
    return n > q ? n - q : 0;
}

static inline bool pool_below_quota(const struct slab_pool *pl)
{
    uint32_t q = LOAD(&pl->quota_pages);
    return q && LOAD(&pl->npages) < q;
}

/* A free page for pool pl if its quota (or, without one, what the others are owed) allows, or
 * with `force` whenever one is free. Takes pool_lock. */
static uint32_t pool_take_free_page(struct slab *s, struct slab_pool *pl, bool force)
{
    uint32_t got = SLAB_NONE;
    pthread_mutex_lock(&s->pool_lock);
    uint64_t avail = s->nfree_stack + (s->npages - LOAD(&s->next_page));
    bool ok = avail > 0 && (force || (pl->quota_pages ? pl->npages < pl->quota_pages
                                                      : avail > pool_owed(s)));
    if (ok) {
        if (s->nfree_stack) {
            got = s->free_stack[--s->nfree_stack];
        } else {
            got = LOAD(&s->next_page);
            STORE(&s->next_page, got + 1);
        }
        STORE(&pl->npages, pl->npages + 1);
    }
    pthread_mutex_unlock(&s->pool_lock);
    return got;
}

/* Move the count of page p from pool `from` to pool `to` (NULL: the free stack). */
static void pool_transfer(struct slab *s, struct slab_pool *from, struct slab_pool *to, uint32_t p)
{
    if (from == to) return;
    pthread_mutex_lock(&s->pool_lock);
    STORE(&from->npages, from->npages - 1);
    if (to) STORE(&to->npages, to->npages + 1);
    else s->free_stack[s->nfree_stack++] = p;
    pthread_mutex_unlock(&s->pool_lock);
}

int slab_pool_configure(struct slab *s, uint16_t nsid, uint64_t quota, enum slab_policy policy)
{
    struct slab_pool *pl = pool_get(s, nsid % STORE_NS_MAX);
    if (!pl) return -1;
    uint64_t q = quota ? quota / s->page_size : 0;
    if (quota && q == 0) q = 1;
    if (q > s->npages) q = s->npages;
    pthread_mutex_lock(&s->pool_lock);
    STORE(&pl->quota_pages, (uint32_t)q);
    /* Policy state first, so that a chunk admitted under the new policy finds it. */
    int rc = evict_pool_prepare(pl, policy, q ? q * s->page_size : s->mapped);
    __atomic_store_n(&pl->policy, (uint8_t)policy, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->pool_lock);
    return rc;
}

uint32_t slab_pool_pages(struct slab *s, uint16_t nsid)
{
    struct slab_pool *pl = __atomic_load_n(&s->pools[nsid % STORE_NS_MAX], __ATOMIC_ACQUIRE);
    return pl ? LOAD(&pl->npages) : 0;
}

enum slab_policy slab_pool_policy(struct slab *s, uint16_t nsid)
{
    struct slab_pool *pl = __atomic_load_n(&s->pools[nsid % STORE_NS_MAX], __ATOMIC_ACQUIRE);
    return pl ? (enum slab_policy)__atomic_load_n(&pl->policy, __ATOMIC_ACQUIRE)
              : SLAB_POLICY_LRU;
}

/* ---- page lists (class lock held) --------------------------------------------------------- */

/* Append page p to class c of pool pl and make them its owner. */
static void class_page_add(struct slab *s, struct slab_pool *pl, struct slab_class *c, int clsid,
                           uint32_t p)
{
    struct slab_page *pg = &s->pages[p];
    pg->next = SLAB_NONE;
    pg->prev = c->tail;
    if (c->tail != SLAB_NONE) s->pages[c->tail].next = p;
    else c->head = p;
    c->tail = p;
    STORE(&pg->nsid, pl->id);
    STORE(&pg->clsid, (uint8_t)clsid);
    STORE(&pg->moving, 0);
    STORE(&c->npages, c->npages + 1);
    c->carved += pg->carved;
    if (c->npagev == c->capv) {
        /* Out of memory leaves the page out of random sampling only; the hand still sees it. */
        uint32_t cap = c->capv ? 2 * c->capv : 8;
        uint32_t *v = realloc(c->pagev, cap * sizeof *v);
        if (v) {
            c->pagev = v;
            c->capv = cap;
        }
    }
    if (c->npagev < c->capv) c->pagev[c->npagev++] = p;
    evict_class_grew(pl, c);
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
    for (uint32_t k = 0; k < c->npagev; k++)
        if (c->pagev[k] == p) {
            c->pagev[k] = c->pagev[--c->npagev];
            break;
        }
    if (c->cur == p) c->cur = SLAB_NONE;
    STORE(&c->npages, c->npages - 1);
    c->carved -= pg->carved;
    STORE(&pg->moving, 1);

    const char *lo = s->base + ((size_t)p << s->page_shift);
    const char *hi = lo + s->page_size;
    struct item *keep = NULL, *it = c->free;
    c->free = NULL;
    c->nfree = 0;
    for (; it; it = keep) {
        keep = free_next(it);
        const char *ch = (const char *)it;
        if (ch < lo || ch >= hi) class_free_push(c, it);
    }
}

/* Undo class_page_detach after a failed move: the page rejoins the class, its free chunks the
 * free list. */
static void class_page_restore(struct slab *s, struct slab_pool *pl, struct slab_class *c,
                               int clsid, uint32_t p)
{
    struct slab_page *pg = &s->pages[p];
    class_page_add(s, pl, c, clsid, p);
    for (uint32_t i = 0; i < pg->carved; i++) {
        struct item *it = slab_chunk(s, p, i, c->size);
        if (slab_chunk_state(it) & ITEM_SLAB_FREE) class_free_push(c, it);
    }
    if (c->cur == SLAB_NONE && pg->carved < c->perpage) c->cur = p;
}

/* ---- allocation --------------------------------------------------------------------------- */

/* A chunk from the free list or the page being carved, or NULL. */
static struct item *class_take_free(struct slab *s, struct slab_class *c)
{
    if (c->free) {
        struct item *it = c->free;
        c->free = free_next(it);
        c->nfree--;
        return it;
    }
    if (c->cur == SLAB_NONE) return NULL;
    struct slab_page *pg = &s->pages[c->cur];
    struct item *it = slab_chunk(s, c->cur, pg->carved, c->size);
    pg->carved++;
    c->carved++;
    if (pg->carved == c->perpage) c->cur = SLAB_NONE;
    return it;
}

void slab_count_gone(struct slab_class *c, enum slab_visit why, int r)
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

/* Does page p hold a chunk that is neither linked nor free (a caller's, or one being freed)? */
static bool page_has_inflight(const struct slab *s, const struct slab_class *c, uint32_t p)
{
    uint32_t n = s->pages[p].carved;
    for (uint32_t i = 0; i < n; i++)
        if (!(slab_chunk_state(slab_chunk(s, p, i, c->size)) & (ITEM_LINKED | ITEM_SLAB_FREE)))
            return true;
    return false;
}

/* Empty page p of donor class c (its lock held on entry and on return; released meanwhile while
 * waiting for busy shards). Returns 0 with the page detached, moving and all its chunks free, or
 * -1 with the page given back to the class. */
static int page_drain(struct slab *s, struct slab_pool *pl, struct slab_class *c, int clsid,
                      uint32_t p, slab_visit_fn fn, void *ctx)
{
    class_page_detach(s, c, p);
    for (unsigned round = 0;; round++) {
        bool pending = false;
        uint32_t n = s->pages[p].carved;
        for (uint32_t i = 0; i < n; i++) {
            struct item *it = slab_chunk(s, p, i, c->size);
            uint8_t f = slab_chunk_state(it);
            if (f & ITEM_SLAB_FREE) continue;
            if (!(f & ITEM_LINKED)) {
                pending = true; /* unlinked by its owner, its slab_free is waiting for our lock */
                continue;
            }
            int r = fn(ctx, it, SLAB_VISIT_STEAL);
            if (r & SLAB_GONE) {
                slab_count_gone(c, SLAB_VISIT_STEAL, r);
                __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
            } else if (r & SLAB_PINNED) {
                class_page_restore(s, pl, c, clsid, p);
                return -1;
            } else {
                pending = true;
            }
        }
        if (!pending) return 0;
        if (round >= SLAB_STEAL_ROUNDS) {
            class_page_restore(s, pl, c, clsid, p);
            return -1;
        }
        /* The shard holders we wait for may be waiting for this very lock (to free a chunk). */
        pthread_mutex_unlock(&c->lock);
        sched_yield();
        pthread_mutex_lock(&c->lock);
    }
}

/* Empty one page of class d of pool pl for someone else. Returns the page (detached, moving,
 * still counted in pl) or SLAB_NONE. */
static uint32_t donor_give_page(struct slab *s, struct slab_pool *pl, int d, slab_visit_fn fn,
                                void *ctx)
{
    struct slab_class *c = &pl->cls[d];
    uint32_t cand[SLAB_STEAL_PAGES];
    int ncand = 0;
    pthread_mutex_lock(&c->lock);
    /* Start at the hand: the pages it is about to sweep hold the coldest items. */
    uint32_t p = c->hand_page != SLAB_NONE ? c->hand_page : c->head;
    for (uint32_t start = p; p != SLAB_NONE && ncand < SLAB_STEAL_PAGES;) {
        cand[ncand++] = p;
        p = slab_class_page_next(s, c, p);
        if (p == start) break;
    }
    uint32_t got = SLAB_NONE;
    for (int k = 0; k < ncand && got == SLAB_NONE; k++) {
        p = cand[k];
        /* An earlier failed attempt released the lock: the page may have moved meanwhile. */
        if (LOAD(&s->pages[p].clsid) != d || LOAD(&s->pages[p].nsid) != pl->id ||
            LOAD(&s->pages[p].moving))
            continue;
        if (page_has_inflight(s, c, p)) continue;
        if (page_drain(s, pl, c, d, p, fn, ctx) == 0) got = p;
    }
    pthread_mutex_unlock(&c->lock);
    return got;
}

/* Take a page from the class of pool pl with the most pages (other than `skip`, 0 for none)
 * and empty it. Called with no class lock held. Returns the page, still counted in pl, or
 * SLAB_NONE. */
static uint32_t pool_give_page(struct slab *s, struct slab_pool *pl, int skip, slab_visit_fn fn,
                               void *ctx)
{
    int tried[SLAB_STEAL_DONORS];
    for (int ntried = 0; ntried < SLAB_STEAL_DONORS; ntried++) {
        int best = 0;
        uint32_t most = 0;
        for (int k = 1; k <= s->nclasses; k++) {
            if (k == skip) continue;
            bool seen = false;
            for (int t = 0; t < ntried; t++) seen |= tried[t] == k;
            uint32_t np = LOAD(&pl->cls[k].npages);
            if (!seen && np > most) {
                most = np;
                best = k;
            }
        }
        if (!best) return SLAB_NONE;
        tried[ntried] = best;
        uint32_t p = donor_give_page(s, pl, best, fn, ctx);
        if (p != SLAB_NONE) return p;
    }
    return SLAB_NONE;
}

/* A page from the other pool with the most pages beyond its guarantee, moved to pool `to`.
 * No class lock held. Returns the page or SLAB_NONE. */
static uint32_t steal_from_pools(struct slab *s, struct slab_pool *to, slab_visit_fn fn, void *ctx)
{
    struct slab_pool *best = NULL;
    uint32_t most = 0;
    for (int i = 0; i < STORE_NS_MAX; i++) {
        struct slab_pool *pl = __atomic_load_n(&s->pools[i], __ATOMIC_ACQUIRE);
        if (!pl || pl == to) continue;
        uint32_t ex = pool_excess(pl);
        if (ex > most) {
            most = ex;
            best = pl;
        }
    }
    if (!best) return SLAB_NONE;
    uint32_t p = pool_give_page(s, best, 0, fn, ctx);
    if (p != SLAB_NONE) pool_transfer(s, best, to, p);
    return p;
}

/* Give an emptied page to class c (its lock held) and count the move. */
static void class_adopt(struct slab *s, struct slab_pool *pl, struct slab_class *c, int clsid,
                        uint32_t p)
{
    struct slab_page *pg = &s->pages[p];
    pg->carved = 0;
    class_page_add(s, pl, c, clsid, p);
    c->c.pages_moved++;
    if (c->cur == SLAB_NONE) {
        c->cur = p;
        return;
    }
    /* Another thread gave the class a page meanwhile; only one page is carved lazily. */
    for (uint32_t i = 0; i < c->perpage; i++) {
        struct item *it = slab_chunk(s, p, i, c->size);
        __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
        class_free_push(c, it);
    }
    pg->carved = c->perpage;
    c->carved += c->perpage;
}

/* A chunk from a page of the free pages, if the pool may have one (class lock held). */
static struct item *class_take_new_page(struct slab *s, struct slab_pool *pl,
                                        struct slab_class *c, int clsid, bool force)
{
    uint32_t p = pool_take_free_page(s, pl, force);
    if (p == SLAB_NONE) return NULL;
    s->pages[p].carved = 0;
    class_page_add(s, pl, c, clsid, p);
    c->cur = p;
    return class_take_free(s, c);
}

/* Release c's lock, get a page by `how` (0: from a pool over its guarantee; 1: from another
 * class of pl, then, for a pool without a quota, from another pool), retake the lock and adopt
 * it. Returns a chunk or NULL. */
static struct item *class_refill(struct slab *s, struct slab_pool *pl, struct slab_class *c,
                                 int clsid, int how, slab_visit_fn fn, void *ctx)
{
    /* Release our lock first: holding two class locks could deadlock two movers. */
    pthread_mutex_unlock(&c->lock);
    uint32_t p;
    if (how == 0) {
        p = steal_from_pools(s, pl, fn, ctx);
    } else {
        p = pool_give_page(s, pl, clsid, fn, ctx);
        if (p == SLAB_NONE && LOAD(&pl->quota_pages) == 0) p = steal_from_pools(s, pl, fn, ctx);
    }
    pthread_mutex_lock(&c->lock);
    if (p != SLAB_NONE) class_adopt(s, pl, c, clsid, p);
    return class_take_free(s, c);
}

struct item *slab_alloc(struct slab *s, uint16_t nsid, int clsid, uint64_t hv, slab_visit_fn fn,
                        void *ctx)
{
    struct slab_pool *pl = pool_get(s, nsid % STORE_NS_MAX);
    if (!pl) pl = pool_get(s, 0); /* out of memory for a new pool: account to default */
    if (!pl) return NULL;
    struct slab_class *c = &pl->cls[clsid];
    pthread_mutex_lock(&c->lock);
    struct item *it = class_take_free(s, c);
    if (!it) it = class_take_new_page(s, pl, c, clsid, false);
    /* Under its quota with no free page left (quotas raised after others filled memory): take
     * back what is owed from pools beyond their guarantee before evicting our own items. */
    if (!it && pool_below_quota(pl)) it = class_refill(s, pl, c, clsid, 0, fn, ctx);
    if (!it) it = evict_run(s, pl, c, fn, ctx);
    if (!it) it = class_refill(s, pl, c, clsid, 1, fn, ctx);
    /* Last resort, so that a store that fits never fails: a page owed to a quota'd pool (which
     * takes it back from us later, as we are then beyond our guarantee). */
    if (!it && LOAD(&pl->quota_pages) == 0) it = class_take_new_page(s, pl, c, clsid, true);
    if (it) {
        /* Before unlocking: a walker must never see stale flags of a previous life (or of a
         * previous owner's layout) on a chunk that is now ours. */
        __atomic_store_n(&it->iflags, 0, __ATOMIC_RELAXED);
        evict_admit(pl, c, it, hv);
    } else {
        c->c.alloc_failures++;
    }
    pthread_mutex_unlock(&c->lock);
    return it;
}

/* The class that owns a chunk's page. Stable for a chunk in flight: a page holding one is never
 * moved (page_has_inflight, page_drain wait for it). */
static struct slab_class *slab_class_of_chunk(struct slab *s, const struct item *it)
{
    const struct slab_page *pg = &s->pages[slab_page_of(s, it)];
    return &s->pools[LOAD(&pg->nsid)]->cls[LOAD(&pg->clsid)];
}

void slab_free(struct slab *s, struct item *it)
{
    struct slab_class *c = slab_class_of_chunk(s, it);
    pthread_mutex_lock(&c->lock);
    if (slab_chunk_state(it) & ITEM_SLAB_FREE) {
        /* Freed twice: a bug. Never let it corrupt the free list (two owners for one chunk);
         * say so, and stop a sanitizer build at once so that tests find it. */
        c->c.double_frees++;
        pthread_mutex_unlock(&c->lock);
        log_error("slab: chunk %p freed twice", (void *)it);
#ifdef __SANITIZE_ADDRESS__
        abort();
#endif
        return;
    }
    __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
    /* In a page being moved the mover collects it; everywhere else it is reusable at once. */
    if (!s->pages[slab_page_of(s, it)].moving) class_free_push(c, it);
    pthread_mutex_unlock(&c->lock);
}

uint32_t slab_trim(struct slab *s, uint32_t max, slab_visit_fn fn, void *ctx)
{
    uint32_t done = 0;
    for (int i = 0; i < STORE_NS_MAX && done < max; i++) {
        struct slab_pool *pl = __atomic_load_n(&s->pools[i], __ATOMIC_ACQUIRE);
        if (!pl) continue;
        while (done < max && LOAD(&pl->quota_pages) && pool_excess(pl) > 0) {
            uint32_t p = pool_give_page(s, pl, 0, fn, ctx);
            if (p == SLAB_NONE) break;
            struct slab_page *pg = &s->pages[p];
            struct slab_class *c = &pl->cls[pg->clsid];
            pthread_mutex_lock(&c->lock);
            c->c.pages_trimmed++;
            /* Unowned from here on: walkers skip it, slab_free never sees its chunks again. */
            STORE(&pg->clsid, 0);
            pthread_mutex_unlock(&c->lock);
            pool_transfer(s, pl, NULL, p);
            done++;
        }
    }
    return done;
}

/* ---- walking, stats ----------------------------------------------------------------------- */

/* Lock the class that owns `page` (only if it is class `want`, when want is not 0). Returns
 * it locked, with *clsid set, or NULL when the page is out of range, unowned, of another class
 * or moving. */
static struct slab_class *page_owner_lock(struct slab *s, uint32_t page, int want, int *clsid)
{
    if (page >= slab_pages_used(s)) return NULL;
    int cls = LOAD(&s->pages[page].clsid);
    if (cls == 0 || (want != 0 && cls != want)) return NULL;
    uint16_t nsid = LOAD(&s->pages[page].nsid);
    struct slab_pool *pl = __atomic_load_n(&s->pools[nsid], __ATOMIC_ACQUIRE);
    if (!pl) return NULL;
    struct slab_class *c = &pl->cls[cls];
    pthread_mutex_lock(&c->lock);
    /* Ownership changes only through `moving`, set under the owner's lock: re-check under it. */
    if (LOAD(&s->pages[page].clsid) != cls || LOAD(&s->pages[page].nsid) != nsid ||
        LOAD(&s->pages[page].moving)) {
        pthread_mutex_unlock(&c->lock);
        return NULL;
    }
    *clsid = cls;
    return c;
}

uint32_t slab_walk_page(struct slab *s, uint32_t page, uint32_t from, uint32_t max,
                        slab_visit_fn fn, void *ctx)
{
    int clsid;
    struct slab_class *c = page_owner_lock(s, page, 0, &clsid);
    if (c == NULL) return SLAB_NONE;
    uint32_t n = s->pages[page].carved;
    uint32_t end = from + max < n ? from + max : n;
    for (uint32_t i = from; i < end; i++) {
        struct item *it = slab_chunk(s, page, i, c->size);
        if (!(slab_chunk_state(it) & ITEM_LINKED)) continue;
        int r = fn(ctx, it, SLAB_VISIT_SWEEP);
        if (!(r & SLAB_GONE)) continue;
        slab_count_gone(c, SLAB_VISIT_SWEEP, r);
        __atomic_store_n(&it->iflags, ITEM_SLAB_FREE, __ATOMIC_RELAXED);
        class_free_push(c, it);
    }
    pthread_mutex_unlock(&c->lock);
    return end < n ? end : SLAB_NONE;
}

uint32_t slab_peek_page(struct slab *s, uint32_t page, uint32_t from, uint32_t max, int clsid,
                        void (*fn)(void *ctx, struct item *it, int clsid), void *ctx)
{
    int cls;
    struct slab_class *c = page_owner_lock(s, page, clsid, &cls);
    if (c == NULL) return SLAB_NONE;
    uint32_t n = s->pages[page].carved;
    uint32_t end = from + max < n ? from + max : n;
    for (uint32_t i = from; i < end; i++) {
        struct item *it = slab_chunk(s, page, i, c->size);
        if (slab_chunk_state(it) & ITEM_LINKED) fn(ctx, it, cls);
    }
    pthread_mutex_unlock(&c->lock);
    return end < n ? end : SLAB_NONE;
}

static void counters_add(struct slab_counters *out, const struct slab_counters *c)
{
    out->evictions += c->evictions;
    out->evicted_unfetched += c->evicted_unfetched;
    out->expired_unfetched += c->expired_unfetched;
    out->reclaimed += c->reclaimed;
    out->sweeper_reclaimed += c->sweeper_reclaimed;
    out->pages_moved += c->pages_moved;
    out->alloc_failures += c->alloc_failures;
    out->pages_trimmed += c->pages_trimmed;
    out->double_frees += c->double_frees;
}

void slab_sum_counters(struct slab *s, struct slab_counters *out)
{
    for (int p = 0; p < STORE_NS_MAX; p++) {
        struct slab_pool *pl = __atomic_load_n(&s->pools[p], __ATOMIC_ACQUIRE);
        if (!pl) continue;
        for (int i = 1; i <= s->nclasses; i++) {
            struct slab_class *c = &pl->cls[i];
            pthread_mutex_lock(&c->lock);
            counters_add(out, &c->c);
            pthread_mutex_unlock(&c->lock);
        }
    }
}

/* Add class c's figures into out (its lock taken here). */
static void class_info_add(struct slab *s, struct slab_class *c, struct slab_class_info *out)
{
    pthread_mutex_lock(&c->lock);
    out->pages += c->npages;
    out->carved += c->carved;
    out->nfree += c->nfree;
    counters_add(&out->c, &c->c);
    /* CLOCK keeps no age order; the chunks just ahead of the hand are the next to go, so the
     * oldest access among a sample of them stands in for the tail age of an LRU. */
    uint32_t p = c->hand_page != SLAB_NONE ? c->hand_page : c->head;
    uint32_t i = c->hand_page != SLAB_NONE ? c->hand_idx : 0;
    for (uint32_t seen = 0; p != SLAB_NONE && seen < SLAB_OLDEST_SAMPLE && c->carved;) {
        if (i >= s->pages[p].carved) {
            p = slab_class_page_next(s, c, p);
            i = 0;
            continue;
        }
        struct item *it = slab_chunk(s, p, i++, c->size);
        seen++;
        if (!(slab_chunk_state(it) & ITEM_LINKED)) continue;
        uint32_t at = LOAD(&it->atime);
        if (!out->oldest_atime || at < out->oldest_atime) out->oldest_atime = at;
    }
    pthread_mutex_unlock(&c->lock);
}

bool slab_class_info(struct slab *s, int clsid, struct slab_class_info *out)
{
    if (clsid < 1 || clsid > s->nclasses) return false;
    memset(out, 0, sizeof *out);
    out->chunk_size = s->size[clsid];
    out->chunks_per_page = s->perpage[clsid];
    for (int p = 0; p < STORE_NS_MAX; p++) {
        struct slab_pool *pl = __atomic_load_n(&s->pools[p], __ATOMIC_ACQUIRE);
        if (pl) class_info_add(s, &pl->cls[clsid], out);
    }
    return true;
}
