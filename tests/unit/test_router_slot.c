/* test_router_slot.c — unit tests for shoal-router's slots: CRC16-XMODEM against its check
 * value, hash tags (the Redis Cluster rule) and the default slot map of design.md. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/slot.h"

static void test_crc16_check_value(void **state)
{
    assert_int_equal(slot_crc16("123456789", 9), 0x31C3);
    assert_int_equal(slot_crc16("", 0), 0);
}

/* Redis Cluster uses the same function: these slots are from its specification. */
static void test_slots_match_redis_cluster(void **state)
{
    assert_int_equal(slot_of_key("foo", 3), 12182);
    assert_int_equal(slot_of_key("bar", 3), 5061);
    assert_int_equal(slot_of_key("123456789", 9), 0x31C3 % SLOT_COUNT);
}

static void test_hash_tag_rules(void **state)
{
    const char *h;
    size_t n;
    slot_hash_part("{u:42}:cart", 11, &h, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(h, "u:42", 4);
    assert_int_equal(slot_of_key("{u:42}:cart", 11), slot_of_key("{u:42}:profile", 14));
    assert_int_equal(slot_of_key("{u:42}:cart", 11), slot_of_key("u:42", 4));
    /* empty tag: the whole key */
    slot_hash_part("{}x", 3, &h, &n);
    assert_int_equal(n, 3);
    /* no closing brace: the whole key */
    slot_hash_part("a{bc", 4, &h, &n);
    assert_int_equal(n, 4);
    /* only the first { counts, up to the first } after it */
    slot_hash_part("x{a}{b}", 7, &h, &n);
    assert_int_equal(n, 1);
    assert_memory_equal(h, "a", 1);
    slot_hash_part("{{a}}", 5, &h, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(h, "{a", 2);
}

/* node i owns floor(i*16384/N) .. floor((i+1)*16384/N)-1, checked against the formula for
 * every slot and several N. */
static void test_default_owner_matches_the_ranges(void **state)
{
    uint32_t ns[] = {1, 2, 3, 5, 7, 100, 16384};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        uint32_t n = ns[k];
        for (uint32_t i = 0; i < n; i++) {
            uint32_t lo = (uint32_t)((uint64_t)i * SLOT_COUNT / n);
            uint32_t hi = (uint32_t)((uint64_t)(i + 1) * SLOT_COUNT / n);
            for (uint32_t s = lo; s < hi; s++) assert_int_equal(slot_default_owner(s, n), i);
        }
    }
    assert_int_equal(slot_default_owner(5461, 3), 1);
    assert_int_equal(slot_default_owner(5460, 3), 0);
    assert_int_equal(slot_default_owner(16383, 3), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16_check_value),
        cmocka_unit_test(test_slots_match_redis_cluster),
        cmocka_unit_test(test_hash_tag_rules),
        cmocka_unit_test(test_default_owner_matches_the_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
