/* test_pools.c — unit tests of namespace memory in the storage engine (store_ns_configure and
 * the slab pools behind it): quotas isolate namespaces, pools without a quota leave what the
 * quotas are owed, a lowered quota is trimmed, a store that fits never fails, and the eviction
 * policies keep what they promise through a one-pass scan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/clock.h"
#include "node/store.h"

#define MB (1ull << 20)

static struct store *mk_store(uint64_t mb, uint64_t sweep_ms)
{
    struct store_options o;
    store_options_default(&o);
    o.memory_mb = mb;
    o.sweep_interval_ms = sweep_ms;
    char err[256] = "";
    struct store *st = NULL;
    if (store_create(&st, &o, err, sizeof err) != 0) fail_msg("store_create: %s", err);
    return st;
}

/* Set `key` in namespace nsid to nbytes of value. False if the engine found no memory. */
static bool ns_put(struct store *st, uint16_t nsid, const char *key, size_t nbytes)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    struct item *it = store_alloc(st, nsid, key, nkey, nbytes, 0);
    if (!it) return false;
    memset(item_value(it), 'v', nbytes);
    uint32_t now = clock_now();
    store_lock(st, hv);
    struct item *old = store_find(st, hv, key, nkey, now, NULL);
    if (old) store_replace(st, hv, old, it, now);
    else store_link(st, hv, it, now);
    store_unlock(st, hv);
    return true;
}

/* Is `key` cached? A hit counts as a read (the policy sees it). */
static bool ns_get(struct store *st, const char *key)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    uint32_t now = clock_now();
    store_lock(st, hv);
    struct item *it = store_find(st, hv, key, nkey, now, NULL);
    if (it) store_bump(st, it, now);
    store_unlock(st, hv);
    return it != NULL;
}

/* Store n keys "<prefix><i>" of nbytes each into nsid; every store must succeed. */
static void fill(struct store *st, uint16_t nsid, const char *prefix, int n, size_t nbytes)
{
    char key[64];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s%06d", prefix, i);
        if (!ns_put(st, nsid, key, nbytes)) fail_msg("store of %s failed", key);
    }
}

static int count_present(struct store *st, const char *prefix, int n)
{
    char key[64];
    int found = 0;
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s%06d", prefix, i);
        found += ns_get(st, key);
    }
    return found;
}

static struct store_ns_stats ns_stats(struct store *st, uint16_t nsid)
{
    struct store_ns_stats s;
    store_ns_stats(st, nsid, &s);
    return s;
}

static void test_quota_isolates_namespaces(void **state)
{
    (void)state;
    struct store *st = mk_store(16, 60000);
    assert_int_equal(store_ns_configure(st, 1, 4 * MB, STORE_POLICY_LRU), 0);
    assert_int_equal(store_ns_configure(st, 2, 4 * MB, STORE_POLICY_LRU), 0);
    fill(st, 2, "b:", 2500, 1000); /* ~2.6 MB */
    fill(st, 1, "a:", 20000, 1000); /* ~21 MB into a 4 MB quota */
    fill(st, 0, "d:", 20000, 1000); /* default: no quota */
    assert_int_equal(count_present(st, "b:", 2500), 2500);
    assert_true(ns_stats(st, 1).memory <= 4 * MB);
    assert_true(ns_stats(st, 1).evictions > 0);
    assert_int_equal(ns_stats(st, 2).evictions, 0);
    assert_true(ns_stats(st, 0).memory <= 16 * MB - 8 * MB);
    store_destroy(&st);
}

static void test_owed_pages_wait_for_their_namespace(void **state)
{
    (void)state;
    struct store *st = mk_store(16, 60000);
    assert_int_equal(store_ns_configure(st, 3, 8 * MB, STORE_POLICY_LRU), 0);
    fill(st, 0, "d:", 30000, 1000);
    assert_true(ns_stats(st, 0).memory <= 8 * MB);
    fill(st, 3, "q:", 7000, 1000); /* ~7.3 MB: all of it fits in the quota */
    assert_int_equal(ns_stats(st, 3).evictions, 0);
    assert_int_equal(count_present(st, "q:", 7000), 7000);
    store_destroy(&st);
}

