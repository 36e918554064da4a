/* test_nodefigs.c — reading a shoal-node's /metrics text (common/nodefigs): node totals, each
 * namespace's series gathered under its name, series it does not know left alone, and a
 * missing total reported as -1 rather than 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/nodefigs.h"

static const char text[] =
    "# HELP shoal_node_curr_items items stored now\n"
    "# TYPE shoal_node_curr_items gauge\n"
    "shoal_node_curr_items 300\n"
    "shoal_node_curr_items_extra 7\n"
    "shoal_node_bytes 6090\n"
    "shoal_node_limit_maxbytes 67108864\n"
    "shoal_node_get_hits_total 41\n"
    "shoal_node_get_misses_total 9\n"
    "shoal_node_ns_get_hits_total{namespace=\"default\"} 1\n"
    "shoal_node_ns_get_hits_total{namespace=\"catalog\"} 40\n"
    "shoal_node_ns_get_misses_total{namespace=\"catalog\"} 8\n"
    "shoal_node_ns_sets_total{namespace=\"catalog\"} 200\n"
    "shoal_node_ns_deletes_total{namespace=\"catalog\"} 3\n"
    "shoal_node_ns_lease_wins_total{namespace=\"catalog\"} 99\n"
    "shoal_node_ns_quota_bytes{namespace=\"catalog\"} 8388608\n"
    "shoal_node_ns_memory_bytes{namespace=\"catalog\"} 262144\n"
    "shoal_node_ns_items{namespace=\"catalog\"} 200\n"
    "shoal_node_ns_bytes{namespace=\"catalog\"} 5000\n"
    "shoal_node_ns_items{namespace=\"broken\n";

static void test_totals_and_namespaces_are_read(void **state)
{
    struct nodefigs *f = malloc(sizeof *f);
    assert_non_null(f);
    nodefigs_parse(text, f);
    assert_true(f->items == 300 && f->bytes == 6090 && f->limit == 67108864);
    assert_true(f->hits == 41 && f->misses == 9);
    assert_true(f->version == -1); /* no such series: unknown, not 0 */
    assert_int_equal(f->nns, 2);   /* the unterminated label is skipped */
    assert_string_equal(f->ns[0].name, "default");
    assert_true(f->ns[0].hits == 1 && f->ns[0].sets == 0);
    const struct nodefigs_ns *c = &f->ns[1];
    assert_string_equal(c->name, "catalog");
    assert_true(c->hits == 40 && c->misses == 8 && c->sets == 200 && c->deletes == 3);
    assert_true(c->quota == 8388608 && c->memory == 262144 && c->items == 200 && c->bytes == 5000);
    free(f);
}

static void test_a_series_is_matched_by_its_whole_name(void **state)
{
    assert_true(nodefigs_metric(text, "shoal_node_curr_items") == 300);
    assert_true(nodefigs_metric(text, "shoal_node_curr") == -1);
    assert_true(nodefigs_metric("", "shoal_node_bytes") == -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_totals_and_namespaces_are_read),
        cmocka_unit_test(test_a_series_is_matched_by_its_whole_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
