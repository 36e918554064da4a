/* store.c — the storage engine's public API (store.h): glue between the segmented log (seg.c),
 * the sharded index (index.c) and the sweeper (sweeper.c), plus expiry, flush, CAS and stats.
 *
 * The one policy that lives here is the visitor: when the log needs a linked item moved
 * (cleaning, reinsertion) or gone (eviction, sweep) it calls store_visit, which try-locks the
 * item's shard, then moves the item and repoints its index slot, or unlinks it. Readers copy
 * values out under the shard lock, so a move under that lock is invisible to them. */
#include "node/store.h"

#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/slot.h"
#include "node/index.h"
#include "node/seg.h"

_Static_assert((int)STORE_POLICY_LRU == (int)SEG_POLICY_LRU &&
                   (int)STORE_POLICY_LFU == (int)SEG_POLICY_LFU &&
                   (int)STORE_POLICY_S3FIFO == (int)SEG_POLICY_S3FIFO,
               "store and log name the policies alike");
_Static_assert(((ITEM_LINKED | ITEM_FETCHED | ITEM_STALE | ITEM_TOKEN | ITEM_HOLD | ITEM_FLAGS |
                 ITEM_KEY_BINARY) & ITEM_SEG_DEAD) == 0,
               "the log's private flag overlaps a public one");

/* The transient item cache (the paper's, for short-TTL keys): per index shard, guarded by the
 * shard lock, the items stored with a TTL of at most STORE_TRANSIENT_TTL seconds, so that the
 * sweeper thread frees each within about a second of its expiry without walking all memory.
 * Bounded per shard; items beyond the bound wait for the regular sweep. */
#define STORE_TRANSIENT_TTL 60
#define STORE_TRANSIENT_PER_SHARD 2048
#define STORE_BUSY_RETRIES 4   /* yields before a busy victim item is skipped (store_lock_retry) */

struct transient_entry {
    uint64_t hv;  /* the key's hash and the CAS find the item wherever it has moved since */
    uint64_t cas;
    uint32_t exptime;
};

struct transient {
    struct transient_entry *v;
    uint32_t n, cap;
    uint64_t reclaimed;
};

struct store {
    struct segs *segs;
    struct index *index;
    struct sweeper *sweeper;
    struct transient *transient; /* INDEX_SHARDS of them */
    uint64_t memory;
    uint64_t item_max;
    uint64_t trimmed_at; /* index table bytes at the last malloc_trim (sweeper thread only) */

    /* Moves reported while move_watch > 0 (store_watch_moves): a walk that must not miss an
     * item cleaning moves past it (a replication full sync). on_move is set once, before any
     * watch; move_watch is read relaxed under the moved item's shard lock and the pool lock. */
    store_move_fn on_move;
    void *on_move_ctx;
    uint32_t move_watch;

    /* Flush state, read on every lookup, written by store_flush (under flush_lock).
     * Immediate flush at second flush_time: items with atime < flush_time are dead, and in that
     * same second those with cas < flush_cas. (CAS alone would kill items stored later with an
     * explicit small CAS, the ms E flag, and spare older ones with an explicit large one.)
     * Delayed flush: items with atime <= oldest_live are dead once now >= oldest_live. */
    uint64_t flush_cas;
    uint32_t flush_time;
    uint32_t oldest_live;
    pthread_mutex_t flush_lock;

    /* Linked items and their bytes per size class (`stats items` number and mem_requested):
     * relaxed atomic adds on link and unlink, never on a hit. */
    struct {
        uint64_t items, bytes;
        uint8_t seen; /* ever held an item: `stats slabs` keeps showing it, as memcached does */
    } cls[SEG_CLASS_MAX + 1];

    /* Slot drops (store_drop_slots), written under flush_lock: per slot, items with atime <
     * drop_time[s], or == and cas < drop_cas[s], are dead, but only while drop_pending (read
     * on every lookup); it clears once the sweeper's clean passes (ones that skipped no dropped
     * item) reach drop_until. */
    uint32_t *drop_time;
    uint64_t *drop_cas;
    uint32_t drop_pending;
    uint64_t drop_until;
    uint64_t dropped; /* items removed for it (relaxed atomic) */

