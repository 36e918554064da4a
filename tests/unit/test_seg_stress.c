/* test_seg_stress.c — concurrency stress of the segmented log through the store's API, at a
 * memory small enough that every allocation cleans, evicts or clears windows for runs: worker
 * threads set (allocating outside and inside their shard lock), append (allocating while holding
 * the old item, as cmd_concat does), read, delete and store short-TTL items in three namespaces,
 * while a dump walker, the sweeper (10 ms) and a thread changing quotas and policies run. Every
 * value is a pattern derived from its key and length, checked on every read and after every
 * allocation made while holding an item: a record moved, reused or torn under a holder fails
 * the test. At the end the counters must agree with what the index holds. */
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "node/store.h"

#define MB (1ull << 20)
#define NKEYS 3000
#define WORKERS 4

static struct store *mk(uint64_t mb)
{
    struct store_options o;
    store_options_default(&o);
    o.memory_mb = mb;
    o.item_max = 1 << 20;
    o.sweep_interval_ms = 10;
    char err[256] = "";
    struct store *st = NULL;
    if (store_create(&st, &o, err, sizeof err) != 0) fail_msg("store_create: %s", err);
    return st;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Byte i of a value of key k: depends on the key and the offset, never on the length, so that an
 * appended value (old bytes, then new ones of the same key) checks the same way. */
static inline char pat(int k, uint32_t i) { return (char)('A' + (k * 7 + i * 13 + i / 251) % 53); }

static void fill(struct item *it, int k, uint32_t from)
{
    char *v = item_value(it);
    for (uint32_t i = from; i < it->nbytes; i++) v[i] = pat(k, i);
}

/* True if `it` holds key k's key and pattern. */
static bool intact(struct item *it, const char *key, size_t nkey, int k)
{
    if (it->nkey != nkey || memcmp(item_key(it), key, nkey) != 0) return false;
    const char *v = item_value(it);
    for (uint32_t i = 0; i < it->nbytes; i++)
        if (v[i] != pat(k, i)) return false;
    return true;
}

struct sargs {
    struct store *st;
    unsigned seed;
    volatile int *stop;
    bool big; /* values up to 300 KB (runs at -m 4), else below one segment */
    uint64_t ops, corrupt, fails;
};

static size_t pick_len(unsigned *seed, bool big)
{
    unsigned r = rand_r(seed) % 100;
    if (r < 60) return rand_r(seed) % 300;
    if (r < 90) return rand_r(seed) % 8000;
    if (r < 98) return rand_r(seed) % 60000;
    if (!big) return rand_r(seed) % 60000;
    return 60000 + rand_r(seed) % 240000;
}

static int mkkey(char *key, size_t n, int k)
{
    static const char *const ns[] = {"", "qa:", "qb:"};
    return snprintf(key, n, "%sk%d", ns[k % 3], k);
}

static void *worker(void *p)
{
    struct sargs *a = p;
    char key[32];
    while (!__atomic_load_n(a->stop, __ATOMIC_RELAXED)) {
        int k = (int)(rand_r(&a->seed) % NKEYS);
        size_t nkey = (size_t)mkkey(key, sizeof key, k);
        uint16_t nsid = (uint16_t)(k % 3);
        uint32_t now = clock_now();
        uint64_t hv = store_hash(key, nkey);
        unsigned op = rand_r(&a->seed) % 100;
        a->ops++;
        if (op < 40) { /* read */
            store_lock(a->st, hv);
            struct item *it = store_find(a->st, hv, key, nkey, now, NULL);
            if (it) {
                if (!intact(it, key, nkey, k)) a->corrupt++;
                store_bump(a->st, it, now);
            }
            store_unlock(a->st, hv);
        } else if (op < 75) { /* set, allocating outside or inside the shard lock */
            bool locked = op >= 65;
            size_t len = pick_len(&a->seed, a->big);
            uint32_t exp = rand_r(&a->seed) % 3 == 0 ? now + 1 + rand_r(&a->seed) % 2 : 0;
            struct item *it = NULL;
            if (!locked) {
                it = store_alloc(a->st, nsid, key, nkey, len, 0);
                if (!it) {
                    a->fails++;
                    continue;
                }
                fill(it, k, 0);
            }
            store_lock(a->st, hv);
            struct item *old = store_find(a->st, hv, key, nkey, now, NULL);
            if (locked) {
                it = store_alloc(a->st, nsid, key, nkey, len, 0);
                if (!it) {
                    a->fails++;
                    store_unlock(a->st, hv);
                    continue;
                }
                fill(it, k, 0);
                if (old && !intact(old, key, nkey, k)) a->corrupt++; /* moved under its holder? */
            }
            it->exptime = exp;
            if (old) store_replace(a->st, hv, old, it, now);
            else if (!store_link(a->st, hv, it, now)) store_free(a->st, it);
            store_unlock(a->st, hv);
        } else if (op < 85) { /* append: allocate while holding the old item */
            size_t add = 1 + rand_r(&a->seed) % 2000;
            store_lock(a->st, hv);
            struct item *old = store_find(a->st, hv, key, nkey, now, NULL);
            if (old && old->nbytes + add < 900000) {
                struct item *nit = store_alloc(a->st, old->nsid, item_key(old), old->nkey,
                                               old->nbytes + add, 0);
                if (!intact(old, key, nkey, k)) a->corrupt++;
                if (nit) {
                    memcpy(item_value(nit), item_value(old), old->nbytes);
                    fill(nit, k, old->nbytes);
                    nit->exptime = old->exptime;
                    store_replace(a->st, hv, old, nit, now);
                } else {
                    a->fails++;
                }
            }
            store_unlock(a->st, hv);
        } else if (op < 95) { /* delete */
            store_lock(a->st, hv);
            struct item *it = store_find(a->st, hv, key, nkey, now, NULL);
            if (it) store_unlink(a->st, hv, it);
            store_unlock(a->st, hv);
        } else { /* an allocation abandoned in flight (a refused store) */
            struct item *it = store_alloc(a->st, nsid, key, nkey, pick_len(&a->seed, a->big), 0);
            if (it) store_free(a->st, it);
        }
    }
    return NULL;
}

struct wargs {
    struct store *st;
    volatile int *stop;
    uint64_t walks, seen, bad;
};

static void dump_one(void *ctx, const struct item *it, int clsid)
{
    struct wargs *w = ctx;
    (void)clsid;
    w->seen++;
    /* a key the workers wrote, at its full length */
    const char *key = item_key((struct item *)it);
    if (it->nkey < 2 || it->nkey > 12 || (key[0] != 'k' && key[0] != 'q'))
        w->bad++;
}

static void *walker(void *p)
{
    struct wargs *w = p;
    while (!__atomic_load_n(w->stop, __ATOMIC_RELAXED)) {
        struct store_cursor cur = {0};
        while (store_dump_step(w->st, &cur, 0, 512, dump_one, w))
            ;
        w->walks++;
    }
    return NULL;
}

struct cfgargs {
    struct store *st;
    volatile int *stop;
    uint64_t mb;
    bool on;
};

static void *configurer(void *p)
{
    struct cfgargs *c = p;
    unsigned seed = 99;
    uint64_t seg = store_page_size(c->st);
    while (c->on && !__atomic_load_n(c->stop, __ATOMIC_RELAXED)) {
        uint16_t ns = (uint16_t)(1 + rand_r(&seed) % 2);
        static const uint64_t parts[] = {0, 4, 4, 4, 8, 16};
        uint64_t q = parts[rand_r(&seed) % 6] * seg;
        if (q > (c->mb << 20) / 2) q = (c->mb << 20) / 2;
        store_ns_configure(c->st, ns, q, (enum store_policy)(rand_r(&seed) % 3));
        if (rand_r(&seed) % 20 == 0) store_flush(c->st, clock_now(), clock_now());
        nap_ms(20);
    }
    return NULL;
}

/* `churn`: values up to 300 KB and quotas, policies and flushes changing all the while. Returns
 * the allocation failures. */
static uint64_t run(uint64_t mb, int seconds, bool churn)
{
    struct store *st = mk(mb);
    store_ns_configure(st, 1, (mb << 20) / 4, STORE_POLICY_S3FIFO);
    store_ns_configure(st, 2, (mb << 20) / 4, STORE_POLICY_LFU);
    volatile int stop = 0;
    struct sargs a[WORKERS];
    pthread_t th[WORKERS + 2];
    for (int i = 0; i < WORKERS; i++) {
        a[i] = (struct sargs){.st = st, .seed = 77u + (unsigned)i, .stop = &stop,
                             .big = churn};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &a[i]), 0);
    }
    struct wargs w = {.st = st, .stop = &stop};
    struct cfgargs c = {.st = st, .stop = &stop, .mb = mb, .on = churn};
    assert_int_equal(pthread_create(&th[WORKERS], NULL, walker, &w), 0);
    assert_int_equal(pthread_create(&th[WORKERS + 1], NULL, configurer, &c), 0);
    nap_ms(seconds * 1000L);
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    uint64_t ops = 0, corrupt = 0, fails = 0;
    for (int i = 0; i < WORKERS + 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < WORKERS; i++) {
        ops += a[i].ops;
        corrupt += a[i].corrupt;
        fails += a[i].fails;
    }
    struct store_stats s;
    store_stats(st, &s);
    print_message("    %llu MB: %llu ops, %llu walks, %llu items, %llu evictions, %llu moved, "
                  "%llu alloc failures\n",
                  (unsigned long long)mb, (unsigned long long)ops, (unsigned long long)w.walks,
                  (unsigned long long)s.curr_items, (unsigned long long)s.evictions,
                  (unsigned long long)s.slab_pages_moved, (unsigned long long)fails);
    assert_int_equal(corrupt, 0);
    assert_int_equal(w.bad, 0);
    assert_true(ops > 1000 && w.walks > 0);
    /* every counted item can be found, intact; the bytes agree. The short TTLs (<= 2 s) pass
     * first, so that the sweeper takes nothing between this count and the stats. */
    nap_ms(3100);
    uint64_t found = 0, bytes = 0;
    uint32_t now = clock_now();
    char key[32];
    for (int k = 0; k < NKEYS; k++) {
        size_t nkey = (size_t)mkkey(key, sizeof key, k);
        uint64_t hv = store_hash(key, nkey);
        store_lock(st, hv);
        struct item *it = store_find_raw(st, hv, key, nkey, now, NULL);
        if (it) {
            assert_true(intact(it, key, nkey, k));
            found++;
            bytes += ITEM_HEADER + it->nkey + it->nbytes;
        }
        store_unlock(st, hv);
    }
    store_stats(st, &s);
    assert_int_equal(s.curr_items, found);
    assert_int_equal(s.bytes, bytes);
    assert_true(s.bytes <= mb << 20);
    uint64_t cls_items = 0;
    for (int i = 1; i <= store_class_count(st); i++) {
        struct store_class_stats cs;
        store_class_stats(st, i, &cs);
        cls_items += cs.curr_items;
    }
    assert_int_equal(cls_items, found);
    store_destroy(&st);
    return fails;
}

