/* test_store.c — unit tests of the storage engine (src/node/store.h): item lifecycle, CAS,
 * expiry, stale grace, flush, eviction, page moves between classes, hash growth, limits (threads
 * and the sweeper: test_store_threads.c). */
#include "store_harness.h"

/* ---- tests -------------------------------------------------------------------------------- */

static void test_class_table(void **state)
{
    (void)state;
    struct store *st = mk_quiet(64);
    int n = store_class_count(st);
    assert_true(n > 27 && n < 256);
    uint32_t prev = 0;
    for (int i = 1; i <= n; i++) {
        struct store_class_stats cs;
        assert_true(store_class_stats(st, i, &cs));
        assert_int_equal(cs.chunk_size % 4, 0);
        assert_true(cs.chunk_size > prev);
        if (i == 1) assert_int_equal(cs.chunk_size, 24); /* the smallest record */
        else if (cs.chunk_size <= 256) assert_int_equal(cs.chunk_size, prev + 8);
        else if (i < n) assert_true(cs.chunk_size <= prev * 1.08 + 4);
        /* classes are reporting buckets; a "page" is a log segment (256 KiB at -m 64), and a
         * bucket of records larger than one counts one a page */
        uint32_t per = (256u << 10) / cs.chunk_size;
        assert_int_equal(cs.chunks_per_page, per ? per : 1);
        prev = cs.chunk_size;
    }
    assert_int_equal(prev, 1 << 20); /* the last class holds item_max */
    struct store_class_stats cs;
    assert_false(store_class_stats(st, 0, &cs));
    assert_false(store_class_stats(st, n + 1, &cs));
    /* 22-byte header + 30-byte key + 100-byte value = 152, a 152-byte record (4-aligned);
     * flags take 4 */
    assert_int_equal(store_item_size(st, 30, 100, 0), 152);
    assert_int_equal(store_item_size(st, 30, 100, 7), 156);
    assert_int_equal(store_item_size(st, 1, 0, 0), 24);
    struct store_stats s = stats(st);
    assert_int_equal(s.page_size, 256 << 10); /* -m / 256, from 128 KiB to 1 MiB */
    /* -m bounds the index too: its first tables (2^16 slots, 512 KiB) take two segments */
    assert_int_equal(s.pages_total, 254);
    assert_int_equal(s.pages_used, 0);
    assert_int_equal(s.limit_maxbytes, 64ull << 20);
    assert_int_equal(s.hash_power_level, 16);
    assert_int_equal(s.hash_bytes, 8ull << 16);
    store_destroy(&st);
    assert_null(st);
}

