/* store.c — the storage engine's public API (store.h): glue between the slab allocator
 * (slab.c), the sharded index (index.c) and the sweeper (sweeper.c), plus expiry, flush, CAS and
 * stats.
 *
 * The one policy that lives here is the victim visitor: when the slab layer needs a linked item
 * gone (CLOCK eviction, page move, sweep) it calls store_visit, which try-locks the item's shard
 * and unlinks it. */
#include "node/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/index.h"
#include "node/slab.h"

_Static_assert(sizeof(struct item) == 40, "item header must stay 40 bytes");
_Static_assert(((ITEM_LINKED | ITEM_FETCHED | ITEM_STALE | ITEM_TOKEN) & ITEM_SLAB_FREE) == 0,
               "slab's private flag overlaps a public one");

struct store {
    struct slab *slab;
    struct index *index;
    struct sweeper *sweeper;
    uint64_t memory;
    uint64_t item_max;

    /* Flush state, read on every lookup, written by store_flush (under flush_lock).
     * Immediate flush at second flush_time: items with atime < flush_time are dead, and in that
     * same second those with cas < flush_cas. (CAS alone would kill items stored later with an
     * explicit small CAS, the ms E flag, and spare older ones with an explicit large one.)
     * Delayed flush: items with atime <= oldest_live are dead once now >= oldest_live. */
    uint64_t flush_cas;
    uint32_t flush_time;
    uint32_t oldest_live;
    pthread_mutex_t flush_lock;

    /* Stale grace per namespace id, seconds (store_set_grace); read without a lock. */
    uint32_t grace[STORE_NS_MAX];

    /* On its own cache line: every store writes it. */
    uint64_t cas_next __attribute__((aligned(64)));
} __attribute__((aligned(64)));

/* The shard whose lock this thread took with store_lock, so that the visitor never tries to lock
 * it again and knows it may unlink from it (see store_visit). */
static __thread struct index_shard *tls_held;

#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)

/* Why an item is no longer valid, or STORE_HIT. Reads the item's fields with relaxed atomics, so
 * the slab walkers may call it without the shard lock as a first guess (re-checked under it). */
static inline enum store_miss store_dead(const struct store *st, const struct item *it,
                                         uint32_t now)
{
    uint32_t atime = LOAD(&it->atime);
    uint64_t fcas = __atomic_load_n(&st->flush_cas, __ATOMIC_ACQUIRE);
    if (__builtin_expect(fcas != 0, 0)) {
        uint32_t ft = LOAD(&st->flush_time);
        if (atime < ft || (atime == ft && LOAD(&it->cas) < fcas)) return STORE_MISS_FLUSHED;
    }
    uint32_t ol = LOAD(&st->oldest_live);
    if (__builtin_expect(ol != 0, 0) && now >= ol && atime <= ol) return STORE_MISS_FLUSHED;
    uint32_t exp = LOAD(&it->exptime);
    if (exp != 0 && exp <= now) return STORE_MISS_EXPIRED;
    return STORE_HIT;
}

/* Is `it`, which store_dead found expired, still in its namespace's stale grace? Relaxed reads,
 * as store_dead. */
static inline bool store_in_grace(const struct store *st, const struct item *it, uint32_t now)
{
    uint32_t g = LOAD(&st->grace[it->nsid % STORE_NS_MAX]);
    if (g == 0 || LOAD(&it->nbytes) == 0 || (LOAD(&it->iflags) & (ITEM_HOLD | ITEM_STALE)))
        return false;
    uint32_t exp = LOAD(&it->exptime);
    return exp != 0 && exp <= now && now - exp < g;
}

/* Take `it` out of the index (shard lock held); the caller frees or reuses the chunk. */
static inline void store_unindex(struct index_shard *sh, uint64_t hv, struct item *it)
{
    index_remove(sh, hv, it);
    __atomic_store_n(&it->iflags, it->iflags & ~ITEM_LINKED, __ATOMIC_RELAXED);
}

/* Make `it` visible to walkers: release, so a walker that sees ITEM_LINKED sees the key too. */
static inline void store_mark_linked(struct item *it)
{
    __atomic_store_n(&it->iflags, it->iflags | ITEM_LINKED, __ATOMIC_RELEASE);
}

