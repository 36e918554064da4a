/* slab_int.h — the slab layer's private structures, shared by slab.c (pages, pools, classes)
 * and evict.c (eviction policies). Nothing outside those two files includes it.
 *
 * Memory is one reservation cut into pages. Every page belongs to nobody (the free stack, or
 * never touched) or to one (pool, class): a pool is one namespace's memory, with its own set of
 * size classes, its own quota and its own eviction policy. A class cuts its pages into chunks of
 * one size. */
#ifndef SHOAL_NODE_SLAB_INT_H
#define SHOAL_NODE_SLAB_INT_H

#include <pthread.h>

#include "node/slab.h"

struct slab_page {
    uint32_t next, prev; /* the owning class's page list, in order of arrival */
    uint32_t carved;     /* chunks cut so far (owner's lock) */
    uint16_t nsid;       /* owning pool; meaningful only while clsid != 0 */
    uint8_t clsid;       /* owning class, 0 when unassigned; read without a lock by walkers */
    uint8_t moving;      /* being emptied; chunks freed here stay out of free lists */
};

/* S3-FIFO's small queue of one class: the chunks admitted as new items, oldest first. Entries
 * whose chunk has since been freed, reused or promoted are skipped when they come up. */
struct evict_ring {
    struct item **slot;
    uint32_t cap; /* a power of two, or 0 */
    uint32_t head, tail; /* free-running; len = tail - head */
};

/* One size class of one pool. Everything in it is guarded by `lock`, except npages (read
 * without it when choosing a donor). */
struct slab_class {
    pthread_mutex_t lock;
    uint32_t size;
    uint32_t perpage;
    struct item *free; /* chained through the first 8 bytes of each free chunk (free_next) */
    uint64_t nfree;
    uint64_t carved; /* sum of its pages' carved counts */
    uint32_t npages;
    uint32_t head, tail;
    uint32_t cur;                 /* page still being carved, or SLAB_NONE */
    uint32_t hand_page, hand_idx; /* eviction hand */
    uint32_t *pagev;              /* the class's pages, in no order: random sampling (lfu) */
    uint32_t npagev, capv;
    struct evict_ring small;      /* s3fifo only */
    struct slab_counters c;
} __attribute__((aligned(64)));

struct slab_pool {
    struct slab *slab;    /* the allocator it belongs to */
    uint16_t id;
    uint8_t policy;       /* enum slab_policy; relaxed atomic, read on every hit */
    uint32_t npages;      /* pages owned (pool_lock; read relaxed elsewhere) */
    uint32_t quota_pages; /* 0: no quota of its own (pool_lock; read relaxed elsewhere) */
    uint32_t *ghost;      /* s3fifo: fingerprints of keys recently evicted from the small queue */
    uint32_t ghost_mask;
    struct slab_class cls[]; /* [0] unused, [1..nclasses] */
};

struct slab {
    char *base;
    size_t mapped;
    uint32_t page_size;
    unsigned page_shift;
    uint32_t npages;
    uint32_t next_page; /* pages [next_page, npages) were never used; atomic */
    int nclasses;
    uint32_t size[SLAB_CLASS_MAX + 1];
    uint32_t perpage[SLAB_CLASS_MAX + 1];
    struct slab_page *pages;

    pthread_mutex_t pool_lock; /* pools[] creation, the free stack, pool page counts, quotas */
    uint32_t *free_stack;      /* pages given back (trimmed quotas), reused before new ones */
    uint32_t nfree_stack;
    struct slab_pool *pools[STORE_NS_MAX]; /* created on first use, freed by slab_destroy */
};

#define SLAB_LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define SLAB_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

static inline struct item *slab_chunk(const struct slab *s, uint32_t page, uint32_t i,
                                      uint32_t size)
{
    return (struct item *)(s->base + ((size_t)page << s->page_shift) + (size_t)i * size);
}

static inline uint32_t slab_page_of(const struct slab *s, const struct item *it)
{
    return (uint32_t)(((const char *)it - s->base) >> s->page_shift);
}

static inline uint8_t slab_chunk_state(struct item *it)
{
    return __atomic_load_n(&it->iflags, __ATOMIC_ACQUIRE);
}

/* A free chunk's link to the next one, kept in its first 8 bytes (the CAS of a live item; the
 * chunk is only 4-byte aligned, hence memcpy). iflags, further on, stays readable by walkers. */
static inline struct item *free_next(const struct item *it)
{
    struct item *n;
    __builtin_memcpy(&n, it, sizeof n);
    return n;
}

/* Put chunk `it` on class c's free list (class lock held). */
static inline void class_free_push(struct slab_class *c, struct item *it)
{
    __builtin_memcpy(it, &c->free, sizeof c->free);
    c->free = it;
    c->nfree++;
}

/* Next page of c after p, wrapping to the head. */
static inline uint32_t slab_class_page_next(const struct slab *s, const struct slab_class *c,
                                            uint32_t p)
{
    uint32_t n = s->pages[p].next;
    return n != SLAB_NONE ? n : c->head;
}

/* Is `it` still a chunk of class c: its page owned by c and not being moved, `it` on c's chunk
 * grid and carved? Class c's lock held. A pointer kept across page moves (s3fifo's ring) must
 * pass this before it is read: its page may since belong to another class, cut differently. */
bool slab_chunk_of_class(const struct slab *s, const struct slab_class *c, const struct item *it);

/* Count a chunk given up by a visitor in class c's counters. */
void slab_count_gone(struct slab_class *c, enum slab_visit why, int r);

/* evict.c: pick a victim in class c of pool pl by the pool's policy and have the visitor take
 * it. Class lock held. Returns the chunk (in flight) or NULL. */
struct item *evict_run(struct slab *s, struct slab_pool *pl, struct slab_class *c,
                       slab_visit_fn fn, void *ctx);
/* evict.c: set up a fresh chunk's policy state (it->clock) and queue it (s3fifo); `hv` is the
 * key's hash, for the ghost check. Class lock held. */
void evict_admit(struct slab_pool *pl, struct slab_class *c, struct item *it, uint64_t hv);
/* evict.c: the class gained pages: let the small queue grow with it. Class lock held. */
void evict_class_grew(struct slab_pool *pl, struct slab_class *c);
/* evict.c: allocate what `policy` needs in pool pl holding up to `capacity` bytes, before the
 * pool switches to it. pool_lock held. Returns 0, or -1 when out of memory (the pool keeps
 * working; s3fifo then runs without its ghost). */
int evict_pool_prepare(struct slab_pool *pl, enum slab_policy policy, uint64_t capacity);
void evict_pool_free(struct slab_pool *pl);
void evict_class_free(struct slab_class *c);

#endif