static void test_basic_lifecycle(void **state)
{
    (void)state;
    struct store *st = mk_quiet(64);
    uint32_t now = clock_now();
    struct item *it = store_alloc(st, 0, "foo", 3, 5, 42);
    assert_non_null(it);
    assert_int_equal(it->nkey, 3);
    assert_int_equal(it->nbytes, 5);
    assert_memory_equal(item_key(it), "foo", 3);
    assert_int_equal(item_cas(it), 0);
    assert_int_equal(it->exptime, 0);
    assert_int_equal(item_flags(it), 42);
    assert_int_equal(it->iflags, ITEM_FLAGS);
    assert_int_equal(it->clock, 0);
    assert_true(store_item_class(st, it) >= 1);
    memcpy(item_value(it), "hello", 5);

    uint64_t hv = store_hash("foo", 3);
    enum store_miss why;
    store_lock(st, hv);
    assert_null(store_find(st, hv, "foo", 3, now, &why));
    assert_int_equal(why, STORE_MISS_ABSENT);
    store_link(st, hv, it, now);
    assert_true(it->iflags & ITEM_LINKED);
    assert_int_equal(it->atime, now);
    uint64_t cas1 = item_cas(it);
    assert_true(cas1 > 0);
    struct item *f = store_find(st, hv, "foo", 3, now, &why);
    assert_ptr_equal(f, it);
    assert_int_equal(why, STORE_HIT);
    assert_memory_equal(item_value(f), "hello", 5);
    assert_int_equal(item_flags(f), 42);
    assert_memory_equal(item_value(f), "hello", 5); /* the flags after it left it alone */
    assert_null(store_find(st, hv, "fo", 2, now, NULL));
    store_unlock(st, hv);

    struct store_stats s = stats(st);
    assert_int_equal(s.curr_items, 1);
    assert_int_equal(s.total_items, 1);
    assert_int_equal(s.bytes, ITEM_HEADER + 3 + 5 + 4); /* the flags, 42, take 4 */

    /* replace: new value, higher cas, old memory returned */
    struct item *it2 = store_alloc(st, 0, "foo", 3, 11, 0);
    assert_non_null(it2);
    memcpy(item_value(it2), "hello world", 11);
    store_lock(st, hv);
    struct item *old = store_find(st, hv, "foo", 3, now + 1, NULL);
    assert_ptr_equal(old, it);
    store_replace(st, hv, old, it2, now + 1);
    f = store_find(st, hv, "foo", 3, now + 1, NULL);
    assert_ptr_equal(f, it2);
    assert_true(item_cas(f) > cas1);
    assert_int_equal(f->atime, now + 1);
    assert_memory_equal(item_value(f), "hello world", 11);
    store_unlock(st, hv);
    s = stats(st);
    assert_int_equal(s.curr_items, 1);
    assert_int_equal(s.total_items, 2);
    assert_int_equal(s.bytes, ITEM_HEADER + 3 + 11);

    /* bump */
    store_lock(st, hv);
    f = store_find(st, hv, "foo", 3, now + 2, NULL);
    assert_false(f->iflags & ITEM_FETCHED);
    store_bump(st, f, now + 2);
    assert_true(f->iflags & ITEM_FETCHED);
    assert_int_equal(f->clock, 1);
    assert_int_equal(f->atime, now + 2);
    store_bump(st, f, now + 2); /* nothing changes, nothing breaks */
    assert_int_equal(f->clock, 1);

    /* unlink */
    store_unlink(st, hv, f);
    assert_null(store_find(st, hv, "foo", 3, now + 2, &why));
    assert_int_equal(why, STORE_MISS_ABSENT);
    store_unlock(st, hv);
    s = stats(st);
    assert_int_equal(s.curr_items, 0);
    assert_int_equal(s.bytes, 0);

    /* free of an unlinked item: the next record follows it in the log (no reuse in place) */
    struct item *a = store_alloc(st, 0, "bar", 3, 5, 0);
    assert_non_null(a);
    store_free(st, a);
    struct item *b = store_alloc(st, 0, "baz", 3, 5, 0);
    assert_ptr_equal((char *)a + store_item_size(st, 3, 5, 0), b);
    store_free(st, b);

    /* per-class accounting */
    assert_true(put(st, "k1", 100, 'x', 0, now));
    int cls = 0;
    for (int i = 1; i <= store_class_count(st); i++) {
        struct store_class_stats cs;
        store_class_stats(st, i, &cs);
        if (cs.curr_items) {
            assert_int_equal(cs.curr_items, 1);
            assert_int_equal(cs.used_chunks, 1);
            assert_int_equal(cs.total_pages, 1);
            /* the bucket of its record size: the smallest class that holds it */
            assert_true(cs.chunk_size >= store_item_size(st, 2, 100, 0));
            assert_true(cs.chunk_size < store_item_size(st, 2, 100, 0) + 8);
            cls = i;
        }
    }
    assert_true(cls > 0);
    store_destroy(&st);
}

static void test_cas_increasing(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    uint64_t last = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t c = store_next_cas(st);
        assert_true(c > last);
        last = c;
    }
    char key[32];
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "cas%d", i % 10);
        assert_true(put(st, key, 10, 'a', 0, now));
        uint64_t cas;
        assert_true(get(st, key, now, NULL, NULL, NULL, &cas));
        assert_true(cas > last);
        last = cas;
    }
    /* an explicit cas is kept */
    struct item *it = store_alloc(st, 0, "explicit", 8, 1, 0);
    item_set_cas(it, 7);
    uint64_t hv = store_hash("explicit", 8);
    store_lock(st, hv);
    store_link(st, hv, it, now);
    assert_int_equal(item_cas(it), 7);
    store_unlock(st, hv);
    store_destroy(&st);
}

