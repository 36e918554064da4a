/* test_protocol.c — unit tests for the memcache request-line parser (src/protocol).
 *
 * Expected answers and error strings were checked against a live memcached 1.6.18; where shoal
 * deliberately differs (refusing '+' signs, control bytes in keys, 33-bit client flags; newer
 * meta flags) the test says so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "protocol/protocol.h"

#define ITEM_MAX ((size_t)1024 * 1024)

static struct proto_req req;
static const char *err;
static const char *cur_line;
static size_t cur_len;

static enum proto_status parse_n(const char *line, size_t len)
{
    cur_line = line;
    cur_len = len;
    err = "unset";
    return proto_parse(line, len, ITEM_MAX, &req, &err);
}

static enum proto_status parse(const char *line) { return parse_n(line, strlen(line)); }

/* Every pointer the parser returns points into the line (or keybuf for base64 keys). */
static void check_pointers(void)
{
    const char *lo = cur_line, *hi = cur_line + cur_len;
    if (req.key && req.key != req.keybuf) {
        assert_true(req.key >= lo && req.key + req.nkey <= hi);
    }
    if (req.keys) assert_true(req.keys >= lo && req.keys <= req.keys_end && req.keys_end <= hi);
    if (req.arg) assert_true(req.arg >= lo && req.arg + req.narg <= hi);
    for (int i = 0; i < req.meta.nflags; i++)
        assert_true(req.meta.flag[i].tok >= lo && req.meta.flag[i].tok + req.meta.flag[i].ntok <= hi);
    assert_true(req.nkey <= PROTO_KEY_MAX);
}

#define OK(line)                                                                                 \
    do {                                                                                         \
        enum proto_status st_ = parse(line);                                                     \
        if (st_ != PROTO_OK) fail_msg("'%s': status %d (%s), want OK", (line), st_, err);       \
        assert_null(err);                                                                        \
        check_pointers();                                                                        \
    } while (0)

#define KEY_IS(k)                                                                                \
    do {                                                                                         \
        assert_int_equal(req.nkey, strlen(k));                                                   \
        assert_memory_equal(req.key, (k), strlen(k));                                            \
    } while (0)

struct err_case {
    const char *line;
    enum proto_status st;
    const char *msg;
};

static const char *E = "ERROR";
static const char *BADFMT = "CLIENT_ERROR bad command line format";
static const char *TOO_LARGE = "SERVER_ERROR object too large for cache";
#define SW PROTO_ERR_CLIENT_SWALLOW

static void run_err_cases(const struct err_case *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        enum proto_status st = parse(c[i].line);
        if (st != c[i].st || err == NULL || strcmp(err, c[i].msg) != 0)
            fail_msg("'%s': got status %d '%s', want %d '%s'", c[i].line, st, err ? err : "(null)",
                     c[i].st, c[i].msg);
        check_pointers();
    }
}
#define RUN_ERR_CASES(arr) run_err_cases((arr), sizeof(arr) / sizeof((arr)[0]))

static char *repeat(char c, size_t n)
{
    static char bufs[4][1024];
    static int which;
    char *b = bufs[which++ & 3];
    assert_true(n < sizeof bufs[0]);
    memset(b, c, n);
    b[n] = '\0';
    return b;
}

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