/* ---- victims ------------------------------------------------------------------------------ */

struct store_alloc_ctx {
    struct store *st;
    const char *key; /* the key being allocated: its item may be held by the caller */
    size_t nkey;
    uint32_t now;
};

/* The slab visitor (see slab_visit_fn): class lock held, never blocks on a shard lock.
 *  EVICT: an expired item goes at once; a live one with its CLOCK bit set gets the bit cleared
 *         and stays; other live ones go if their shard can be try-locked. The caller's own shard
 *         is skipped, since the caller may hold pointers into it.
 *  STEAL: every item of the page must go. In the caller's own shard (already locked by this
 *         thread) any item but the one with the caller's key may go; that one is pinned.
 *  SWEEP: only expired or flushed items go. */
static int store_visit(struct store *st, struct item *it, enum slab_visit why, uint32_t now,
                       const char *akey, size_t ankey)
{
    enum store_miss dead = store_dead(st, it, now);
    /* the sweeper keeps an expired item in its stale grace; eviction may take it */
    bool keep = dead == STORE_HIT || (dead == STORE_MISS_EXPIRED && store_in_grace(st, it, now));
    if (why == SLAB_VISIT_SWEEP && keep) return SLAB_KEEP;
    if (why == SLAB_VISIT_EVICT && dead == STORE_HIT && LOAD(&it->clock)) {
        __atomic_store_n(&it->clock, 0, __ATOMIC_RELAXED);
        return SLAB_KEEP;
    }
    uint64_t hv = index_hash(item_key(it), it->nkey);
    struct index_shard *sh = index_shard_of(st->index, hv);
    bool mine = sh == tls_held;
    if (mine) {
        if (why != SLAB_VISIT_STEAL) return SLAB_BUSY;
        if (it->nkey == ankey && memcmp(item_key(it), akey, ankey) == 0) return SLAB_PINNED;
    } else if (pthread_mutex_trylock(&sh->lock) != 0) {
        return SLAB_BUSY;
    }
    int r;
    if (!(LOAD(&it->iflags) & ITEM_LINKED)) {
        r = SLAB_BUSY; /* its owner unlinked it and is about to free it */
    } else {
        dead = store_dead(st, it, now);
        keep = dead == STORE_HIT || (dead == STORE_MISS_EXPIRED && store_in_grace(st, it, now));
        if (why == SLAB_VISIT_SWEEP && keep) {
            r = SLAB_KEEP; /* touched or re-stored since the first look */
        } else {
            r = SLAB_GONE;
            if (dead != STORE_HIT) r |= SLAB_GONE_EXPIRED;
            __atomic_fetch_add(dead != STORE_HIT ? &sh->ns[it->nsid].expired
                                                 : &sh->ns[it->nsid].evictions,
                               1, __ATOMIC_RELAXED);
            if (!(it->iflags & ITEM_FETCHED)) r |= SLAB_GONE_UNFETCHED;
            store_unindex(sh, hv, it);
        }
    }
    if (!mine) pthread_mutex_unlock(&sh->lock);
    return r;
}

static int store_visit_alloc(void *ctx, struct item *it, enum slab_visit why)
{
    struct store_alloc_ctx *a = ctx;
    if (!a->now) a->now = clock_now(); /* only once a victim is needed */
    return store_visit(a->st, it, why, a->now, a->key, a->nkey);
}

