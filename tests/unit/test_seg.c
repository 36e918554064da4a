/* test_seg.c — unit tests of the segmented log behind the store (src/node/seg.h), through the
 * store's API: bump allocation, sealing, freeing, cleaning that moves items and keeps them
 * readable, no eviction below 90% live bytes with random size mixes (also with runs and items of
 * nearly a segment at -m 8), runs for large items (and room for one when every window holds part
 * of another run), pinned in-flight items, quota isolation, short-TTL items reaped after a move,
 * and s3fifo's size-aware admission (small items asked for as often as large ones are kept more). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/clock.h"
#include "node/store.h"

#define MB (1ull << 20)

static struct store *mk(uint64_t mb, uint64_t item_max)
{
    struct store_options o;
    store_options_default(&o);
    o.memory_mb = mb;
    o.item_max = item_max;
    o.sweep_interval_ms = 60000; /* no sweeping during a test */
    char err[256] = "";
    struct store *st = NULL;
    if (store_create(&st, &o, err, sizeof err) != 0) fail_msg("store_create: %s", err);
    return st;
}

static struct store_stats stats(struct store *st)
{
    struct store_stats s;
    store_stats(st, &s);
    return s;
}

/* The byte at offset i of the value stored for `key` in round `gen` (any key, any offset). */
static char pattern(const char *key, uint32_t gen, size_t i)
{
    uint32_t h = gen * 2654435761u;
    for (const char *p = key; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    return (char)('A' + (h + i * 7) % 26);
}

/* Store key (namespace nsid) with nbytes of its round-`gen` pattern. False if no memory. */
static bool put(struct store *st, uint16_t nsid, const char *key, size_t nbytes, uint32_t gen)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    struct item *it = store_alloc(st, nsid, key, nkey, nbytes, 0);
    if (!it) return false;
    for (size_t i = 0; i < nbytes; i++) item_value(it)[i] = pattern(key, gen, i);
    uint32_t now = clock_now();
    store_lock(st, hv);
    struct item *old = store_find(st, hv, key, nkey, now, NULL);
    if (old) store_replace(st, hv, old, it, now);
    else assert_true(store_link(st, hv, it, now));
    store_unlock(st, hv);
    return true;
}

/* Is key cached with nbytes of its round-`gen` pattern? Fails the test on a wrong byte. */
static bool check(struct store *st, const char *key, size_t nbytes, uint32_t gen)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, key, nkey, clock_now(), NULL);
    if (it) {
        if (it->nbytes != nbytes) fail_msg("%s: %u bytes, want %zu", key, it->nbytes, nbytes);
        for (size_t i = 0; i < nbytes; i++)
            if (item_value(it)[i] != pattern(key, gen, i))
                fail_msg("%s: byte %zu corrupted", key, i);
    }
    store_unlock(st, hv);
    return it != NULL;
}

static void del(struct store *st, const char *key)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, key, nkey, clock_now(), NULL);
    if (it) store_unlink(st, hv, it);
    store_unlock(st, hv);
}

