/* test_router_lineedit.c — unit tests for the router's line edits and meta replies: every TTL
 * carrier rewritten by a namespace's rules (gutter cap included), q and noreply removed, cuts
 * applied in order; a warm lookup's reply parsed, a client's mg answered in its own flags, and
 * a flag the router added taken back out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "router/lineedit.h"
#include "router/metareply.h"

#define NOW 1800000000LL

static const struct topo_ns catalog = {.default_ttl = 600, .max_ttl = 3600};
static const struct topo_ns plain = {0};
static const struct topo_ns dflt = {.default_ttl = 600}; /* a default and no maximum */

/* The line as sent to the node after the TTL edits of `ns` (with `cap`), q stripped. */
static void edited(const char *line, const struct topo_ns *ns, uint64_t cap, char *out,
                   size_t cap_out, int *nedits)
{
    struct proto_req req;
    const char *err;
    assert_int_equal(proto_parse(line, strlen(line), 1 << 20, &req, &err), PROTO_OK);
    struct ledit_ttl e;
    *nedits = ledit_ttl(&req, line, strlen(line), ns, cap, NOW, &e);
    struct buf b;
    buf_init(&b);
    assert_int_equal(ledit_copy(&b, line, strlen(line), &req, false, req.cmd >= CMD_MG ? "q" : NULL, e.cut, e.n), 0);
    assert_true(buf_used(&b) < cap_out);
    memcpy(out, buf_start(&b), buf_used(&b));
    out[buf_used(&b)] = '\0';
    buf_release(&b);
}

#define EXPECT(line, ns, cap, want, n)                                                           \
    do {                                                                                         \
        char got[512];                                                                           \
        int k;                                                                                   \
        edited(line, ns, cap, got, sizeof got, &k);                                              \
        assert_string_equal(got, want "\r\n");                                                   \
        assert_int_equal(k, n);                                                                  \
    } while (0)

static void test_text_exptimes(void **state)
{
    EXPECT("set catalog:a 1 0 5", &catalog, 0, "set catalog:a 1 600 5", 1);
    EXPECT("add catalog:a 1 99999 5", &catalog, 0, "add catalog:a 1 3600 5", 1);
    EXPECT("cas catalog:a 1 100 5 77", &catalog, 0, "cas catalog:a 1 100 5 77", 0);
    EXPECT("touch catalog:a 0", &catalog, 0, "touch catalog:a 600", 1);
    EXPECT("gat 99999 catalog:a catalog:b", &catalog, 0, "gat 3600 catalog:a catalog:b", 1);
    EXPECT("gats 0 catalog:a", &catalog, 0, "gats 600 catalog:a", 1);
    EXPECT("gat -1 catalog:a", &catalog, 0, "gat -1 catalog:a", 0); /* expired stays expired */
    /* absolute times: as sent when within the rules, max_ttl (relative) when longer */
    EXPECT("gat 1800000005 catalog:a", &catalog, 0, "gat 1800000005 catalog:a", 0);
    EXPECT("gat 1799999000 catalog:a", &catalog, 0, "gat 1799999000 catalog:a", 0); /* past */
    EXPECT("gat 1805184000 catalog:a", &catalog, 0, "gat 3600 catalog:a", 1); /* 60 days */
    EXPECT("set d:a 1 1805184000 5", &dflt, 0, "set d:a 1 1805184000 5", 0);
    EXPECT("touch d:a 1805184000", &dflt, 0, "touch d:a 1805184000", 0);
    EXPECT("gat 1805184000 d:a", &dflt, 0, "gat 1805184000 d:a", 0);
    EXPECT("ms d:a 5 T1805184000", &dflt, 0, "ms d:a 5 T1805184000", 0);
    EXPECT("mg d:a T1805184000 N1805184000", &dflt, 0, "mg d:a T1805184000 N1805184000", 0);
    EXPECT("ma d:a N1805184000 T1805184000", &dflt, 0, "ma d:a N1805184000 T1805184000", 0);
    EXPECT("mg d:a T0 N1805184000", &dflt, 0, "mg d:a T600 N1805184000", 1);
    EXPECT("append catalog:a 0 0 1", &catalog, 0, "append catalog:a 0 0 1", 0);
    EXPECT("gat 0 k", &plain, 0, "gat 0 k", 0);
}

