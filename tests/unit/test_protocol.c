/* test_protocol.c — unit tests for the memcache request-line parser (src/protocol).
 *
 * Expected answers and error strings were checked against a live memcached 1.6.18; where shoal
 * deliberately differs (refusing '+' signs, control bytes in keys, 33-bit client flags; newer
 * meta flags) the test says so. */
#include "protocol_harness.h"

/* ---- numbers ---------------------------------------------------------------------------- */

static void test_u64(void **state)
{
    uint64_t v = 42;
    assert_true(proto_parse_u64("0", 1, &v) && v == 0);
    assert_true(proto_parse_u64("18446744073709551615", 20, &v) && v == UINT64_MAX);
    assert_true(proto_parse_u64("007", 3, &v) && v == 7);
    assert_true(proto_parse_u64("000000000000000000000000001", 27, &v) && v == 1);
    assert_true(proto_parse_u64("00018446744073709551615", 23, &v) && v == UINT64_MAX);
    assert_true(proto_parse_u64("1234", 2, &v) && v == 12); /* length-bounded, not NUL-bounded */
    v = 42;
    assert_false(proto_parse_u64("18446744073709551616", 20, &v));
    assert_false(proto_parse_u64("99999999999999999999", 20, &v));
    assert_false(proto_parse_u64("184467440737095516150", 21, &v));
    assert_false(proto_parse_u64("", 0, &v));
    assert_false(proto_parse_u64("+1", 2, &v));
    assert_false(proto_parse_u64("-1", 2, &v));
    assert_false(proto_parse_u64("-0", 2, &v));
    assert_false(proto_parse_u64(" 1", 2, &v));
    assert_false(proto_parse_u64("1 ", 2, &v));
    assert_false(proto_parse_u64("1a", 2, &v));
    assert_false(proto_parse_u64("0x10", 4, &v));
    assert_false(proto_parse_u64("1\0", 2, &v));
    assert_int_equal(v, 42); /* untouched on failure */
}

static void test_i64(void **state)
{
    int64_t v = 42;
    assert_true(proto_parse_i64("0", 1, &v) && v == 0);
    assert_true(proto_parse_i64("-0", 2, &v) && v == 0);
    assert_true(proto_parse_i64("-1", 2, &v) && v == -1);
    assert_true(proto_parse_i64("9223372036854775807", 19, &v) && v == INT64_MAX);
    assert_true(proto_parse_i64("-9223372036854775808", 20, &v) && v == INT64_MIN);
    assert_true(proto_parse_i64("-0009", 5, &v) && v == -9);
    v = 42;
    assert_false(proto_parse_i64("9223372036854775808", 19, &v));
    assert_false(proto_parse_i64("-9223372036854775809", 20, &v));
    assert_false(proto_parse_i64("18446744073709551616", 20, &v));
    assert_false(proto_parse_i64("", 0, &v));
    assert_false(proto_parse_i64("-", 1, &v));
    assert_false(proto_parse_i64("+5", 2, &v));
    assert_false(proto_parse_i64("--1", 3, &v));
    assert_false(proto_parse_i64("-+1", 3, &v));
    assert_false(proto_parse_i64("1-", 2, &v));
    assert_false(proto_parse_i64("5s", 2, &v));
    assert_int_equal(v, 42);
}

/* memcached's safe_strto* readings, as observed on memcached 1.6.18. */
static void test_mc_numbers(void **state)
{
    uint32_t u = 42;
    int32_t i = 42;
    uint64_t v = 42;
    assert_true(proto_mc_u32("4294967296", 10, &u) && u == 0); /* low 32 bits */
    assert_true(proto_mc_u32("4294967297", 10, &u) && u == 1);
    assert_true(proto_mc_u32("18446744073709551615", 20, &u) && u == UINT32_MAX);
    assert_true(proto_mc_u32("9223372036854775808", 19, &u) && u == 0);
    assert_true(proto_mc_u32("+5", 2, &u) && u == 5);
    assert_true(proto_mc_u32("-0", 2, &u) && u == 0);
    assert_true(proto_mc_u32("-18446744073709551615", 21, &u) && u == 1); /* wraps positive */
    assert_true(proto_mc_u32("5\tz", 3, &u) && u == 5); /* white space ends the number */
    assert_true(proto_mc_u32("\t\v7", 3, &u) && u == 7);
    assert_true(proto_mc_u32("7\r", 2, &u) && u == 7);
    assert_true(proto_mc_u32("1234", 2, &u) && u == 12); /* length-bounded */
    u = 42;
    assert_false(proto_mc_u32("-1", 2, &u));
    assert_false(proto_mc_u32("-9223372036854775808", 20, &u));
    assert_false(proto_mc_u32("18446744073709551616", 20, &u)); /* ERANGE */
    assert_false(proto_mc_u32("", 0, &u));
    assert_false(proto_mc_u32("-", 1, &u));
    assert_false(proto_mc_u32("+", 1, &u));
    assert_false(proto_mc_u32("\t", 1, &u));
    assert_false(proto_mc_u32("0x1", 3, &u));
    assert_false(proto_mc_u32("5z", 2, &u));
    assert_false(proto_mc_u32("++5", 3, &u));
    assert_int_equal(u, 42);

    assert_true(proto_mc_i32("-1", 2, &i) && i == -1);
    assert_true(proto_mc_i32("2147483648", 10, &i) && i == INT32_MIN);
    assert_true(proto_mc_i32("4294967297", 10, &i) && i == 1);
    assert_true(proto_mc_i32("-4294967291", 11, &i) && i == 5);
    assert_true(proto_mc_i32("9223372036854775807", 19, &i) && i == -1);
    assert_true(proto_mc_i32("-9223372036854775808", 20, &i) && i == 0);
    assert_true(proto_mc_i32("+1\x0b", 3, &i) && i == 1);
    i = 42;
    assert_false(proto_mc_i32("9223372036854775808", 19, &i));
    assert_false(proto_mc_i32("-9223372036854775809", 20, &i));
    assert_false(proto_mc_i32("1.5", 3, &i));
    assert_int_equal(i, 42);

    assert_true(proto_mc_u64("18446744073709551615", 20, &v) && v == UINT64_MAX);
    assert_true(proto_mc_u64("+1", 2, &v) && v == 1);
    v = 42;
    assert_false(proto_mc_u64("-1", 2, &v));
    assert_false(proto_mc_u64("18446744073709551616", 20, &v));
    assert_int_equal(v, 42);
}

