/* test_protocol_meta.c — unit tests for the meta commands' request lines (mg, ms, md, ma, mn,
 * me: src/protocol/meta.c), and that parsing one request leaves nothing of the one before.
 *
 * Expected answers and error strings were checked against a live memcached 1.6.18, as in
 * test_protocol.c. */
#include "protocol_harness.h"

/* ---- meta ------------------------------------------------------------------------------- */

static void test_meta_basic(void **state)
{
    OK("mn");
    assert_int_equal(req.cmd, CMD_MN);
    OK("mn x y z"); /* memcached ignores mn's arguments */
    assert_int_equal(req.meta.nflags, 0);

    OK("mg k");
    assert_int_equal(req.cmd, CMD_MG);
    KEY_IS("k");
    assert_int_equal(req.meta.nflags, 0);
    assert_int_equal(req.meta.has, 0);
    assert_int_equal(req.meta.has_upper, 0);
    assert_int_equal(req.meta.delta, 1);

    OK("mg  k  v  ");
    KEY_IS("k");
    assert_int_equal(req.meta.nflags, 1);
    assert_int_equal(req.meta.flag[0].flag, 'v');
    OK("mg k\r");
    KEY_IS("k");
}

static void test_meta_flag_order(void **state)
{
    OK("mg a2V5 v t c k Oabc q s f h l u N30 R10 T60 E77 b3");
    /* 'b3' is b with a stray token (ignored, as memcached does): the key is base64 */
    assert_true(req.meta.base64);
    assert_ptr_equal(req.key, req.keybuf);
    KEY_IS("key");
    const char *order = "vtckOqsfhluNRTEb";
    assert_int_equal(req.meta.nflags, strlen(order));
    for (size_t i = 0; i < strlen(order); i++) assert_int_equal(req.meta.flag[i].flag, order[i]);
    assert_int_equal(req.meta.flag[4].ntok, 3);
    assert_memory_equal(req.meta.flag[4].tok, "abc", 3);
    assert_int_equal(req.meta.flag[0].ntok, 0);
    assert_int_equal(req.meta.flag[15].ntok, 1);
    assert_int_equal(req.meta.nopaque, 3);
    assert_memory_equal(req.meta.opaque, "abc", 3);
    assert_true(req.meta.quiet);
    assert_int_equal(req.meta.vivify, 30);
    assert_int_equal(req.meta.recache, 10);
    assert_int_equal(req.meta.ttl, 60);
    assert_int_equal(req.meta.cas_new, 77);
    for (const char *c = order; *c; c++) assert_true(proto_meta_has(&req.meta, *c));
    assert_false(proto_meta_has(&req.meta, 'x'));
    assert_false(proto_meta_has(&req.meta, 'C'));
    assert_false(proto_meta_has(&req.meta, '1'));
    assert_int_equal(req.meta.has, (1u << ('v' - 'a')) | (1u << ('t' - 'a')) | (1u << ('c' - 'a')) |
                                       (1u << ('k' - 'a')) | (1u << ('q' - 'a')) | (1u << ('s' - 'a')) |
                                       (1u << ('f' - 'a')) | (1u << ('h' - 'a')) | (1u << ('l' - 'a')) |
                                       (1u << ('u' - 'a')) | (1u << ('b' - 'a')));

    OK("mg k T-1 vxyz Pfoo/bar L C18446744073709551615 O");
    assert_int_equal(req.meta.ttl, -1);
    assert_int_equal(req.meta.flag[1].flag, 'v');
    assert_int_equal(req.meta.flag[1].ntok, 3); /* kept; memcached ignores it */
    assert_int_equal(req.meta.flag[2].ntok, 7);
    assert_memory_equal(req.meta.flag[2].tok, "foo/bar", 7);
    assert_true(req.meta.cas_in == UINT64_MAX);
    assert_true(proto_meta_has(&req.meta, 'O'));
    assert_int_equal(req.meta.nopaque, 0);
}

