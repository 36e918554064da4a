/* test_router_repairlog.c — unit tests for the router's repair log (src/router/repairlog.c):
 * distinct keys only, the bound and its overflow, taking keys out to replay them while new
 * ones come in, growth past the first allocation, and the delete line of a key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
#include "router/repairlog.h"

static enum repairlog_added add(struct repairlog *l, const char *key)
{
    return repairlog_add(l, key, strlen(key));
}

/* Does the batch hold exactly `keys` (in the order logged)? */
static void assert_batch(const struct repairlog_batch *b, const char **keys, uint32_t n)
{
    assert_int_equal(b->n, n);
    for (uint32_t i = 0; i < n; i++) {
        size_t nkey;
        const char *k = repairlog_key(b, i, &nkey);
        assert_int_equal(nkey, strlen(keys[i]));
        assert_memory_equal(k, keys[i], nkey);
    }
}

static void test_distinct_keys_in_order(void **state)
{
    struct repairlog l;
    repairlog_init(&l, 8);
    assert_true(repairlog_clean(&l));
    assert_int_equal(add(&l, "hot:a"), REPAIRLOG_ADDED);
    assert_int_equal(add(&l, "hot:b"), REPAIRLOG_ADDED);
    assert_int_equal(add(&l, "hot:a"), REPAIRLOG_KEPT); /* a hot key takes one entry */
    assert_int_equal(add(&l, "hot:ab"), REPAIRLOG_ADDED);
    assert_int_equal(add(&l, "hot:"), REPAIRLOG_ADDED);
    assert_int_equal(l.n, 4);
    assert_false(repairlog_clean(&l));
    struct repairlog_batch b;
    repairlog_take(&l, &b);
    const char *want[] = {"hot:a", "hot:b", "hot:ab", "hot:"};
    assert_batch(&b, want, 4);
    assert_true(repairlog_clean(&l)); /* taken out: the log is empty */
    /* keys logged while a batch is replayed are new entries, even ones in the batch */
    assert_int_equal(add(&l, "hot:a"), REPAIRLOG_ADDED);
    assert_int_equal(l.n, 1);
    repairlog_batch_free(&b);
    repairlog_free(&l);
}

static void test_bound_overflows(void **state)
{
    struct repairlog l;
    repairlog_init(&l, 3);
    assert_int_equal(add(&l, "k1"), REPAIRLOG_ADDED);
    assert_int_equal(add(&l, "k2"), REPAIRLOG_ADDED);
    assert_int_equal(add(&l, "k3"), REPAIRLOG_ADDED);
    assert_int_equal(add(&l, "k2"), REPAIRLOG_KEPT); /* held: no overflow */
    assert_int_equal(add(&l, "k4"), REPAIRLOG_OVERFLOW);
    assert_true(l.overflowed);
    assert_int_equal(l.n, 0); /* the keys are forgotten: the whole node is repaired */
    assert_false(repairlog_clean(&l));
    assert_int_equal(add(&l, "k5"), REPAIRLOG_KEPT); /* reported once */
    struct repairlog_batch b;
    repairlog_take(&l, &b);
    assert_int_equal(b.n, 0);
    assert_true(l.overflowed); /* taking keys does not clear the overflow */
    repairlog_batch_free(&b);
    repairlog_reset(&l); /* the node was flushed */
    assert_true(repairlog_clean(&l));
    assert_int_equal(add(&l, "k1"), REPAIRLOG_ADDED);
    repairlog_set_overflow(&l); /* the flush failed: retry it */
    assert_true(l.overflowed);
    assert_int_equal(l.n, 0);
    repairlog_free(&l);
}

static void test_zero_bound_always_overflows(void **state)
{
    struct repairlog l;
    repairlog_init(&l, 0);
    assert_int_equal(add(&l, "k"), REPAIRLOG_OVERFLOW);
    assert_true(l.overflowed);
    repairlog_free(&l);
    assert_true(repairlog_clean(&l));
}

/* Many keys: the array and index grow past their first size, every key is found again
 * (no duplicates), binary keys included, and the bound still holds. */
static void test_growth_and_lookup(void **state)
{
    struct repairlog l;
    repairlog_init(&l, 5000);
    char key[32];
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(key, sizeof key, "ns:%d", i);
        assert_int_equal(repairlog_add(&l, key, (size_t)n), REPAIRLOG_ADDED);
    }
    for (int i = 0; i < 5000; i += 7) {
        int n = snprintf(key, sizeof key, "ns:%d", i);
        assert_int_equal(repairlog_add(&l, key, (size_t)n), REPAIRLOG_KEPT);
    }
    const char bin[] = {'a', 0, ' ', '\n'};
    assert_int_equal(repairlog_add(&l, bin, sizeof bin), REPAIRLOG_OVERFLOW);
    repairlog_free(&l);

    repairlog_init(&l, 100);
    assert_int_equal(repairlog_add(&l, bin, sizeof bin), REPAIRLOG_ADDED);
    assert_int_equal(repairlog_add(&l, bin, 1), REPAIRLOG_ADDED); /* "a": another key */
    assert_int_equal(repairlog_add(&l, bin, sizeof bin), REPAIRLOG_KEPT);
    assert_int_equal(repairlog_add(&l, "", 0), REPAIRLOG_KEPT); /* not a key: ignored */
    assert_int_equal(l.n, 2);
    repairlog_free(&l);
}

static void test_delete_lines(void **state)
{
    struct buf b;
    buf_init(&b);
    assert_int_equal(repairlog_delete_line(&b, "hot:k1", 6), 0);
    const char bin[] = {'a', 0, ' ', (char)0xff};
    assert_int_equal(repairlog_delete_line(&b, bin, sizeof bin), 0);
    assert_int_equal(repairlog_delete_line(&b, "caf\xc3\xa9", 5), 0); /* UTF-8 is text */
    buf_append(&b, "", 1);
    assert_string_equal(buf_start(&b), "md hot:k1\r\nmd YQAg/w== b\r\nmd caf\xc3\xa9\r\n");
    buf_release(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distinct_keys_in_order),
        cmocka_unit_test(test_bound_overflows),
        cmocka_unit_test(test_zero_bound_always_overflows),
        cmocka_unit_test(test_growth_and_lookup),
        cmocka_unit_test(test_delete_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
