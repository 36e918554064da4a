/* test_control_lease.c — unit tests for shoal-control's slot lease table (issue 15, C3): a node
 * is lapsed exactly from its last grant + L + margin (L/20 + 100 ms), never before; a node never
 * granted is lapsed unless a takeover time covers it; a takeover counts for every node but
 * never shortens a later grant; the listing shows ages and lapsed flags. Renewals are judged by
 * the published view (listed nodes, its version); a promotion begins only over a lapsed lease
 * and, until it ends, refuses the node's renewals, so none names a version older than it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/lease.h"

static void test_margin_is_a_twentieth_plus_100ms(void **state)
{
    assert_int_equal(lease_margin_ms(2000), 200);
    assert_int_equal(lease_margin_ms(1000), 150);
    assert_int_equal(lease_margin_ms(100), 105);
}

static void test_lapsed_exactly_at_grant_plus_lease_plus_margin(void **state)
{
    struct lease_table *t = lease_table_new(2000);
    assert_non_null(t);
    assert_int_equal(lease_grant(t, "10.0.0.1:11211", 50000), 0);
    assert_false(lease_lapsed(t, "10.0.0.1:11211", 50000));
    assert_false(lease_lapsed(t, "10.0.0.1:11211", 50000 + 2000 + 200 - 1));
    assert_true(lease_lapsed(t, "10.0.0.1:11211", 50000 + 2000 + 200));
    /* a renewal starts the count again */
    assert_int_equal(lease_grant(t, "10.0.0.1:11211", 51000), 0);
    assert_false(lease_lapsed(t, "10.0.0.1:11211", 50000 + 2000 + 200));
    assert_true(lease_lapsed(t, "10.0.0.1:11211", 51000 + 2200));
    lease_table_free(&t);
    assert_null(t);
}

static void test_never_granted_is_lapsed_without_takeover(void **state)
{
    struct lease_table *t = lease_table_new(2000);
    assert_true(lease_lapsed(t, "10.0.0.9:1", 1));
    assert_true(lease_lapsed(t, "10.0.0.9:1", 1000000));
    assert_int_equal(lease_age_ms(t, "10.0.0.9:1", 5), -1);
    lease_table_free(&t);
}

static void test_takeover_counts_every_node_as_granted_then(void **state)
{
    struct lease_table *t = lease_table_new(1000);
    lease_takeover(t, 70000);
    assert_false(lease_lapsed(t, "never:1", 70000 + 1149));
    assert_true(lease_lapsed(t, "never:1", 70000 + 1150));
    assert_int_equal(lease_age_ms(t, "never:1", 70400), 400);
    /* an older grant than the takeover counts from the takeover */
    lease_grant(t, "old:1", 60000);
    assert_false(lease_lapsed(t, "old:1", 70000 + 1000));
    /* a later grant counts from itself */
    lease_grant(t, "new:1", 71000);
    assert_false(lease_lapsed(t, "new:1", 70000 + 1150));
    assert_true(lease_lapsed(t, "new:1", 71000 + 1150));
    lease_table_free(&t);
}

static void test_nodes_are_independent(void **state)
{
    struct lease_table *t = lease_table_new(500);
    lease_grant(t, "a:1", 1000);
    lease_grant(t, "b:1", 2000);
    assert_true(lease_lapsed(t, "a:1", 1000 + 625));
    assert_false(lease_lapsed(t, "b:1", 1000 + 625));
    assert_true(lease_lapsed(t, "c:1", 1000));
    lease_table_free(&t);
}

static void test_list_shows_pool_nodes_and_granted_ones(void **state)
{
    struct lease_table *t = lease_table_new(1000);
    lease_grant(t, "a:1", 1000);
    lease_grant(t, "gone:1", 1000);
    json_t *nodes = json_pack("[s,s]", "a:1", "never:1");
    json_t *l = lease_list(t, nodes, 1300);
    assert_non_null(l);
    assert_int_equal(json_object_size(l), 3);
    json_t *a = json_object_get(l, "a:1");
    assert_int_equal(json_integer_value(json_object_get(a, "age_ms")), 300);
    assert_true(json_is_false(json_object_get(a, "lapsed")));
    json_t *never = json_object_get(l, "never:1");
    assert_true(json_is_null(json_object_get(never, "age_ms")));
    assert_true(json_is_true(json_object_get(never, "lapsed")));
    assert_non_null(json_object_get(l, "gone:1"));
    json_decref(l);
    json_decref(nodes);
    lease_table_free(&t);
}

/* {"version": v, "pools": {"main": {"nodes": [{"node": a}, ...]}}}: what lease_publish reads */
static json_t *view(uint64_t v, const char *a, const char *b)
{
    return json_pack("{s:I,s:{s:{s:[{s:s},{s:s}]}}}", "version", (json_int_t)v, "pools", "main",
                     "nodes", "node", a, "node", b);
}

