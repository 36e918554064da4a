/* test_detail.c — unit tests for the `stats detail` prefix table (src/node/detail.h): what counts
 * under which prefix, keys without one, the bound on prefixes, clearing, the dump's format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
#include "node/detail.h"

static int setup(void **state)
{
    static struct detail d;
    detail_init(&d);
    *state = &d;
    return 0;
}

static int teardown(void **state)
{
    detail_teardown(*state);
    return 0;
}

/* The dump as a NUL-terminated string (caller frees the buf). */
static const char *dump(struct detail *d, struct buf *b)
{
    buf_init(b);
    assert_int_equal(detail_dump(d, b, 0, SIZE_MAX), DETAIL_BUCKETS);
    buf_append(b, "", 1);
    return buf_start(b);
}

#define REC(d, k, op, hit) detail_record((d), (k), strlen(k), (op), (hit))

static void test_counts_under_the_text_before_the_first_colon(void **state)
{
    struct detail *d = *state;
    REC(d, "ns:a:b", DETAIL_GET, true);
    REC(d, "ns:c", DETAIL_GET, false);
    REC(d, "ns:c", DETAIL_SET, false);
    REC(d, "ns:c", DETAIL_DEL, false);
    struct buf b;
    assert_string_equal(dump(d, &b), "PREFIX ns get 2 hit 1 set 1 del 1\r\n");
    buf_release(&b);
}

static void test_keys_without_a_colon_are_not_counted(void **state)
{
    struct detail *d = *state;
    REC(d, "plain", DETAIL_GET, true);
    struct buf b;
    assert_string_equal(dump(d, &b), "");
    buf_release(&b);
}

static void test_empty_prefix_counts(void **state)
{
    struct detail *d = *state;
    REC(d, ":x", DETAIL_SET, false);
    struct buf b;
    assert_string_equal(dump(d, &b), "PREFIX  get 0 hit 0 set 1 del 0\r\n");
    buf_release(&b);
}

static void test_prefixes_are_bounded(void **state)
{
    struct detail *d = *state;
    char key[32];
    for (int i = 0; i < DETAIL_PREFIX_MAX + 10; i++) {
        snprintf(key, sizeof key, "p%d:k", i);
        REC(d, key, DETAIL_GET, false);
    }
    assert_int_equal(d->count, DETAIL_PREFIX_MAX);
    assert_int_equal(d->dropped, 10);
    REC(d, "p0:again", DETAIL_GET, true); /* a known prefix still counts */
    assert_int_equal(d->dropped, 10);
}

static void test_clear_forgets_everything(void **state)
{
    struct detail *d = *state;
    REC(d, "a:1", DETAIL_GET, true);
    detail_clear(d);
    struct buf b;
    assert_string_equal(dump(d, &b), "");
    buf_release(&b);
    assert_int_equal(d->count, 0);
}

/* A dump in slices lists every prefix once, and each slice stops soon after its byte budget. */
static void test_dump_in_slices_lists_each_prefix_once(void **state)
{
    struct detail *d = *state;
    char key[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(key, sizeof key, "p%d:k", i);
        REC(d, key, DETAIL_SET, false);
    }
    struct buf whole, sliced;
    dump(d, &whole);
    buf_init(&sliced);
    int from = 0, slices = 0;
    while (from < DETAIL_BUCKETS) {
        size_t before = buf_used(&sliced);
        from = detail_dump(d, &sliced, from, 1024);
        assert_true(buf_used(&sliced) - before < 1024 + 64 * 64); /* a bucket past the budget */
        slices++;
    }
    buf_append(&sliced, "", 1);
    assert_true(slices > 10);
    assert_int_equal(buf_used(&sliced), buf_used(&whole));
    assert_string_equal(buf_start(&sliced), buf_start(&whole));
    buf_release(&whole);
    buf_release(&sliced);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_counts_under_the_text_before_the_first_colon, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_keys_without_a_colon_are_not_counted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_empty_prefix_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefixes_are_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clear_forgets_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dump_in_slices_lists_each_prefix_once, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