static uint64_t rng(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* ---- allocation ------------------------------------------------------------------------------ */

static void test_bump_allocation(void **state)
{
    (void)state;
    struct store *st = mk(16, MB);
    struct item *a = store_alloc(st, 0, "a", 1, 100, 0);
    struct item *b = store_alloc(st, 0, "bb", 2, 37, 9);
    struct item *c = store_alloc(st, 0, "c", 1, 0, 0);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    /* records follow each other, each 4-aligned */
    assert_ptr_equal((char *)a + store_item_size(st, 1, 100, 0), b);
    assert_ptr_equal((char *)b + store_item_size(st, 2, 37, 9), c);
    assert_int_equal(store_item_size(st, 2, 37, 9), 68); /* ITEM_HEADER + 2 + 37 + 4 = 67 -> 68 */
    store_free(st, a);
    store_free(st, b);
    store_free(st, c);
    store_destroy(&st);
}

static void test_sealing_takes_a_new_segment(void **state)
{
    (void)state;
    struct store *st = mk(16, MB);
    uint32_t seg = store_page_size(st);
    assert_int_equal(seg, 128 << 10); /* -m / 256, at least 128 KiB */
    char key[32];
    size_t len = store_item_size(st, 6, 1000, 0);
    struct item *first = NULL, *prev = NULL;
    int n = 0;
    for (;; n++) {
        snprintf(key, sizeof key, "k%05d", n);
        struct item *it = store_alloc(st, 0, key, 6, 1000, 0);
        assert_non_null(it);
        if (!first) first = it;
        if (prev && (char *)it != (char *)prev + len) {
            /* sealed: the segment had no room for one more; the next starts a segment */
            assert_true((size_t)((char *)prev + len - (char *)first) + len > seg);
            assert_int_equal(((char *)it - (char *)first) % seg, 0);
            store_free(st, it);
            break;
        }
        prev = it;
        store_free(st, it);
    }
    assert_int_equal(n, (int)(seg / len));
    assert_int_equal(stats(st).pages_used, 2);
    store_destroy(&st);
}

static void test_free_leaves_a_dead_record(void **state)
{
    (void)state;
    struct store *st = mk(16, MB);
    assert_true(put(st, 0, "x", 500, 1));
    assert_true(put(st, 0, "y", 500, 1));
    struct store_stats s = stats(st);
    assert_int_equal(s.curr_items, 2);
    del(st, "x");
    s = stats(st);
    assert_int_equal(s.curr_items, 1);
    assert_int_equal(s.bytes, ITEM_HEADER + 1 + 500);
    /* a new item goes to the head, after y, not into x's place */
    struct item *z = store_alloc(st, 0, "z", 1, 500, 0);
    uint64_t hv = store_hash("y", 1);
    store_lock(st, hv);
    struct item *y = store_find(st, hv, "y", 1, clock_now(), NULL);
    assert_ptr_equal((char *)y + store_item_size(st, 1, 500, 0), z);
    store_unlock(st, hv);
    store_free(st, z);
    assert_true(check(st, "y", 500, 1));
    store_destroy(&st);
}

/* ---- cleaning ----------------------------------------------------------------------------- */

/* Overwrites and deletes leave dead bytes everywhere; with 70-80% live, new stores clean
 * (moving items inside their segments and into heads) and never evict, and every item still
 * reads back whole. */
static void test_cleaning_moves_items_and_keeps_them_readable(void **state)
{
    (void)state;
    struct store *st = mk(4, MB);
    enum { KEYS = 2500 };
    static uint32_t gen[KEYS], size[KEYS];
    uint64_t x = 0x9E3779B97F4A7C15ull, live = 0;
    char key[32];
    for (int round = 0; round < 40000; round++) {
        int k = (int)(rng(&x) % KEYS);
        snprintf(key, sizeof key, "c:%d", k);
        uint32_t n = 16 + (uint32_t)(rng(&x) % 2400);
        uint64_t after = live - (size[k] ? size[k] + ITEM_HEADER + strlen(key) : 0) + n + ITEM_HEADER + strlen(key);
        if (after > 4 * MB * 75 / 100) { /* stay near 75% live: delete instead */
            if (size[k]) {
                del(st, key);
                live -= size[k] + ITEM_HEADER + strlen(key);
                size[k] = 0;
            }
            continue;
        }
        gen[k]++;
        assert_true(put(st, 0, key, n, gen[k]));
        live = after;
        size[k] = n;
    }
    struct store_stats s = stats(st);
    print_message("cleaning: %llu items, %llu bytes, %llu segments cleaned, %llu evictions\n",
                  (unsigned long long)s.curr_items, (unsigned long long)s.bytes,
                  (unsigned long long)s.slab_pages_moved, (unsigned long long)s.evictions);
    assert_int_equal(s.evictions, 0);
    assert_true(s.slab_pages_moved > 20);
    for (int k = 0; k < KEYS; k++) {
        snprintf(key, sizeof key, "c:%d", k);
        assert_int_equal(check(st, key, size[k], gen[k]), size[k] != 0);
    }
    store_destroy(&st);
}

/* The rule of issue 11: no eviction while live items use less than 90% of -m, for random size
 * mixes (items up to a quarter segment) under overwrites. Kept at 85% by the test. */
static void no_eviction_below_90(uint64_t mb, uint32_t maxval, int rounds)
{
    struct store *st = mk(mb, MB);
    int keys = (int)(mb * MB / (maxval / 2 + 40));
    uint32_t *size = calloc((size_t)keys, sizeof *size);
    assert_non_null(size);
    uint64_t x = 88172645463325252ull ^ mb, live = 0, cap = mb * MB * 85 / 100;
    char key[32];
    for (int round = 0; round < rounds; round++) {
        int k = (int)(rng(&x) % (uint64_t)keys);
        int nkey = snprintf(key, sizeof key, "r:%d", k);
        uint32_t n = 1 + (uint32_t)(rng(&x) % maxval);
        uint64_t old = size[k] ? size[k] + ITEM_HEADER + (uint64_t)nkey : 0;
        if (live - old + n + ITEM_HEADER + (uint64_t)nkey > cap) {
            if (size[k]) {
                del(st, key);
                live -= old;
                size[k] = 0;
            }
            continue;
        }
        if (!put(st, 0, key, n, 1)) fail_msg("store %d failed at %llu live", round,
                                             (unsigned long long)live);
        live = live - old + n + ITEM_HEADER + (uint64_t)nkey;
        size[k] = n;
    }
    struct store_stats s = stats(st);
    print_message("-m %llu, values 1..%u: %llu items, %.1f%% live, %llu segments cleaned, "
                  "%llu evictions\n", (unsigned long long)mb, maxval,
                  (unsigned long long)s.curr_items, 100.0 * (double)s.bytes / (double)(mb * MB),
                  (unsigned long long)s.slab_pages_moved, (unsigned long long)s.evictions);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.alloc_failures, 0);
    assert_true(s.bytes > mb * MB * 80 / 100); /* the test did fill it */
    free(size);
    store_destroy(&st);
}

