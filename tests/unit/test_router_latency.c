/* test_router_latency.c — unit tests for the router's latency histograms (lathist.h): bucket
 * bounds, quantiles, sums over workers, the Prometheus summary text, and the per-pool and
 * per-namespace summaries scopestats renders from them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
#include "router/lathist.h"
#include "router/nodestats.h"
#include "router/scopestats.h"

static void test_buckets(void **state)
{
    assert_int_equal(lathist_bucket(0), 0);
    assert_int_equal(lathist_bucket(1), 0);
    assert_int_equal(lathist_bucket(2), 1);
    assert_int_equal(lathist_bucket(3), 1);
    assert_int_equal(lathist_bucket(127), 6);
    assert_int_equal(lathist_bucket(128), 7);
    assert_int_equal(lathist_bucket((1u << 23) - 1), 22);
    assert_int_equal(lathist_bucket(1u << 23), LATHIST_BUCKETS - 1);
    assert_int_equal(lathist_bucket(UINT64_MAX), LATHIST_BUCKETS - 1); /* slower: the last */
}

static void test_quantiles_and_sum(void **state)
{
    struct lathist a = {0}, b = {0}, acc = {0};
    assert_int_equal(lathist_quantile(&a, 0.5), 0); /* empty */
    for (int i = 0; i < 60; i++) lathist_record(&a, 10); /* [8, 16) */
    for (int i = 0; i < 35; i++) lathist_record(&b, 1000); /* [512, 1024) */
    for (int i = 0; i < 5; i++) lathist_record(&b, 100000); /* [65536, 131072) */
    lathist_add(&acc, &a);
    lathist_add(&acc, &b);
    assert_int_equal(lathist_count(&acc), 100);
    assert_int_equal(acc.sum_us, 60 * 10 + 35 * 1000 + 5 * 100000);
    assert_int_equal(lathist_quantile(&acc, 0.5), 16);
    assert_int_equal(lathist_quantile(&acc, 0.9), 1024);
    assert_int_equal(lathist_quantile(&acc, 0.99), 131072);
    assert_int_equal(lathist_quantile(&acc, 1.0), 131072);
    struct lathist slow = {0};
    lathist_record(&slow, 1ull << 40);
    assert_int_equal(lathist_quantile(&slow, 0.5), 1u << LATHIST_BUCKETS); /* the last bound */
}

static void test_render(void **state)
{
    struct lathist h = {0};
    lathist_record(&h, 3);
    lathist_record(&h, 5);
    struct buf out;
    buf_init(&out);
    lathist_render_head(&out, "x_us", "help text");
    lathist_render(&out, "x_us", "pool", "p", &h);
    buf_append(&out, "", 1);
    assert_string_equal(buf_start(&out), "# HELP x_us help text\n# TYPE x_us summary\n"
                                         "x_us{pool=\"p\",quantile=\"0.5\"} 8\n"
                                         "x_us{pool=\"p\",quantile=\"0.9\"} 8\n"
                                         "x_us{pool=\"p\",quantile=\"0.99\"} 8\n"
                                         "x_us_sum{pool=\"p\"} 8\nx_us_count{pool=\"p\"} 2\n");
    buf_release(&out);
}

static void test_scope_summaries(void **state)
{
    struct scopestats s;
    assert_int_equal(scopestats_init(&s, 2), 0);
    struct nodestats nodes;
    nodestats_init(&nodes, 2);
    struct topo_pool pools[2] = {{.name = "main"}, {.name = "slow"}};
    struct topo_ns ns[2] = {{.name = "default"}, {.name = "s", .pool = 1}};
    struct topo t = {.version = 1, .npools = 2, .nns = 2, .pools = pools, .ns = ns,
                     .gutter_pool = -1};
    for (int i = 0; i < 3; i++) scopestat_latency(&s, 0, 1, -1, 80000); /* [65536, 131072) */
    for (int i = 0; i < 2; i++) scopestat_latency(&s, 1, 1, 1, 90000);
    scopestat_latency(&s, 1, 0, 0, 100);
    scopestat_latency(&s, 0, TOPO_POOLS_MAX, SCOPESTATS_NS_MAX, 1); /* out of range: ignored */
    struct buf out;
    buf_init(&out);
    scopestats_render(&s, &t, &nodes, &out);
    buf_append(&out, "", 1);
    static const char *const want[] = {
        "# TYPE shoal_router_pool_latency_us summary\n",
        "shoal_router_pool_latency_us{pool=\"slow\",quantile=\"0.5\"} 131072\n",
        "shoal_router_pool_latency_us_count{pool=\"slow\"} 5\n",
        "shoal_router_pool_latency_us_sum{pool=\"slow\"} 420000\n",
        "shoal_router_pool_latency_us{pool=\"main\",quantile=\"0.99\"} 128\n",
        "shoal_router_pool_latency_us_count{pool=\"main\"} 1\n",
        "# TYPE shoal_router_namespace_latency_us summary\n",
        "shoal_router_namespace_latency_us{namespace=\"s\",quantile=\"0.9\"} 131072\n",
        "shoal_router_namespace_latency_us_count{namespace=\"s\"} 2\n",
        "shoal_router_namespace_latency_us_count{namespace=\"default\"} 1\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (strstr(buf_start(&out), want[i]) == NULL) fail_msg("missing: %s", want[i]);
    buf_release(&out);
    nodestats_teardown(&nodes);
    scopestats_teardown(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_quantiles_and_sum),
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_scope_summaries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
