/* test_promote.c — unit tests for promote_diff (common/promote.h): a slot is promoted when its
 * node in the new document was its replica in the old one (unless node and replica swapped: a
 * drain), per pool, each slot listed once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/promote.h"
#include "common/slot.h"

static json_t *doc(const char *text)
{
    json_error_t e;
    json_t *d = json_loads(text, 0, &e);
    assert_non_null(d);
    return d;
}

#define A "\"10.0.0.1:1\""
#define B "\"10.0.0.2:1\""
#define C "\"10.0.0.3:1\""

static const char *old_text =
    "{\"version\":1,\"pools\":{\"main\":{\"nodes\":[" A "," B "," C "],\"slots\":["
    "{\"from\":0,\"to\":5460,\"node\":" A ",\"replica\":" B "},"
    "{\"from\":5461,\"to\":10921,\"node\":" B ",\"replica\":" C "},"
    "{\"from\":10922,\"to\":16383,\"node\":" C ",\"replica\":" A "}]}}}";

static void test_replica_made_primary_is_promoted(void **state)
{
    /* A dies: its range goes to its replica B; the range where A was replica gets another */
    json_t *o = doc(old_text), *n = doc(
        "{\"version\":2,\"pools\":{\"main\":{\"nodes\":[" A "," B "," C "],\"slots\":["
        "{\"from\":0,\"to\":5460,\"node\":" B ",\"replica\":" C "},"
        "{\"from\":5461,\"to\":10921,\"node\":" B ",\"replica\":" C "},"
        "{\"from\":10922,\"to\":16383,\"node\":" C ",\"replica\":" B "}]}}}");
    uint16_t *out = malloc(SLOT_COUNT * sizeof *out);
    size_t k = promote_diff(o, n, NULL, out);
    assert_int_equal(k, 5461);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[5460], 5460);
    assert_int_equal(promote_diff(o, n, "main", out), 5461);
    assert_int_equal(promote_diff(o, n, "other", out), 0);
    /* the same document twice, or the way back (B's replica was C, not A): nothing */
    assert_int_equal(promote_diff(o, o, NULL, out), 0);
    assert_int_equal(promote_diff(n, o, NULL, out), 0);
    free(out);
    json_decref(o);
    json_decref(n);
}

static void test_split_ranges_and_a_swap(void **state)
{
    /* a drain swaps node and replica on part of a range (the new map splits it): a planned
     * switch after a handoff with no lag, not a promotion (nothing to replay); B's range goes
     * to its replica C with another replica (A), as after B's death: promoted */
    json_t *o = doc(old_text), *n = doc(
        "{\"version\":2,\"pools\":{\"main\":{\"nodes\":[" A "," B "," C "],\"slots\":["
        "{\"from\":0,\"to\":99,\"node\":" B ",\"replica\":" A "},"
        "{\"from\":100,\"to\":5460,\"node\":" A ",\"replica\":" B "},"
        "{\"from\":5461,\"to\":5470,\"node\":" C ",\"replica\":" A "},"
        "{\"from\":5471,\"to\":10921,\"node\":" A "},"
        "{\"from\":10922,\"to\":16383,\"node\":" C ",\"replica\":" A "}]}}}");
    uint16_t *out = malloc(SLOT_COUNT * sizeof *out);
    size_t k = promote_diff(o, n, NULL, out);
    assert_int_equal(k, 10); /* 5471-10921 went to A, which was not their replica */
    for (size_t i = 0; i < k; i++) assert_int_equal(out[i], 5461 + i);
    /* a swap without a new replica named is a promotion as any other */
    json_t *m = doc(
        "{\"version\":2,\"pools\":{\"main\":{\"nodes\":[" A "," B "," C "],\"slots\":["
        "{\"from\":0,\"to\":5460,\"node\":" B "},"
        "{\"from\":5461,\"to\":10921,\"node\":" B ",\"replica\":" C "},"
        "{\"from\":10922,\"to\":16383,\"node\":" C ",\"replica\":" A "}]}}}");
    assert_int_equal(promote_diff(o, m, NULL, out), 5461);
    free(out);
    json_decref(o);
    json_decref(n);
    json_decref(m);
}

static void test_pools_without_maps_or_replicas_and_bad_input(void **state)
{
    json_t *o = doc("{\"version\":1,\"pools\":{\"p\":{\"nodes\":[" A "," B "]},"
                    "\"q\":{\"nodes\":[" A "," B "],\"slots\":[{\"from\":0,\"to\":16383,"
                    "\"node\":" A "}]},"
                    "\"r\":{\"nodes\":[" A "," B "],\"slots\":[{\"from\":0,\"to\":9,"
                    "\"node\":" A ",\"replica\":" B "},{\"from\":10,\"to\":16383,\"node\":" A
                    "}]}}}");
    json_t *n = doc("{\"version\":2,\"pools\":{\"p\":{\"nodes\":[" B "]},"
                    "\"q\":{\"nodes\":[" A "," B "],\"slots\":[{\"from\":0,\"to\":16383,"
                    "\"node\":" B "}]},"
                    "\"r\":{\"nodes\":[" A "," B "],\"slots\":[{\"from\":0,\"to\":16383,"
                    "\"node\":" B "}]}}}");
    uint16_t *out = malloc(SLOT_COUNT * sizeof *out);
    /* p: no map; q: no replica named; r: slots 0-9 had B as replica */
    assert_int_equal(promote_diff(o, n, NULL, out), 10);
    assert_int_equal(out[9], 9);
    /* the same slot promoted in two pools is listed once */
    json_t *n2 = json_deep_copy(n);
    json_object_set_new(json_object_get(n2, "pools"), "q", json_deep_copy(json_object_get(
        json_object_get(n, "pools"), "r")));
    json_object_set_new(json_object_get(o, "pools"), "q", json_deep_copy(json_object_get(
        json_object_get(o, "pools"), "r")));
    assert_int_equal(promote_diff(o, n2, NULL, out), 10);
    assert_int_equal(promote_diff(NULL, n, NULL, out), 0);
    assert_int_equal(promote_diff(o, NULL, NULL, out), 0);
    json_t *junk = doc("{\"pools\":{\"r\":{\"slots\":[{\"from\":\"x\"},7,{\"from\":-5,\"to\":"
                       "99999,\"node\":" B "}]}}}");
    assert_int_equal(promote_diff(o, junk, NULL, out), 10);
    free(out);
    json_decref(o);
    json_decref(n);
    json_decref(n2);
    json_decref(junk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replica_made_primary_is_promoted),
        cmocka_unit_test(test_split_ranges_and_a_swap),
        cmocka_unit_test(test_pools_without_maps_or_replicas_and_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