static void test_no_eviction_below_90_percent_m8(void **state)
{
    (void)state;
    no_eviction_below_90(8, 16000, 120000);
}

static void test_no_eviction_below_90_percent_m64(void **state)
{
    (void)state;
    no_eviction_below_90(64, 4000, 200000);
}

/* ---- runs --------------------------------------------------------------------------------- */

static void test_runs_hold_large_items(void **state)
{
    (void)state;
    struct store *st = mk(8, MB);
    char key[32];
    static const size_t big[] = {40000, 100000, 300000, 900000, 65000};
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "big:%d", i);
        assert_true(put(st, 0, key, big[i], 3));
    }
    for (int i = 0; i < 300; i++) { /* small items between them */
        snprintf(key, sizeof key, "s:%d", i);
        assert_true(put(st, 0, key, 700, 3));
    }
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "big:%d", i);
        assert_true(check(st, key, big[i], 3));
    }
    struct store_stats s = stats(st);
    assert_int_equal(s.evictions, 0);
    /* churn of large items in a full store: windows of contiguous segments are cleared for
     * them, no store fails, and what is found is intact */
    uint64_t x = 12345;
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof key, "churn:%d", (int)(rng(&x) % 40));
        size_t n = 33000 + rng(&x) % 500000;
        assert_true(put(st, 0, key, n, (uint32_t)i));
        assert_true(check(st, key, n, (uint32_t)i));
    }
    s = stats(st);
    assert_int_equal(s.alloc_failures, 0);
    assert_true(s.bytes <= 8 * MB);
    store_destroy(&st);
}

/* Room for a run when every window holds part of another run and no two free segments are
 * adjacent (the arena as churn of large items leaves it): below 90% live, nothing is evicted.
 * Layout at -m 8 (64 segments of 128 KiB), repeated every `period` segments: a 140 KB item's
 * run and the segment that shares its tail, then plain segments of small items, half live;
 * about 53% live, none free. A 400 KB item needs 4 segments: every window holds a run. */