struct dump_seen {
    int n, big, bad;
    int only_cls;
};

static void dump_count(void *ctx, const struct item *it, int clsid)
{
    struct dump_seen *d = ctx;
    d->n++;
    if (it->nbytes == 1000) d->big++;
    if (it->nkey < 2 || (d->only_cls && clsid != d->only_cls)) d->bad++;
}

/* Walk the whole store in steps of `budget` chunks; returns what was seen. */
static struct dump_seen dump_all(struct store *st, int clsid, uint32_t budget)
{
    struct dump_seen d = {.only_cls = clsid};
    struct store_cursor cur = {0};
    int steps = 0;
    while (store_dump_step(st, &cur, clsid, budget, dump_count, &d)) steps++;
    assert_true(steps < 1000000);
    return d;
}

static void test_dump_walk_visits_each_live_item_once(void **state)
{
    (void)state;
    struct store *st = mk_quiet(16);
    uint32_t now = clock_now();
    char key[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_true(put(st, key, i % 3 == 0 ? 1000 : 10, 'v', 0, now));
    }
    assert_true(put(st, "expired", 10, 'e', 1, now)); /* 1: already expired */
    assert_true(del(st, "k1", now));
    for (uint32_t budget = 1; budget <= 4096; budget *= 16) {
        struct dump_seen d = dump_all(st, 0, budget);
        assert_int_equal(d.n, 2999);
        assert_int_equal(d.big, 1000);
        assert_int_equal(d.bad, 0);
    }
    /* one class: only its items */
    size_t nkey = strlen("k0");
    uint64_t hv = store_hash("k0", nkey);
    store_lock(st, hv);
    int big_cls = store_item_class(st, store_find(st, hv, "k0", nkey, now, NULL));
    store_unlock(st, hv);
    struct dump_seen d = dump_all(st, big_cls, 256);
    assert_int_equal(d.n, 1000);
    assert_int_equal(d.big, 1000);
    assert_int_equal(d.bad, 0);
    store_destroy(&st);
}

static void test_class_figures_follow_links(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    assert_true(put(st, "a", 100, 'a', 0, now));
    size_t nkey = 1;
    uint64_t hv = store_hash("a", nkey);
    store_lock(st, hv);
    int cls = store_item_class(st, store_find(st, hv, "a", nkey, now, NULL));
    store_unlock(st, hv);
    struct store_class_stats cs;
    assert_true(store_class_stats(st, cls, &cs));
    assert_int_equal(cs.curr_items, 1);
    assert_int_equal(cs.mem_requested, ITEM_HEADER + 1 + 100);
    assert_true(put(st, "b", 100, 'b', 0, now));
    assert_true(put(st, "a", 100, 'A', 0, now)); /* a replace counts once */
    assert_true(store_class_stats(st, cls, &cs));
    assert_int_equal(cs.curr_items, 2);
    assert_int_equal(cs.mem_requested, 2 * (ITEM_HEADER + 1 + 100));
    assert_true(del(st, "a", now));
    assert_true(del(st, "b", now));
    assert_true(store_class_stats(st, cls, &cs));
    assert_int_equal(cs.curr_items, 0);
    assert_int_equal(cs.mem_requested, 0);
    store_destroy(&st);
}

