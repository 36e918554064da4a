/* test_router_failover.c — unit tests for src/router/failover.c: which requests may be retried
 * on the gutter pool once they may have reached their node, and the shared mark-down epoch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "router/failover.h"
#include "router/upstream.h"

static uint8_t kind_of(const char *line)
{
    struct proto_req req;
    const char *err = NULL;
    assert_int_equal(proto_parse(line, strlen(line), 1 << 20, &req, &err), PROTO_OK);
    return failover_kind(&req);
}

/* A repeat of these answers and leaves the item alike: retried even once sent. */
static void test_idempotent_requests_are_retried_once_sent(void **state)
{
    (void)state;
    static const char *const any[] = {
        "get a b", "gets a", "gat 10 a", "gats 10 a b", "mg a v", "mg a v N30", "me a",
        "set a 0 0 1", "replace a 0 0 1", "delete a", "touch a 10", "ms a 1", "ms a 1 MS",
        "ms a 1 MR T5", "md a", "md a I T30",
    };
    for (size_t i = 0; i < sizeof any / sizeof any[0]; i++)
        if (kind_of(any[i]) != FAILOVER_ANY) fail_msg("%s: not FAILOVER_ANY", any[i]);
}

/* These may have taken effect on the node, and a repeat would answer otherwise: retried only
 * when never sent. */
static void test_other_writes_are_retried_only_unsent(void **state)
{
    (void)state;
    static const char *const unsent[] = {
        "add a 0 0 1", "append a 0 0 1", "prepend a 0 0 1", "cas a 0 0 1 5", "incr a 1",
        "decr a 1", "ma a", "ma a MD D2", "ms a 1 ME", "ms a 1 MA", "ms a 1 MP", "ms a 1 C5",
        "md a C5",
    };
    for (size_t i = 0; i < sizeof unsent / sizeof unsent[0]; i++)
        if (kind_of(unsent[i]) != FAILOVER_UNSENT) fail_msg("%s: not FAILOVER_UNSENT", unsent[i]);
}

/* Two workers' views of one node share its epoch: the first to mark it down moves it (odd)
 * and bumps the generation the others watch; a second mark-down of a node already down moves
 * nothing; finding it healthy moves it on (even). */
static void test_mark_down_is_published_once(void **state)
{
    (void)state;
    static struct router r;
    static struct rworker w0, w1;
    static struct upnode a, b;
    uint64_t health = 0;
    memset(&r, 0, sizeof r);
    w0.r = w1.r = &r;
    a.w = &w0;
    b.w = &w1;
    a.health = b.health = &health;
    failover_publish(&a, true);
    assert_int_equal(health, 1);
    assert_int_equal(r.health_gen, 1);
    assert_int_equal(a.health_seen, 1);
    failover_publish(&b, true);
    assert_int_equal(health, 1);
    assert_int_equal(r.health_gen, 1);
    assert_int_equal(b.health_seen, 1);
    failover_publish(&b, false);
    assert_int_equal(health, 2);
    assert_int_equal(r.health_gen, 2);
    failover_publish(&a, false);
    assert_int_equal(health, 2);
    assert_int_equal(a.health_seen, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idempotent_requests_are_retried_once_sent),
        cmocka_unit_test(test_other_writes_are_retried_only_unsent),
        cmocka_unit_test(test_mark_down_is_published_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