static void test_meta_ttl_flags(void **state)
{
    EXPECT("mg catalog:a N99999 v T0", &catalog, 0, "mg catalog:a N3600 v T600", 2);
    EXPECT("mg catalog:a R99999 v", &catalog, 0, "mg catalog:a R99999 v", 0); /* a threshold */
    EXPECT("mg catalog:a v", &catalog, 0, "mg catalog:a v", 0);
    EXPECT("ms catalog:a 2 T99999 N0 MA", &catalog, 0, "ms catalog:a 2 T3600 N600 MA", 2);
    EXPECT("ms catalog:a 2 q", &catalog, 0, "ms catalog:a 2 T600", 1); /* q gone, T added */
    EXPECT("ms catalog:a 2 T100", &catalog, 0, "ms catalog:a 2 T100", 0);
    EXPECT("ma catalog:a T99999 N-1 q", &catalog, 0, "ma catalog:a T3600 N-1", 1);
    EXPECT("ma catalog:a N0 J5", &catalog, 0, "ma catalog:a N600 J5", 1);
    EXPECT("md catalog:a I T99999", &catalog, 0, "md catalog:a I T3600", 1);
    EXPECT("md catalog:a T99999", &catalog, 0, "md catalog:a T99999", 0); /* T needs I */
    EXPECT("md catalog:a H5 q", &catalog, 0, "md catalog:a H5", 0);       /* a hold-off */
    EXPECT("ms k 2", &plain, 0, "ms k 2", 0);
}

static void test_gutter_cap(void **state)
{
    EXPECT("mg k N3600 T0 v", &plain, 7, "mg k N7 T7 v", 2);
    EXPECT("gat 3600 k j", &plain, 7, "gat 7 k j", 1);
    EXPECT("ma k N5", &plain, 7, "ma k N5", 0);
    EXPECT("set catalog:a 0 0 1", &catalog, 7, "set catalog:a 0 7 1", 1);
    EXPECT("ms k 1", &plain, 7, "ms k 1 T7", 1);
}

static void test_copy_cuts_noreply_and_order(void **state)
{
    const char *line = "delete k noreply";
    struct proto_req req;
    const char *err;
    assert_int_equal(proto_parse(line, strlen(line), 1024, &req, &err), PROTO_OK);
    const char *tok;
    size_t ntok;
    assert_true(ledit_token(line, strlen(line), 1, &tok, &ntok));
    struct ledit_cut cut = {tok + ntok, tok + ntok, " 2", 2};
    struct buf b;
    buf_init(&b);
    assert_int_equal(ledit_copy(&b, line, strlen(line), &req, true, NULL, &cut, 1), 0);
    assert_int_equal(buf_used(&b), strlen("delete k 2\r\n"));
    assert_memory_equal(buf_start(&b), "delete k 2\r\n", buf_used(&b));
    buf_release(&b);

    line = "mg k q N30 v\r";
    assert_int_equal(proto_parse(line, strlen(line), 1024, &req, &err), PROTO_OK);
    struct ledit_cut cuts[2] = {ledit_append(line, strlen(line), " c", 2),
                                ledit_append(line, strlen(line), " H2", 3)};
    buf_init(&b);
    assert_int_equal(ledit_copy(&b, line, strlen(line), &req, false, "q", cuts, 2), 0);
    assert_int_equal(buf_used(&b), strlen("mg k N30 v c H2\r\n"));
    assert_memory_equal(buf_start(&b), "mg k N30 v c H2\r\n", buf_used(&b));
    buf_release(&b);
}