static void test_expiry_lazy(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    enum store_miss why;
    assert_true(put(st, "short", 10, 's', now + 10, now));
    assert_true(put(st, "forever", 10, 'f', 0, now));
    assert_true(get(st, "short", now + 5, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_HIT);
    assert_false(get(st, "short", now + 10, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_MISS_EXPIRED);
    assert_false(get(st, "short", now + 11, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_MISS_ABSENT);
    assert_true(get(st, "forever", now + 1000000, &why, NULL, NULL, NULL));
    struct store_stats s = stats(st);
    assert_int_equal(s.curr_items, 1);
    /* "short" was read once before expiring, so not counted as unfetched */
    assert_int_equal(s.expired_unfetched, 0);
    assert_true(put(st, "unread", 10, 'u', now + 1, now));
    assert_false(get(st, "unread", now + 2, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_MISS_EXPIRED);
    s = stats(st);
    assert_int_equal(s.expired_unfetched, 1);
    assert_int_equal(s.bytes, ITEM_HEADER + 7 + 10);
    store_destroy(&st);
}

static void test_grace_keeps_expired_item_for_stale_readers(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    enum store_miss why;
    store_set_grace(st, 3, 5);
    put_ns(st, "g", 10, now + 10, now, 3, 0);
    assert_true(get_grace(st, "g", now + 9, &why));
    assert_int_equal(why, STORE_HIT);
    /* expired, within 5 s of grace: returned only to a GRACE lookup, marked EXPIRED */
    assert_true(get_grace(st, "g", now + 10, &why));
    assert_int_equal(why, STORE_MISS_EXPIRED);
    assert_true(get_grace(st, "g", now + 14, &why));
    assert_int_equal(why, STORE_MISS_EXPIRED);
    assert_int_equal(stats(st).curr_items, 1);
    /* grace over: reclaimed like any expired item */
    assert_false(get_grace(st, "g", now + 15, &why));
    assert_int_equal(why, STORE_MISS_EXPIRED);
    assert_int_equal(stats(st).curr_items, 0);
    store_destroy(&st);
}

static void test_grace_plain_lookup_reclaims(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    enum store_miss why;
    store_set_grace(st, 3, 5);
    put_ns(st, "g", 10, now + 10, now, 3, 0);
    assert_false(get(st, "g", now + 11, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_MISS_EXPIRED);
    assert_false(get_grace(st, "g", now + 11, &why));
    assert_int_equal(why, STORE_MISS_ABSENT);
    store_destroy(&st);
}

static void test_grace_only_for_its_namespace_and_real_values(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    enum store_miss why;
    store_set_grace(st, 3, 5);
    put_ns(st, "other-ns", 10, now + 10, now, 4, 0);
    put_ns(st, "empty", 0, now + 10, now, 3, 0);
    put_ns(st, "stale", 10, now + 10, now, 3, ITEM_STALE);
    put_ns(st, "hold", 0, now + 10, now, 3, ITEM_HOLD);
    const char *none[] = {"other-ns", "empty", "stale", "hold"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
        assert_false(get_grace(st, none[i], now + 11, &why));
        assert_int_equal(why, STORE_MISS_EXPIRED);
    }
    /* turning grace off ends it at once */
    put_ns(st, "g", 10, now + 10, now, 3, 0);
    assert_true(get_grace(st, "g", now + 11, &why));
    store_set_grace(st, 3, 0);
    assert_false(get_grace(st, "g", now + 11, &why));
    assert_int_equal(stats(st).curr_items, 0);
    store_destroy(&st);
}

static void test_flush_immediate(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    enum store_miss why;
    char key[32];
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "f%d", i);
        assert_true(put(st, key, 20, 'x', 0, now));
    }
    store_flush(st, now, now);
    assert_false(get(st, "f0", now, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_MISS_FLUSHED);
    /* stored after the flush, in the same second: alive */
    assert_true(put(st, "after", 20, 'y', 0, now));
    assert_true(get(st, "after", now, &why, NULL, NULL, NULL));
    /* and in a later second */
    assert_true(put(st, "later", 20, 'y', 0, now + 1));
    assert_true(get(st, "later", now + 1, NULL, NULL, NULL, NULL));
    for (int i = 1; i < 100; i++) {
        snprintf(key, sizeof key, "f%d", i);
        assert_false(get(st, key, now + 1, &why, NULL, NULL, NULL));
        assert_int_equal(why, STORE_MISS_FLUSHED);
    }
    assert_int_equal(stats(st).curr_items, 2);
    store_destroy(&st);
}

static void test_flush_delayed(void **state)
{
    (void)state;
    struct store *st = mk_quiet(8);
    uint32_t now = clock_now();
    enum store_miss why;
    assert_true(put(st, "old", 20, 'o', 0, now));
    store_flush(st, now + 10, now);
    assert_true(get(st, "old", now + 5, &why, NULL, NULL, NULL)); /* not yet */
    assert_true(put(st, "mid", 20, 'm', 0, now + 6));
    assert_false(get(st, "old", now + 10, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_MISS_FLUSHED);
    assert_false(get(st, "mid", now + 10, &why, NULL, NULL, NULL));
    assert_int_equal(why, STORE_MISS_FLUSHED);
    assert_true(put(st, "new", 20, 'n', 0, now + 11));
    assert_true(get(st, "new", now + 12, &why, NULL, NULL, NULL));
    /* a later flush must not bring back what the first one killed */
    assert_true(put(st, "x", 20, 'x', 0, now + 9));
    store_flush(st, now + 100, now + 20);
    assert_false(get(st, "x", now + 21, &why, NULL, NULL, NULL));
    assert_true(get(st, "new", now + 21, &why, NULL, NULL, NULL));
    /* an immediate flush cancels a pending delayed one and kills everything */
    store_flush(st, now + 21, now + 21);
    assert_false(get(st, "new", now + 22, &why, NULL, NULL, NULL));
    assert_true(put(st, "y", 20, 'y', 0, now + 22));
    assert_true(get(st, "y", now + 200, &why, NULL, NULL, NULL));
    store_destroy(&st);
}

static void test_eviction_full(void **state)
{
    (void)state;
    struct store *st = mk_quiet(2);
    uint32_t now = clock_now();
    char key[32];
    const int N = 60000; /* ~9 MB of items into 2 MB */
    const char *hot = "hot-key";
    assert_true(put(st, hot, 100, 'h', 0, now));
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "k%07d", i);
        /* every other allocation with the shard lock held, as append/incr do */
        assert_true(put_ex(st, key, 100, (char)('a' + i % 26), 0, now, i & 1));
        if (i % 200 == 0) assert_true(get(st, hot, now, NULL, NULL, NULL, NULL));
        if (i % 5000 == 0) {
            struct store_stats s = stats(st);
            assert_true(s.bytes <= 2u << 20);
        }
    }
    struct store_stats s = stats(st);
    assert_true(s.evictions > 0);
    assert_int_equal(s.alloc_failures, 0);
    assert_true(s.bytes <= 2u << 20);
    assert_true(s.curr_items <= (2u << 20) / store_item_size(st, 8, 100, 0));
    assert_int_equal(s.curr_items + s.evictions, N + 1);
    assert_int_equal(s.evicted_unfetched, s.evictions); /* none of those was read */
    assert_int_equal(s.pages_used, s.pages_total);
    /* the latest items and the hot one survive */
    char first = 0;
    uint32_t nb = 0;
    snprintf(key, sizeof key, "k%07d", N - 1);
    assert_true(get(st, key, now, NULL, &nb, &first, NULL));
    assert_int_equal(nb, 100);
    assert_int_equal(first, 'a' + (N - 1) % 26);
    assert_true(get(st, hot, now, NULL, NULL, &first, NULL));
    assert_int_equal(first, 'h');
    /* the oldest are gone */
    assert_false(get(st, "k0000000", now, NULL, NULL, NULL, NULL));
    store_destroy(&st);
}

static void test_reclaim_expired(void **state)
{
    (void)state;
    struct store *st = mk_quiet(2);
    uint32_t now = clock_now();
    char key[32];
    /* exptime 1 is "already expired" on the store clock: every reuse is a reclaim */
    for (int i = 0; i < 40000; i++) {
        snprintf(key, sizeof key, "e%07d", i);
        assert_true(put(st, key, 100, 'e', 1, now));
    }
    struct store_stats s = stats(st);
    assert_int_equal(s.evictions, 0);
    assert_true(s.reclaimed > 0);
    assert_int_equal(s.expired_unfetched, s.reclaimed);
    assert_int_equal(s.curr_items + s.reclaimed, 40000);
    store_destroy(&st);
}

static void test_steal_page(void **state)
{
    (void)state;
    struct store *st = mk_quiet(2);
    uint32_t now = clock_now();
    char key[32];
    for (int i = 0; i < 30000; i++) {
        snprintf(key, sizeof key, "s%07d", i);
        assert_true(put(st, key, 100, 's', 0, now));
    }
    struct store_stats s = stats(st);
    assert_int_equal(s.pages_used, s.pages_total);
    uint64_t small_before = s.curr_items;
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "big%d", i);
        assert_true(put(st, key, 50 * 1024, (char)('A' + i), 0, now));
        uint32_t nb = 0;
        char first = 0;
        assert_true(get(st, key, now, NULL, &nb, &first, NULL));
        assert_int_equal(nb, 50 * 1024);
        assert_int_equal(first, 'A' + i);
    }
    s = stats(st);
    assert_true(s.slab_pages_moved >= 1);
    assert_int_equal(s.alloc_failures, 0);
    assert_true(s.curr_items < small_before + 20);
    assert_true(s.bytes <= 2u << 20);
    /* and back: the small class still works (it kept a page, or takes one back) */
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "t%07d", i);
        assert_true(put(st, key, 100, 't', 0, now));
    }
    /* a third class with no page at all */
    assert_true(put(st, "mid", 5000, 'm', 0, now));
    assert_true(get(st, "mid", now, NULL, NULL, NULL, NULL));
    assert_int_equal(stats(st).alloc_failures, 0);
    store_destroy(&st);
}