static void test_meta_get_errors(void **state)
{
    char lk[600], lo31[64], lo32[64], lp255[300], lp256[300], lb252[300], lb248[300];
    snprintf(lk, sizeof lk, "mg %s v", repeat('a', 251));
    snprintf(lo31, sizeof lo31, "mg k O%s", repeat('o', 31));
    snprintf(lo32, sizeof lo32, "mg k O%s", repeat('o', 32));
    snprintf(lp255, sizeof lp255, "mg k P%s", repeat('p', 255));
    snprintf(lp256, sizeof lp256, "mg k P%s", repeat('p', 256));
    snprintf(lb252, sizeof lb252, "mg %s b", repeat('A', 252));
    snprintf(lb248, sizeof lb248, "mg %s b v", repeat('A', 248));
    OK(lo31);
    assert_int_equal(req.meta.nopaque, 31);
    OK(lp255);
    assert_int_equal(req.meta.flag[0].ntok, 255);
    OK(lb248);
    assert_int_equal(req.nkey, 186);

    static const char *badtok = "CLIENT_ERROR bad token in command line format";
    static const char *inv = "CLIENT_ERROR invalid flag";
    static const char *dup = "CLIENT_ERROR duplicate flag";
    static const char *dec = "CLIENT_ERROR error decoding key";
    static const char *mlen = "CLIENT_ERROR incorrect length for M token";
    struct err_case c[] = {
        {"mg", PROTO_ERR_UNKNOWN, E},
        {"mg ", PROTO_ERR_UNKNOWN, E},
        {lk, PROTO_ERR_CLIENT, BADFMT},
        {lb252, PROTO_ERR_CLIENT, BADFMT}, /* the encoded key is held to 250 bytes too */
        {"mg k v v", PROTO_ERR_CLIENT, dup},
        {"mg k v k v", PROTO_ERR_CLIENT, dup},
        {"mg k O1 O2", PROTO_ERR_CLIENT, dup},
        {"mg k P P", PROTO_ERR_CLIENT, dup},
        {"mg k x", PROTO_ERR_CLIENT, inv},
        {"mg k a", PROTO_ERR_CLIENT, inv},
        {"mg k Z", PROTO_ERR_CLIENT, inv},
        {"mg k S1", PROTO_ERR_CLIENT, inv},
        {"mg k 5", PROTO_ERR_CLIENT, inv},
        {"mg k -", PROTO_ERR_CLIENT, inv},
        {"mg k \x80", PROTO_ERR_CLIENT, inv},
        {"mg k q x", PROTO_ERR_CLIENT, inv},
        {"mg k Tabc", PROTO_ERR_CLIENT, badtok},
        {"mg k T", PROTO_ERR_CLIENT, badtok},
        {"mg k T1x", PROTO_ERR_CLIENT, badtok},
        {"mg k T9223372036854775808", PROTO_ERR_CLIENT, badtok},
        {"mg k N", PROTO_ERR_CLIENT, badtok},
        {"mg k Nabc", PROTO_ERR_CLIENT, badtok},
        {"mg k R", PROTO_ERR_CLIENT, badtok},
        {"mg k Cabc", PROTO_ERR_CLIENT, badtok},
        {"mg k C18446744073709551616", PROTO_ERR_CLIENT, badtok},
        {"mg k E", PROTO_ERR_CLIENT, badtok},
        {"mg k E-1", PROTO_ERR_CLIENT, badtok},
        {lp256, PROTO_ERR_CLIENT, badtok},
        {"mg k Fabc", PROTO_ERR_CLIENT, BADFMT},
        {"mg k F-1", PROTO_ERR_CLIENT, BADFMT},
        {"mg k Dabc", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid numeric delta value"},
        {"mg k J", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid numeric initial value"},
        {"mg k M", PROTO_ERR_CLIENT, mlen},
        {"mg k MXX", PROTO_ERR_CLIENT, mlen},
        {lo32, PROTO_ERR_CLIENT, "CLIENT_ERROR opaque token too long"},
        {"mg k b", PROTO_ERR_CLIENT, dec},
        {"mg a2V5= b v", PROTO_ERR_CLIENT, dec},
        {"mg a2V b v", PROTO_ERR_CLIENT, dec},
        {"mg !!!! b v", PROTO_ERR_CLIENT, dec},
        {"mg ==== b v", PROTO_ERR_CLIENT, dec},
    };
    RUN_ERR_CASES(c);
}

/* memcached's ranking when a line has several mistakes: an invalid or duplicate flag wins at
 * once; among bad tokens the last one is reported, and a bad F only keeps the default string;
 * a bad M mode comes next and an overlong opaque last. */
static void test_meta_error_precedence(void **state)
{
    static const char *badtok = "CLIENT_ERROR bad token in command line format";
    static const char *dec = "CLIENT_ERROR error decoding key";
    char o1[80], o2[80], o3[80], o4[80], o5[80];
    snprintf(o1, sizeof o1, "mg k O1 O%s", repeat('o', 40));
    snprintf(o2, sizeof o2, "ms k 1 O%s MX", repeat('o', 40));
    snprintf(o3, sizeof o3, "ms k 1 MX O%s", repeat('o', 40));
    snprintf(o4, sizeof o4, "ma k MX O%s", repeat('o', 40));
    snprintf(o5, sizeof o5, "mg k b O%s", repeat('o', 40));
    struct err_case c[] = {
        {"mg k b Tabc", PROTO_ERR_CLIENT, badtok},
        {"mg k Tabc b", PROTO_ERR_CLIENT, dec},
        {"mg k Fabc Tabc", PROTO_ERR_CLIENT, badtok},
        {"mg k Tabc Fabc", PROTO_ERR_CLIENT, badtok},
        {"mg k Fabc", PROTO_ERR_CLIENT, BADFMT},
        {"mg k Fabc x", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid flag"},
        {"mg k Tabc q q", PROTO_ERR_CLIENT, "CLIENT_ERROR duplicate flag"},
        {"mg k q q Tabc", PROTO_ERR_CLIENT, "CLIENT_ERROR duplicate flag"},
        {"mg k Dx Jx", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid numeric initial value"},
        {"mg k Jx Dx", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid numeric delta value"},
        {"mg k M Tx", PROTO_ERR_CLIENT, badtok},
        {"mg k Tx M", PROTO_ERR_CLIENT, "CLIENT_ERROR incorrect length for M token"},
        {o1, PROTO_ERR_CLIENT, "CLIENT_ERROR duplicate flag"},
        {o2, PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid mode for ms M token"},
        {o3, PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid mode for ms M token"},
        {o4, PROTO_ERR_CLIENT, "CLIENT_ERROR invalid mode for ma M token"},
        {o5, PROTO_ERR_CLIENT, dec},
        {"ms k 1 MX Tx", PROTO_ERR_CLIENT_SWALLOW, badtok},
        {"ma k Fabc MX", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid or duplicate flag"},
        {"ma k MX Fabc", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid or duplicate flag"},
    };
    RUN_ERR_CASES(c);
}

static void test_meta_too_many(void **state)
{
    char line[400] = "mg k";
    for (int i = 0; i < PROTO_META_FLAGS_MAX; i++) strcat(line, " v");
    assert_int_equal(parse(line), PROTO_ERR_CLIENT);
    assert_string_equal(err, "CLIENT_ERROR duplicate flag");
    strcat(line, " v");
    assert_int_equal(parse(line), PROTO_ERR_CLIENT);
    assert_string_equal(err, "CLIENT_ERROR too many meta flags"); /* counted before the rest */
    strcpy(line, "md k");
    for (int i = 0; i <= PROTO_META_FLAGS_MAX; i++) strcat(line, " q");
    assert_int_equal(parse(line), PROTO_ERR_CLIENT);
    assert_string_equal(err, "CLIENT_ERROR too many meta flags");
    /* every flag mg accepts at once */
    OK("mg a2V5 b c f h k l q s t u v C1 D1 E1 F1 I J1 L M1 N1 O1 P R1 T1");
    assert_int_equal(req.meta.nflags, 24);
}

static void test_meta_base64(void **state)
{
    OK("mg a2V5 b v k");
    assert_true(req.meta.base64);
    assert_ptr_equal(req.key, req.keybuf);
    KEY_IS("key");
    OK("mg AA== b");
    assert_int_equal(req.nkey, 1);
    assert_int_equal(req.key[0], 0);
    OK("mg AAAAAA== v b");
    assert_int_equal(req.nkey, 4);
    OK("ms Zm9v 3 b");
    KEY_IS("foo");
    OK("me Zm9v b");
    assert_int_equal(req.cmd, CMD_ME);
    KEY_IS("foo");
    assert_true(req.meta.base64);
    assert_int_equal(req.meta.nflags, 1);
    /* decoded binary key may hold any byte */
    OK("md AAEC/w== b");
    assert_int_equal(req.nkey, 4);
    assert_memory_equal(req.key, "\x00\x01\x02\xff", 4);
}

static void test_meta_set(void **state)
{
    OK("ms k 5");
    assert_int_equal(req.cmd, CMD_MS);
    KEY_IS("k");
    assert_int_equal(req.nbytes, 5);
    assert_int_equal(req.meta.mode, 0);
    OK("ms k 0 T10 F4294967295 c MA I q C99 E100 k O9 S5 s");
    assert_int_equal(req.nbytes, 0);
    assert_int_equal(req.meta.ttl, 10);
    assert_true(req.meta.flags == UINT32_MAX);
    assert_int_equal(req.meta.mode, 'A');
    assert_true(req.meta.invalidate);
    assert_true(req.meta.quiet);
    assert_int_equal(req.meta.cas_in, 99);
    assert_int_equal(req.meta.cas_new, 100);
    assert_int_equal(req.meta.nflags, 12);
    OK("ms k 1 Ma");
    assert_int_equal(req.meta.mode, 'A');
    static const struct {
        const char *line;
        char mode;
    } modes[] = {{"ms k 1 ME", 'E'}, {"ms k 1 Me", 'E'}, {"ms k 1 MP", 'P'}, {"ms k 1 Mp", 'P'},
                 {"ms k 1 MR", 'R'}, {"ms k 1 Mr", 'R'}, {"ms k 1 MS", 'S'}, {"ms k 1 Ms", 'S'}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        OK(modes[i].line);
        assert_int_equal(req.meta.mode, modes[i].mode);
    }
    OK("ms k 01 T-1");
    assert_int_equal(req.nbytes, 1);
    OK("ms k 1048574");

    char lk[600], lo[64];
    snprintf(lk, sizeof lk, "ms %s 1", repeat('a', 251));
    snprintf(lo, sizeof lo, "ms k 1 O%s", repeat('o', 32));
    struct err_case c[] = {
        {"ms", PROTO_ERR_UNKNOWN, E},
        {"ms ", PROTO_ERR_UNKNOWN, E},
        /* until datalen is known the data is left unread */
        {"ms k", PROTO_ERR_CLIENT, BADFMT},
        {"ms k ", PROTO_ERR_CLIENT, BADFMT},
        {"ms k abc", PROTO_ERR_CLIENT, BADFMT},
        {"ms k -1", PROTO_ERR_CLIENT, BADFMT},
        {"ms k 1-", PROTO_ERR_CLIENT, BADFMT},
        {"ms k 1x", PROTO_ERR_CLIENT, BADFMT},
        {"ms k T1", PROTO_ERR_CLIENT, BADFMT},
        {"ms k 2147483646", PROTO_ERR_CLIENT, BADFMT},
        /* after it, memcached swallows the data; we do for an overlong key too */
        {lk, PROTO_ERR_CLIENT_SWALLOW, BADFMT},
        {"ms k 1 x", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid flag"},
        {"ms k 2000000 x", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid flag"},
        {"ms k 1 q q", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR duplicate flag"},
        {"ms k 1 b", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR error decoding key"},
        {"ms k 1 Fabc", PROTO_ERR_CLIENT_SWALLOW, BADFMT},
        {"ms k 1 F-1", PROTO_ERR_CLIENT_SWALLOW, BADFMT},
        {"ms k 1 Dabc", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid numeric delta value"},
        {"ms k 1 Cabc", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR bad token in command line format"},
        {"ms k 1 Tabc", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR bad token in command line format"},
        {"ms k 1 Sx", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR bad token in command line format"},
        {"ms k 1 MX", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid mode for ms M token"},
        {"ms k 1 MI", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid mode for ms M token"},
        {"ms k 1 M", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR incorrect length for M token"},
        {"ms k 1 MSS", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR incorrect length for M token"},
        {"ms k 2000000 MX", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR invalid mode for ms M token"},
        {lo, PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR opaque token too long"},
        {"ms a2V5\x01 1 b", PROTO_ERR_CLIENT_SWALLOW, "CLIENT_ERROR error decoding key"},
        {"ms k 1048575", PROTO_ERR_TOO_LARGE, TOO_LARGE},
        {"ms k 2000000 T1", PROTO_ERR_TOO_LARGE, TOO_LARGE},
        {"ms k 2147483645", PROTO_ERR_TOO_LARGE, TOO_LARGE},
    };
    RUN_ERR_CASES(c);
    assert_int_equal(parse("ms k 1 x"), PROTO_ERR_CLIENT_SWALLOW);
    assert_int_equal(req.nbytes, 1);
    assert_int_equal(parse("ms k 2000000 q"), PROTO_ERR_TOO_LARGE);
    assert_int_equal(req.nbytes, 2000000);
    KEY_IS("k");
    assert_int_equal(parse("ms Zm9v 2000000 b"), PROTO_ERR_TOO_LARGE);
    KEY_IS("foo");
}

static void test_meta_delete_arith(void **state)
{
    OK("md k q I T30 x C5 E6 k O1");
    assert_int_equal(req.cmd, CMD_MD);
    assert_true(req.meta.quiet && req.meta.invalidate);
    assert_int_equal(req.meta.ttl, 30);
    assert_true(proto_meta_has(&req.meta, 'x'));
    assert_int_equal(req.meta.cas_in, 5);
    assert_int_equal(req.meta.cas_new, 6);

    OK("ma k");
    assert_int_equal(req.cmd, CMD_MA);
    assert_int_equal(req.meta.delta, 1);
    assert_int_equal(req.meta.initial, 0);
    assert_int_equal(req.meta.mode, 0);
    OK("ma k N0 J10 D5 MD T5 q t c v k O1 C3 E4");
    assert_int_equal(req.meta.vivify, 0);
    assert_true(proto_meta_has(&req.meta, 'N'));
    assert_int_equal(req.meta.initial, 10);
    assert_int_equal(req.meta.delta, 5);
    assert_int_equal(req.meta.mode, 'D');
    assert_int_equal(req.meta.nflags, 13);
    OK("ma k D18446744073709551615 J18446744073709551615");
    assert_true(req.meta.delta == UINT64_MAX && req.meta.initial == UINT64_MAX);
    static const struct {
        const char *line;
        char mode;
    } modes[] = {{"ma k MI", 'I'}, {"ma k Mi", 'I'}, {"ma k M+", 'I'},
                 {"ma k MD", 'D'}, {"ma k Md", 'D'}, {"ma k M-", 'D'}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        OK(modes[i].line);
        assert_int_equal(req.meta.mode, modes[i].mode);
    }

    static const char *invdup = "CLIENT_ERROR invalid or duplicate flag";
    static const char *opq = "CLIENT_ERROR opaque token too long";
    char lk1[600], lk2[600], lo1[64], lo2[64];
    snprintf(lk1, sizeof lk1, "md %s", repeat('a', 251));
    snprintf(lk2, sizeof lk2, "ma %s", repeat('a', 251));
    snprintf(lo1, sizeof lo1, "md k O%s", repeat('o', 32));
    snprintf(lo2, sizeof lo2, "ma k O%s", repeat('o', 32));
    struct err_case c[] = {
        {"md", PROTO_ERR_UNKNOWN, E},
        {"ma", PROTO_ERR_UNKNOWN, E},
        {lk1, PROTO_ERR_CLIENT, BADFMT},
        {lk2, PROTO_ERR_CLIENT, BADFMT},
        {"md k q q", PROTO_ERR_CLIENT, invdup},
        {"ma k q q", PROTO_ERR_CLIENT, invdup},
        {"md k a", PROTO_ERR_CLIENT, invdup},
        {"ma k x", PROTO_ERR_CLIENT, invdup},
        {"md k Tabc", PROTO_ERR_CLIENT, invdup},
        {"ma k Tabc", PROTO_ERR_CLIENT, invdup},
        {"ma k Dabc", PROTO_ERR_CLIENT, invdup},
        {"ma k D", PROTO_ERR_CLIENT, invdup},
        {"ma k D-1", PROTO_ERR_CLIENT, invdup},
        {"ma k D18446744073709551616", PROTO_ERR_CLIENT, invdup},
        {"ma k Jabc", PROTO_ERR_CLIENT, invdup},
        {"ma k Nabc", PROTO_ERR_CLIENT, invdup},
        {"md k Fabc", PROTO_ERR_CLIENT, invdup},
        {"ma k M", PROTO_ERR_CLIENT, invdup},
        {"ma k MIx", PROTO_ERR_CLIENT, invdup},
        {"md k b", PROTO_ERR_CLIENT, invdup},
        {"ma k b", PROTO_ERR_CLIENT, invdup},
        {"ma k MX", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid mode for ma M token"},
        {"ma k M*", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid mode for ma M token"},
        {lo1, PROTO_ERR_CLIENT, opq},
        {lo2, PROTO_ERR_CLIENT, opq},
    };
    RUN_ERR_CASES(c);
}

static void test_meta_debug(void **state)
{
    OK("me k");
    assert_int_equal(req.cmd, CMD_ME);
    KEY_IS("k");
    assert_false(req.meta.base64);
    OK("me k x"); /* memcached ignores other tokens */
    OK("me a2V5 x b");
    KEY_IS("a2V5"); /* b counts only right after the key */
    OK("me a2V5 bx");
    KEY_IS("a2V5");
    char lk[600];
    snprintf(lk, sizeof lk, "me %s", repeat('a', 251));
    struct err_case c[] = {
        {"me", PROTO_ERR_CLIENT, BADFMT},
        {"me ", PROTO_ERR_CLIENT, BADFMT},
        {lk, PROTO_ERR_CLIENT, BADFMT},
        {"me k b", PROTO_ERR_CLIENT, BADFMT},
        {"me !!! b", PROTO_ERR_CLIENT, BADFMT},
    };
    RUN_ERR_CASES(c);
}

/* Fields from an earlier request never leak into the next. */
static void test_reset(void **state)
{
    OK("ma a2V5 b q N5 J6 D7 MD T8 O1 C9 E10 t");
    OK("mn");
    assert_int_equal(req.meta.nflags, 0);
    assert_int_equal(req.meta.has | req.meta.has_upper, 0);
    assert_false(req.meta.base64 || req.meta.quiet || req.meta.invalidate);
    assert_int_equal(req.meta.mode, 0);
    assert_int_equal(req.meta.delta, 1);
    assert_int_equal(req.meta.initial | req.meta.cas_in | req.meta.cas_new, 0);
    assert_null(req.meta.opaque);
    assert_null(req.key);
    OK("cas k 1 2 3 4 noreply");
    OK("get k");
    assert_false(req.noreply);
    assert_int_equal(req.cas | req.flags | req.nbytes | req.exptime, 0);
    OK("shutdown graceful");
    OK("stats");
    assert_null(req.arg);
    assert_false(req.has_arg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_basic),
        cmocka_unit_test(test_meta_flag_order),
        cmocka_unit_test(test_meta_get_errors),
        cmocka_unit_test(test_meta_error_precedence),
        cmocka_unit_test(test_meta_too_many),
        cmocka_unit_test(test_meta_base64),
        cmocka_unit_test(test_meta_set),
        cmocka_unit_test(test_meta_delete_arith),
        cmocka_unit_test(test_meta_debug),
        cmocka_unit_test(test_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