static int store_visit_sweep(void *ctx, struct item *it, enum slab_visit why)
{
    return store_visit(ctx, it, why, clock_now(), NULL, 0);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

void store_options_default(struct store_options *o)
{
#define X(name, type, def, lo, hi, help) o->name = (def);
    STORE_OPTIONS(X)
#undef X
}

static bool store_opt_in_range(uint64_t v, uint64_t lo, uint64_t hi) { return v >= lo && v <= hi; }

int store_create(struct store **out, const struct store_options *o, char *err, size_t errlen)
{
    *out = NULL;
#define X(name, type, def, lo, hi, help)                                                         \
    if (!store_opt_in_range(o->name, (uint64_t)(lo), (uint64_t)(hi))) {                          \
        snprintf(err, errlen, "%s must be between %llu and %llu (got %llu)", #name,              \
                 (unsigned long long)(lo), (unsigned long long)(hi),                             \
                 (unsigned long long)o->name);                                                   \
        return -1;                                                                               \
    }
    STORE_OPTIONS(X)
#undef X
    struct store *st;
    if (posix_memalign((void **)&st, 64, sizeof *st)) {
        snprintf(err, errlen, "out of memory creating the store");
        return -1;
    }
    memset(st, 0, sizeof *st);
    st->memory = o->memory_mb << 20;
    st->item_max = o->item_max;
    st->cas_next = 1;
    pthread_mutex_init(&st->flush_lock, NULL);
    if (slab_create(&st->slab, st->memory, st->item_max, err, errlen)) goto fail;
    if (o->huge_pages && slab_advise_huge(st->slab) != 0)
        log_warn("transparent huge pages unavailable for item memory; using normal pages");
    if (index_create(&st->index, (unsigned)o->hash_power, slab_class_count(st->slab), err,
                     errlen))
        goto fail;
    if (sweeper_create(&st->sweeper, st->slab, store_visit_sweep, st,
                       (uint32_t)o->sweep_interval_ms, err, errlen))
        goto fail;
    *out = st;
    return 0;
fail:
    index_destroy(&st->index);
    slab_destroy(&st->slab);
    pthread_mutex_destroy(&st->flush_lock);
    free(st);
    return -1;
}

void store_destroy(struct store **stp)
{
    struct store *st = *stp;
    if (!st) return;
    sweeper_destroy(&st->sweeper); /* first: it walks the slab and the index */
    index_destroy(&st->index);
    slab_destroy(&st->slab);
    pthread_mutex_destroy(&st->flush_lock);
    free(st);
    *stp = NULL;
}

/* ---- locking, allocation ------------------------------------------------------------------ */

uint64_t store_hash(const char *key, size_t nkey) { return index_hash(key, nkey); }

void store_lock(struct store *st, uint64_t hv)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    pthread_mutex_lock(&sh->lock);
    tls_held = sh;
}

void store_unlock(struct store *st, uint64_t hv)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    tls_held = NULL;
    pthread_mutex_unlock(&sh->lock);
}

/* Class for an item of this key and value length, or 0 if it exceeds item_max. */
static int store_class_of(const struct store *st, size_t nkey, size_t nbytes)
{
    if (nkey > UINT8_MAX || nbytes > UINT32_MAX) return 0;
    size_t total = sizeof(struct item) + nkey + nbytes;
    /* memcached counts the value's \r\n against the limit; so do we, to refuse the same items */
    if (total + 2 > st->item_max) return 0;
    return slab_class_for(st->slab, total);
}

size_t store_item_size(const struct store *st, size_t nkey, size_t nbytes)
{
    int id = store_class_of(st, nkey, nbytes);
    return id ? slab_chunk_size(st->slab, id) : 0;
}

struct item *store_alloc(struct store *st, const char *key, size_t nkey, size_t nbytes)
{
    int id = store_class_of(st, nkey, nbytes);
    if (!id) return NULL;
    struct store_alloc_ctx ctx = {.st = st, .key = key, .nkey = nkey};
    struct item *it = slab_alloc(st->slab, id, store_visit_alloc, &ctx);
    if (!it) return NULL;
    /* iflags is already 0 (set by the slab under its lock); the rest is ours to initialise. */
    it->hnext = NULL;
    it->cas = 0;
    it->exptime = 0;
    it->atime = 0;
    it->nbytes = (uint32_t)nbytes;
    it->flags = 0;
    it->nkey = (uint8_t)nkey;
    it->clsid = (uint8_t)id;
    it->clock = 0;
    it->nsid = 0;
    memcpy(it->data, key, nkey);
    return it;
}

void store_free(struct store *st, struct item *it) { slab_free(st->slab, it); }

/* ---- index operations (shard lock held) --------------------------------------------------- */