static void test_hit_parsing(void **state)
{
    struct mreply_item it;
    const char ok[] = "VA 5 f3 t-1 c99 kabc h1\r\nhello\r\n";
    assert_true(mreply_hit(ok, sizeof ok - 1, &it));
    assert_int_equal(it.vlen, 5);
    assert_memory_equal(it.data, "hello\r\n", 7);
    assert_int_equal(it.ttl, -1);
    assert_memory_equal(it.flags, "3", it.nflags);
    assert_memory_equal(it.cas, "99", it.ncas);
    assert_memory_equal(it.key, "abc", it.nkey);
    assert_memory_equal(it.h, "1", it.nh);
    assert_null(it.l);
    const char stale[] = "VA 5 f3 t10 c99 X W\r\nhello\r\n";
    assert_false(mreply_hit(stale, sizeof stale - 1, &it));
    const char held[] = "VA 0 f0 t10 c99 Z\r\n\r\n";
    assert_false(mreply_hit(held, sizeof held - 1, &it));
    const char cut_short[] = "VA 5 f3 t10 c99\r\nhel";
    assert_false(mreply_hit(cut_short, sizeof cut_short - 1, &it));
    assert_false(mreply_hit("EN\r\n", 4, &it));
    assert_false(mreply_hit("SERVER_ERROR x\r\n", 16, &it));
}

static void compose(const char *line, int64_t touched, const char *want, size_t nwant)
{
    struct mreply_item it;
    const char warm[] = "VA 4 f7 t50 c12 h0 l3\r\nwxyz\r\n";
    assert_true(mreply_hit(warm, sizeof warm - 1, &it));
    struct proto_req req;
    const char *err;
    assert_int_equal(proto_parse(line, strlen(line), 1024, &req, &err), PROTO_OK);
    struct buf b;
    buf_init(&b);
    assert_int_equal(mreply_compose_mg(&b, &req, &it, touched), 0);
    assert_int_equal(buf_used(&b), nwant);
    assert_memory_equal(buf_start(&b), want, nwant);
    buf_release(&b);
}

#define COMPOSE(line, touched, want) compose(line, touched, want, sizeof want - 1)

static void test_compose_mg(void **state)
{
    COMPOSE("mg key v", 0, "VA 4\r\nwxyz\r\n");
    COMPOSE("mg key s t c f q k Oop", 0, "HD s4 t50 c12 f7 kkey Oop\r\n");
    COMPOSE("mg key T9 t", 9, "HD t9\r\n"); /* T moves the TTL a later t reports */
    COMPOSE("mg key t T9", 9, "HD t50\r\n");
    COMPOSE("mg key h l u v N30", 0, "VA 4 h0 l3\r\nwxyz\r\n");
    COMPOSE("mg a2V5 b k v", 0, "VA 4 ka2V5 b\r\nwxyz\r\n");
}

static void test_drop_added_flag(void **state)
{
    struct buf b;
    buf_init(&b);
    const char won[] = "VA 0 t30 c123 W\r\n\r\n";
    assert_int_equal(mreply_drop_flag(&b, won, sizeof won - 1, 'c'), 0);
    assert_int_equal(buf_used(&b), strlen("VA 0 t30 W\r\n\r\n"));
    assert_memory_equal(buf_start(&b), "VA 0 t30 W\r\n\r\n", buf_used(&b));
    buf_release(&b);
    buf_init(&b);
    const char hit[] = "HD c9\r\n";
    assert_int_equal(mreply_drop_flag(&b, hit, sizeof hit - 1, 'c'), 0);
    assert_int_equal(buf_used(&b), 4);
    assert_memory_equal(buf_start(&b), "HD\r\n", 4);
    buf_release(&b);
    buf_init(&b);
    const char value[] = "VA 3 Oc1 c5\r\nc c\r\n"; /* an opaque and the value are left alone */
    assert_int_equal(mreply_drop_flag(&b, value, sizeof value - 1, 'c'), 0);
    assert_int_equal(buf_used(&b), strlen("VA 3 Oc1\r\nc c\r\n"));
    assert_memory_equal(buf_start(&b), "VA 3 Oc1\r\nc c\r\n", buf_used(&b));
    buf_release(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_exptimes),
        cmocka_unit_test(test_meta_ttl_flags),
        cmocka_unit_test(test_gutter_cap),
        cmocka_unit_test(test_copy_cuts_noreply_and_order),
        cmocka_unit_test(test_hit_parsing),
        cmocka_unit_test(test_compose_mg),
        cmocka_unit_test(test_drop_added_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
