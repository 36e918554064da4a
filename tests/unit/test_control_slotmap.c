/* test_control_slotmap.c — unit tests for shoal-control's slot maps (issue 13.3): every map is
 * within one slot of even and covers every slot; adding a node moves only the slots it takes
 * (floor(16384/(N+1)), within 1% of 1/(N+1)) and none between old nodes; removing a node moves
 * only its slots. Checked for many pool sizes and for long sequences of joins and leaves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/slotmap.h"

static uint16_t map[SLOT_COUNT], before[SLOT_COUNT];

static void test_even_map_is_design_default(void **state)
{
    for (uint32_t n = 1; n <= 300; n++) {
        slotmap_even(map, n);
        assert_int_equal(slotmap_check_even(map, n), 0);
        /* the exact rule: slot s belongs to the largest i with floor(i*16384/n) <= s */
        for (uint32_t s = 0; s < SLOT_COUNT; s += 31) {
            uint32_t i = map[s];
            assert_true((uint64_t)i * SLOT_COUNT / n <= s);
            assert_true((uint64_t)(i + 1) * SLOT_COUNT / n > s);
        }
    }
}

/* Adding node N to an even map of N nodes: only the new node gains, each old node loses at most
 * its excess over even, the result is even, and the moved count is floor(16384/(N+1)). */
static void check_add(uint32_t n)
{
    memcpy(before, map, sizeof map);
    uint32_t moved = slotmap_add(map, n);
    assert_int_equal(moved, SLOT_COUNT / (n + 1));
    uint32_t changed = 0;
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (map[s] == before[s]) continue;
        changed++;
        assert_int_equal(map[s], n); /* nothing moves between old nodes */
    }
    assert_int_equal(changed, moved);
    assert_int_equal(slotmap_check_even(map, n + 1), 0);
    double frac = (double)moved / SLOT_COUNT, ideal = 1.0 / (n + 1);
    assert_true(frac >= ideal * 0.99 - 1.0 / SLOT_COUNT && frac <= ideal * 1.01);
}

static void test_add_moves_only_the_new_nodes_share(void **state)
{
    for (uint32_t n = 1; n <= 200; n++) {
        slotmap_even(map, n);
        check_add(n);
    }
}

static void test_growing_one_node_at_a_time_stays_even(void **state)
{
    slotmap_even(map, 1);
    for (uint32_t n = 1; n < 300; n++) check_add(n);
}

/* Removing node g: only g's slots move, every survivor keeps what it had (renumbered), and the
 * result is even. */
static void check_remove(uint32_t n, uint32_t g)
{
    memcpy(before, map, sizeof map);
    uint32_t counts[SLOTMAP_NODES_MAX];
    slotmap_counts(before, n, counts);
    uint32_t moved = slotmap_remove(map, n, g);
    assert_int_equal(moved, counts[g]);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (before[s] == g) {
            assert_true(map[s] < n - 1);
            continue;
        }
        uint16_t want = before[s] > g ? before[s] - 1 : before[s];
        assert_int_equal(map[s], want);
    }
    assert_int_equal(slotmap_check_even(map, n - 1), 0);
}

static void test_remove_moves_only_the_leavers_slots(void **state)
{
    for (uint32_t n = 2; n <= 40; n++)
        for (uint32_t g = 0; g < n; g++) {
            slotmap_even(map, n);
            check_remove(n, g);
        }
}

static void test_joins_and_leaves_in_any_order_stay_even(void **state)
{
    srand(13);
    uint32_t n = 3;
    slotmap_even(map, n);
    for (int step = 0; step < 2000; step++) {
        if (n == 1 || (n < 64 && rand() % 2)) {
            check_add(n);
            n++;
        } else {
            check_remove(n, (uint32_t)rand() % n);
            n--;
        }
    }
}

static void test_ranges_cover_every_slot_once(void **state)
{
    static struct slot_range r[SLOT_COUNT];
    slotmap_even(map, 3);
    slotmap_add(map, 3);
    slotmap_remove(map, 4, 1);
    size_t k = slotmap_to_ranges(map, r);
    assert_true(k >= 3 && k <= 8); /* runs stay few */
    uint32_t next = 0;
    for (size_t i = 0; i < k; i++) {
        assert_int_equal(r[i].from, next);
        assert_true(r[i].to >= r[i].from);
        for (uint32_t s = r[i].from; s <= r[i].to; s++) assert_int_equal(map[s], r[i].node);
        next = r[i].to + 1u;
    }
    assert_int_equal(next, SLOT_COUNT);
}

static void test_check_even_refuses_uneven_and_unowned(void **state)
{
    slotmap_even(map, 4);
    assert_int_equal(slotmap_check_even(map, 4), 0);
    map[0] = 1; /* node 0 now holds 4095 and node 1 4097: two apart */
    assert_int_equal(slotmap_check_even(map, 4), -1);
    slotmap_even(map, 4);
    map[5] = 4;
    assert_int_equal(slotmap_check_even(map, 4), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_even_map_is_design_default),
        cmocka_unit_test(test_add_moves_only_the_new_nodes_share),
        cmocka_unit_test(test_growing_one_node_at_a_time_stays_even),
        cmocka_unit_test(test_remove_moves_only_the_leavers_slots),
        cmocka_unit_test(test_joins_and_leaves_in_any_order_stay_even),
        cmocka_unit_test(test_ranges_cover_every_slot_once),
        cmocka_unit_test(test_check_even_refuses_uneven_and_unowned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