struct item *store_find(struct store *st, uint64_t hv, const char *key, size_t nkey, uint32_t now,
                        enum store_miss *why)
{
    return store_find_ex(st, hv, key, nkey, now, why, 0);
}

struct item *store_find_raw(struct store *st, uint64_t hv, const char *key, size_t nkey,
                            uint32_t now, enum store_miss *why)
{
    return store_find_ex(st, hv, key, nkey, now, why, STORE_FIND_HELD);
}

void store_set_grace(struct store *st, uint16_t nsid, uint32_t secs)
{
    __atomic_store_n(&st->grace[nsid % STORE_NS_MAX], secs, __ATOMIC_RELAXED);
}

struct item *store_find_ex(struct store *st, uint64_t hv, const char *key, size_t nkey,
                           uint32_t now, enum store_miss *why, unsigned opts)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    struct item *it = index_find(sh, hv, key, nkey);
    enum store_miss m = STORE_MISS_ABSENT;
    if (it) {
        m = store_dead(st, it, now);
        if (m == STORE_MISS_EXPIRED && (opts & STORE_FIND_GRACE) && store_in_grace(st, it, now)) {
            /* kept for stale-while-revalidate: the caller sees it, marked by *why */
        } else if (m != STORE_HIT) {
            if (m == STORE_MISS_EXPIRED && !(it->iflags & ITEM_FETCHED)) sh->expired_unfetched++;
            __atomic_fetch_add(&sh->ns[it->nsid].expired, 1, __ATOMIC_RELAXED);
            store_unindex(sh, hv, it);
            slab_free(st->slab, it);
            it = NULL;
        } else if ((it->iflags & ITEM_HOLD) && !(opts & STORE_FIND_HELD)) {
            it = NULL;
            m = STORE_MISS_HELD;
        }
    }
    if (why) *why = m;
    return it;
}

void store_link(struct store *st, uint64_t hv, struct item *it, uint32_t now)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    it->atime = now;
    if (it->cas == 0) it->cas = store_next_cas(st);
    index_insert(sh, hv, it);
    sh->total_items++;
    store_mark_linked(it);
}

void store_replace(struct store *st, uint64_t hv, struct item *old, struct item *it, uint32_t now)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    it->atime = now;
    if (it->cas == 0) it->cas = store_next_cas(st);
    if (!index_swap(sh, hv, old, it)) {
        /* `old` was not linked (a caller bug): still store the new item, free nothing twice. */
        index_insert(sh, hv, it);
        sh->total_items++;
        store_mark_linked(it);
        return;
    }
    sh->total_items++;
    store_mark_linked(it);
    __atomic_store_n(&old->iflags, old->iflags & ~ITEM_LINKED, __ATOMIC_RELAXED);
    slab_free(st->slab, old);
}

void store_unlink(struct store *st, uint64_t hv, struct item *it)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    if (!(it->iflags & ITEM_LINKED)) return; /* not ours to free twice */
    store_unindex(sh, hv, it);
    slab_free(st->slab, it);
}

void store_bump(struct item *it, uint32_t now)
{
    /* Write only what changes: a hot item read by many threads must not bounce its line. */
    if (!__atomic_load_n(&it->clock, __ATOMIC_RELAXED))
        __atomic_store_n(&it->clock, 1, __ATOMIC_RELAXED);
    /* Atomic because slab walkers read iflags without the shard lock. */
    if (!(it->iflags & ITEM_FETCHED))
        __atomic_store_n(&it->iflags, it->iflags | ITEM_FETCHED, __ATOMIC_RELAXED);
    if (it->atime != now) __atomic_store_n(&it->atime, now, __ATOMIC_RELAXED);
}

uint64_t store_next_cas(struct store *st)
{
    return __atomic_fetch_add(&st->cas_next, 1, __ATOMIC_RELAXED);
}