    /* Namespace flushes (store_flush_ns), written under flush_lock, read on every lookup: items
     * of namespace id i with atime < ns_flush_time[i], or == and cas < ns_flush_cas[i], are
     * dead (flush_all's rule, per namespace; 0 cas: never flushed). */
    uint32_t ns_flush_time[STORE_NS_MAX];
    uint64_t ns_flush_cas[STORE_NS_MAX];

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
 * the log's walkers may call it without the shard lock as a first guess (re-checked under it). */
static inline enum store_miss store_dead(const struct store *st, const struct item *it,
                                         uint32_t now)
{
    uint32_t atime = LOAD(&it->atime);
    uint64_t fcas = __atomic_load_n(&st->flush_cas, __ATOMIC_ACQUIRE);
    if (__builtin_expect(fcas != 0, 0)) {
        uint32_t ft = LOAD(&st->flush_time);
        if (atime < ft || (atime == ft && item_cas(it) < fcas)) return STORE_MISS_FLUSHED;
    }
    uint32_t ol = LOAD(&st->oldest_live);
    if (__builtin_expect(ol != 0, 0) && now >= ol && atime <= ol) return STORE_MISS_FLUSHED;
    uint8_t nsid = LOAD(&it->nsid);
    uint64_t ncas = __atomic_load_n(&st->ns_flush_cas[nsid], __ATOMIC_ACQUIRE);
    if (__builtin_expect(ncas != 0, 0)) {
        uint32_t nt = LOAD(&st->ns_flush_time[nsid]);
        if (atime < nt || (atime == nt && item_cas(it) < ncas)) return STORE_MISS_FLUSHED;
    }
    if (__builtin_expect(__atomic_load_n(&st->drop_pending, __ATOMIC_ACQUIRE) != 0, 0)) {
        uint16_t s = slot_of_key(it->data, LOAD(&it->nkey));
        uint64_t dcas = __atomic_load_n(&st->drop_cas[s], __ATOMIC_ACQUIRE);
        uint32_t dt = LOAD(&st->drop_time[s]);
        if (dcas != 0 && (atime < dt || (atime == dt && item_cas(it) < dcas)))
            return STORE_MISS_DROPPED;
    }
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

/* Count `it` in (sign 1) or out (-1) of its size class's figures. */
static inline void store_cls_count(struct store *st, const struct item *it, int sign)
{
    int c = seg_bucket_for(st->segs, seg_item_size(it));
    uint64_t b = index_item_bytes(it);
    if (sign > 0) {
        if (!LOAD(&st->cls[c].seen)) __atomic_store_n(&st->cls[c].seen, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&st->cls[c].items, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&st->cls[c].bytes, b, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_sub(&st->cls[c].items, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&st->cls[c].bytes, b, __ATOMIC_RELAXED);
    }
}

/* Take `it` out of the index (shard lock held); the caller frees or reuses the chunk. */
static inline void store_unindex(struct store *st, struct index_shard *sh, uint64_t hv,
                                 struct item *it)
{
    uint64_t shrunk = sh->shrinks;
    if (index_remove(sh, hv, it)) store_cls_count(st, it, -1);
    /* a smaller table: its share of -m goes back to the items now */
    if (sh->shrinks != shrunk) seg_set_reserve(st->segs, index_table_bytes(st->index));
    __atomic_store_n(&it->iflags, it->iflags & ~ITEM_LINKED, __ATOMIC_RELAXED);
}

/* Make the in-flight `it` visible to walkers: release, so a walker that sees ITEM_LINKED sees
 * the key too; then its segment is no longer pinned by it. */
static inline void store_mark_linked(struct store *st, struct item *it)
{
    __atomic_store_n(&it->iflags, it->iflags | ITEM_LINKED, __ATOMIC_RELEASE);
    seg_linked(st->segs, it);
}

/* ---- victims ------------------------------------------------------------------------------ */

struct store_alloc_ctx {
    struct store *st;
    const char *key; /* the key being allocated: its item may be held by the caller */
    size_t nkey;
    uint32_t now;
};

/* Move linked `it` to `dst` (shard lock held) and repoint its index slot. The regions overlap
 * only with dst + header <= it (seg.h): the header goes first, so that the swap reads both
 * intact, then the rest. False if the index does not hold it (nothing moved). */
static bool store_move(struct index_shard *sh, uint64_t hv, struct item *it, struct item *dst)
{
    size_t len = seg_item_size(it);
    if ((char *)dst + len <= (char *)it || (char *)dst >= (char *)it + len) {
        memcpy(dst, it, len);
        return index_swap(sh, hv, it, dst);
    }
    memcpy(dst, it, sizeof *it);
    if (!index_swap(sh, hv, it, dst)) return false;
    memmove(dst, it, len);
    return true;
}

/* Try-lock shard sh again after yielding the CPU, up to STORE_BUSY_RETRIES times: a victim's
 * item whose shard a get holds is most often held by a thread that was descheduled with the lock
 * (2 busy vCPUs), and skipping the item leaves the bytes evicted before it dead until its segment
 * is a victim again a whole turn of the queue later (docs/architecture.md, "Cleaning in a full
 * pool"). Yielding lets that thread run and let go. Never blocks: a lock still held after the
 * retries is skipped as before. */
static bool store_lock_retry(struct index_shard *sh)
{
    for (int i = 0; i < STORE_BUSY_RETRIES; i++) {
        sched_yield();
        if (pthread_mutex_trylock(&sh->lock) == 0) return true;
    }
    return false;
}

/* The log's visitor (see seg_visit_fn): pool lock held, never blocks on a shard lock.
 *  PEEK:  says whether the item looks expired or flushed; takes nothing.
 *  MOVE:  the item moves to dst if its shard can be try-locked; an expired one goes instead.
 *  EVICT: the policy's victim goes if its shard can be try-locked.
 *  SWEEP: only expired or flushed items go.
 * In the caller's own shard (already locked by this thread) any item but the one with the
 * caller's key may move or go; that one is pinned, since the caller may hold a pointer to it. */
static int store_visit(struct store *st, struct item *it, enum seg_visit why, struct item *dst,
                       uint32_t now, const char *akey, size_t ankey)
{
    enum store_miss dead = store_dead(st, it, now);
    if (why == SEG_VISIT_PEEK) return dead != STORE_HIT ? SEG_DEAD : SEG_KEEP;
    /* the sweeper keeps an expired item in its stale grace; eviction may take it */
    bool keep = dead == STORE_HIT || (dead == STORE_MISS_EXPIRED && store_in_grace(st, it, now));
    if (why == SEG_VISIT_SWEEP && keep) return SEG_KEEP;
    uint64_t hv = index_hash(item_key(it), it->nkey);
    struct index_shard *sh = index_shard_of(st->index, hv);
    bool mine = sh == tls_held;
    if (mine) {
        if (it->nkey == ankey && memcmp(item_key(it), akey, ankey) == 0) return SEG_PINNED;
    } else if (pthread_mutex_trylock(&sh->lock) != 0 &&
               (why == SEG_VISIT_SWEEP || !store_lock_retry(sh))) {
        /* a dropped item left behind: the pending drop must outlive this pass */
        if (why == SEG_VISIT_SWEEP && dead == STORE_MISS_DROPPED) return SEG_BUSY | SEG_MISSED;
        return SEG_BUSY;
    }
    int r;
    if (!(LOAD(&it->iflags) & ITEM_LINKED)) {
        r = SEG_BUSY; /* its owner unlinked it and is about to free it */
    } else {
        dead = store_dead(st, it, now);
        keep = dead == STORE_HIT || (dead == STORE_MISS_EXPIRED && store_in_grace(st, it, now));
        if (why == SEG_VISIT_SWEEP && keep) {
            r = SEG_KEEP; /* touched or re-stored since the first look */
        } else if (why == SEG_VISIT_MOVE && keep) {
            r = store_move(sh, hv, it, dst) ? SEG_MOVED : SEG_BUSY;
            if (r == SEG_MOVED && __builtin_expect(LOAD(&st->move_watch) != 0, 0) &&
                dead == STORE_HIT && !(LOAD(&dst->iflags) & ITEM_HOLD))
                st->on_move(st->on_move_ctx, dst); /* what a dump walk would have read */
        } else {
            r = SEG_GONE;
            if (dead != STORE_HIT) r |= SEG_GONE_EXPIRED;
            if (dead == STORE_MISS_DROPPED) __atomic_fetch_add(&st->dropped, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(dead != STORE_HIT ? &sh->ns[it->nsid].expired
                                                 : &sh->ns[it->nsid].evictions,
                               1, __ATOMIC_RELAXED);
            if (!(it->iflags & ITEM_FETCHED)) r |= SEG_GONE_UNFETCHED;
            store_unindex(st, sh, hv, it);
        }
    }
    if (!mine) pthread_mutex_unlock(&sh->lock);
    return r;
}

static int store_visit_alloc(void *ctx, struct item *it, enum seg_visit why, struct item *dst)
{
    struct store_alloc_ctx *a = ctx;
    if (!a->now) a->now = clock_now(); /* only once a victim is needed */
    return store_visit(a->st, it, why, dst, a->now, a->key, a->nkey);
}

static int store_visit_sweep(void *ctx, struct item *it, enum seg_visit why, struct item *dst)
{
    return store_visit(ctx, it, why, dst, clock_now(), NULL, 0);
}

/* ---- transient items ---------------------------------------------------------------------- */

/* Remember a just-linked item of shard `shard` if it expires soon (shard lock held). */
static void transient_note(struct store *st, uint64_t hv, struct item *it, uint32_t now)
{
    uint32_t exp = it->exptime;
    if (exp == 0 || exp <= now || exp - now > STORE_TRANSIENT_TTL) return;
    struct transient *t = &st->transient[hv & (INDEX_SHARDS - 1)];
    if (t->n == t->cap) {
        if (t->cap >= STORE_TRANSIENT_PER_SHARD) return;
        uint32_t cap = t->cap ? 2 * t->cap : 16;
        struct transient_entry *v = realloc(t->v, cap * sizeof *v);
        if (!v) return; /* the regular sweep will find it */
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = (struct transient_entry){hv, item_cas(it), exp};
}

/* The sweeper's tick: free the noted items of every shard that have expired. */
static void transient_reap(void *ctx)
{
    struct store *st = ctx;
    uint32_t now = clock_now();
    for (unsigned s = 0; s < INDEX_SHARDS; s++) {
        struct transient *t = &st->transient[s];
        if (__atomic_load_n(&t->n, __ATOMIC_RELAXED) == 0) continue;
        struct index_shard *sh = &st->index->shards[s];
        pthread_mutex_lock(&sh->lock);
        for (uint32_t i = 0; i < t->n;) {
            struct transient_entry *e = &t->v[i];
            if (e->exptime > now) {
                i++;
                continue;
            }
            /* Moved, replaced or gone since: the index knows; a replacement has another CAS. */
            struct item *it = index_find_cas(sh, e->hv, e->cas);
            if (it && store_dead(st, it, now) == STORE_MISS_EXPIRED &&
                !store_in_grace(st, it, now)) { /* kept for stale readers: the sweep's */
                if (!(it->iflags & ITEM_FETCHED)) sh->expired_unfetched++;
                __atomic_fetch_add(&sh->ns[it->nsid].expired, 1, __ATOMIC_RELAXED);
                store_unindex(st, sh, e->hv, it);
                seg_free(st->segs, it, false);
                t->reclaimed++;
            }
            *e = t->v[--t->n]; /* handled, or touched since (the regular sweep has it) */
        }
        pthread_mutex_unlock(&sh->lock);
    }
}

/* Segments withheld per tick at most: an index growing while a large store fills (a few MB a
 * second) is followed within a tick or two. */
#define STORE_WITHHOLD_PER_TICK 32

/* The sweeper's tick (about every second): transient items; -m's share of the index and the
 * ghosts withheld from the pools (seg_withhold); and,
 * after the index grew, malloc's free pages given back: outgrown tables leave free chunks in the
 * workers' arenas, resident until trimmed. */
static void store_tick(void *ctx)
{
    struct store *st = ctx;
    transient_reap(ctx);
    if (__atomic_load_n(&st->drop_pending, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&st->flush_lock);
        if (st->drop_pending && sweeper_clean_passes(st->sweeper) >= st->drop_until)
            __atomic_store_n(&st->drop_pending, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&st->flush_lock);
    }
    uint64_t tables = index_table_bytes(st->index);
    if (tables != st->trimmed_at) {
        malloc_trim(0);
        st->trimmed_at = tables;
    }
    seg_withhold(st->segs, tables, STORE_WITHHOLD_PER_TICK, store_visit_sweep, st);
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
    if (seg_create(&st->segs, st->memory, st->item_max, err, errlen)) goto fail;
    if (o->huge_pages && seg_advise_huge(st->segs) != 0)
        log_warn("transparent huge pages unavailable for item memory; using normal pages");
    /* -m bounds the index too (seg_withhold): the first tables take at most 1/128 of it (the
     * default 2^16 slots, 512 KiB, from -m 64 up); they grow with the items anyway. */
    unsigned hash_power = (unsigned)o->hash_power;
    while (hash_power > INDEX_SHARD_BITS + 3 &&
           ((uint64_t)sizeof(uint64_t) << hash_power) > st->memory / 128)
        hash_power--;
    if (index_create(&st->index, hash_power, err, errlen))
        goto fail;
    /* the first tables' share of -m is withheld from the start: a store's capacity is known
     * before the first item, not a tick later */
    seg_withhold(st->segs, index_table_bytes(st->index), UINT32_MAX, NULL, NULL);
    st->transient = calloc(INDEX_SHARDS, sizeof *st->transient);
    if (!st->transient) {
        snprintf(err, errlen, "out of memory creating the store");
        goto fail;
    }
    if (sweeper_create(&st->sweeper, st->segs, store_visit_sweep, store_tick, st,
                       (uint32_t)o->sweep_interval_ms, err, errlen))
        goto fail;
    *out = st;
    return 0;
fail:
    free(st->transient);
    index_destroy(&st->index);
    seg_destroy(&st->segs);
    pthread_mutex_destroy(&st->flush_lock);
    free(st);
    return -1;
}

void store_destroy(struct store **stp)
{
    struct store *st = *stp;
    if (!st) return;
    sweeper_destroy(&st->sweeper); /* first: it walks the log and the index */
    for (unsigned i = 0; i < INDEX_SHARDS; i++) free(st->transient[i].v);
    free(st->transient);
    index_destroy(&st->index);
    seg_destroy(&st->segs);
    pthread_mutex_destroy(&st->flush_lock);
    free(st->drop_time);
    free(st->drop_cas);
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

size_t store_item_size(const struct store *st, size_t nkey, size_t nbytes, uint32_t flags)
{
    if (nkey > UINT8_MAX || nbytes > UINT32_MAX) return 0;
    size_t total = ITEM_HEADER + nkey + nbytes + (flags ? sizeof flags : 0);
    /* memcached counts the value's \r\n against the limit; so do we, to refuse the same items */
    if (total + 2 > st->item_max) return 0;
    return seg_record_size(nkey, nbytes, flags != 0);
}

int store_item_class(const struct store *st, const struct item *it)
{
    return seg_bucket_for(st->segs, seg_item_size(it));
}

struct item *store_alloc(struct store *st, uint16_t nsid, const char *key, size_t nkey,
                         size_t nbytes, uint32_t flags)
{
    if (store_item_size(st, nkey, nbytes, flags) == 0) return NULL;
    struct store_alloc_ctx ctx = {.st = st, .key = key, .nkey = nkey};
    nsid %= STORE_NS_MAX;
    /* Only s3fifo's ghost check needs the hash here; spare the others the work. */
    uint64_t hv = seg_pool_policy(st->segs, nsid) == SEG_POLICY_S3FIFO ? index_hash(key, nkey) : 0;
    struct item *it = seg_alloc(st->segs, nsid, (uint8_t)nkey, (uint32_t)nbytes,
                                flags ? ITEM_FLAGS : 0, hv, store_visit_alloc, &ctx);
    if (!it) return NULL;
    /* nkey, nbytes, iflags, nsid and clock are set by the log under its lock (walkers step over
     * the record by them); the rest is ours to initialise. */
    item_set_cas(it, 0);
    it->exptime = 0;
    it->atime = 0;
    memcpy(it->data, key, nkey);
    if (flags) memcpy(it->data + nkey + nbytes, &flags, sizeof flags);
    return it;
}

void store_free(struct store *st, struct item *it) { seg_free(st->segs, it, true); }

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
            if (m == STORE_MISS_DROPPED) __atomic_fetch_add(&st->dropped, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&sh->ns[it->nsid].expired, 1, __ATOMIC_RELAXED);
            store_unindex(st, sh, hv, it);
            seg_free(st->segs, it, false);
            it = NULL;
        } else if ((it->iflags & ITEM_HOLD) && !(opts & STORE_FIND_HELD)) {
            it = NULL;
            m = STORE_MISS_HELD;
        }
    }
    if (why) *why = m;
    return it;
}

bool store_link(struct store *st, uint64_t hv, struct item *it, uint32_t now)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    uint64_t grown = sh->expansions;
    if (!index_insert(sh, hv, it)) return false;
    /* a bigger table: -m's share for the index grows now, so pools leave that room untouched */
    if (sh->expansions != grown) seg_set_reserve(st->segs, index_table_bytes(st->index));
    store_cls_count(st, it, 1);
    it->atime = now;
    if (item_cas(it) == 0) item_set_cas(it, store_next_cas(st));
    sh->total_items++;
    store_mark_linked(st, it);
    transient_note(st, hv, it, now);
    return true;
}

void store_replace(struct store *st, uint64_t hv, struct item *old, struct item *it, uint32_t now)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    it->atime = now;
    if (item_cas(it) == 0) item_set_cas(it, store_next_cas(st));
    if (!index_swap(sh, hv, old, it)) {
        /* `old` was not linked (a caller bug): still store the new item, free nothing twice.
         * Should the table be full as well, `it` stays unlinked and is leaked rather than freed,
         * since the caller goes on using it; the log says so. */
        if (!store_link(st, hv, it, now))
            log_warn("store_replace: item not linked and its index shard is full");
        return;
    }
    store_cls_count(st, old, -1);
    store_cls_count(st, it, 1);
    sh->total_items++;
    store_mark_linked(st, it);
    __atomic_store_n(&old->iflags, old->iflags & ~ITEM_LINKED, __ATOMIC_RELAXED);
    seg_free(st->segs, old, false);
    transient_note(st, hv, it, now);
}

void store_unlink(struct store *st, uint64_t hv, struct item *it)
{
    struct index_shard *sh = index_shard_of(st->index, hv);
    if (!(it->iflags & ITEM_LINKED)) return; /* not ours to free twice */
    store_unindex(st, sh, hv, it);
    seg_free(st->segs, it, false);
}

void store_bump(struct store *st, struct item *it, uint32_t now)
{
    /* Write only what changes: a hot item read by many threads must not bounce its line. */
    seg_bump(st->segs, it, now);
    /* Atomic because the log's walkers read iflags without the shard lock. */
    if (!(it->iflags & ITEM_FETCHED))
        __atomic_store_n(&it->iflags, it->iflags | ITEM_FETCHED, __ATOMIC_RELAXED);
    if (it->atime != now) __atomic_store_n(&it->atime, now, __ATOMIC_RELAXED);
}

uint64_t store_next_cas(struct store *st)
{
    /* 48 bits kept (item_cas): 0 is "none", so the counter wraps to 1 */
    uint64_t v = __atomic_fetch_add(&st->cas_next, 1, __ATOMIC_RELAXED) & STORE_CAS_MAX;
    return v ? v : store_next_cas(st);
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

void store_flush_ns(struct store *st, uint16_t nsid, uint32_t now)
{
    if (nsid >= STORE_NS_MAX) return;
    pthread_mutex_lock(&st->flush_lock);
    uint64_t cas = store_next_cas(st); /* above every cas stored so far */
    /* time before cas: a reader that sees the new cas (acquire) sees its time */
    __atomic_store_n(&st->ns_flush_time[nsid], now, __ATOMIC_RELAXED);
    __atomic_store_n(&st->ns_flush_cas[nsid], cas, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&st->flush_lock);
}

int store_drop_slots(struct store *st, const uint16_t *slots, size_t n, uint32_t now)
{
    if (n == 0) return 0;
    pthread_mutex_lock(&st->flush_lock);
    if (st->drop_cas == NULL) {
        st->drop_time = calloc(SLOT_COUNT, sizeof *st->drop_time);
        st->drop_cas = calloc(SLOT_COUNT, sizeof *st->drop_cas);
        if (st->drop_time == NULL || st->drop_cas == NULL) {
            free(st->drop_time);
            free(st->drop_cas);
            st->drop_time = NULL;
            st->drop_cas = NULL;
            pthread_mutex_unlock(&st->flush_lock);
            return -1;
        }
    }
    uint64_t cas = store_next_cas(st); /* above every cas handed out so far */
    for (size_t i = 0; i < n; i++) {
        uint16_t s = slots[i] % SLOT_COUNT;
        /* time before cas: a reader that sees the new cas (acquire) sees its time */
        __atomic_store_n(&st->drop_time[s], now, __ATOMIC_RELAXED);
        __atomic_store_n(&st->drop_cas[s], cas, __ATOMIC_RELEASE);
    }
    /* the pass under way may have walked some segments already: the next whole one counts, and
     * only a pass that skipped no dropped item (its shard was busy) counts at all */
    st->drop_until = sweeper_clean_passes(st->sweeper) + 2;
    __atomic_store_n(&st->drop_pending, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&st->flush_lock);
    return 0;
}

uint64_t store_dropped_items(const struct store *st) { return LOAD(&st->dropped); }
bool store_drop_pending(const struct store *st) { return LOAD(&st->drop_pending) != 0; }

/* ---- stats -------------------------------------------------------------------------------- */

int store_ns_configure(struct store *st, uint16_t nsid, uint64_t quota, enum store_policy policy)
{
    return seg_pool_configure(st->segs, nsid % STORE_NS_MAX, quota, (enum seg_policy)policy);
}

uint32_t store_page_size(const struct store *st) { return seg_size(st->segs); }
uint32_t store_pages_used(const struct store *st) { return seg_used(st->segs); }
uint64_t store_memory(const struct store *st) { return st->memory; }

void store_ns_stats(struct store *st, uint16_t nsid, struct store_ns_stats *out)
{
    const struct index_ns *ns = &st->index->ns[nsid % STORE_NS_MAX];
    out->memory = (uint64_t)seg_pool_segs(st->segs, nsid % STORE_NS_MAX) * seg_size(st->segs);
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
        out->transient_reclaimed += st->transient[i].reclaimed;
        buckets += sh->nslots;
        pthread_mutex_unlock(&sh->lock);
    }
    struct seg_counters c = {0};
    seg_sum_counters(st->segs, &c);
    out->evictions = c.evictions;
    out->evicted_unfetched = c.evicted_unfetched;
    out->expired_unfetched += c.expired_unfetched;
    out->reclaimed = c.reclaimed;
    out->sweeper_reclaimed = c.sweeper_reclaimed;
    out->slab_pages_moved = c.segs_cleaned;
    out->slab_pages_trimmed = c.segs_trimmed;
    out->alloc_failures = c.alloc_failures;
    out->hash_bytes = buckets * sizeof(uint64_t); /* one slot each (index.h) */
    out->ghost_bytes = seg_ghost_bytes(st->segs);
    out->reserved_bytes = (uint64_t)seg_held(st->segs) * seg_size(st->segs);
    out->hash_power_level = 63 - (uint64_t)__builtin_clzll(buckets);
    out->limit_maxbytes = st->memory;
    out->page_size = seg_size(st->segs);
    out->pages_total = seg_count(st->segs) - seg_reserved(st->segs); /* what items may use */
    out->pages_used = seg_used(st->segs);
}

int store_class_count(const struct store *st) { return seg_bucket_count(st->segs); }
uint32_t store_class_chunk_min(const struct store *st) { return seg_bucket_size(st->segs, 1); }

/* A bucket's figures in memcached's shape: its items are its used chunks; its pages are the
 * segments' worth of its items rounded up, and at least one once it has held an item (so it
 * keeps showing in `stats slabs`, as a memcached class keeps its pages); the rest of those
 * pages' chunks count as free. */
bool store_class_stats(struct store *st, int clsid, struct store_class_stats *out)
{
    struct seg_bucket_info bi;
    if (!seg_bucket_info(st->segs, clsid, &bi)) return false;
    memset(out, 0, sizeof *out);
    uint32_t seg = seg_size(st->segs);
    out->chunk_size = bi.size;
    out->chunks_per_page = bi.size < seg ? seg / bi.size : 1;
    out->curr_items = LOAD(&st->cls[clsid].items);
    out->mem_requested = LOAD(&st->cls[clsid].bytes);
    out->used_chunks = out->curr_items;
    out->total_pages = (uint32_t)((out->curr_items + out->chunks_per_page - 1) /
                                  out->chunks_per_page);
    if (out->total_pages == 0 && LOAD(&st->cls[clsid].seen)) out->total_pages = 1;
    out->total_chunks = (uint64_t)out->total_pages * out->chunks_per_page;
    out->free_chunks = out->total_chunks - out->used_chunks;
    out->evictions = bi.c.evictions;
    out->evicted_unfetched = bi.c.evicted_unfetched;
    out->expired_unfetched = bi.c.expired_unfetched;
    out->reclaimed = bi.c.reclaimed;
    uint32_t now = clock_now();
    out->oldest_age = bi.oldest_atime && now > bi.oldest_atime ? now - bi.oldest_atime : 0;
    out->sweeper_reclaimed = bi.c.sweeper_reclaimed;
    out->alloc_failures = bi.c.alloc_failures;
    return true;
}

struct store_dump_ctx {
    struct store *st;
    uint32_t now;
    store_dump_fn fn;
    void *ctx;
};

static void store_dump_one(void *arg, struct item *it, int clsid)
{
    struct store_dump_ctx *d = arg;
    if (LOAD(&it->iflags) & ITEM_HOLD) return; /* a hold-off tombstone reads as absent */
    if (store_dead(d->st, it, d->now) != STORE_HIT) return;
    d->fn(d->ctx, it, clsid);
}

void store_set_move_hook(struct store *st, store_move_fn fn, void *ctx)
{
    st->on_move_ctx = ctx;
    st->on_move = fn;
}

void store_watch_moves(struct store *st, bool on)
{
    /* seq_cst: a move that reads 0 here finished under its pool's lock before the watcher's
     * walk first took that lock, so the walk reads the item where it went */
    if (on && st->on_move) __atomic_fetch_add(&st->move_watch, 1, __ATOMIC_SEQ_CST);
    else if (!on && st->on_move) __atomic_fetch_sub(&st->move_watch, 1, __ATOMIC_SEQ_CST);
}

bool store_dump_step(struct store *st, struct store_cursor *cur, int clsid, uint32_t budget,
                     store_dump_fn fn, void *ctx)
{
    struct store_dump_ctx d = {.st = st, .now = clock_now(), .fn = fn, .ctx = ctx};
    uint32_t n = seg_count(st->segs);
    while (budget > 0 && cur->page < n) {
        uint32_t batch = budget < STORE_DUMP_BATCH ? budget : STORE_DUMP_BATCH;
        struct seg_pos pos = {.seg = cur->page, .off = cur->idx, .gen = cur->gen,
                              .restarts = cur->restarts};
        bool more = seg_peek(st->segs, &pos, batch, clsid, store_dump_one, &d);
        budget = budget > batch ? budget - batch : 0;
        if (pos.busy && cur->waits < SEG_WALK_WAITS) {
            cur->waits++;
            break; /* the next step comes back to it */
        }
        if (!more) {
            cur->page++;
            cur->idx = 0;
            cur->restarts = 0;
            cur->waits = 0;
        } else {
            cur->idx = pos.off;
            cur->gen = pos.gen;
            cur->restarts = pos.restarts;
        }
    }
    return cur->page < n;
}
