/* test_router_keep.c — unit tests for the bytes large requests keep for a moved-retry
 * (frag_keep, request.h): a reservation fits --moved-keep-max and --buffers-max or is refused
 * with nothing taken, it shows in the client-buffer budget, and it is given back whole when
 * the fragment gives its bytes up or is destroyed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/membudget.h"
#include "router/request.h"

static void test_keep_within_max_is_counted_in_both_budgets_and_given_back(void **state)
{
    struct membudget mb;
    membudget_init(&mb, 1 << 20);
    struct keepbudget kb = {.max = 300000, .mb = &mb};
    struct frag *f = frag_create(NULL, 0);
    assert_non_null(f);
    assert_true(frag_keep(f, &kb, 200000));
    assert_int_equal(kb.used, 200000);
    assert_int_equal(membudget_used(&mb), 200000);
    frag_unkeep(f);
    assert_int_equal(kb.used, 0);
    assert_int_equal(membudget_used(&mb), 0);
    frag_unkeep(f); /* twice: nothing more */
    assert_int_equal(kb.used, 0);
    frag_destroy(f);
}

static void test_keep_past_max_is_refused_with_nothing_taken(void **state)
{
    struct membudget mb;
    membudget_init(&mb, 1 << 20);
    struct keepbudget kb = {.max = 300000, .mb = &mb};
    struct frag *a = frag_create(NULL, 0), *b = frag_create(NULL, 1);
    assert_true(frag_keep(a, &kb, 200000));
    assert_false(frag_keep(b, &kb, 200000));
    assert_int_equal(kb.used, 200000);
    assert_int_equal(membudget_used(&mb), 200000);
    assert_int_equal(b->kept, 0);
    frag_destroy(a); /* destroying gives it back too */
    assert_int_equal(kb.used, 0);
    assert_int_equal(membudget_used(&mb), 0);
    assert_true(frag_keep(b, &kb, 200000));
    frag_destroy(b);
    assert_int_equal(kb.used, 0);
}

static void test_keep_past_buffers_max_is_refused(void **state)
{
    struct membudget mb;
    membudget_init(&mb, 1 << 20);
    struct keepbudget kb = {.max = 32 << 20, .mb = &mb};
    uint64_t clients = 0;
    membudget_account(&mb, &clients, (1 << 20) - 100000); /* the clients' own buffers */
    struct frag *f = frag_create(NULL, 0);
    assert_false(frag_keep(f, &kb, 200000));
    assert_int_equal(kb.used, 0);
    assert_int_equal(membudget_used(&mb), (1 << 20) - 100000);
    membudget_account(&mb, &clients, 0);
    assert_true(frag_keep(f, &kb, 200000));
    frag_destroy(f);
    assert_int_equal(membudget_used(&mb), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep_within_max_is_counted_in_both_budgets_and_given_back),
        cmocka_unit_test(test_keep_past_max_is_refused_with_nothing_taken),
        cmocka_unit_test(test_keep_past_buffers_max_is_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    request_pools_drain();
    return rc;
}