/* A page move while the caller holds its key's shard lock and a pointer to the old item (the
 * append path): the old item must survive until replaced. */
static void test_steal_with_lock_held(void **state)
{
    (void)state;
    struct store *st = mk_quiet(2);
    uint32_t now = clock_now();
    char key[32];
    for (int i = 0; i < 30000; i++) {
        snprintf(key, sizeof key, "s%07d", i);
        assert_true(put(st, key, 100, (char)('a' + i % 26), 0, now));
    }
    for (int j = 0; j < 10; j++) {
        int i = 29999 - j * 997;
        snprintf(key, sizeof key, "s%07d", i);
        size_t nkey = strlen(key);
        uint64_t hv = store_hash(key, nkey);
        store_lock(st, hv);
        struct item *old = store_find(st, hv, key, nkey, now, NULL);
        if (!old) { /* evicted by an earlier round's page moves */
            store_unlock(st, hv);
            continue;
        }
        size_t big = 50 * 1024 + (size_t)j * 8192; /* a new class each round */
        struct item *nit = store_alloc(st, 0, key, nkey, big, 0);
        assert_non_null(nit);
        /* old is intact */
        assert_true(old->iflags & ITEM_LINKED);
        assert_int_equal(old->nkey, nkey);
        assert_memory_equal(item_key(old), key, nkey);
        assert_int_equal(old->nbytes, 100);
        for (int b = 0; b < 100; b++) assert_int_equal(item_value(old)[b], 'a' + i % 26);
        memcpy(item_value(nit), item_value(old), 100);
        memset(item_value(nit) + 100, 'z', big - 100);
        store_replace(st, hv, old, nit, now);
        store_unlock(st, hv);
        uint32_t nb = 0;
        char first = 0;
        assert_true(get(st, key, now, NULL, &nb, &first, NULL));
        assert_int_equal(nb, big);
        assert_int_equal(first, 'a' + i % 26);
    }
    assert_true(stats(st).slab_pages_moved >= 1);
    store_destroy(&st);
}