static void test_renew_grants_listed_nodes_naming_the_published_version(void **state)
{
    struct lease_table *t = lease_table_new(1000);
    uint64_t v = 99;
    assert_int_equal(lease_renew(t, "a:1", 1000, &v), LEASE_UNLISTED); /* nothing published */
    json_t *m = view(7, "a:1", "b:1");
    assert_int_equal(lease_publish(t, m), 0);
    json_decref(m);
    assert_int_equal(lease_version(t), 7);
    assert_int_equal(lease_renew(t, "a:1", 1000, &v), 0);
    assert_int_equal(v, 7);
    assert_false(lease_lapsed(t, "a:1", 1000 + 1149));
    assert_int_equal(lease_renew(t, "c:1", 1000, &v), LEASE_UNLISTED);
    assert_int_equal(lease_age_ms(t, "c:1", 1000), -1); /* an unlisted renewal records nothing */
    json_t *l = lease_listed(t);
    assert_int_equal(json_array_size(l), 2);
    json_decref(l);
    lease_table_free(&t);
}

static void test_promotion_begins_only_over_a_lapsed_lease(void **state)
{
    struct lease_table *t = lease_table_new(1000);
    json_t *m = view(3, "a:1", "b:1");
    lease_publish(t, m);
    json_decref(m);
    uint64_t v;
    assert_int_equal(lease_renew(t, "a:1", 5000, &v), 0);
    assert_false(lease_promote_begin(t, "a:1", 5000 + 1149)); /* renewed: stays primary */
    assert_int_equal(lease_renew(t, "a:1", 5000 + 1149, &v), 0); /* and nothing was marked */
    assert_true(lease_promote_begin(t, "a:1", 5000 + 1149 + 1150));
    lease_promote_end(t, "a:1");
    lease_table_free(&t);
}

static void test_renewals_are_refused_between_promotion_begin_and_end(void **state)
{
    struct lease_table *t = lease_table_new(1000);
    json_t *m = view(3, "a:1", "b:1");
    lease_publish(t, m);
    json_decref(m);
    uint64_t v;
    assert_true(lease_promote_begin(t, "a:1", 10000)); /* never granted: lapsed */
    assert_int_equal(lease_renew(t, "a:1", 10001, &v), LEASE_PROMOTING);
    assert_true(lease_lapsed(t, "a:1", 10001)); /* the refusal granted nothing */
    assert_int_equal(lease_renew(t, "b:1", 10001, &v), 0); /* others renew as ever */
    assert_int_equal(v, 3);
    /* the promotion's version is installed and published, then the promotion ends */
    m = view(4, "a:1", "b:1");
    lease_publish(t, m);
    json_decref(m);
    assert_int_equal(lease_renew(t, "a:1", 10002, &v), LEASE_PROMOTING);
    lease_promote_end(t, "a:1");
    assert_int_equal(lease_renew(t, "a:1", 10003, &v), 0);
    assert_int_equal(v, 4); /* names the promotion's version: the node fences until it has it */
    lease_table_free(&t);
}

static void test_two_promotions_over_one_node_refuse_until_both_end(void **state)
{
    struct lease_table *t = lease_table_new(1000);
    json_t *m = view(3, "a:1", "b:1");
    lease_publish(t, m);
    json_decref(m);
    uint64_t v;
    assert_true(lease_promote_begin(t, "a:1", 10000));
    assert_true(lease_promote_begin(t, "a:1", 10000));
    lease_promote_end(t, "a:1");
    assert_int_equal(lease_renew(t, "a:1", 10001, &v), LEASE_PROMOTING);
    lease_promote_end(t, "a:1");
    assert_int_equal(lease_renew(t, "a:1", 10002, &v), 0);
    lease_table_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_margin_is_a_twentieth_plus_100ms),
        cmocka_unit_test(test_lapsed_exactly_at_grant_plus_lease_plus_margin),
        cmocka_unit_test(test_never_granted_is_lapsed_without_takeover),
        cmocka_unit_test(test_takeover_counts_every_node_as_granted_then),
        cmocka_unit_test(test_nodes_are_independent),
        cmocka_unit_test(test_list_shows_pool_nodes_and_granted_ones),
        cmocka_unit_test(test_renew_grants_listed_nodes_naming_the_published_version),
        cmocka_unit_test(test_promotion_begins_only_over_a_lapsed_lease),
        cmocka_unit_test(test_renewals_are_refused_between_promotion_begin_and_end),
        cmocka_unit_test(test_two_promotions_over_one_node_refuse_until_both_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
