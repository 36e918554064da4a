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

/* ---- replicas (issue 15) ------------------------------------------------------------------ */

static uint16_t rep[SLOT_COUNT], rep_before[SLOT_COUNT];

/* Every slot has a valid replica, and live nodes hold within one slot of even (spread). */
static void check_replicas_even(uint32_t n, const uint16_t *zone, const uint8_t *live)
{
    assert_int_equal(slotmap_check_replicas(map, rep, n, zone, live), 0);
    uint32_t cnt[SLOTMAP_NODES_MAX] = {0}, nlive = 0, lo = SLOT_COUNT, hi = 0;
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        assert_true(rep[s] < n);
        assert_true(rep[s] != map[s]);
        cnt[rep[s]]++;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (live && !live[i]) {
            assert_int_equal(cnt[i], 0);
            continue;
        }
        nlive++;
        if (cnt[i] < lo) lo = cnt[i];
        if (cnt[i] > hi) hi = cnt[i];
    }
    assert_true(hi - lo <= 1);
}

static void test_replicas_fresh_map_is_even_and_short(void **state)
{
    static struct slot_range r[SLOT_COUNT];
    for (uint32_t n = 2; n <= 200; n++) {
        slotmap_even(map, n);
        for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = SLOTMAP_NONE;
        assert_int_equal(slotmap_replicas(map, rep, n, NULL, NULL), SLOT_COUNT);
        check_replicas_even(n, NULL, NULL);
        /* a ring: node i's slots on one or two nodes, so the ranges stay few */
        assert_true(slotmap_to_ranges_r(map, rep, r) <= 2 * n);
        /* and computing again changes nothing */
        assert_int_equal(slotmap_replicas(map, rep, n, NULL, NULL), 0);
    }
}

static void test_replicas_one_node_has_none(void **state)
{
    slotmap_even(map, 1);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = 0; /* invalid: itself */
    assert_int_equal(slotmap_replicas(map, rep, 1, NULL, NULL), SLOT_COUNT);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) assert_int_equal(rep[s], SLOTMAP_NONE);
    assert_int_equal(slotmap_check_replicas(map, rep, 1, NULL, NULL), 0);
}

static void test_replicas_go_to_another_zone(void **state)
{
    uint16_t zone[SLOTMAP_NODES_MAX];
    for (uint32_t z = 2; z <= 4; z++)
        for (uint32_t n = z; n <= 48; n += z) { /* equal zones, nodes interleaved or grouped */
            for (int grouped = 0; grouped < 2; grouped++) {
                for (uint32_t i = 0; i < n; i++)
                    zone[i] = (uint16_t)(grouped ? i / (n / z) : i % z);
                slotmap_even(map, n);
                for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = SLOTMAP_NONE;
                slotmap_replicas(map, rep, n, zone, NULL);
                for (uint32_t s = 0; s < SLOT_COUNT; s++)
                    assert_true(zone[rep[s]] != zone[map[s]]);
                check_replicas_even(n, zone, NULL);
            }
        }
    /* unequal zones: still another zone for every slot, even where it cannot be even */
    uint16_t z3[3] = {1, 1, 2};
    slotmap_even(map, 3);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = SLOTMAP_NONE;
    slotmap_replicas(map, rep, 3, z3, NULL);
    assert_int_equal(slotmap_check_replicas(map, rep, 3, z3, NULL), 0);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) assert_true(z3[rep[s]] != z3[map[s]]);
    /* one zone only: any other node */
    uint16_t same[4] = {7, 7, 7, 7};
    slotmap_even(map, 4);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = SLOTMAP_NONE;
    slotmap_replicas(map, rep, 4, same, NULL);
    check_replicas_even(4, same, NULL);
}

/* A join moves only about the new node's share of replicas (plus the slots it took as owner,
 * whose replica may have been it), a leave only the leaver's replicas and the slots it owned;
 * in any order, the map stays valid and even. */