static void run_room_layout(int period)
{
    struct store *st = mk(8, MB);
    uint32_t seg = store_page_size(st);
    assert_int_equal(seg, 128 << 10);
    /* the segments items may use: -m holds the index too, and the index of the ~8,000 small
     * items below (about 90 KiB) takes one of the 64, withheld at the top */
    const int nseg = 63;
    char key[32];
    size_t per = seg / store_item_size(st, 7, 1000, 0), small = (size_t)nseg * per;
    int groups = nseg / period;
    for (size_t i = 0; i < small; i++) { /* every segment full of small items, bottom up */
        snprintf(key, sizeof key, "s:%05zu", i);
        assert_true(put(st, 0, key, 1000, 1));
    }
    assert_int_equal(stats(st).pages_total, nseg);
    bool *kept = calloc(small, sizeof *kept);
    assert_non_null(kept);
    size_t off = (size_t)(nseg % period); /* spare segments at the bottom: plain, single */
    for (size_t i = 0; i < small; i++) { /* run pairs dead, plain segments half live */
        size_t g = i / per;
        bool pair = g >= off && (g - off) % (size_t)period < 2;
        kept[i] = !pair && i % 2 == 0;
        snprintf(key, sizeof key, "s:%05zu", i);
        if (!kept[i]) del(st, key);
    }
    for (int k = 0; k < groups; k++) { /* each lands in a dead pair: the cheapest window */
        snprintf(key, sizeof key, "run:%d", k);
        assert_true(put(st, 0, key, 140000, 2));
    }
    struct store_stats s = stats(st);
    assert_int_equal(s.evictions, 0);
    assert_true(s.bytes < 8 * MB * 60 / 100);
    assert_true(put(st, 0, "big", 400000, 3));
    s = stats(st);
    print_message("period %d: after the big store %.1f%% live, %llu evictions\n", period,
                  100.0 * (double)s.bytes / (double)(8 * MB), (unsigned long long)s.evictions);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.alloc_failures, 0);
    assert_true(check(st, "big", 400000, 3));
    for (int k = 0; k < groups; k++) {
        snprintf(key, sizeof key, "run:%d", k);
        assert_true(check(st, key, 140000, 2));
    }
    for (size_t i = 0; i < small; i++) {
        snprintf(key, sizeof key, "s:%05zu", i);
        assert_int_equal(check(st, key, 1000, 1), kept[i]);
    }
    free(kept);
    store_destroy(&st);
}

/* Two plain segments per period: the run in the chosen window moves to a window of plain
 * segments cleared for it first. */
static void test_run_room_when_every_window_holds_a_run(void **state)
{
    (void)state;
    run_room_layout(4);
}

/* One plain segment per period, so no two plain segments are adjacent either: a run slides
 * down into the segment below it (cleared), which frees the end it shared, until a window of
 * plain segments exists. */
static void test_run_room_when_no_plain_window_exists(void **state)
{
    (void)state;
    run_room_layout(3);
}

/* The rule with the integration test's mix at -m 8: values log-uniform from 10 B to 512 KB (as
 * many of 10-100 B as of 50-500 KB), so that most bytes are in runs and items of nearly a
 * segment, kept at 88% live by deleting the oldest items, over `rounds` stores. Windows for
 * runs and room for items of nearly a segment must be found without evicting. */
static void no_eviction_with_runs_m8(uint64_t seed, int rounds)
{
    struct store *st = mk(8, MB);
    enum { KEYS = 4096 };
    static uint32_t size[KEYS];
    memset(size, 0, sizeof size);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ seed, live = 0, cap = 8 * MB * 88 / 100;
    int oldest = 0, next = 0; /* keys next..oldest-1 (mod KEYS) are live, oldest first */
    char key[32];
    for (int round = 0; round < rounds; round++) {
        double u = (double)(rng(&x) % 1000000) / 1e6;
        uint32_t n = (uint32_t)(10.0 * __builtin_exp(u * __builtin_log(512.0 * 1024 / 10)));
        int k = next;
        int nkey = snprintf(key, sizeof key, "w:%d", k);
        uint64_t cost = n + 24 + (uint64_t)nkey;
        while (live + cost > cap || (oldest != next && (next + 1) % KEYS == oldest)) {
            snprintf(key, sizeof key, "w:%d", oldest);
            del(st, key);
            live -= size[oldest] + 24 + strlen(key);
            size[oldest] = 0;
            oldest = (oldest + 1) % KEYS;
        }
        snprintf(key, sizeof key, "w:%d", k);
        if (!put(st, 0, key, n, (uint32_t)round))
            fail_msg("store %d of %u B failed at %llu live", round, n, (unsigned long long)live);
        size[k] = n;
        live += cost;
        next = (next + 1) % KEYS;
        if (oldest == next) oldest = (oldest + 1) % KEYS; /* never: the loop above keeps room */
    }
    struct store_stats s = stats(st);
    print_message("seed %llu: %llu items, %.1f%% live, %llu segments cleaned, %llu evictions\n",
                  (unsigned long long)seed, (unsigned long long)s.curr_items,
                  100.0 * (double)s.bytes / (double)(8 * MB),
                  (unsigned long long)s.slab_pages_moved, (unsigned long long)s.evictions);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.alloc_failures, 0);
    store_destroy(&st);
}

