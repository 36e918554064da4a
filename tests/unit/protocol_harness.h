/* protocol_harness.h — what test_protocol.c and test_protocol_meta.c share: parse a line into
 * a request, check every pointer it returns lies in the line, and table-driven error cases.
 * Included by one test file each (its statics are that file's own). */
#ifndef SHOAL_TESTS_PROTOCOL_HARNESS_H
#define SHOAL_TESTS_PROTOCOL_HARNESS_H

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

__attribute__((unused)) static enum proto_status parse_n(const char *line, size_t len)
{
    cur_line = line;
    cur_len = len;
    err = "unset";
    return proto_parse(line, len, ITEM_MAX, &req, &err);
}

__attribute__((unused)) static enum proto_status parse(const char *line) { return parse_n(line, strlen(line)); }

/* Every pointer the parser returns points into the line (or keybuf for base64 keys). */
__attribute__((unused)) static void check_pointers(void)
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

__attribute__((unused)) static const char *E = "ERROR";
__attribute__((unused)) static const char *BADFMT = "CLIENT_ERROR bad command line format";
__attribute__((unused)) static const char *TOO_LARGE = "SERVER_ERROR object too large for cache";
#define SW PROTO_ERR_CLIENT_SWALLOW

__attribute__((unused)) static void run_err_cases(const struct err_case *c, size_t n)
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

__attribute__((unused)) static char *repeat(char c, size_t n)
{
    static char bufs[4][1024];
    static int which;
    char *b = bufs[which++ & 3];
    assert_true(n < sizeof bufs[0]);
    memset(b, c, n);
    b[n] = '\0';
    return b;
}

#endif