/* The fields that memcached reads with those helpers. */
static void test_mc_number_fields(void **state)
{
    OK("set k 4294967296 0 1");
    assert_int_equal(req.flags, 0);
    OK("set k +5 0 1");
    assert_int_equal(req.flags, 5);
    OK("set k 5\tz 0 1");
    assert_int_equal(req.flags, 5);
    OK("set k 0 -4294967291 1");
    assert_int_equal(req.exptime, 5);
    OK("set k 0 0 4294967297");
    assert_int_equal(req.nbytes, 1);
    OK("set k 0 0 +1\r");
    assert_int_equal(req.nbytes, 1);
    OK("set k 0 0 1\r\r"); /* "1\r": white space after the digits */
    assert_int_equal(req.nbytes, 1);
    OK("cas k 0 0 1 +5");
    assert_int_equal(req.cas, 5);
    OK("incr k +5");
    assert_int_equal(req.delta, 5);
    OK("touch k +10");
    assert_int_equal(req.exptime, 10);
    OK("gat +10 k");
    assert_int_equal(req.exptime, 10);
    OK("flush_all +1");
    assert_int_equal(req.exptime, 1);
    OK("verbosity 4294967297");
    assert_int_equal(req.delta, 1);
    OK("mg k T4294967301 N+1 R-1");
    assert_int_equal(req.meta.ttl, 5);
    assert_int_equal(req.meta.vivify, 1);
    assert_int_equal(req.meta.recache, -1);
    OK("ms k 1 F4294967297");
    assert_int_equal(req.meta.flags, 1);
    OK("ms k +1");
    assert_int_equal(req.nbytes, 1);
    OK("ms k 4294967297 T0");
    assert_int_equal(req.nbytes, 1);
    OK("ma k D+2 J+3 C+4 E+5");
    assert_int_equal(req.meta.delta, 2);
    assert_int_equal(req.meta.initial, 3);
    assert_int_equal(req.meta.cas_in, 4);
    assert_int_equal(req.meta.cas_new, 5);
}

/* An unknown command whose last token starts with "HTTP/" closes the connection silently. */
static void test_http_lines(void **state)
{
    static const char *http[] = {"GET / HTTP/1.0",      "PUT /x HTTP/1.1", "POST / HTTP/1.1",
                                 "HEAD / HTTP/1.0\r",   "HTTP/1.1",        "mxx HTTP/1",
                                 "OPTIONS * HTTP/1.1",  "x1 HTTP/",        "PRI * HTTP/2.0"};
    for (size_t i = 0; i < sizeof http / sizeof http[0]; i++) {
        if (parse(http[i]) != PROTO_ERR_CLOSE) fail_msg("'%s' not closed", http[i]);
        assert_string_equal(err, "");
    }
    struct err_case c[] = {
        {"GET / HTTP/1.0 x", PROTO_ERR_UNKNOWN, E}, /* the last token decides */
        {"dog / HTTP/1.0", PROTO_ERR_UNKNOWN, E},   /* d is dispatched first */
        {"gxx / HTTP/1.0", PROTO_ERR_UNKNOWN, E},
        {"mx HTTP/1.0", PROTO_ERR_UNKNOWN, E},
        {"G HTTP/1.0", PROTO_ERR_UNKNOWN, E},      /* one-byte command */
        {"foo http/1.0", PROTO_ERR_UNKNOWN, E},    /* case matters */
        {"GET / HTTP", PROTO_ERR_UNKNOWN, E},
        {"bget HTTP/1.0", PROTO_ERR_UNKNOWN, E},   /* a command memcached has */
        {"extstore HTTP/1.0", PROTO_ERR_UNKNOWN, E},
    };
    RUN_ERR_CASES(c);
    OK("get HTTP/1.0"); /* a key */
    OK("watch HTTP/1.0"); /* a command */
    /* memcached looks at 23 tokens at most */
    char line[400] = "GET";
    for (int i = 0; i < 21; i++) strcat(line, " a");
    strcat(line, " HTTP/1.0");
    assert_int_equal(parse(line), PROTO_ERR_CLOSE);
    strcat(line, " b");
    assert_int_equal(parse(line), PROTO_ERR_CLOSE);
    strcpy(line, "GET");
    for (int i = 0; i < 22; i++) strcat(line, " a");
    strcat(line, " HTTP/1.0"); /* the 24th token */
    assert_int_equal(parse(line), PROTO_ERR_UNKNOWN);
}

