/* test_lease.c — unit tests for the per-key lease memory (src/node/lease.h): the lease_period
 * window, wins in flight until filled or timed out, tokens, full buckets, threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "node/lease.h"

static int setup(void **state)
{
    *state = lease_table_create(1024);
    return *state ? 0 : -1;
}

static int teardown(void **state)
{
    struct lease_table *t = *state;
    lease_table_destroy(&t);
    assert_null(t);
    return 0;
}

static void test_unknown_key_may_win(void **state)
{
    struct lease_table *t = *state;
    uint64_t until = 42;
    assert_true(lease_may_win(t, 0x1234, 1000, &until));
    assert_int_equal(until, 42); /* untouched when nothing blocks */
}

static void test_period_blocks_until_it_ends(void **state)
{
    struct lease_table *t = *state;
    assert_true(lease_record_win(t, 7, 100, 1000, 2000, 0));
    uint64_t until = 0;
    assert_false(lease_may_win(t, 7, 1000, &until));
    assert_int_equal(until, 3000);
    assert_false(lease_may_win(t, 7, 2999, NULL));
    assert_true(lease_may_win(t, 7, 3000, NULL));
    assert_true(lease_may_win(t, 8, 1000, NULL)); /* another key is not affected */
}

static void test_fill_ends_the_period_not(void **state)
{
    struct lease_table *t = *state;
    lease_record_win(t, 7, 100, 1000, 2000, 5000);
    lease_filled(t, 7, 100);
    uint64_t until = 0;
    assert_false(lease_may_win(t, 7, 1500, &until));
    assert_int_equal(until, 3000); /* the period still runs after the fill */
    assert_true(lease_may_win(t, 7, 3000, NULL));
}

static void test_in_flight_until_filled(void **state)
{
    struct lease_table *t = *state;
    lease_record_win(t, 9, 555, 1000, 0, 30000);
    uint64_t until = 0;
    assert_false(lease_may_win(t, 9, 1001, &until));
    assert_int_equal(until, 31000);
    lease_filled(t, 9, 554); /* not the holder's token: nothing changes */
    assert_false(lease_may_win(t, 9, 1002, NULL));
    lease_filled(t, 9, 555);
    assert_true(lease_may_win(t, 9, 1002, NULL));
}

static void test_in_flight_times_out(void **state)
{
    struct lease_table *t = *state;
    lease_record_win(t, 9, 555, 1000, 0, 2000);
    assert_false(lease_may_win(t, 9, 2999, NULL));
    assert_true(lease_may_win(t, 9, 3000, NULL));
}

static void test_later_window_wins_until(void **state)
{
    struct lease_table *t = *state;
    uint64_t until = 0;
    lease_record_win(t, 11, 1, 0, 10000, 3000);
    assert_false(lease_may_win(t, 11, 1, &until));
    assert_int_equal(until, 10000);
    lease_record_win(t, 12, 1, 0, 3000, 10000);
    assert_false(lease_may_win(t, 12, 1, &until));
    assert_int_equal(until, 10000);
}

/* More blocking keys than the table holds: the oldest windows give way, newer ones stay, and
 * the call says when it had to drop a blocking entry. */
static void test_full_table_drops_soonest_ending(void **state)
{
    (void)state;
    struct lease_table *t = lease_table_create(64);
    int dropped = 0;
    for (uint64_t k = 1; k <= 1000; k++)
        if (!lease_record_win(t, k * 0x9E3779B97F4A7C15ull, k, k, 100000, 0)) dropped++;
    assert_true(dropped >= 1000 - 64);
    assert_true(dropped < 1000);
    /* the last key recorded always blocks; an entry whose window ended is reused silently */
    assert_false(lease_may_win(t, 1000 * 0x9E3779B97F4A7C15ull, 2000, NULL));
    struct lease_table *u = lease_table_create(64);
    for (uint64_t k = 1; k <= 1000; k++)
        assert_true(lease_record_win(u, k * 0x9E3779B97F4A7C15ull, k, k * 10, 5, 0));
    lease_table_destroy(&u);
    lease_table_destroy(&t);
}

/* Many threads on distinct keys sharing buckets: no crash, every key sees its own window. */
struct worker_arg {
    struct lease_table *t;
    uint64_t base;
    int bad;
};

static void *worker(void *p)
{
    struct worker_arg *a = p;
    for (uint64_t i = 0; i < 20000; i++) {
        uint64_t hv = (a->base + i % 16) * 0xC2B2AE3D27D4EB4Full;
        uint64_t now = i * 10;
        if (lease_may_win(a->t, hv, now, NULL)) lease_record_win(a->t, hv, i, now, 50, 0);
        else if (lease_may_win(a->t, hv, now + 50, NULL) == false) a->bad++;
    }
    return NULL;
}

static void test_threads(void **state)
{
    struct lease_table *t = *state;
    pthread_t th[4];
    struct worker_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct worker_arg){t, (uint64_t)(i + 1) * 1000, 0};
        pthread_create(&th[i], NULL, worker, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unknown_key_may_win, setup, teardown),
        cmocka_unit_test_setup_teardown(test_period_blocks_until_it_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill_ends_the_period_not, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_flight_until_filled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_flight_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_later_window_wins_until, setup, teardown),
        cmocka_unit_test(test_full_table_drops_soonest_ending),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
