/* test_router_latency.c — unit tests for the router's latency histograms (lathist.h): bucket
 * bounds, quantiles, sums over workers, the Prometheus summary text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
#include "router/lathist.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_quantiles_and_sum),
        cmocka_unit_test(test_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