static void test_hash_growth(void **state)
{
    (void)state;
    struct store *st = mk(64, 1 << 20, 8, 60000);
    uint32_t now = clock_now();
    char key[32];
    const int N = 200000;
    struct store_stats s = stats(st);
    assert_int_equal(s.hash_power_level, 10); /* 2^8 asked, but one 8-slot bucket per shard (128) */
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key:%d", i);
        assert_true(put(st, key, 16, (char)i, 0, now));
    }
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key:%d", i);
        char first = 0;
        if (!get(st, key, now, NULL, NULL, &first, NULL)) fail_msg("lost %s", key);
        assert_int_equal(first, (char)i);
    }
    s = stats(st);
    assert_int_equal(s.curr_items, N);
    assert_int_equal(s.evictions, 0);
    assert_true(s.hash_expansions > 0);
    assert_true(s.hash_power_level >= 17);
    /* load at most INDEX_LOAD_NUM/INDEX_LOAD_DEN (9/10) of the slots (8 bytes each) in every
     * shard */
    assert_true(s.hash_bytes / 8 * INDEX_LOAD_NUM / INDEX_LOAD_DEN >= (uint64_t)N);
    for (int i = 0; i < N; i += 2) {
        snprintf(key, sizeof key, "key:%d", i);
        assert_true(del(st, key, now));
    }
    assert_int_equal(stats(st).curr_items, N / 2);
    store_destroy(&st);
}

