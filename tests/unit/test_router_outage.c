/* test_router_outage.c — unit tests for a sharded node back from an outage
 * (src/router/outage.c): which of its keys' requests it takes in each state, which writes are
 * logged for it and which are watched for failure, and when its repair puts it back in use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "router/outage.h"
#include "router/replica.h"

struct fixture {
    struct router r;
    struct rworker w;
    struct upnode owner, gutter;
};

static int setup(void **state)
{
    static struct fixture fx;
    memset(&fx, 0, sizeof fx);
    fx.r.cfg.probe_ms = 100;
    fx.w.r = &fx.r;
    fx.w.now_ms = 1000;
    struct upnode *nodes[] = {&fx.owner, &fx.gutter};
    for (int i = 0; i < 2; i++) {
        nodes[i]->w = &fx.w;
        strcpy(nodes[i]->node.addr, i ? "127.0.0.1:2" : "127.0.0.1:1");
        repairlog_init(&nodes[i]->repair, 4);
    }
    *state = &fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    repairlog_free(&fx->owner.repair);
    repairlog_free(&fx->gutter.repair);
    return 0;
}

/* The probe found the node healthy (upstream.c's upnode_success). */
static void probe_answers(struct upnode *un)
{
    un->down = false;
    replica_node_up(un);
}

/* A repair request sent for the node is answered: `ok`, or a failure. */
static void repair_answered(struct upnode *un, const char *key, bool ok)
{
    struct frag *f = frag_create(NULL, 0);
    assert_non_null(f);
    assert_int_equal(replica_tag(f, un, REPL_REPAIR, key, strlen(key)), 0);
    replica_frag_done(f, ok ? "HD\r\n" : "SERVER_ERROR x\r\n", ok ? 4 : 16, !ok);
    frag_destroy(f);
}

static void test_requests_by_state(void **state)
{
    struct fixture *fx = *state;
    struct upnode *un = &fx->owner;
    assert_true(outage_reads(un) && outage_writes(un)); /* in use */
    un->down = un->mending = true;                       /* marked down */
    assert_false(outage_reads(un) || outage_writes(un));
    un->down = false; /* healthy, its repair not started: neither */
    assert_false(outage_reads(un) || outage_writes(un));
    un->repairs_inflight = 2; /* its deletes sent: writes, not reads */
    assert_false(outage_reads(un));
    assert_true(outage_writes(un));
    un->down = true; /* down again meanwhile */
    assert_false(outage_writes(un));
    un->down = un->mending = false;
    un->repairs_inflight = 0;
    /* keys logged after a failure on a node that is up do not take it out of use */
    assert_int_equal(repairlog_add(&un->repair, "k", 1), REPAIRLOG_ADDED);
    assert_true(outage_reads(un) && outage_writes(un));
}

static void test_which_writes_are_logged(void **state)
{
    struct fixture *fx = *state;
    struct upnode *owner = &fx->owner, *gutter = &fx->gutter;
    struct frag *f = frag_create(NULL, 0);
    assert_non_null(f);
    /* to the owner in use: watched (logged if it fails there), not logged */
    assert_int_equal(outage_write(f, owner, owner, "k1", 2), 0);
    assert_non_null(f->repl);
    assert_int_equal(f->repl->kind, REPL_OWNER);
    assert_ptr_equal(f->repl->un, owner);
    assert_true(repairlog_clean(&owner->repair));
    /* the node's own answer, an error included, is the write's outcome: nothing logged */
    static const char too_large[] = "SERVER_ERROR object too large for cache\r\n";
    replica_frag_done(f, too_large, sizeof too_large - 1, false);
    assert_true(repairlog_clean(&owner->repair));
    /* the router gave up on it (a timeout, a lost connection): logged */
    static const char lost[] = "SERVER_ERROR shoal-router: node a:1 closed the connection\r\n";
    replica_frag_done(f, lost, sizeof lost - 1, true);
    assert_int_equal(owner->repair.n, 1);
    repairlog_reset(&owner->repair);
    fx->w.m.repair_keys_logged = 0;
    replica_write_free(f->repl);
    f->repl = NULL;
    /* to the gutter: logged for the owner */
    owner->down = owner->mending = true;
    assert_int_equal(outage_write(f, owner, gutter, "k2", 2), 0);
    assert_null(f->repl);
    assert_int_equal(owner->repair.n, 1);
    assert_true(repairlog_clean(&gutter->repair));
    /* failing at once on the owner (no gutter): logged, once per distinct key */
    assert_int_equal(outage_write(f, owner, owner, "k3", 2), 0);
    assert_int_equal(outage_write(f, owner, owner, "k3", 2), 0);
    assert_null(f->repl);
    assert_int_equal(owner->repair.n, 2);
    assert_int_equal(fx->w.m.repair_keys_logged, 2);
    frag_destroy(f);
}

static void test_back_in_use_once_repaired(void **state)
{
    struct fixture *fx = *state;
    struct upnode *un = &fx->owner;
    /* nothing logged: in use again as soon as the probe answers */
    un->down = un->mending = true;
    probe_answers(un);
    assert_false(un->mending);
    assert_true(outage_reads(un));
    /* keys logged while down: held until every delete has been answered */
    un->down = un->mending = true;
    replica_log(un, "a", 1, false);
    replica_log(un, "b", 1, false);
    probe_answers(un);
    assert_true(un->mending);
    assert_int_equal(un->repair_at_ms, 1100); /* one probe interval later */
    struct repairlog_batch b;
    repairlog_take(&un->repair, &b); /* what replica_repair sends */
    un->repairs_inflight = b.n;
    repairlog_batch_free(&b);
    assert_true(outage_writes(un) && !outage_reads(un));
    repair_answered(un, "a", true);
    assert_true(un->mending);
    repair_answered(un, "b", false); /* failed: logged again, still held */
    assert_true(un->mending);
    assert_int_equal(un->repair.n, 1);
    assert_false(outage_writes(un)); /* its next repair is not under way yet */
    repairlog_take(&un->repair, &b);
    un->repairs_inflight = b.n;
    repairlog_batch_free(&b);
    repair_answered(un, "b", true);
    assert_false(un->mending);
    assert_true(outage_reads(un));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_requests_by_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_which_writes_are_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_back_in_use_once_repaired, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
