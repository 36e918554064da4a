/* test_control_etcd.c — unit tests for shoal-control's etcd gateway client helpers (etcd.h):
 * base64 of keys and values both ways, for every length modulo 3 and every byte value; the
 * gateway's 64-bit integers read from strings or numbers; a range reply read into a key's
 * revisions, lease and value; a reply with no kvs read as an absent key; the endpoint list's
 * rules. The requests themselves are tested against a real etcd in test_control_etcd.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/etcd.h"

/* A range reply holding one key whose value is `p` (n bytes), as etcd's gateway writes it. */
static json_t *range_reply(const char *p, size_t n)
{
    json_t *v = etcd_b64(p, n);
    assert_non_null(v);
    return json_pack("{s:{s:s},s:[{s:s,s:s,s:s,s:s,s:s,s:o}],s:s}", "header", "revision", "9",
                     "kvs", "key", "eA==", "create_revision", "4", "mod_revision", "9",
                     "version", "3", "lease", "7587870000000000001", "value", v, "count", "1");
}

static void test_base64_round_trips_every_length_and_byte(void **state)
{
    char in[300];
    for (size_t i = 0; i < sizeof in; i++) in[i] = (char)(i * 7 + 1);
    for (size_t n = 0; n < sizeof in; n++) {
        json_t *rep = range_reply(in, n);
        struct etcd_kv kv;
        assert_int_equal(etcd_kv_from(rep, 0, &kv), 0);
        assert_true(kv.exists);
        assert_int_equal(kv.len, n);
        assert_memory_equal(kv.value, in, n);
        assert_int_equal(kv.value[n], 0); /* NUL-terminated for the JSON parser */
        etcd_kv_release(&kv);
        json_decref(rep);
    }
}

static void test_base64_matches_the_known_encoding(void **state)
{
    static const char *const cases[][2] = {
        {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="},
        {"/shoal/control/state", "L3Nob2FsL2NvbnRyb2wvc3RhdGU="}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = etcd_b64(cases[i][0], strlen(cases[i][0]));
        assert_string_equal(json_string_value(j), cases[i][1]);
        json_decref(j);
    }
}

static void test_kv_reads_revisions_and_lease_from_strings(void **state)
{
    json_t *rep = range_reply("{}", 2);
    struct etcd_kv kv;
    assert_int_equal(etcd_kv_from(rep, 0, &kv), 0);
    assert_int_equal(kv.create_rev, 4);
    assert_int_equal(kv.mod_rev, 9);
    assert_int_equal(kv.lease, 7587870000000000001LL);
    assert_int_equal(etcd_revision(rep), 9);
    etcd_kv_release(&kv);
    json_decref(rep);
}

static void test_kv_absent_when_reply_has_no_kvs(void **state)
{
    json_t *rep = json_pack("{s:{s:s}}", "header", "revision", "12");
    struct etcd_kv kv;
    assert_int_equal(etcd_kv_from(rep, 0, &kv), 0);
    assert_false(kv.exists);
    assert_null(kv.value);
    assert_int_equal(etcd_revision(rep), 12);
    json_decref(rep);
}

static void test_kv_refuses_a_value_that_is_not_base64(void **state)
{
    json_t *rep = json_pack("{s:[{s:s,s:s}]}", "kvs", "key", "eA==", "value", "no*base64");
    struct etcd_kv kv;
    assert_int_equal(etcd_kv_from(rep, 0, &kv), -1);
    etcd_kv_release(&kv);
    json_decref(rep);
}

static void test_int_reads_strings_numbers_and_absence(void **state)
{
    json_t *s = json_string("-42"), *i = json_integer(42);
    assert_int_equal(etcd_int(s), -42);
    assert_int_equal(etcd_int(i), 42);
    assert_int_equal(etcd_int(NULL), 0);
    json_t *back = etcd_i64(INT64_MAX);
    assert_string_equal(json_string_value(back), "9223372036854775807");
    json_decref(s);
    json_decref(i);
    json_decref(back);
}

static void test_endpoint_list_rules(void **state)
{
    char err[200];
    struct etcd *e = etcd_create("127.0.0.1:2379, http://10.0.0.2:2379/,", 100, err, sizeof err);
    assert_non_null(e);
    etcd_destroy(&e);
    assert_null(etcd_create(" , ", 100, err, sizeof err));
    assert_non_null(strstr(err, "at least one URL"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64_round_trips_every_length_and_byte),
        cmocka_unit_test(test_base64_matches_the_known_encoding),
        cmocka_unit_test(test_kv_reads_revisions_and_lease_from_strings),
        cmocka_unit_test(test_kv_absent_when_reply_has_no_kvs),
        cmocka_unit_test(test_kv_refuses_a_value_that_is_not_base64),
        cmocka_unit_test(test_int_reads_strings_numbers_and_absence),
        cmocka_unit_test(test_endpoint_list_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