static void test_replicas_move_little_on_joins_and_leaves(void **state)
{
    srand(15);
    uint32_t n = 3;
    slotmap_even(map, n);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = SLOTMAP_NONE;
    slotmap_replicas(map, rep, n, NULL, NULL);
    for (int step = 0; step < 600; step++) {
        if (n == 2 || (n < 40 && rand() % 2)) {
            uint32_t moved = slotmap_add(map, n);
            n++;
            memcpy(rep_before, rep, sizeof rep);
            uint32_t changed = slotmap_replicas(map, rep, n, NULL, NULL);
            assert_true(changed <= moved + SLOT_COUNT / n + 1);
        } else {
            uint32_t g = (uint32_t)rand() % n;
            uint32_t cnt_rep = 0;
            for (uint32_t s = 0; s < SLOT_COUNT; s++) {
                cnt_rep += rep[s] == g;
                if (rep[s] == g) rep[s] = SLOTMAP_NONE;
                else if (rep[s] > g && rep[s] != SLOTMAP_NONE) rep[s]--;
            }
            uint32_t moved = slotmap_remove(map, n, g);
            n--;
            uint32_t changed = slotmap_replicas(map, rep, n, NULL, NULL);
            /* the leaver's replicas were dropped above; the rest: slots it owned whose new
             * owner was their replica */
            assert_true(changed <= cnt_rep + moved);
        }
        check_replicas_even(n, NULL, NULL);
    }
}

/* A dead node: its slots go to their replicas (as a promotion does), and the replicas are
 * computed again with it not live: nothing names it, the survivors are even, and only the
 * promoted slots and those it was replica of change. Back again, it takes its even share. */
static void test_replicas_after_promotion_and_return(void **state)
{
    for (uint32_t n = 2; n <= 24; n++)
        for (uint32_t dead = 0; dead < n; dead += 3) {
            uint8_t live[SLOTMAP_NODES_MAX];
            memset(live, 1, n);
            slotmap_even(map, n);
            for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = SLOTMAP_NONE;
            slotmap_replicas(map, rep, n, NULL, NULL);
            uint32_t touched = 0;
            for (uint32_t s = 0; s < SLOT_COUNT; s++) {
                if (map[s] == dead) {
                    map[s] = rep[s];
                    rep[s] = SLOTMAP_NONE;
                    touched++;
                } else if (rep[s] == dead) {
                    touched++;
                }
            }
            live[dead] = 0;
            uint32_t changed = slotmap_replicas(map, rep, n, NULL, live);
            assert_true(changed <= touched + SLOT_COUNT / n + 1);
            if (n == 2) {
                for (uint32_t s = 0; s < SLOT_COUNT; s++) assert_int_equal(rep[s], SLOTMAP_NONE);
            } else if (n == 3) { /* the promoted node owns 2/3: the other holds its replicas */
                assert_int_equal(slotmap_check_replicas(map, rep, n, NULL, live), 0);
            } else {
                check_replicas_even(n, NULL, live);
            }
            for (uint32_t s = 0; s < SLOT_COUNT; s++) assert_true(map[s] != dead);
            live[dead] = 1;
            slotmap_replicas(map, rep, n, NULL, live);
            if (n == 2) /* it holds every replica: the other owns every slot */
                for (uint32_t s = 0; s < SLOT_COUNT; s++) assert_int_equal(rep[s], dead);
            else
                check_replicas_even(n, NULL, live); /* the returning node holds its share again */
        }
}

static void test_check_replicas_refuses_invalid(void **state)
{
    slotmap_even(map, 3);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) rep[s] = SLOTMAP_NONE;
    slotmap_replicas(map, rep, 3, NULL, NULL);
    assert_int_equal(slotmap_check_replicas(map, rep, 3, NULL, NULL), 0);
    uint16_t keep = rep[0];
    rep[0] = map[0]; /* its own owner */
    assert_int_equal(slotmap_check_replicas(map, rep, 3, NULL, NULL), -1);
    rep[0] = SLOTMAP_NONE; /* missing */
    assert_int_equal(slotmap_check_replicas(map, rep, 3, NULL, NULL), -1);
    rep[0] = keep;
    uint8_t live[3] = {1, 1, 1};
    live[keep] = 0; /* a dead replica */
    assert_int_equal(slotmap_check_replicas(map, rep, 3, NULL, live), -1);
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
        cmocka_unit_test(test_replicas_fresh_map_is_even_and_short),
        cmocka_unit_test(test_replicas_one_node_has_none),
        cmocka_unit_test(test_replicas_go_to_another_zone),
        cmocka_unit_test(test_replicas_move_little_on_joins_and_leaves),
        cmocka_unit_test(test_replicas_after_promotion_and_return),
        cmocka_unit_test(test_check_replicas_refuses_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
