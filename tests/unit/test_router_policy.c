/* test_router_policy.c — unit tests for the router's namespace rules: default TTL for 0,
 * clamping to the maximum ("never" included), absolute times, expired values left alone, and
 * the token buckets of ops_per_sec and bytes_per_sec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
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
    /* an absolute time with more than max_ttl left is clamped to it, relative */
    assert_true(policy_ttl(&ns, NOW + 100000, NOW, &out));
    assert_int_equal(out, 3600);
}

#define DAYS(n) ((int64_t)(n) * 86400)

/* Absolute times (over 30 days): a rule that changes one writes a value meaning what it
 * decided; one that does not leaves it as sent, never as a relative TTL over 30 days (which
 * the node would read as a time in 1970: expired at once). */
static void test_absolute_times(void **state)
{
    const struct topo_ns rules[] = {{.default_ttl = 600}, {.max_ttl = 3600},
                                    {.default_ttl = 600, .max_ttl = 86400},
                                    {.max_ttl = DAYS(30)}};
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const struct topo_ns *ns = &rules[i];
        int64_t out = -7;
        assert_false(policy_ttl(ns, NOW - 5, NOW, &out));           /* past: expired */
        assert_false(policy_ttl(ns, DAYS(30) + 1, NOW, &out));     /* 1970: expired */
        assert_false(policy_ttl(ns, NOW + 100, NOW, &out));         /* near: within any max */
        assert_int_equal(out, -7);
        bool clamped = policy_ttl(ns, NOW + DAYS(60), NOW, &out); /* far future */
        if (ns->max_ttl == 0) {
            assert_false(clamped);
        } else {
            assert_true(clamped);
            assert_int_equal(out, ns->max_ttl);
            assert_true(out <= DAYS(30)); /* relative, as the node reads it */
        }
    }
    struct topo_ns wide = {.max_ttl = DAYS(30)};
    int64_t out = 0;
    assert_false(policy_ttl(&wide, NOW + DAYS(30), NOW, &out)); /* exactly max_ttl left */
    assert_true(policy_ttl(&wide, NOW + DAYS(30) + 1, NOW, &out));
    assert_int_equal(out, DAYS(30));
    /* the gutter's cap clamps an absolute time like max_ttl */
    struct topo_ns dflt = {.default_ttl = 600};
    assert_true(policy_ttl_capped(&dflt, 10, NOW + DAYS(60), NOW, &out));
    assert_int_equal(out, 10);
    assert_false(policy_ttl_capped(&dflt, 10, NOW + 5, NOW, &out));
}

/* A rule over 30 days (topo.c refuses one; the function must still not write a relative TTL
 * the node reads as absolute) is written as an absolute time. */
static void test_rule_over_30_days_written_absolute(void **state)
{
    struct topo_ns ns = {.default_ttl = DAYS(40), .max_ttl = DAYS(45)};
    int64_t out = 0;
    assert_true(policy_ttl(&ns, 0, NOW, &out));
    assert_int_equal(out, NOW + DAYS(40));
    assert_true(policy_ttl(&ns, NOW + DAYS(60), NOW, &out));
    assert_int_equal(out, NOW + DAYS(45));
    assert_false(policy_ttl(&ns, NOW + DAYS(44), NOW, &out));
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

/* A TTL left (a warm item's, for its fill) as a wire TTL: over 30 days it must be absolute. */
static void test_ttl_left_to_wire(void **state)
{
    assert_int_equal(policy_ttl_wire(-1, NOW), 0); /* never */
    assert_int_equal(policy_ttl_wire(0, NOW), 1);  /* its last second, not "never" */
    assert_int_equal(policy_ttl_wire(500, NOW), 500);
    assert_int_equal(policy_ttl_wire(DAYS(30), NOW), DAYS(30));
    assert_int_equal(policy_ttl_wire(DAYS(60), NOW), NOW + DAYS(60));
    assert_int_equal(policy_ttl_left(policy_ttl_wire(DAYS(60), NOW), NOW), DAYS(60));
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

static void test_bucket_takes_back_what_it_gave(void **state)
{
    struct topo_bucket b = {.rate = 10, .milli = 10 * 1000, .last_ms = 0};
    uint64_t t = 5000;
    for (int i = 0; i < 10; i++) assert_true(policy_take(&b, t, 1));
    assert_false(policy_take(&b, t, 1));
    policy_give(&b, 3); /* a request refused after taking them */
    int ok = 0;
    for (int i = 0; i < 5; i++) ok += policy_take(&b, t, 1);
    assert_int_equal(ok, 3);
    policy_give(&b, 50); /* never past a full bucket */
    ok = 0;
    for (int i = 0; i < 20; i++) ok += policy_take(&b, t, 1);
    assert_int_equal(ok, 10);
    struct topo_bucket none = {.rate = 0};
    policy_give(&none, 5);
    assert_int_equal(none.milli, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_rules_no_rewrite),
        cmocka_unit_test(test_default_applies_to_zero_only),
        cmocka_unit_test(test_max_clamps_long_and_never),
        cmocka_unit_test(test_default_then_max),
        cmocka_unit_test(test_absolute_times),
        cmocka_unit_test(test_rule_over_30_days_written_absolute),
        cmocka_unit_test(test_ttl_left_to_wire),
        cmocka_unit_test(test_bucket_admits_its_rate_per_second),
        cmocka_unit_test(test_bucket_takes_back_what_it_gave),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