/* Each seed evicted 2 to 8 items before session 7's fixes. Seed 16 evicted one until a run could
 * begin after the end of another run (docs/architecture.md, "Runs"); seeds 1..19 hold now.
 * SEG_TEST_SEED=N runs seed N alone. */
static void test_no_eviction_with_runs_and_near_segment_items_m8(void **state)
{
    (void)state;
    const char *only = getenv("SEG_TEST_SEED");
    if (only) {
        no_eviction_with_runs_m8(strtoull(only, NULL, 10), 3000);
        return;
    }
    for (uint64_t seed = 1; seed <= 8; seed++) no_eviction_with_runs_m8(seed, 3000);
    no_eviction_with_runs_m8(16, 3000);
}

/* ---- pins --------------------------------------------------------------------------------- */

/* An allocated, not yet linked item (a value still arriving) is never moved or overwritten,
 * however much the store churns meanwhile. */
static void test_inflight_items_are_pinned(void **state)
{
    (void)state;
    struct store *st = mk(2, MB / 2);
    struct item *held = store_alloc(st, 0, "held", 4, 3000, 0);
    assert_non_null(held);
    for (size_t i = 0; i < 3000; i++) item_value(held)[i] = pattern("held", 9, i);
    char key[32];
    for (int i = 0; i < 20000; i++) { /* ~10x the memory */
        snprintf(key, sizeof key, "w:%d", i % 3000);
        assert_true(put(st, 0, key, 900 + (size_t)(i % 7) * 50, 1));
    }
    assert_true(stats(st).evictions > 0);
    assert_int_equal(held->nkey, 4);
    assert_memory_equal(item_key(held), "held", 4);
    for (size_t i = 0; i < 3000; i++) assert_int_equal(item_value(held)[i], pattern("held", 9, i));
    uint64_t hv = store_hash("held", 4);
    store_lock(st, hv);
    assert_true(store_link(st, hv, held, clock_now()));
    store_unlock(st, hv);
    assert_true(check(st, "held", 3000, 9));
    store_destroy(&st);
}

/* ---- quotas ------------------------------------------------------------------------------- */

/* A namespace kept below 90% of its quota with random sizes never evicts while another
 * namespace churns far beyond its own quota. */
static void test_quota_isolation_with_random_sizes(void **state)
{
    (void)state;
    struct store *st = mk(16, MB);
    assert_int_equal(store_ns_configure(st, 1, 4 * MB, STORE_POLICY_LRU), 0);
    assert_int_equal(store_ns_configure(st, 2, 4 * MB, STORE_POLICY_S3FIFO), 0);
    uint64_t x = 777, live2 = 0;
    char key[32];
    static uint32_t size2[3000];
    for (int i = 0; i < 60000; i++) {
        snprintf(key, sizeof key, "a:%d", i);
        assert_true(put(st, 1, key, 1 + rng(&x) % 3000, 1));
        int k = (int)(rng(&x) % 3000);
        int nkey = snprintf(key, sizeof key, "b:%d", k);
        uint32_t n = 1 + (uint32_t)(rng(&x) % 3000);
        uint64_t old = size2[k] ? size2[k] + ITEM_HEADER + (uint64_t)nkey : 0;
        if (live2 - old + n + ITEM_HEADER + (uint64_t)nkey > 4 * MB * 85 / 100) continue;
        assert_true(put(st, 2, key, n, 1));
        live2 = live2 - old + n + ITEM_HEADER + (uint64_t)nkey;
        size2[k] = n;
    }
    struct store_ns_stats a, b;
    store_ns_stats(st, 1, &a);
    store_ns_stats(st, 2, &b);
    print_message("quota 4 MB each: ns1 %llu evictions, ns2 %llu items %llu bytes %llu "
                  "evictions\n", (unsigned long long)a.evictions, (unsigned long long)b.items,
                  (unsigned long long)b.bytes, (unsigned long long)b.evictions);
    assert_true(a.evictions > 0);
    assert_true(a.memory <= 4 * MB);
    assert_int_equal(b.evictions, 0);
    assert_true(b.bytes > 4 * MB * 80 / 100);
    for (int k = 0; k < 3000; k++) {
        snprintf(key, sizeof key, "b:%d", k);
        assert_int_equal(check(st, key, size2[k], 1), size2[k] != 0);
    }
    store_destroy(&st);
}

