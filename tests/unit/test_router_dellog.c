/* test_router_dellog.c — unit tests for the router's recent-deletes ring (dellog.h): entries
 * come back oldest first, the oldest are forgotten when it is full (wrapping around its end),
 * and a time bound skips the older ones; and the slot map's replicas (topo.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "router/dellog.h"
#include "router/replyframe.h"
#include "router/topo.h"

struct seen {
    char keys[64][32];
    uint16_t slots[64];
    int n;
};

static void collect(void *ctx, uint64_t ms, uint16_t slot, const char *key, size_t nkey)
{
    (void)ms;
    struct seen *s = ctx;
    assert_true(s->n < 64 && nkey < 32);
    memcpy(s->keys[s->n], key, nkey);
    s->keys[s->n][nkey] = 0;
    s->slots[s->n++] = slot;
}

struct count {
    int n;
    int first_slot;
};

static void count(void *ctx, uint64_t ms, uint16_t slot, const char *key, size_t nkey)
{
    (void)ms;
    struct count *c = ctx;
    if (c->n++ == 0) c->first_slot = slot;
}

static void test_ring_keeps_the_newest_in_order(void **state)
{
    struct dellog l;
    dellog_init(&l, 4096); /* 4096 / (11 + 5) = 256 entries of 5-byte keys */
    char key[16];
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "k%04d", i);
        dellog_put(&l, (uint64_t)i, (uint16_t)i, key, 5);
    }
    struct seen s = {0};
    dellog_each(&l, 990, collect, &s);
    assert_int_equal(s.n, 10);
    assert_string_equal(s.keys[0], "k0990");
    assert_string_equal(s.keys[9], "k0999");
    assert_int_equal(s.slots[9], 999);
    /* everything kept is the newest, contiguous run: 4096 / (11 + 5) entries */
    struct count c = {0, 0};
    dellog_each(&l, 0, count, &c);
    assert_int_equal(c.n, 256);
    assert_int_equal(c.first_slot, 744);
    dellog_free(&l);
}

static void test_mixed_key_sizes_wrap(void **state)
{
    struct dellog l;
    dellog_init(&l, 4096);
    char key[251];
    memset(key, 'x', sizeof key);
    for (int i = 0; i < 200; i++) {
        size_t n = (size_t)(1 + (i * 37) % 250);
        key[0] = (char)('a' + i % 26);
        dellog_put(&l, (uint64_t)i, 7, key, n);
    }
    dellog_put(&l, 500, 8, "last", 4);
    struct seen s = {0};
    dellog_each(&l, 500, collect, &s);
    assert_int_equal(s.n, 1);
    assert_string_equal(s.keys[0], "last");
    assert_int_equal(s.slots[0], 8);
    assert_true(l.used <= l.cap);
    /* a log of size 0 keeps nothing and never fails */
    struct dellog none;
    dellog_init(&none, 0);
    dellog_put(&none, 1, 1, "k", 1);
    struct seen z = {0};
    dellog_each(&none, 0, collect, &z);
    assert_int_equal(z.n, 0);
    dellog_free(&l);
    dellog_free(&none);
}

static void test_slot_map_replicas_and_copies(void **state)
{
    const char *doc =
        "{\"version\":1,\"pools\":{\"main\":{\"nodes\":[\"127.0.0.1:1\",\"127.0.0.1:2\"],"
        "\"slots\":[{\"from\":0,\"to\":8191,\"node\":\"127.0.0.1:1\",\"replica\":\"127.0.0.1:2\"},"
        "{\"from\":8192,\"to\":16383,\"node\":\"127.0.0.1:2\"}]}},"
        "\"namespaces\":{\"default\":{\"pool\":\"main\",\"copies\":2},"
        "\"one\":{\"pool\":\"main\",\"copies\":1}}}";
    struct topo *t;
    char err[256];
    assert_int_equal(topo_parse(doc, strlen(doc), TOPO_NUMERIC_HOSTS, &t, err, sizeof err), 0);
    assert_true(topo_has_replicas(t));
    /* "foo" is slot 12182 (no replica), "bar" 5061 (replica node 1) */
    assert_int_equal(topo_replica_route(t, "foo", 3), -1);
    assert_int_equal(topo_replica_route(t, "bar", 3), 1);
    /* one copy: not on the replica */
    assert_int_equal(topo_replica_route(t, "one:{bar}", 9), -1);
    topo_destroy(&t);
}

/* The reply to a replay batch (`md k q` lines and `mn`): NF and error lines, then MN. */
static void test_quiet_batch_reply_frames(void **state)
{
    struct reply_want w;
    const char req[] = "md a q\r\nmd b q\r\nmn\r\n";
    reply_want_of(&w, req, sizeof req - 1);
    w.list = RLIST_QUIET;
    size_t len;
    assert_int_equal(reply_list_line(&w, "MN\r\n", 4, true, &len), RLL_END);
    assert_int_equal(len, 4);
    assert_int_equal(reply_list_line(&w, "NF\r\nMN\r\n", 8, true, &len), RLL_ITEM);
    assert_int_equal(reply_list_line(&w, "SERVER_ERROR x\r\n", 16, false, &len), RLL_ITEM);
    assert_int_equal(reply_list_line(&w, "HD\r\n", 4, true, &len), RLL_BAD);
    assert_int_equal(reply_list_line(&w, "MN", 2, true, &len), RLL_MORE);
    assert_int_equal(reply_check_want(&w, req, "NF\r\nCLIENT_ERROR bad\r\nMN\r\n", 26), RFIT_OK);
    assert_int_equal(reply_check_want(&w, req, "NF\r\nEND\r\n", 9), RFIT_BAD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_keeps_the_newest_in_order),
        cmocka_unit_test(test_mixed_key_sizes_wrap),
        cmocka_unit_test(test_slot_map_replicas_and_copies),
        cmocka_unit_test(test_quiet_batch_reply_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
