/* test_router_replaycut.c — unit tests for where a promotion's delete replay starts
 * (router/replaycut.h): the new primary's `stats repl` stamp for the dead primary is found
 * (and only that primary's), the cutoff is the stamp less the margin moved onto the workers'
 * monotonic clock, no stamp means the whole window, and the promoted slots are grouped per
 * (dead primary, new primary). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "router/dellog.h"
#include "router/replaycut.h"

static const char reply[] = "STAT repl_enabled 1\r\n"
                            "STAT primary:0:node 10.0.0.1:11211\r\n"
                            "STAT primary:0:replid 00112233aabbccdd\r\n"
                            "STAT primary:0:applied 100\r\n"
                            "STAT primary:0:applied_wall_ms 1000\r\n"
                            "STAT primary:0:state online\r\n"
                            "STAT primary:1:node 10.0.0.2:11211\r\n"
                            "STAT primary:1:applied 7\r\n"
                            "STAT primary:1:applied_wall_ms 2000\r\n"
                            "STAT primary:1:state down\r\n"
                            "STAT primary:2:node 10.0.0.3:11211\r\n"
                            "STAT primary:2:applied_wall_ms 0\r\n"
                            "END\r\n";

static void test_stamp_of_the_named_primary_only(void **state)
{
    (void)state;
    uint64_t w = 0;
    assert_int_equal(replaycut_parse(reply, strlen(reply), "10.0.0.2:11211", &w), 0);
    assert_int_equal(w, 2000);
    assert_int_equal(replaycut_parse(reply, strlen(reply), "10.0.0.1:11211", &w), 0);
    assert_int_equal(w, 1000);
    /* unknown primary, a zero stamp (never stamped), an older node without the field */
    assert_int_equal(replaycut_parse(reply, strlen(reply), "10.0.0.9:11211", &w), -1);
    assert_int_equal(replaycut_parse(reply, strlen(reply), "10.0.0.3:11211", &w), -1);
    const char old[] = "STAT primary:0:node 10.0.0.1:11211\r\nSTAT primary:0:applied 5\r\nEND\r\n";
    assert_int_equal(replaycut_parse(old, strlen(old), "10.0.0.1:11211", &w), -1);
    const char junk[] = "STAT primary:0:node 10.0.0.1:11211\r\nSTAT primary:0:applied_wall_ms 12x\r\n";
    assert_int_equal(replaycut_parse(junk, strlen(junk), "10.0.0.1:11211", &w), -1);
}

static void test_cutoff_is_stamp_less_margin_on_the_monotonic_clock(void **state)
{
    (void)state;
    /* wall now 100,000; stamp 99,500 (applied up to 0.5 s ago); margin 1 s: deletes of the
     * last 1.5 s, i.e. since monotonic 50,000 - 1,500 */
    assert_int_equal(replaycut_since(true, 99500, 1000, 100000, 50000), 48500);
    /* no stamp: 0, the whole window */
    assert_int_equal(replaycut_since(false, 99500, 1000, 100000, 50000), 0);
    /* a stamp in our future (skew beyond the margin): from now */
    assert_int_equal(replaycut_since(true, 200000, 1000, 100000, 50000), 50000);
    /* a stamp older than the monotonic clock's start: everything */
    assert_int_equal(replaycut_since(true, 10000, 1000, 100000, 50000), 0);
    /* the window stays the outer bound */
    assert_int_equal(dellog_cutoff(40000, 48500), 48500);
    assert_int_equal(dellog_cutoff(40000, 0), 40000);
}

static void test_promoted_slots_grouped_per_dead_and_new_primary(void **state)
{
    (void)state;
    json_t *old = json_loads(
        "{\"pools\":{\"p\":{\"slots\":["
        "{\"from\":0,\"to\":9,\"node\":\"a:1\",\"replica\":\"b:1\"},"
        "{\"from\":10,\"to\":19,\"node\":\"a:1\",\"replica\":\"c:1\"},"
        "{\"from\":20,\"to\":16383,\"node\":\"b:1\",\"replica\":\"c:1\"}]}}}", 0, NULL);
    json_t *now = json_loads(
        "{\"pools\":{\"p\":{\"slots\":["
        "{\"from\":0,\"to\":9,\"node\":\"b:1\",\"replica\":\"c:1\"},"
        "{\"from\":10,\"to\":19,\"node\":\"c:1\",\"replica\":\"b:1\"},"
        "{\"from\":20,\"to\":16383,\"node\":\"b:1\",\"replica\":\"c:1\"}]}}}", 0, NULL);
    assert_non_null(old);
    assert_non_null(now);
    uint16_t slots[] = {0, 5, 9, 10, 19};
    uint8_t group[5];
    const char *o[4], *n[4];
    assert_int_equal(replaycut_pairs(old, now, slots, 5, group, o, n, 4), 2);
    assert_int_equal(group[0], group[2]);
    assert_string_equal(o[group[0]], "a:1");
    assert_string_equal(n[group[0]], "b:1");
    assert_string_equal(n[group[3]], "c:1");
    assert_int_equal(group[3], group[4]);
    /* no room for a second pair: its slots are unknown (the whole window) */
    assert_int_equal(replaycut_pairs(old, now, slots, 5, group, o, n, 1), 1);
    assert_int_equal(group[3], REPLAYCUT_UNKNOWN);
    json_decref(old);
    json_decref(now);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stamp_of_the_named_primary_only),
        cmocka_unit_test(test_cutoff_is_stamp_less_margin_on_the_monotonic_clock),
        cmocka_unit_test(test_promoted_slots_grouped_per_dead_and_new_primary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
