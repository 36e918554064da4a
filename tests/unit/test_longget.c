/* test_longget.c — unit tests for taking a get line over the line limit in parts
 * (protocol/longget.h): which lines start one, where each part ends, bad keys and exptimes,
 * the dropped rest after an error, and the reply that ends it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "protocol/longget.h"

#define S(lit) lit, sizeof(lit) - 1

static void test_start_takes_get_verbs_only(void **state)
{
    (void)state;
    struct lget g;
    const char *err = NULL;
    assert_int_equal(lget_start(&g, S("get a b c"), &err), 3);
    assert_int_equal(g.cmd, CMD_GET);
    assert_int_equal(lget_start(&g, S("  gets a"), &err), 6);
    assert_int_equal(g.cmd, CMD_GETS);
    assert_int_equal(lget_start(&g, S("gat 60 a b"), &err), 6);
    assert_int_equal(g.cmd, CMD_GAT);
    assert_int_equal(g.exptime, 60);
    assert_null(err);
    assert_int_equal(lget_start(&g, S("gats -1 a"), &err), 7);
    assert_int_equal(g.exptime, -1);
    assert_int_equal(lget_start(&g, S("set a 0 0 1"), &err), 0);
    assert_int_equal(lget_start(&g, S("delete aaaa"), &err), 0);
    assert_int_equal(lget_start(&g, S("getx a"), &err), 0);
    assert_int_equal(lget_start(&g, S("getaaaaaaa"), &err), 0); /* no space: not one */
    char lead[200];
    memset(lead, ' ', 150);
    memcpy(lead + 150, "get a", 5);
    assert_int_equal(lget_start(&g, lead, 155, &err), 0); /* over 100 leading spaces */
    assert_int_equal(lget_start(&g, S("gat x1 a b"), &err), 6);
    assert_true(g.skip);
    assert_string_equal(err, "CLIENT_ERROR invalid exptime argument");
}

static void test_parts_end_at_the_last_space_then_the_newline(void **state)
{
    (void)state;
    struct lget g = {.cmd = CMD_GET};
    const char *k, *e, *err;
    size_t used;
    const char *in = " a bb cc";
    assert_int_equal(lget_next(&g, in, strlen(in), SIZE_MAX, &k, &e, &used, &err), LGET_PART);
    assert_int_equal(used, 5); /* " a bb", "cc" may go on */
    assert_memory_equal(k, " a bb", 5);
    assert_int_equal(e - k, 5);
    assert_true(g.any);
    in = " cc";
    assert_int_equal(lget_next(&g, in, 1, SIZE_MAX, &k, &e, &used, &err), LGET_PART);
    assert_int_equal(used, 1); /* a lone space goes */
    assert_int_equal(lget_next(&g, "cc", 2, SIZE_MAX, &k, &e, &used, &err), LGET_WAIT);
    in = "cc dd\r\nversion\r\n";
    assert_int_equal(lget_next(&g, in, strlen(in), SIZE_MAX, &k, &e, &used, &err), LGET_LAST);
    assert_int_equal(used, 7);
    assert_int_equal(e - k, 5); /* the \r is not part of a key */
    assert_string_equal(lget_end_reply(&g), "END\r\n");
    /* a window: at most `max` bytes looked at */
    g = (struct lget){.cmd = CMD_GET};
    char buf[600];
    memset(buf, 'k', sizeof buf);
    for (int i = 9; i < 600; i += 10) buf[i] = ' ';
    assert_int_equal(lget_next(&g, buf, sizeof buf, 300, &k, &e, &used, &err), LGET_PART);
    assert_int_equal(used, 299);
}

static void test_bad_key_skips_to_the_newline(void **state)
{
    (void)state;
    struct lget g = {.cmd = CMD_GETS};
    const char *k, *e, *err = NULL;
    size_t used;
    char buf[400];
    memset(buf, 'x', sizeof buf);
    assert_int_equal(lget_next(&g, buf, 200, SIZE_MAX, &k, &e, &used, &err), LGET_WAIT);
    assert_int_equal(lget_next(&g, buf, 300, SIZE_MAX, &k, &e, &used, &err), LGET_BAD);
    assert_string_equal(err, "CLIENT_ERROR bad command line format");
    assert_true(g.skip);
    assert_int_equal(lget_next(&g, buf, 300, SIZE_MAX, &k, &e, &used, &err), LGET_PART);
    assert_int_equal(used, 300);
    assert_ptr_equal(k, e);
    const char *in = "yy zz\r\nversion\r\n";
    assert_int_equal(lget_next(&g, in, strlen(in), 10, &k, &e, &used, &err), LGET_LAST);
    assert_int_equal(used, 7);
    assert_null(lget_end_reply(&g)); /* the error stood in for END */
}

/* A key of the longest length whose \r has come but not its \n is still a key: wait for the
 * \n (the fuzzer found this refused when the \r and \n came in different reads). */
static void test_longest_key_before_a_lone_cr_waits(void **state)
{
    (void)state;
    struct lget g = {.cmd = CMD_GET};
    const char *k, *e, *err = NULL;
    size_t used;
    char buf[PROTO_KEY_MAX + 2];
    memset(buf, 'x', PROTO_KEY_MAX);
    buf[PROTO_KEY_MAX] = '\r';
    buf[PROTO_KEY_MAX + 1] = '\n';
    assert_int_equal(lget_next(&g, buf, PROTO_KEY_MAX + 1, PROTO_KEY_MAX + 2, &k, &e, &used, &err),
                     LGET_WAIT);
    assert_int_equal(lget_next(&g, buf, PROTO_KEY_MAX + 2, PROTO_KEY_MAX + 2, &k, &e, &used, &err),
                     LGET_LAST);
    assert_int_equal(e - k, PROTO_KEY_MAX);
    assert_string_equal(lget_end_reply(&g), "END\r\n");
}

static void test_end_reply_of_a_line_without_keys(void **state)
{
    (void)state;
    struct lget g = {.cmd = CMD_GET};
    const char *k, *e, *err;
    size_t used;
    assert_int_equal(lget_next(&g, S("    \r\n"), SIZE_MAX, &k, &e, &used, &err), LGET_LAST);
    assert_false(g.any);
    assert_string_equal(lget_end_reply(&g), "ERROR\r\n"); /* as memcached's bare get */
    g = (struct lget){.cmd = CMD_GAT};
    assert_int_equal(lget_next(&g, S("  \n"), SIZE_MAX, &k, &e, &used, &err), LGET_LAST);
    assert_string_equal(lget_end_reply(&g), "END\r\n"); /* gat without keys is END */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_takes_get_verbs_only),
        cmocka_unit_test(test_parts_end_at_the_last_space_then_the_newline),
        cmocka_unit_test(test_bad_key_skips_to_the_newline),
        cmocka_unit_test(test_longest_key_before_a_lone_cr_waits),
        cmocka_unit_test(test_end_reply_of_a_line_without_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