/* A quota lowered below the segments a pool owns, with its live bytes still below 90% of the new
 * quota, evicts nothing even when cleaning cannot give the excess back (three runs whose unused
 * ends no cleaning can fill): the pool stays beyond its quota until dead bytes appear, then
 * the trim gives the excess back. Before, the trim's last resort (seg_shrink) evicted a run. */
static void test_trim_keeps_a_pool_below_90_percent_of_its_lowered_quota(void **state)
{
    (void)state;
    struct store_options o;
    store_options_default(&o);
    o.memory_mb = 64; /* 256 segments of 256 KiB */
    o.item_max = MB;
    o.sweep_interval_ms = 10; /* the trim runs on every pass */
    char err[256] = "", key[32];
    struct store *st = NULL;
    if (store_create(&st, &o, err, sizeof err) != 0) fail_msg("store_create: %s", err);
    uint32_t seg = store_page_size(st);
    assert_int_equal(seg, 256 * 1024);
    assert_int_equal(store_ns_configure(st, 1, 16 * MB, STORE_POLICY_LRU), 0);
    for (int i = 0; i < 3; i++) { /* 3 runs of 3 segments, 75 KB of each in its third */
        snprintf(key, sizeof key, "r:%d", i);
        assert_true(put(st, 1, key, 600000, 1));
    }
    struct store_ns_stats a;
    store_ns_stats(st, 1, &a);
    assert_int_equal(a.memory, 9 * (uint64_t)seg);
    /* 8 segments: 1.8 MB live is 86% of it */
    assert_int_equal(store_ns_configure(st, 1, 8 * (uint64_t)seg, STORE_POLICY_LRU), 0);
    for (int i = 0; i < 50; i++) { /* 50 sweep intervals */
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        store_ns_stats(st, 1, &a);
        if (a.evictions) break;
    }
    print_message("quota lowered to 8 segments: %llu evictions, %llu segments\n",
                  (unsigned long long)a.evictions, (unsigned long long)(a.memory / seg));
    assert_int_equal(a.evictions, 0);
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "r:%d", i);
        assert_true(check(st, key, 600000, 1));
    }
    del(st, "r:1"); /* a run freed: back within the quota */
    for (int i = 0; i < 500 && a.memory > 8 * (uint64_t)seg; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        store_ns_stats(st, 1, &a);
    }
    assert_true(a.memory <= 8 * (uint64_t)seg);
    assert_int_equal(a.evictions, 0);
    store_destroy(&st);
}

/* Overwrites in a roomy store reuse mostly dead segments before touching free ones, so item
 * memory in use follows the live set, not the bytes written (a free list's behaviour). */
static void test_overwrites_reuse_segments_before_free_ones(void **state)
{
    (void)state;
    struct store *st = mk(64, MB); /* 256 segments of 256 KiB */
    char key[32];
    uint64_t x = 5;
    for (int i = 0; i < 200000; i++) { /* 200 MB written over 2,000 keys of ~1 KB: 2 MB live */
        snprintf(key, sizeof key, "o:%d", (int)(rng(&x) % 2000));
        assert_true(put(st, 0, key, 900 + rng(&x) % 200, 1));
    }
    struct store_stats s = stats(st);
    print_message("2 MB live after 200 MB of overwrites: %u of %u segments used\n", s.pages_used,
                  s.pages_total);
    assert_int_equal(s.evictions, 0);
    assert_true((uint64_t)s.pages_used * store_page_size(st) <= 8 * MB);
    store_destroy(&st);
}

/* ---- transient items ---------------------------------------------------------------------- */

static struct item *find(struct store *st, const char *key)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, key, nkey, clock_now(), NULL);
    store_unlock(st, hv);
    return it;
}

/* A short-TTL item is remembered by (hash, CAS): moved by cleaning, it is still reaped within
 * about a second of its expiry. */
