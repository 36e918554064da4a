/* test_router_upqueue.c — unit tests for a node's fair wait queue (src/router/upqueue.c): each
 * client's requests leave in the order queued, a client with nothing waiting goes first, the
 * others take turns (of one request, or of a quantum), expired requests are taken per flow in order, and draining it leaves it
 * empty and reusable (flows and buckets grown and given back). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "router/request.h"
#include "router/upqueue.h"

#define NF 4096

static struct frag frags[NF];

/* frags[i], queued for `pin` with deadline `deadline`. */
static struct frag *push(struct upqueue *q, int i, unsigned pin, uint64_t deadline)
{
    struct frag *f = &frags[i];
    memset(f, 0, sizeof *f);
    f->idx = (uint16_t)i;
    f->deadline_ms = deadline;
    assert_int_equal(upqueue_push(q, f, pin), 0);
    return f;
}

/* Pop one and check it is frags[want] of `pin`. */
static void pop_is(struct upqueue *q, int want, unsigned pin)
{
    assert_false(upqueue_empty(q));
    assert_int_equal(upqueue_next_pin(q), pin);
    unsigned got_pin = 99999;
    struct frag *f = upqueue_pop(q, 1, &got_pin);
    assert_ptr_equal(f, &frags[want]);
    assert_int_equal(got_pin, pin);
}

static void test_one_client_keeps_its_order(void **state)
{
    struct upqueue q;
    upqueue_init(&q);
    for (int i = 0; i < 5; i++) push(&q, i, 7, 100);
    assert_int_equal(q.nwait, 5);
    for (int i = 0; i < 5; i++) pop_is(&q, i, 7);
    assert_true(upqueue_empty(&q));
    unsigned pin;
    assert_null(upqueue_pop(&q, 1, &pin));
    upqueue_free(&q);
}

/* A client with a deep pipeline queued first; a second one's single request, queued after all
 * of it, leaves next, not after the thousand. */
static void test_a_client_with_nothing_waiting_goes_next(void **state)
{
    struct upqueue q;
    upqueue_init(&q);
    for (int i = 0; i < 1000; i++) push(&q, i, 5, 100);
    pop_is(&q, 0, 5); /* the deep one was fresh when it came: its first goes */
    push(&q, 1000, 9, 100);
    pop_is(&q, 1000, 9);
    pop_is(&q, 1, 5);
    /* fresh again once it had nothing waiting */
    push(&q, 1001, 9, 100);
    pop_is(&q, 1001, 9);
    for (int i = 2; i < 1000; i++) pop_is(&q, i, 5);
    assert_true(upqueue_empty(&q));
    upqueue_free(&q);
}

/* Three clients with several requests each take turns, each in its own order. */
static void test_deep_clients_take_turns(void **state)
{
    struct upqueue q;
    upqueue_init(&q);
    for (int i = 0; i < 3; i++) push(&q, i, 1, 100);      /* a0 a1 a2 */
    for (int i = 3; i < 6; i++) push(&q, i, 2, 100);      /* b0 b1 b2 */
    for (int i = 6; i < 8; i++) push(&q, i, 3, 100);      /* c0 c1 */
    /* fresh flows first, in the order they came; then round-robin */
    int want[] = {0, 3, 6, 1, 4, 7, 2, 5};
    unsigned pins[] = {1, 2, 3, 1, 2, 3, 1, 2};
    for (int k = 0; k < 8; k++) pop_is(&q, want[k], pins[k]);
    assert_true(upqueue_empty(&q));
    upqueue_free(&q);
}

/* A turn of 3: each client sends up to three in a row, then the next one's turn. */
static void test_a_turn_lasts_the_quantum(void **state)
{
    struct upqueue q;
    upqueue_init(&q);
    for (int i = 0; i < 5; i++) push(&q, i, 1, 100);      /* a0..a4 */
    for (int i = 5; i < 7; i++) push(&q, i, 2, 100);      /* b0 b1 */
    int want[] = {0, 1, 2, 5, 6, 3, 4};
    for (int k = 0; k < 7; k++) {
        unsigned pin;
        assert_ptr_equal(upqueue_pop(&q, 3, &pin), &frags[want[k]]);
        assert_int_equal(pin, want[k] < 5 ? 1 : 2);
    }
    assert_true(upqueue_empty(&q));
    upqueue_free(&q);
}

static void test_expired_are_taken_per_client_in_order(void **state)
{
    struct upqueue q;
    upqueue_init(&q);
    push(&q, 0, 1, 10);
    push(&q, 1, 1, 20);
    push(&q, 2, 1, 30);
    push(&q, 3, 2, 15);
    push(&q, 4, 2, 40);
    unsigned pin;
    (void)upqueue_pop(&q, 1, &pin); /* frags[0]: flow 1 now in the round */
    struct frag *l = upqueue_take_expired(&q, 20);
    assert_ptr_equal(l, &frags[3]); /* flow 2 was still fresh: its list is looked at first */
    assert_ptr_equal(l->next, &frags[1]);
    assert_null(l->next->next);
    assert_int_equal(q.nwait, 2);
    assert_null(upqueue_take_expired(&q, 25));
    pop_is(&q, 4, 2); /* still fresh: before the round */
    l = upqueue_take_expired(&q, 1000);
    assert_ptr_equal(l, &frags[2]);
    assert_null(l->next);
    assert_true(upqueue_empty(&q));
    assert_int_equal(q.nflows, 0);
    upqueue_free(&q);
}

/* Thousands of clients: the hash grows; take_all drains each client's requests in order, and
 * the queue works again after. */
static void test_many_clients_drain_and_reuse(void **state)
{
    struct upqueue q;
    upqueue_init(&q);
    for (int i = 0; i < NF; i++) push(&q, i, (unsigned)(i % 1500), 100);
    assert_int_equal(q.nflows, 1500);
    assert_true(q.nbuckets >= 1500);
    int last[1500];
    for (int p = 0; p < 1500; p++) last[p] = -1;
    int n = 0;
    for (struct frag *f = upqueue_take_all(&q); f; f = f->next, n++) {
        int p = f->idx % 1500;
        assert_true(f->idx > last[p]);
        last[p] = f->idx;
    }
    assert_int_equal(n, NF);
    assert_true(upqueue_empty(&q));
    assert_int_equal(q.nflows, 0);
    push(&q, 0, 3, 100);
    push(&q, 1, 4, 100);
    pop_is(&q, 0, 3);
    pop_is(&q, 1, 4);
    upqueue_free(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_client_keeps_its_order),
        cmocka_unit_test(test_a_client_with_nothing_waiting_goes_next),
        cmocka_unit_test(test_deep_clients_take_turns),
        cmocka_unit_test(test_a_turn_lasts_the_quantum),
        cmocka_unit_test(test_expired_are_taken_per_client_in_order),
        cmocka_unit_test(test_many_clients_drain_and_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
