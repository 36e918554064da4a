/* test_router_policy.c — unit tests for the router's namespace rules: default TTL for 0,
 * clamping to the maximum ("never" included), absolute times, expired values left alone, and
 * the token buckets of ops_per_sec and bytes_per_sec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "router/policy.h"

#define NOW 1800000000LL /* a unix time */

static void test_no_rules_no_rewrite(void **state)
{
    struct topo_ns ns = {.default_ttl = 0, .max_ttl = 0};
    int64_t out = -7;
    assert_false(policy_ttl(&ns, 0, NOW, &out));
    assert_false(policy_ttl(&ns, 999999, NOW, &out));
    assert_int_equal(out, -7);
}

static void test_default_applies_to_zero_only(void **state)
{
    struct topo_ns ns = {.default_ttl = 600};
    int64_t out = 0;
    assert_true(policy_ttl(&ns, 0, NOW, &out));
    assert_int_equal(out, 600);
    assert_false(policy_ttl(&ns, 100, NOW, &out)); /* a TTL the client chose stands */
    assert_false(policy_ttl(&ns, -1, NOW, &out)); /* already expired stays expired */
}

static void test_max_clamps_long_and_never(void **state)
{
    struct topo_ns ns = {.max_ttl = 3600};
    int64_t out = 0;
    assert_true(policy_ttl(&ns, 0, NOW, &out));
    assert_int_equal(out, 3600);
    assert_true(policy_ttl(&ns, 7200, NOW, &out));
    assert_int_equal(out, 3600);
    assert_false(policy_ttl(&ns, 3600, NOW, &out));
    assert_false(policy_ttl(&ns, 60, NOW, &out));
    /* absolute times: converted to relative, then clamped */
    assert_true(policy_ttl(&ns, NOW + 100000, NOW, &out));
    assert_int_equal(out, 3600);
    assert_true(policy_ttl(&ns, NOW + 100, NOW, &out));
    assert_int_equal(out, 100);
    assert_false(policy_ttl(&ns, NOW - 5, NOW, &out)); /* a past absolute time: expired */
}

static void test_default_then_max(void **state)
{
    struct topo_ns ns = {.default_ttl = 600, .max_ttl = 86400};
    int64_t out = 0;
    assert_true(policy_ttl(&ns, 0, NOW, &out));
    assert_int_equal(out, 600);
    assert_true(policy_ttl(&ns, 2592000, NOW, &out));
    assert_int_equal(out, 86400);
}

static void test_bucket_admits_its_rate_per_second(void **state)
{
    struct topo_bucket b = {.rate = 10, .milli = 10 * 1000, .last_ms = 0};
    uint64_t t = 5000;
    int ok = 0;
    for (int i = 0; i < 15; i++) ok += policy_take(&b, t, 1);
    assert_int_equal(ok, 10); /* a full bucket holds one second's worth */
    assert_false(policy_take(&b, t, 1));
    assert_true(policy_take(&b, t + 100, 1)); /* 100 ms refill one token */
    assert_false(policy_take(&b, t + 100, 1));
    ok = 0;
    for (int i = 0; i < 50; i++) ok += policy_take(&b, t + 100000, 1); /* long idle: full, no more */
    assert_int_equal(ok, 10);
    struct topo_bucket none = {.rate = 0};
    assert_true(policy_take(&none, t, 1000000));
    struct topo_bucket bytes = {.rate = 1000, .milli = 1000 * 1000};
    assert_true(policy_take(&bytes, t, 600));
    assert_false(policy_take(&bytes, t, 600)); /* nothing taken on refusal */
    assert_true(policy_take(&bytes, t, 400));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_rules_no_rewrite),
        cmocka_unit_test(test_default_applies_to_zero_only),
        cmocka_unit_test(test_max_clamps_long_and_never),
        cmocka_unit_test(test_default_then_max),
        cmocka_unit_test(test_bucket_admits_its_rate_per_second),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
