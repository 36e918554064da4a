/* test_router_replica.c — unit tests for the router's replica choices (src/router/replica.c):
 * which replica a read goes to when replicas are down or being repaired, and which writes are
 * compare-and-swaps (run on one replica first). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "router/replica.h"

#define NREP 3

struct fixture {
    struct upnode un[NREP];
    struct upnode *map[NREP];
    uint32_t nodes[NREP];
    struct topo_pool pool;
    struct rworker w;
};

static int setup(void **state)
{
    static struct fixture fx;
    memset(&fx, 0, sizeof fx);
    for (uint32_t i = 0; i < NREP; i++) {
        repairlog_init(&fx.un[i].repair, 4);
        fx.map[i] = &fx.un[i];
        fx.nodes[i] = i;
    }
    fx.pool.nnodes = NREP;
    fx.pool.nodes = fx.nodes;
    fx.pool.replicated = true;
    fx.w.map = fx.map;
    *state = &fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    for (uint32_t i = 0; i < NREP; i++) repairlog_free(&fx->un[i].repair);
    return 0;
}

static void test_reads_prefer_home_then_readable_then_up(void **state)
{
    struct fixture *fx = *state;
    assert_int_equal(replica_read_node(&fx->w, &fx->pool, 1), 1); /* every one readable */
    fx->un[1].down = true;
    assert_int_equal(replica_read_node(&fx->w, &fx->pool, 1), 0); /* first readable, in order */
    fx->un[0].repairs_inflight = 1;                                /* being repaired */
    assert_int_equal(replica_read_node(&fx->w, &fx->pool, 1), 2);
    assert_int_equal(repairlog_add(&fx->un[2].repair, "hot:k", 5), REPAIRLOG_ADDED);
    assert_false(replica_readable(&fx->un[2])); /* keys to repair: not read */
    /* nothing readable: one that is up (being repaired) is better than failing */
    assert_int_equal(replica_read_node(&fx->w, &fx->pool, 1), 0);
    fx->un[1].down = false;
    assert_int_equal(replica_read_node(&fx->w, &fx->pool, 1), 1); /* home, unrepaired but up */
    repairlog_set_overflow(&fx->un[1].repair);
    assert_false(replica_readable(&fx->un[1]));
    fx->un[2].down = true;
    fx->un[0].down = true;
    assert_int_equal(replica_read_node(&fx->w, &fx->pool, 2), 1);
    fx->un[1].down = true;
    assert_int_equal(replica_read_node(&fx->w, &fx->pool, 2), 2); /* all down: home fails */
}

static bool compare(const char *line)
{
    struct proto_req req;
    const char *err;
    assert_int_equal(proto_parse(line, strlen(line), 1 << 20, &req, &err), PROTO_OK);
    return replica_is_compare(&req);
}

static void test_which_writes_compare(void **state)
{
    assert_true(compare("cas k 0 0 1 5"));
    assert_true(compare("cas k 0 0 1 5 noreply"));
    assert_true(compare("ms k 1 C5"));
    assert_true(compare("ms k 1 T0 C5 I q"));
    assert_true(compare("md k C5"));
    assert_true(compare("ma k C5 D2 v"));
    assert_false(compare("set k 0 0 1"));
    assert_false(compare("ms k 1 c"));  /* return the CAS: no compare */
    assert_false(compare("ms k 1 E5")); /* set the CAS: no compare */
    assert_false(compare("md k"));
    assert_false(compare("ma k"));
    assert_false(compare("mg k c"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reads_prefer_home_then_readable_then_up, setup,
                                        teardown),
        cmocka_unit_test(test_which_writes_compare),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