static void test_transient_item_found_after_a_move(void **state)
{
    (void)state;
    struct store *st = mk(2, MB / 2);
    char key[32];
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "a:%d", i);
        assert_true(put(st, 0, key, 5000, 1));
    }
    size_t nkey = 1;
    uint64_t hv = store_hash("t", nkey);
    struct item *t = store_alloc(st, 0, "t", nkey, 100, 0);
    assert_non_null(t);
    uint32_t now = clock_now();
    t->exptime = now + 2;
    store_lock(st, hv);
    assert_true(store_link(st, hv, t, now));
    store_unlock(st, hv);
    for (int i = 0; i < 10; i++) { /* the dead bytes before t make its segment the one cleaned */
        snprintf(key, sizeof key, "a:%d", i);
        del(st, key);
    }
    uint64_t x = 99;
    for (int i = 0; stats(st).slab_pages_moved == 0 && i < 100000; i++) {
        snprintf(key, sizeof key, "f:%d", (int)(rng(&x) % 1000));
        assert_true(put(st, 0, key, 1000 + rng(&x) % 1000, 1)); /* ~1.5 MB of 2: cleans */
    }
    struct item *moved = find(st, "t");
    assert_non_null(moved);
    assert_ptr_not_equal(moved, t);
    struct store_stats s;
    for (int i = 0; i < 500; i++) {
        s = stats(st);
        if (s.transient_reclaimed) break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(s.transient_reclaimed, 1);
    assert_null(find(st, "t"));
    store_destroy(&st);
}

/* s3fifo: with small and large keys asked for equally often (uniformly, cache-aside, twice what
 * fits), the small ones hit clearly more often: a key back from the ghost goes straight to main
 * only when its record is small for the pool. Hits are recorded as a get does (store_bump).
 * Before, both hit about 63% of the time. */
static void test_s3fifo_keeps_small_items_asked_for_as_often_as_large_ones(void **state)
{
    (void)state;
    struct store *st = mk(8, MB);
    assert_int_equal(store_ns_configure(st, 0, 0, STORE_POLICY_S3FIFO), 0);
    uint64_t x = 4242, hits[2] = {0, 0}, gets[2] = {0, 0};
    char key[32];
    for (int i = 0; i < 120000; i++) {
        int k = (int)(rng(&x) % 12000), large = k >= 6000;
        size_t n = large ? 2000 : 100;
        snprintf(key, sizeof key, "%c:%05d", large ? 'l' : 's', k);
        bool hit = check(st, key, n, 1);
        if (hit) { /* a read, as a get records it */
            size_t nkey = strlen(key);
            uint64_t hv = store_hash(key, nkey);
            uint32_t now = clock_now();
            store_lock(st, hv);
            struct item *it = store_find(st, hv, key, nkey, now, NULL);
            if (it) store_bump(st, it, now);
            store_unlock(st, hv);
        } else {
            assert_true(put(st, 0, key, n, 1));
        }
        if (i < 60000) continue;
        gets[large]++;
        hits[large] += hit;
    }
    double small = (double)hits[0] / (double)gets[0], big = (double)hits[1] / (double)gets[1];
    print_message("-m 8, 6,000 keys of 100 B and 6,000 of 2,000 B: hit ratio %.3f small, %.3f "
                  "large\n", small, big);
    assert_true(small > big + 0.15);
    store_destroy(&st);
}

int main(void)
{
    clock_setup();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bump_allocation),
        cmocka_unit_test(test_sealing_takes_a_new_segment),
        cmocka_unit_test(test_free_leaves_a_dead_record),
        cmocka_unit_test(test_cleaning_moves_items_and_keeps_them_readable),
        cmocka_unit_test(test_no_eviction_below_90_percent_m8),
        cmocka_unit_test(test_no_eviction_below_90_percent_m64),
        cmocka_unit_test(test_runs_hold_large_items),
        cmocka_unit_test(test_run_room_when_every_window_holds_a_run),
        cmocka_unit_test(test_run_room_when_no_plain_window_exists),
        cmocka_unit_test(test_no_eviction_with_runs_and_near_segment_items_m8),
        cmocka_unit_test(test_inflight_items_are_pinned),
        cmocka_unit_test(test_quota_isolation_with_random_sizes),
        cmocka_unit_test(test_trim_keeps_a_pool_below_90_percent_of_its_lowered_quota),
        cmocka_unit_test(test_transient_item_found_after_a_move),
        cmocka_unit_test(test_overwrites_reuse_segments_before_free_ones),
        cmocka_unit_test(test_s3fifo_keeps_small_items_asked_for_as_often_as_large_ones),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
