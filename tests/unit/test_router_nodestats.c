/* test_router_nodestats.c — unit tests for the router's per-node figures: entries by address,
 * per-worker slots summed, whether a node is down, latency quantiles from power-of-two buckets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
#include "router/nodestats.h"

static void test_entries_sum_and_render(void **state)
{
    struct nodestats s;
    nodestats_init(&s, 2);
    struct nodestat *a = nodestats_get(&s, "127.0.0.1:1");
    assert_non_null(a);
    assert_ptr_equal(nodestats_get(&s, "127.0.0.1:1"), a); /* one entry per address */
    NODESTAT_ADD(a->slots[0].requests, 3);
    NODESTAT_ADD(a->slots[1].requests, 4);
    NODESTAT_ADD(a->slots[1].down, 1);
    for (int i = 0; i < 98; i++) lathist_record(&a->slots[0].lat, 100); /* bucket [64, 128) */
    lathist_record(&a->slots[1].lat, 5000);                             /* [4096, 8192) */
    lathist_record(&a->slots[1].lat, 0);
    struct buf out;
    buf_init(&out);
    nodestats_render(&s, &out);
    buf_append(&out, "", 1);
    const char *t = buf_start(&out);
    assert_non_null(strstr(t, "shoal_router_node_requests{node=\"127.0.0.1:1\"} 7\n"));
    assert_non_null(strstr(t, "shoal_router_node_down{node=\"127.0.0.1:1\"} 1\n"));
    assert_non_null(strstr(t, "shoal_router_node_latency_us{node=\"127.0.0.1:1\",quantile=\"0.5\"} 128\n"));
    assert_non_null(strstr(t, "shoal_router_node_latency_us{node=\"127.0.0.1:1\",quantile=\"0.99\"} 8192\n"));
    assert_non_null(strstr(t, "# TYPE shoal_router_node_latency_us summary\n"));
    assert_non_null(strstr(t, "shoal_router_node_latency_us_sum{node=\"127.0.0.1:1\"} 14800\n"));
    assert_non_null(strstr(t, "shoal_router_node_latency_us_count{node=\"127.0.0.1:1\"} 100\n"));
    buf_release(&out);
    assert_true(nodestats_is_down(&s, "127.0.0.1:1")); /* one worker has it down */
    NODESTAT_ADD(a->slots[1].down, -1);
    assert_false(nodestats_is_down(&s, "127.0.0.1:1"));
    assert_false(nodestats_is_down(&s, "127.0.0.1:2")); /* never used */
    nodestats_teardown(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entries_sum_and_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