void store_flush(struct store *st, uint32_t when, uint32_t now)
{
    pthread_mutex_lock(&st->flush_lock);
    uint64_t fcas = st->flush_cas;
    uint32_t ftime = st->flush_time;
    uint32_t ol = st->oldest_live;
    if (ol != 0 && ol <= now) {
        /* A delayed flush already in force is about to be replaced: fold it into the immediate
         * record so that the items it killed (atime <= ol) stay dead. */
        if (ol >= ftime) {
            ftime = ol;
            fcas = store_next_cas(st); /* above every cas stored so far */
        }
        ol = 0;
    }
    if (when <= now) {
        fcas = store_next_cas(st);
        ftime = now;
        ol = 0; /* an immediate flush also cancels a pending delayed one, as in memcached */
    } else {
        ol = when;
    }
    /* flush_time before flush_cas: a reader that sees the new cas (acquire) sees its time. */
    __atomic_store_n(&st->flush_time, ftime, __ATOMIC_RELAXED);
    __atomic_store_n(&st->flush_cas, fcas, __ATOMIC_RELEASE);
    __atomic_store_n(&st->oldest_live, ol, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&st->flush_lock);
}

/* ---- stats -------------------------------------------------------------------------------- */

void store_ns_stats(struct store *st, uint16_t nsid, struct store_ns_stats *out)
{
    const struct index_ns *ns = &st->index->ns[nsid % STORE_NS_MAX];
    out->items = LOAD(&ns->items);
    out->bytes = LOAD(&ns->bytes);
    out->evictions = LOAD(&ns->evictions);
    out->expired = LOAD(&ns->expired);
}

void store_stats(struct store *st, struct store_stats *out)
{
    memset(out, 0, sizeof *out);
    uint64_t buckets = 0;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        struct index_shard *sh = &st->index->shards[i];
        pthread_mutex_lock(&sh->lock);
        out->curr_items += sh->curr_items;
        out->total_items += sh->total_items;
        out->bytes += sh->bytes;
        out->expired_unfetched += sh->expired_unfetched;
        out->hash_expansions += sh->expansions;
        buckets += (uint64_t)1 << sh->power;
        pthread_mutex_unlock(&sh->lock);
    }
    struct slab_counters c = {0};
    slab_sum_counters(st->slab, &c);
    out->evictions = c.evictions;
    out->evicted_unfetched = c.evicted_unfetched;
    out->expired_unfetched += c.expired_unfetched;
    out->reclaimed = c.reclaimed;
    out->sweeper_reclaimed = c.sweeper_reclaimed;
    out->slab_pages_moved = c.pages_moved;
    out->alloc_failures = c.alloc_failures;
    out->hash_bytes = buckets * sizeof(struct item *);
    out->hash_power_level = 63 - (uint64_t)__builtin_clzll(buckets);
    out->limit_maxbytes = st->memory;
    out->page_size = slab_page_size(st->slab);
    out->pages_total = slab_pages_total(st->slab);
    out->pages_used = slab_pages_used(st->slab);
}

int store_class_count(const struct store *st) { return slab_class_count(st->slab); }

bool store_class_stats(struct store *st, int clsid, struct store_class_stats *out)
{
    struct slab_class_info ci;
    if (!slab_class_info(st->slab, clsid, &ci)) return false;
    memset(out, 0, sizeof *out);
    out->chunk_size = ci.chunk_size;
    out->chunks_per_page = ci.chunks_per_page;
    out->total_pages = ci.pages;
    out->total_chunks = (uint64_t)ci.pages * ci.chunks_per_page;
    out->used_chunks = ci.carved - ci.nfree;
    out->free_chunks = out->total_chunks - out->used_chunks;
    out->evictions = ci.c.evictions;
    out->evicted_unfetched = ci.c.evicted_unfetched;
    out->expired_unfetched = ci.c.expired_unfetched;
    out->reclaimed = ci.c.reclaimed;
    uint32_t now = clock_now();
    out->oldest_age = ci.oldest_atime && now > ci.oldest_atime ? now - ci.oldest_atime : 0;
    for (unsigned i = 0; i < INDEX_SHARDS; i++) {
        struct index_shard *sh = &st->index->shards[i];
        pthread_mutex_lock(&sh->lock);
        out->curr_items += sh->cls_items[clsid];
        pthread_mutex_unlock(&sh->lock);
    }
    return true;
}
