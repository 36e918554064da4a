/* test_control_failover.c — unit tests for shoal-control's quorum rule (FAILOVER.md C4): a
 * node counts as reported down only when a strict majority of the fresh reports that list it
 * say down, and at least one does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "control/failover.h"

static void test_strict_majority_of_listing_routers(void **state)
{
    assert_true(failover_quorum_down(1, 1));
    assert_true(failover_quorum_down(2, 3));
    assert_true(failover_quorum_down(3, 5));
    assert_false(failover_quorum_down(1, 2)); /* a tie is not a majority */
    assert_false(failover_quorum_down(2, 4));
    assert_false(failover_quorum_down(1, 3));
}

static void test_no_report_is_no_quorum(void **state)
{
    assert_false(failover_quorum_down(0, 0));
    assert_false(failover_quorum_down(0, 5));
}

static void test_every_count_up_to_fifty(void **state)
{
    for (unsigned n = 0; n <= 50; n++)
        for (unsigned k = 0; k <= n; k++)
            assert_int_equal(failover_quorum_down(k, n), k >= 1 && k > n - k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strict_majority_of_listing_routers),
        cmocka_unit_test(test_no_report_is_no_quorum),
        cmocka_unit_test(test_every_count_up_to_fifty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