static void test_item_max_and_limits(void **state)
{
    (void)state;
    struct store *st = mk(2, 1024, 16, 60000);
    /* ITEM_HEADER (22) + 10 + 990 + 2 (\r\n) = 1024 fits; one byte more does not */
    assert_int_equal(store_item_size(st, 10, 990, 0), 1024);
    assert_int_equal(store_item_size(st, 10, 991, 0), 0);
    assert_int_equal(store_item_size(st, 256, 1, 0), 0);
    assert_null(store_alloc(st, 0, "0123456789", 10, 991, 0));
    struct item *it = store_alloc(st, 0, "0123456789", 10, 990, 0);
    assert_non_null(it);
    store_free(st, it);
    assert_int_equal(stats(st).alloc_failures, 0);
    store_destroy(&st);

    /* large item_max: the item takes a run of contiguous segments */
    st = mk(16, 3 << 20, 16, 60000);
    struct store_stats s = stats(st);
    assert_int_equal(s.page_size, 128 << 10);
    assert_int_equal(s.pages_total, 127); /* one withheld for the index's first tables */
    uint32_t now = clock_now();
    assert_true(put(st, "huge", (3 << 20) - 100, 'H', 0, now));
    uint32_t nb = 0;
    assert_true(get(st, "huge", now, NULL, &nb, NULL, NULL));
    assert_int_equal(nb, (3 << 20) - 100);
    store_destroy(&st);

    /* bad configurations */
    struct store_options o;
    char err[256];
    store_options_default(&o);
    o.memory_mb = 1; /* item_max 1 MB > half of 1 MB */
    assert_int_equal(store_create(&st, &o, err, sizeof err), -1);
    assert_null(st);
    assert_non_null(strstr(err, "item_max"));
    store_options_default(&o);
    o.memory_mb = 3;
    o.item_max = 1536 * 1024; /* half of -m: a run of 24 segments of 64 KiB holds one */
    assert_int_equal(store_create(&st, &o, err, sizeof err), 0);
    store_destroy(&st);
    store_options_default(&o);
    o.hash_power = 40;
    assert_int_equal(store_create(&st, &o, err, sizeof err), -1);
    assert_non_null(strstr(err, "hash_power"));
}

int main(void)
{
    clock_setup();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_table),
        cmocka_unit_test(test_basic_lifecycle),
        cmocka_unit_test(test_cas_increasing),
        cmocka_unit_test(test_expiry_lazy),
        cmocka_unit_test(test_grace_keeps_expired_item_for_stale_readers),
        cmocka_unit_test(test_grace_plain_lookup_reclaims),
        cmocka_unit_test(test_grace_only_for_its_namespace_and_real_values),
        cmocka_unit_test(test_flush_immediate),
        cmocka_unit_test(test_flush_delayed),
        cmocka_unit_test(test_eviction_full),
        cmocka_unit_test(test_reclaim_expired),
        cmocka_unit_test(test_steal_page),
        cmocka_unit_test(test_steal_with_lock_held),
        cmocka_unit_test(test_hash_growth),
        cmocka_unit_test(test_item_max_and_limits),
        cmocka_unit_test(test_dump_walk_visits_each_live_item_once),
        cmocka_unit_test(test_class_figures_follow_links),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