static int secs(void)
{
    const char *e = getenv("SHOAL_STRESS_SECONDS");
    return e && atoi(e) > 0 ? atoi(e) : 3;
}

/* Allocation failures are allowed here: a run needs contiguous segments that quota'd pools may
 * hold, and a one-segment quota can be all pinned by in-flight items (see the report). */
static void test_stress_m4_runs_and_quota_churn(void **state)
{
    (void)state;
    run(4, secs(), true);
}

static void test_stress_m16_runs_and_quota_churn(void **state)
{
    (void)state;
    run(16, secs(), true);
}

/* Without runs and with fixed quotas of a quarter of memory, a store that fits never fails. */
static void test_stress_m4_steady_never_fails(void **state)
{
    (void)state;
    assert_int_equal(run(4, secs(), false), 0);
}

/* ---- the quota'd pool's runs, concurrently (the livelock of branch ns8) -------------------- */

#define RUN_WORKERS 4

struct rargs {
    struct store *st;
    unsigned seed;
    volatile int *stop;
    uint64_t ops; /* allocations finished (relaxed atomic: the watchdog reads it) */
    double slowest; /* seconds, the longest allocation */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct item *timed_alloc(struct rargs *a, const char *key, size_t nkey, size_t len)
{
    double t0 = now_s();
    struct item *it = store_alloc(a->st, 2, key, nkey, len, 0);
    double took = now_s() - t0;
    if (took > a->slowest) a->slowest = took;
    return it;
}

/* Stores into namespace 2 only, most of them items of 100-220 KB (runs of one or two segments
 * at -m 4 and -m 16), the rest small: every allocation beyond the quota makes its run of the
 * pool's own segments, or empties one of them for a head, concurrently with the others. */
static void *run_worker(void *p)
{
    struct rargs *a = p;
    char key[32];
    while (!__atomic_load_n(a->stop, __ATOMIC_RELAXED)) {
        int k = 3 * (int)(rand_r(&a->seed) % (NKEYS / 3)) + 2; /* namespace 2's keys */
        size_t nkey = (size_t)mkkey(key, sizeof key, k);
        uint64_t hv = store_hash(key, nkey);
        uint32_t now = clock_now();
        size_t len = rand_r(&a->seed) % 4 ? 100000 + rand_r(&a->seed) % 120000
                                          : 1000 + rand_r(&a->seed) % 30000;
        bool locked = rand_r(&a->seed) % 2;
        struct item *it = NULL;
        if (!locked && (it = timed_alloc(a, key, nkey, len)) != NULL) fill(it, k, 0);
        store_lock(a->st, hv);
        struct item *old = store_find(a->st, hv, key, nkey, now, NULL);
        if (locked && (it = timed_alloc(a, key, nkey, len)) != NULL) fill(it, k, 0);
        if (it && old) store_replace(a->st, hv, old, it, now);
        else if (it && !store_link(a->st, hv, it, now)) store_free(a->st, it);
        store_unlock(a->st, hv);
        __atomic_fetch_add(&a->ops, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Run the workers for `seconds` with namespace 2's quota `quota_segs` segments: every worker
 * must finish an allocation at least every 10 s (an allocation that spins fails the test, where
 * the old code hung CI), and all must stop within 10 s of being asked to. */
static void quota_runs(uint64_t mb, uint32_t quota_segs, int seconds)
{
    struct store *st = mk(mb);
    uint64_t seg = store_page_size(st);
    store_ns_configure(st, 2, quota_segs * seg, STORE_POLICY_LFU);
    /* a full store: the default namespace holds the rest, so that free segments run out */
    char key[32];
    for (int k = 0; k < NKEYS; k += 3) {
        size_t nkey = (size_t)mkkey(key, sizeof key, k);
        uint64_t hv = store_hash(key, nkey);
        struct item *it = store_alloc(st, 0, key, nkey, 4000, 0);
        if (!it) continue;
        fill(it, k, 0);
        store_lock(st, hv);
        if (!store_link(st, hv, it, clock_now())) store_free(st, it);
        store_unlock(st, hv);
    }
    volatile int stop = 0;
    struct rargs a[RUN_WORKERS];
    pthread_t th[RUN_WORKERS];
    for (int i = 0; i < RUN_WORKERS; i++) {
        a[i] = (struct rargs){.st = st, .seed = 1234u + (unsigned)i, .stop = &stop};
        assert_int_equal(pthread_create(&th[i], NULL, run_worker, &a[i]), 0);
    }
    uint64_t seen[RUN_WORKERS] = {0};
    int still[RUN_WORKERS] = {0}; /* seconds without a finished allocation */
    for (int t = 0; t < seconds * 10; t++) {
        nap_ms(100);
        if (t % 10 != 9) continue;
        for (int i = 0; i < RUN_WORKERS; i++) {
            uint64_t ops = __atomic_load_n(&a[i].ops, __ATOMIC_RELAXED);
            still[i] = ops == seen[i] ? still[i] + 1 : 0;
            seen[i] = ops;
            if (still[i] >= 10)
                fail_msg("worker %d: no allocation finished for %d s (ops %llu)", i, still[i],
                         (unsigned long long)ops);
        }
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    uint64_t ops = 0;
    double slowest = 0;
    for (int i = 0; i < RUN_WORKERS; i++) {
        if (pthread_timedjoin_np(th[i], NULL, &dl) != 0)
            fail_msg("worker %d still allocating 10 s after the stop", i);
        ops += a[i].ops;
        if (a[i].slowest > slowest) slowest = a[i].slowest;
    }
    struct store_stats s;
    store_stats(st, &s);
    print_message("    %llu MB, quota %u segments: %llu allocations (slowest %.3f s), %llu "
                  "evictions, %llu moved\n",
                  (unsigned long long)mb, quota_segs, (unsigned long long)ops, slowest,
                  (unsigned long long)s.evictions, (unsigned long long)s.slab_pages_moved);
    assert_true(ops > 100);
    store_destroy(&st);
}

static void test_quota_runs_concurrent_m4_always_finish(void **state)
{
    (void)state;
    quota_runs(4, 8, secs());
    quota_runs(4, 4, secs());
}

static void test_quota_runs_concurrent_m16_always_finish(void **state)
{
    (void)state;
    quota_runs(16, 16, secs());
    quota_runs(16, 8, secs());
}

/* A watchdog for the whole binary: a thread spinning where the tests above cannot see it (a
 * join that never returns) must fail CI, not hang it. */
static void watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "test_seg_stress: watchdog: still running after its deadline\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
    _exit(2);
}

int main(void)
{
    clock_setup();
    signal(SIGALRM, watchdog);
    alarm((unsigned)(secs() * 12 + 120));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress_m4_runs_and_quota_churn),
        cmocka_unit_test(test_stress_m16_runs_and_quota_churn),
        cmocka_unit_test(test_stress_m4_steady_never_fails),
        cmocka_unit_test(test_quota_runs_concurrent_m4_always_finish),
        cmocka_unit_test(test_quota_runs_concurrent_m16_always_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