/* memcached's tuning commands parse to their own commands and answer as memcached does. */
static void test_tuning_commands(void **state)
{
    static const struct {
        const char *line;
        enum proto_cmd cmd;
        const char *reply;
        bool silent;
    } c[] = {
        {"slabs automove 1", CMD_SLABS, "OK", false},
        {"slabs automove 4294967297", CMD_SLABS, "OK", false}, /* 32 bits: 1 */
        {"slabs automove 3", CMD_SLABS, "ERROR", false},
        {"slabs automove x", CMD_SLABS, "CLIENT_ERROR bad command line format", false},
        {"slabs automove noreply", CMD_SLABS, "CLIENT_ERROR bad command line format", true},
        {"slabs automove ratio 0.5 noreply", CMD_SLABS, "OK", true},
        {"slabs automove ratio 1e", CMD_SLABS, "ERROR", false},
        {"slabs reassign 1 2", CMD_SLABS, "CLIENT_ERROR slab reassignment disabled", false},
        {"slabs reassign 1 2 3", CMD_SLABS, "ERROR", false},
        {"slabs", CMD_SLABS, "ERROR", false},
        {"lru_crawler crawl 1,,63", CMD_LRU_CRAWLER, "OK", false},
        {"lru_crawler crawl 1,64", CMD_LRU_CRAWLER, "BADCLASS invalid class id", false},
        {"lru_crawler sleep 1000000", CMD_LRU_CRAWLER, "OK", false},
        {"lru_crawler sleep 1000001", CMD_LRU_CRAWLER,
         "CLIENT_ERROR sleep must be one second or less", false},
        {"lru_crawler metadump all", CMD_LRU_CRAWLER, "ERROR", false},
        {"lru tune 40 40 1 1", CMD_LRU, "OK", false},
        {"lru tune 41 40 1 1", CMD_LRU, "ERROR hot and warm pcts must not exceed 80", false},
        {"lru tune 4294967295 1 1 1", CMD_LRU, "OK", false}, /* memcached's sum wraps */
        {"lru temp_ttl -1 noreply", CMD_LRU, "OK", true},
        {"watch", CMD_WATCH, "CLIENT_ERROR watch commands not allowed", false},
        {"watch rawcmds noreply", CMD_WATCH, "CLIENT_ERROR watch commands not allowed", true},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        OK(c[i].line);
        assert_int_equal(req.cmd, c[i].cmd);
        bool silent;
        const char *r = proto_tune_reply(&req, &silent);
        if (strcmp(r, c[i].reply) != 0 || silent != c[i].silent)
            fail_msg("'%s': got '%s'%s", c[i].line, r, silent ? " (silent)" : "");
    }
}

/* ---- base64 ----------------------------------------------------------------------------- */

static void test_base64_vectors(void **state)
{
    static const char *vec[][2] = {{"", ""},          {"f", "Zg=="},         {"fo", "Zm8="},
                                   {"foo", "Zm9v"},   {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
                                   {"foobar", "Zm9vYmFy"}};
    char out[64];
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        size_t n = strlen(vec[i][0]), m = strlen(vec[i][1]);
        assert_int_equal(proto_base64_encode(vec[i][0], n, out, sizeof out), (int)m);
        assert_memory_equal(out, vec[i][1], m);
        assert_int_equal(proto_base64_decode(vec[i][1], m, out, sizeof out), (int)n);
        assert_memory_equal(out, vec[i][0], n);
    }
}

static void test_base64_errors(void **state)
{
    static const char *bad[] = {"Zg=",  "Zg",       "Z",        "Zm9vY",     "====", "A===",
                                "=AAA", "AA=A",     "Zm9v====", "Zm 9",      "Zm9\x01", "Zm9-",
                                "Zm9_", ("Zm9v\x80" "AA"), "Zg==Zg==", "Z=g="};
    char out[64];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (proto_base64_decode(bad[i], strlen(bad[i]), out, sizeof out) != -1)
            fail_msg("decoded '%s'", bad[i]);
    /* unused pad bits need not be zero, as in memcached */
    assert_int_equal(proto_base64_decode("AB==", 4, out, sizeof out), 1);
    assert_int_equal(out[0], 0);
    /* capacity */
    assert_int_equal(proto_base64_decode("Zm9v", 4, out, 3), 3);
    assert_int_equal(proto_base64_decode("Zm9v", 4, out, 2), -1);
    assert_int_equal(proto_base64_decode("Zg==", 4, out, 1), 1);
    assert_int_equal(proto_base64_decode("Zg==", 4, out, 0), -1);
    assert_int_equal(proto_base64_encode("foo", 3, out, 4), 4);
    assert_int_equal(proto_base64_encode("foo", 3, out, 3), -1);
    assert_int_equal(proto_base64_encode("f", 1, out, 3), -1);
    assert_int_equal(proto_base64_encode("", 0, out, 0), 0);
}