static void test_store_never_fails_when_quotas_take_everything(void **state)
{
    (void)state;
    struct store *st = mk_store(8, 60000);
    assert_int_equal(store_ns_configure(st, 1, 8 * MB, STORE_POLICY_LRU), 0);
    /* default is owed nothing, yet a store that fits must succeed */
    fill(st, 0, "d:", 100, 5000);
    fill(st, 0, "e:", 100, 300);
    assert_int_equal(count_present(st, "e:", 100), 100);
    /* and the quota'd namespace still gets its pages back from default */
    fill(st, 1, "q:", 6000, 1000);
    assert_int_equal(ns_stats(st, 1).evictions, 0);
    store_destroy(&st);
}

static void test_lowered_quota_is_trimmed(void **state)
{
    (void)state;
    struct store *st = mk_store(16, 10);
    assert_int_equal(store_ns_configure(st, 1, 12 * MB, STORE_POLICY_LRU), 0);
    fill(st, 1, "a:", 11000, 1000);
    assert_true(ns_stats(st, 1).memory > 8 * MB);
    assert_int_equal(store_ns_configure(st, 1, 2 * MB, STORE_POLICY_LRU), 0);
    for (int i = 0; i < 500 && ns_stats(st, 1).memory > 2 * MB; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_true(ns_stats(st, 1).memory <= 2 * MB);
    assert_true(ns_stats(st, 1).bytes <= 2 * MB);
    struct store_stats s;
    store_stats(st, &s);
    assert_true(s.slab_pages_trimmed >= 8);
    fill(st, 1, "b:", 100, 1000); /* still works at the new size */
    assert_int_equal(count_present(st, "b:", 100), 100);
    store_destroy(&st);
}

/* Share of a hot set, read twice, still cached after a scan of 4x the namespace's size. */
static double hot_kept(enum store_policy policy)
{
    struct store *st = mk_store(16, 60000);
    assert_int_equal(store_ns_configure(st, 1, 4 * MB, policy), 0);
    fill(st, 1, "hot:", 600, 1000);
    for (int r = 0; r < 2; r++) assert_int_equal(count_present(st, "hot:", 600), 600);
    fill(st, 1, "cold:", 16000, 1000);
    double kept = count_present(st, "hot:", 600) / 600.0;
    store_destroy(&st);
    return kept;
}

static void test_policies_through_a_scan(void **state)
{
    (void)state;
    double lru = hot_kept(STORE_POLICY_LRU);
    double lfu = hot_kept(STORE_POLICY_LFU);
    double s3 = hot_kept(STORE_POLICY_S3FIFO);
    print_message("hot set kept: lru %.2f lfu %.2f s3fifo %.2f\n", lru, lfu, s3);
    assert_true(lru < 0.3);
    assert_true(lfu >= 0.8);
    assert_true(s3 >= 0.8);
}

/* s3fifo: a key evicted from the small queue and stored again soon goes straight to main, so
 * it survives a later scan that flushes the small queue. */
static void test_s3fifo_ghost_readmits_to_main(void **state)
{
    (void)state;
    struct store *st = mk_store(16, 60000);
    assert_int_equal(store_ns_configure(st, 1, 2 * MB, STORE_POLICY_S3FIFO), 0);
    fill(st, 1, "g:", 200, 1000);  /* never read: will leave through the small queue */
    fill(st, 1, "s1:", 6000, 1000); /* pushes them out, into the ghost */
    assert_true(count_present(st, "g:", 200) < 20);
    /* the ghost of a 2 MB quota: one 1-byte entry per 128 bytes, counted once written */
    struct store_stats s;
    store_stats(st, &s);
    assert_int_equal(s.ghost_bytes, 2 * MB / 128);
    fill(st, 1, "g:", 200, 1000);  /* back again: the ghost sends them to main */
    fill(st, 1, "s2:", 1500, 1000); /* a scan shorter than main: small churns, main stays */
    assert_true(count_present(st, "g:", 200) >= 180);
    store_destroy(&st);
}

/* s3fifo: before any read has promoted an item, main has not begun, and a key back from the
 * ghost goes through the small queue: in a fill that reads nothing a head of main's own would
 * be a whole segment holding the few keys ghost matches sent there (bench-memory lost one of
 * 64). Once reads have begun main, keys back from the ghost go there again. */
static void test_s3fifo_ghost_readmits_once_main_has_begun(void **state)
{
    (void)state;
    struct store *st = mk_store(16, 60000);
    assert_int_equal(store_ns_configure(st, 1, 2 * MB, STORE_POLICY_S3FIFO), 0);
    fill(st, 1, "g:", 200, 1000);
    fill(st, 1, "s1:", 6000, 1000); /* into the ghost, nothing read */
    fill(st, 1, "g:", 200, 1000);   /* ghost matches, but main has not begun */
    fill(st, 1, "s2:", 6000, 1000); /* flushes the small queue */
    assert_true(count_present(st, "g:", 200) < 20);
    /* a read promotes an item of a small victim into main */
    fill(st, 1, "m:", 10, 1000);
    assert_int_equal(count_present(st, "m:", 10), 10);
    fill(st, 1, "s3:", 2000, 1000);
    assert_int_equal(count_present(st, "m:", 10), 10);
    fill(st, 1, "h:", 200, 1000);
    fill(st, 1, "s4:", 6000, 1000);
    assert_true(count_present(st, "h:", 200) < 20);
    fill(st, 1, "h:", 200, 1000); /* back from the ghost, into main */
    fill(st, 1, "s5:", 1500, 1000);
    assert_true(count_present(st, "h:", 200) >= 180);
    store_destroy(&st);
}

/* Mixed sizes overwritten in little memory: every cleaned segment moves its live items down
 * inside itself or into a head. Every value
 * read back must be the one stored for its key and size (a move that copied the wrong bytes or
 * left the index pointing at the old place corrupts it), and the engine must not crash (run
 * under ASAN in CI). */
static void test_s3fifo_survives_page_moves(void **state)
{
    (void)state;
    struct store *st = mk_store(4, 60000);
    assert_int_equal(store_ns_configure(st, 1, 0, STORE_POLICY_S3FIFO), 0);
    static const size_t sizes[] = {100, 220, 100, 460, 100, 940};
    uint64_t x = 88172645463325252ull, checked = 0;
    char key[32];
    for (int op = 0; op < 60000; op++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % 400);
        size_t n = sizes[(x >> 20) % 6];
        snprintf(key, sizeof key, "m:%d:%zu", k, n);
        size_t nkey = strlen(key);
        uint64_t hv = store_hash(key, nkey);
        uint32_t now = clock_now();
        /* bytes with bits 0 and 7 set: read as an item header (iflags, clock) they look linked
         * and queued, as random client data may */
        char fill = (char)(0x81 | (((k + (int)n) % 64) << 1));
        if ((x >> 40) % 4 == 0) {
            struct item *it = store_alloc(st, 1, key, nkey, n, 0);
            assert_non_null(it);
            memset(item_value(it), fill, n);
            store_lock(st, hv);
            struct item *old = store_find(st, hv, key, nkey, now, NULL);
            if (old) store_replace(st, hv, old, it, now);
            else assert_true(store_link(st, hv, it, now));
            store_unlock(st, hv);
        } else {
            store_lock(st, hv);
            struct item *it = store_find(st, hv, key, nkey, now, NULL);
            if (it) {
                assert_int_equal(it->nbytes, n);
                for (size_t i = 0; i < n; i++)
                    if (item_value(it)[i] != fill) fail_msg("%s: byte %zu corrupted", key, i);
                store_bump(st, it, now);
                checked++;
            }
            store_unlock(st, hv);
        }
    }
    struct store_stats s;
    store_stats(st, &s);
    print_message("s3fifo, 4 MB, mixed sizes: %llu values checked, %llu segments cleaned\n",
                  (unsigned long long)checked, (unsigned long long)s.slab_pages_moved);
    /* 2,400 keys of ~1 MB in all fit: overwrites leave dead bytes that cleaning compacts, and
     * nothing is evicted */
    assert_true(s.slab_pages_moved > 10);
    assert_int_equal(s.evictions, 0);
    assert_true(checked > 300);
    store_destroy(&st);
}

int main(void)
{
    clock_setup();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quota_isolates_namespaces),
        cmocka_unit_test(test_owed_pages_wait_for_their_namespace),
        cmocka_unit_test(test_store_never_fails_when_quotas_take_everything),
        cmocka_unit_test(test_lowered_quota_is_trimmed),
        cmocka_unit_test(test_policies_through_a_scan),
        cmocka_unit_test(test_s3fifo_ghost_readmits_to_main),
        cmocka_unit_test(test_s3fifo_ghost_readmits_once_main_has_begun),
        cmocka_unit_test(test_s3fifo_survives_page_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