static void test_base64_roundtrip(void **state)
{
    char in[256], enc[400], dec[256];
    for (int i = 0; i < 256; i++) in[i] = (char)i;
    for (size_t n = 0; n <= sizeof in; n++) {
        int m = proto_base64_encode(in, n, enc, sizeof enc);
        assert_int_equal(m, (int)((n + 2) / 3 * 4));
        assert_int_equal(proto_base64_decode(enc, (size_t)m, dec, sizeof dec), (int)n);
        assert_memory_equal(dec, in, n);
    }
}

/* ---- retrieval -------------------------------------------------------------------------- */

static void test_get(void **state)
{
    OK("get k");
    assert_int_equal(req.cmd, CMD_GET);
    KEY_IS("k");
    OK("gets a b  c ");
    assert_int_equal(req.cmd, CMD_GETS);
    KEY_IS("a");
    const char *c = req.keys, *k;
    uint8_t nk;
    const char *want[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        assert_true(proto_next_key(&c, req.keys_end, &k, &nk));
        assert_int_equal(nk, 1);
        assert_memory_equal(k, want[i], 1);
    }
    assert_false(proto_next_key(&c, req.keys_end, &k, &nk));
    assert_false(proto_next_key(&c, req.keys_end, &k, &nk));
    assert_true(proto_keys_valid(req.keys, req.keys_end));

    char line[600];
    snprintf(line, sizeof line, "get %s", repeat('a', 250));
    OK(line);
    assert_int_equal(req.nkey, 250);
    OK("get k\r"); /* one trailing \r is part of the line terminator */
    KEY_IS("k");
    OK("   get    k");
    KEY_IS("k");
    OK("get \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87"); /* UTF-8 is fine */
    assert_int_equal(req.nkey, 8);
}

static void test_get_errors(void **state)
{
    char l1[600], l2[600], l3[600];
    snprintf(l1, sizeof l1, "get %s", repeat('a', 251));
    snprintf(l2, sizeof l2, "get k %s", repeat('a', 251));
    snprintf(l3, sizeof l3, "gat 10 k %s j", repeat('a', 251));
    struct err_case c[] = {
        {"get", PROTO_ERR_UNKNOWN, E},
        {"get ", PROTO_ERR_UNKNOWN, E},
        {"gets", PROTO_ERR_UNKNOWN, E},
        {"get\tk", PROTO_ERR_UNKNOWN, E}, /* memcached splits on ' ' only */
        {l1, PROTO_ERR_CLIENT, BADFMT},
        {l2, PROTO_ERR_CLIENT, BADFMT},
        {l3, PROTO_ERR_CLIENT, BADFMT},
        {"gat", PROTO_ERR_UNKNOWN, E},
        {"gats", PROTO_ERR_UNKNOWN, E},
        {"gat abc k", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid exptime argument"},
        {"gat abc", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid exptime argument"},
        {"gat 10x k", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid exptime argument"},
        {"gat 9223372036854775808 k", PROTO_ERR_CLIENT, "CLIENT_ERROR invalid exptime argument"},
    };
    RUN_ERR_CASES(c);
    assert_int_equal(parse_n("get k\0j", 7), PROTO_OK); /* a NUL ends the line */
    KEY_IS("k");
}

/* Keys take every byte but a space, as memcached's do. */
static void test_control_byte_keys(void **state)
{
    OK("get k\tj");
    KEY_IS("k\tj");
    OK("get k\x7f \x01 \xff\xfe");
    KEY_IS("k\x7f");
    assert_true(proto_keys_valid(req.keys, req.keys_end));
    OK("get a k\r\r"); /* one \r ends the line, the other is a key byte */
    OK("set a\rb 0 0 1");
    KEY_IS("a\rb");
    OK("set \x01" "bad 0 0 9");
    KEY_IS("\x01" "bad");
    OK("mg k\x01 v");
    KEY_IS("k\x01");
    OK("ms \x1b[0m 1 T0");
    KEY_IS("\x1b[0m");
    OK("md k\x7f q");
    OK("ma \x80 D1");
    OK("me k\x01");
    KEY_IS("k\x01");
    OK("touch \t 1");
    KEY_IS("\t");
    OK("delete \x02");
    assert_int_equal(parse_n("set k\0x 0 0 1", 14), PROTO_ERR_UNKNOWN); /* "set k" */
}

static void test_gat(void **state)
{
    OK("gat 10 a b");
    assert_int_equal(req.cmd, CMD_GAT);
    assert_int_equal(req.exptime, 10);
    KEY_IS("a");
    OK("gats -1 k");
    assert_int_equal(req.cmd, CMD_GATS);
    assert_int_equal(req.exptime, -1);
    KEY_IS("k");
    OK("gat 10"); /* no keys: memcached answers END */
    assert_null(req.key);
    assert_ptr_equal(req.keys, req.keys_end);
    const char *c = req.keys, *k;
    uint8_t nk;
    assert_false(proto_next_key(&c, req.keys_end, &k, &nk));
    OK("gats 5   ");
    assert_null(req.key);
}

static void test_keys_helpers(void **state)
{
    char line[600];
    snprintf(line, sizeof line, "a %s b", repeat('x', 251));
    const char *end = line + strlen(line), *c = line, *k;
    uint8_t nk;
    assert_false(proto_keys_valid(line, end));
    assert_true(proto_next_key(&c, end, &k, &nk));
    assert_false(proto_next_key(&c, end, &k, &nk)); /* an overlong key ends the iteration */
    assert_ptr_equal(c, end);
    const char *empty = "";
    assert_true(proto_keys_valid(empty, empty));
    const char *sp = "   ";
    assert_true(proto_keys_valid(sp, sp + 3));
    c = sp;
    assert_false(proto_next_key(&c, sp + 3, &k, &nk));
    const char *tab = "a\tb";
    assert_true(proto_keys_valid(tab, tab + 3));
}

/* ---- storage ---------------------------------------------------------------------------- */

static void test_storage(void **state)
{
    OK("set k 0 0 1");
    assert_int_equal(req.cmd, CMD_SET);
    KEY_IS("k");
    assert_int_equal(req.flags, 0);
    assert_int_equal(req.exptime, 0);
    assert_int_equal(req.nbytes, 1);
    assert_false(req.noreply);

    OK("add k 4294967295 -1 0 noreply");
    assert_int_equal(req.cmd, CMD_ADD);
    assert_int_equal(req.flags, UINT32_MAX);
    assert_int_equal(req.exptime, -1);
    assert_int_equal(req.nbytes, 0);
    assert_true(req.noreply);

    OK("replace k 1 2 3");
    assert_int_equal(req.cmd, CMD_REPLACE);
    OK("append k 1 2 3");
    assert_int_equal(req.cmd, CMD_APPEND);
    OK("prepend k 1 2 3");
    assert_int_equal(req.cmd, CMD_PREPEND);

    OK("cas k 1 2 3 4");
    assert_int_equal(req.cmd, CMD_CAS);
    assert_int_equal(req.flags, 1);
    assert_int_equal(req.exptime, 2);
    assert_int_equal(req.nbytes, 3);
    assert_int_equal(req.cas, 4);
    OK("cas k 0 0 1 18446744073709551615 noreply");
    assert_true(req.cas == UINT64_MAX);
    assert_true(req.noreply);

    OK("set k 0 0 1 extra"); /* a last token that is not noreply is ignored */
    assert_false(req.noreply);
    OK("set k 0 0 1 2");
    OK("cas k 0 0 1 5 nope");
    assert_false(req.noreply);
    OK("set k 007 -9223372036854775808 00001");
    assert_int_equal(req.flags, 7);
    assert_int_equal(req.exptime, 0); /* memcached keeps the low 32 bits */
    assert_int_equal(req.nbytes, 1);
    OK("set k 0 0 -0");
    assert_int_equal(req.nbytes, 0);
    OK("  set   k  0  0  1  ");
    KEY_IS("k");
    OK("set k 0 0 1048574\r"); /* exactly item_max with its \r\n */
    assert_int_equal(req.nbytes, 1048574);

    char line[600];
    snprintf(line, sizeof line, "set %s 0 0 1", repeat('k', 250));
    OK(line);
    assert_int_equal(req.nkey, 250);
}

static void test_storage_errors(void **state)
{
    char l1[600], l2[600];
    snprintf(l1, sizeof l1, "set %s 0 0 1", repeat('a', 251));
    snprintf(l2, sizeof l2, "set %s 0 0 1 noreply", repeat('a', 251));
    struct err_case c[] = {
        {"set", PROTO_ERR_UNKNOWN, E},
        {"set k", PROTO_ERR_UNKNOWN, E},
        {"set k 0", PROTO_ERR_UNKNOWN, E},
        {"set k 0 0", PROTO_ERR_UNKNOWN, E},
        {"set k 0 0 1 noreply extra", PROTO_ERR_UNKNOWN, E},
        {"cas k 0 0 1", PROTO_ERR_UNKNOWN, E},
        {"cas k 0 0 1 5 noreply extra", PROTO_ERR_UNKNOWN, E},
        {"SET k 0 0 1", PROTO_ERR_UNKNOWN, E},
        {"set\tk 0 0 1", PROTO_ERR_UNKNOWN, E},
        /* with a readable length, every refusal swallows the data block */
        {l1, SW, BADFMT},
        {l2, SW, BADFMT},
        {"set k abc 0 1", SW, BADFMT},
        {"set k -1 0 1", SW, BADFMT},
        {"set k 18446744073709551616 0 1", SW, BADFMT},
        {"set k 0x1 0 1", SW, BADFMT},
        {"set k - 0 1", SW, BADFMT},
        {"set k 0 abc 1", SW, BADFMT},
        {"set k 0 9223372036854775808 1", SW, BADFMT},
        /* without one, the data is left to run, as memcached leaves it */
        {"set k 0 0 -1", PROTO_ERR_CLIENT, BADFMT},
        {"set k 0 0 abc", PROTO_ERR_CLIENT, BADFMT},
        {"set k 0 0 1x", PROTO_ERR_CLIENT, BADFMT},
        {"set k 0 0 2147483646", PROTO_ERR_CLIENT, BADFMT},
        {"set k 0 0 4294967295", PROTO_ERR_CLIENT, BADFMT}, /* -1 in 32 bits */
        {"set k 0 0 99999999999999999999", PROTO_ERR_CLIENT, BADFMT},
        {"cas k 0 0 1 abc", SW, BADFMT},
        {"cas k 0 0 1 -1", SW, BADFMT},
        {"cas k 0 0 1 18446744073709551616", SW, BADFMT},
        {"cas k 0 0 2000000 abc", SW, BADFMT}, /* bad line beats too large */
        {"set k 0 0 1048575", PROTO_ERR_TOO_LARGE, TOO_LARGE},
        {"set k 0 0 2000000", PROTO_ERR_TOO_LARGE, TOO_LARGE},
        {"set k 0 0 2147483645", PROTO_ERR_TOO_LARGE, TOO_LARGE},
    };
    RUN_ERR_CASES(c);

    assert_int_equal(parse("set big 5 6 2000000 noreply"), PROTO_ERR_TOO_LARGE);
    KEY_IS("big"); /* the node drops the old item, as memcached does */
    assert_int_equal(req.nbytes, 2000000);
    assert_int_equal(req.flags, 5);
    assert_true(req.noreply);
    /* noreply is reported on errors too: memcached then stays silent */
    assert_int_equal(parse("set k abc 0 1 noreply"), SW);
    assert_true(req.noreply);
    assert_int_equal(req.nbytes, 1);
    /* a last "noreply" counts wherever it stands, once the token count fits (memcached) */
    assert_int_equal(parse("set k 0 0 noreply"), PROTO_ERR_CLIENT);
    assert_true(req.noreply);
    assert_int_equal(parse("cas k 0 0 1 noreply"), SW);
    assert_true(req.noreply);
    assert_int_equal(parse("set k 0 noreply"), PROTO_ERR_UNKNOWN);
    assert_false(req.noreply);
    OK("set noreply 0 0 1");
    KEY_IS("noreply");
    assert_false(req.noreply);
    assert_int_equal(parse(l2), SW);
    assert_true(req.noreply);
    assert_int_equal(req.nbytes, 1);
    assert_int_equal(parse_n("set k 0 0 1\0", 12), PROTO_OK);
    /* item_max edge */
    assert_int_equal(proto_parse("set k 0 0 8", 11, 10, &req, &err), PROTO_OK);
    assert_int_equal(proto_parse("set k 0 0 9", 11, 10, &req, &err), PROTO_ERR_TOO_LARGE);
    assert_int_equal(proto_parse("set k 0 0 0", 11, 0, &req, &err), PROTO_ERR_TOO_LARGE);
}

/* ---- other text commands ---------------------------------------------------------------- */

static void test_delete(void **state)
{
    OK("delete k");
    assert_int_equal(req.cmd, CMD_DELETE);
    KEY_IS("k");
    assert_false(req.has_arg);
    assert_false(req.noreply);
    OK("delete k noreply");
    assert_true(req.noreply);
    assert_false(req.has_arg);
    OK("delete k 0");
    assert_true(req.has_arg);
    assert_int_equal(req.exptime, 0);
    OK("delete k 0 noreply");
    assert_true(req.has_arg && req.noreply);
    /* a legacy hold-off time: memcached 1.6.18 refuses it, the node decides */
    OK("delete k 5");
    assert_true(req.has_arg);
    assert_int_equal(req.exptime, 5);
    OK("delete k -5 noreply");
    assert_int_equal(req.exptime, -5);

    static const char *usage = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";
    char l1[600];
    snprintf(l1, sizeof l1, "delete %s", repeat('a', 251));
    struct err_case c[] = {
        {"delete", PROTO_ERR_UNKNOWN, E},
        {"delete k 0 noreply x", PROTO_ERR_UNKNOWN, E},
        {l1, PROTO_ERR_CLIENT, BADFMT},
        {"delete k abc", PROTO_ERR_CLIENT, usage},
        {"delete k noreply 0", PROTO_ERR_CLIENT, usage},
        {"delete k 0 0", PROTO_ERR_CLIENT, usage},
        {"delete k +1", PROTO_ERR_CLIENT, usage},
    };
    RUN_ERR_CASES(c);
    assert_int_equal(parse("delete k abc noreply"), PROTO_ERR_CLIENT);
    assert_true(req.noreply);
    OK("delete noreply"); /* the key is "noreply" */
    KEY_IS("noreply");
    assert_false(req.noreply);
    /* memcached checks the arguments before the key */
    char l2[600];
    snprintf(l2, sizeof l2, "delete %s abc", repeat('a', 251));
    assert_int_equal(parse(l2), PROTO_ERR_CLIENT);
    assert_string_equal(err, usage);
    snprintf(l2, sizeof l2, "delete %s 0", repeat('a', 251));
    assert_int_equal(parse(l2), PROTO_ERR_CLIENT);
    assert_string_equal(err, BADFMT);
}

static void test_incr_decr_touch(void **state)
{
    OK("incr k 5");
    assert_int_equal(req.cmd, CMD_INCR);
    KEY_IS("k");
    assert_int_equal(req.delta, 5);
    OK("decr k 18446744073709551615 noreply");
    assert_int_equal(req.cmd, CMD_DECR);
    assert_true(req.delta == UINT64_MAX);
    assert_true(req.noreply);
    OK("incr k 05 extra");
    assert_int_equal(req.delta, 5);
    assert_false(req.noreply);
    OK("touch k 10");
    assert_int_equal(req.cmd, CMD_TOUCH);
    assert_int_equal(req.exptime, 10);
    OK("touch k -1 noreply");
    assert_int_equal(req.exptime, -1);
    assert_true(req.noreply);

    static const char *delta = "CLIENT_ERROR invalid numeric delta argument";
    static const char *expt = "CLIENT_ERROR invalid exptime argument";
    char l1[600], l2[600];
    snprintf(l1, sizeof l1, "incr %s 1", repeat('a', 251));
    snprintf(l2, sizeof l2, "touch %s 1", repeat('a', 251));
    struct err_case c[] = {
        {"incr", PROTO_ERR_UNKNOWN, E},
        {"incr k", PROTO_ERR_UNKNOWN, E},
        {"incr k ", PROTO_ERR_UNKNOWN, E},
        {"decr k 5 noreply extra", PROTO_ERR_UNKNOWN, E},
        {"touch k", PROTO_ERR_UNKNOWN, E},
        {"touch k 10 noreply extra", PROTO_ERR_UNKNOWN, E},
        {l1, PROTO_ERR_CLIENT, BADFMT},
        {l2, PROTO_ERR_CLIENT, BADFMT},
        {"incr k abc", PROTO_ERR_CLIENT, delta},
        {"decr k abc", PROTO_ERR_CLIENT, delta},
        {"incr k -1", PROTO_ERR_CLIENT, delta},
        {"incr k 5-", PROTO_ERR_CLIENT, delta},
        {"incr k 5x", PROTO_ERR_CLIENT, delta},
        {"incr k 18446744073709551616", PROTO_ERR_CLIENT, delta},
        {"touch k abc", PROTO_ERR_CLIENT, expt},
        {"touch k 9223372036854775808", PROTO_ERR_CLIENT, expt},
        {"touch k 1O", PROTO_ERR_CLIENT, expt},
    };
    RUN_ERR_CASES(c);
    assert_int_equal(parse("incr k abc noreply"), PROTO_ERR_CLIENT);
    assert_true(req.noreply);
    assert_int_equal(parse("incr k noreply"), PROTO_ERR_CLIENT);
    assert_string_equal(err, delta);
    assert_true(req.noreply);
    assert_int_equal(parse("touch k noreply"), PROTO_ERR_CLIENT);
    assert_string_equal(err, expt);
    assert_true(req.noreply);
    OK("incr noreply 5");
    KEY_IS("noreply");
    assert_false(req.noreply);
}

/* flush_ns <namespace> [noreply]: one name token, noreply only as a second token. */
static void test_flush_ns(void **state)
{
    (void)state;
    OK("flush_ns catalog");
    assert_int_equal(req.cmd, CMD_FLUSH_NS);
    assert_true(req.has_arg);
    assert_int_equal(req.narg, 7);
    assert_memory_equal(req.arg, "catalog", 7);
    assert_false(req.noreply);
    OK("flush_ns catalog noreply");
    assert_true(req.noreply);
    assert_int_equal(req.narg, 7);
    assert_int_equal(parse("flush_ns"), PROTO_ERR_UNKNOWN);
    assert_int_equal(parse("flush_ns a b c"), PROTO_ERR_UNKNOWN);
    assert_int_equal(parse("flush_ns a b"), PROTO_ERR_CLIENT);
    assert_false(req.noreply);
}

static void test_flush_verbosity_memlimit(void **state)
{
    OK("flush_all");
    assert_int_equal(req.cmd, CMD_FLUSH_ALL);
    assert_false(req.has_arg);
    OK("flush_all 0");
    assert_true(req.has_arg);
    assert_int_equal(req.delta, 0);
    OK("flush_all 10");
    assert_int_equal(req.delta, 10);
    assert_int_equal(req.exptime, 10);
    OK("flush_all noreply");
    assert_true(req.noreply);
    assert_false(req.has_arg);
    OK("flush_all 10 noreply");
    assert_true(req.noreply);
    assert_int_equal(req.delta, 10);
    OK("flush_all -1");
    assert_int_equal(req.exptime, -1);
    assert_int_equal(req.delta, 0);
    OK("flush_all 10 extra");
    assert_false(req.noreply);

    OK("verbosity 1");
    assert_int_equal(req.cmd, CMD_VERBOSITY);
    assert_true(req.has_arg);
    assert_int_equal(req.delta, 1);
    OK("verbosity 2 noreply");
    assert_true(req.noreply);
    OK("verbosity 1 2");

    OK("cache_memlimit 100");
    assert_int_equal(req.cmd, CMD_CACHE_MEMLIMIT);
    assert_int_equal(req.delta, 100);
    OK("cache_memlimit 64 noreply");
    assert_true(req.noreply);
    OK("cache_memlimit 100 extra");

    static const char *expt = "CLIENT_ERROR invalid exptime argument";
    struct err_case c[] = {
        {"flush_all abc", PROTO_ERR_CLIENT, expt},
        {"flush_all noreply 10", PROTO_ERR_CLIENT, expt},
        {"flush_all 1x", PROTO_ERR_CLIENT, expt},
        {"flush_all 10 noreply extra", PROTO_ERR_UNKNOWN, E},
        {"verbosity", PROTO_ERR_UNKNOWN, E},
        {"verbosity 1 2 3", PROTO_ERR_UNKNOWN, E},
        {"verbosity abc", PROTO_ERR_CLIENT, BADFMT},
        {"verbosity -1", PROTO_ERR_CLIENT, BADFMT},
        {"verbosity noreply", PROTO_ERR_CLIENT, BADFMT},
        {"cache_memlimit", PROTO_ERR_UNKNOWN, E},
        {"cache_memlimit abc", PROTO_ERR_UNKNOWN, E},
        {"cache_memlimit -1", PROTO_ERR_UNKNOWN, E},
        {"cache_memlimit 100 noreply extra", PROTO_ERR_UNKNOWN, E},
    };
    RUN_ERR_CASES(c);
    assert_int_equal(parse("verbosity noreply"), PROTO_ERR_CLIENT);
    assert_true(req.noreply);
    assert_int_equal(parse("cache_memlimit abc noreply"), PROTO_ERR_UNKNOWN);
    assert_true(req.noreply);
    assert_int_equal(parse("flush_all noreply noreply"), PROTO_ERR_CLIENT);
    assert_true(req.noreply);
}

static void test_misc_commands(void **state)
{
    OK("version");
    assert_int_equal(req.cmd, CMD_VERSION);
    OK("version a b c d e f g h i j k l m n o p q r s t u v w x y z");
    OK("quit");
    assert_int_equal(req.cmd, CMD_QUIT);
    OK("quit now");

    OK("stats");
    assert_int_equal(req.cmd, CMD_STATS);
    assert_null(req.arg);
    assert_int_equal(req.narg, 0);
    OK("stats settings");
    assert_int_equal(req.narg, 8);
    assert_memory_equal(req.arg, "settings", 8);
    OK("stats   detail on  \r");
    assert_int_equal(req.narg, 9);
    assert_memory_equal(req.arg, "detail on", 9);
    OK("stats    ");
    assert_null(req.arg);

    OK("shutdown");
    assert_int_equal(req.cmd, CMD_SHUTDOWN);
    assert_false(req.has_arg);
    OK("shutdown graceful");
    assert_true(req.has_arg);
    assert_int_equal(req.narg, 8);
    assert_memory_equal(req.arg, "graceful", 8);
    OK("shutdown foo bar");
    assert_int_equal(req.narg, 7);
}

static void test_unknown(void **state)
{
    struct err_case c[] = {
        {"", PROTO_ERR_UNKNOWN, E},         {"\r", PROTO_ERR_UNKNOWN, E},
        {"   ", PROTO_ERR_UNKNOWN, E},      {"foo", PROTO_ERR_UNKNOWN, E},
        {"gett k", PROTO_ERR_UNKNOWN, E},   {"ge k", PROTO_ERR_UNKNOWN, E},
        {"m", PROTO_ERR_UNKNOWN, E},        {"mx k", PROTO_ERR_UNKNOWN, E},
        {"MG k", PROTO_ERR_UNKNOWN, E},     {"\tget k", PROTO_ERR_UNKNOWN, E},
        {"getsx k", PROTO_ERR_UNKNOWN, E},  {"flush_al", PROTO_ERR_UNKNOWN, E},
        {"cache_memlimix 1", PROTO_ERR_UNKNOWN, E}, {"shutdowN", PROTO_ERR_UNKNOWN, E},
        {"versions", PROTO_ERR_UNKNOWN, E}, {"replacE k 0 0 1", PROTO_ERR_UNKNOWN, E},
        {"xxxxxx", PROTO_ERR_UNKNOWN, E},   {"xxxxxxx", PROTO_ERR_UNKNOWN, E},
        {"xxxxxxxxx", PROTO_ERR_UNKNOWN, E}, {"xxx", PROTO_ERR_UNKNOWN, E},
        {"xxxx", PROTO_ERR_UNKNOWN, E},     {"xxxxx", PROTO_ERR_UNKNOWN, E},
    };
    RUN_ERR_CASES(c);
    assert_int_equal(parse("foo"), PROTO_ERR_UNKNOWN);
    assert_int_equal(req.cmd, CMD_NONE);
    assert_int_equal(proto_parse(NULL, 0, ITEM_MAX, &req, &err), PROTO_ERR_UNKNOWN);
    assert_int_equal(parse_n("get\0k", 5), PROTO_ERR_UNKNOWN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_u64),
        cmocka_unit_test(test_i64),
        cmocka_unit_test(test_base64_vectors),
        cmocka_unit_test(test_base64_errors),
        cmocka_unit_test(test_base64_roundtrip),
        cmocka_unit_test(test_get),
        cmocka_unit_test(test_get_errors),
        cmocka_unit_test(test_control_byte_keys),
        cmocka_unit_test(test_mc_numbers),
        cmocka_unit_test(test_mc_number_fields),
        cmocka_unit_test(test_http_lines),
        cmocka_unit_test(test_tuning_commands),
        cmocka_unit_test(test_gat),
        cmocka_unit_test(test_keys_helpers),
        cmocka_unit_test(test_storage),
        cmocka_unit_test(test_storage_errors),
        cmocka_unit_test(test_delete),
        cmocka_unit_test(test_incr_decr_touch),
        cmocka_unit_test(test_flush_verbosity_memlimit),
        cmocka_unit_test(test_flush_ns),
        cmocka_unit_test(test_misc_commands),
        cmocka_unit_test(test_unknown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
