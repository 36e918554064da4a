/* test_auth.c — unit tests for the auth file and the bearer check (src/common/auth.c): a good
 * file's admin and team tokens recognised; header forms (scheme case, spaces) accepted and
 * others refused with the right reason; a token's prefix or extension not taken for it; each
 * bad entry refused naming it; the client header read from a token file or SHOAL_TOKEN; new
 * tokens random and of the documented form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/auth.h"

static char dir[] = "/tmp/test_auth.XXXXXX";

static const char *write_file(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

#define GOOD                                                                                     \
    "{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"role\": \"admin\"},"               \
    " {\"token\": \"shop-0123456789abcdef\", \"team\": \"shop\", \"name\": \"shop-ci\"}]}"

static void test_tokens_are_recognised(void **state)
{
    char err[512];
    struct auth *a = auth_load(write_file("good.json", GOOD), err, sizeof err);
    assert_non_null(a);
    assert_int_equal(auth_count(a), 2);
    struct auth_caller who;
    assert_int_equal(auth_check(a, "Bearer admin-0123456789abcdef", &who), AUTH_OK);
    assert_true(who.admin);
    assert_string_equal(who.name, "tokens[0]");
    assert_int_equal(auth_check(a, "bearer   shop-0123456789abcdef  ", &who), AUTH_OK);
    assert_false(who.admin);
    assert_string_equal(who.team, "shop");
    assert_string_equal(who.name, "shop-ci");
    auth_destroy(&a);
    assert_null(a);
}

static void test_other_headers_are_refused_with_their_reason(void **state)
{
    char err[512];
    struct auth *a = auth_load(write_file("good.json", GOOD), err, sizeof err);
    assert_non_null(a);
    struct auth_caller who;
    assert_int_equal(auth_check(a, NULL, &who), AUTH_MISSING);
    assert_int_equal(auth_check(a, "", &who), AUTH_MISSING);
    assert_int_equal(auth_check(a, "Basic admin-0123456789abcdef", &who), AUTH_SCHEME);
    assert_int_equal(auth_check(a, "Bearer", &who), AUTH_SCHEME);
    assert_int_equal(auth_check(a, "Bearer ", &who), AUTH_SCHEME);
    assert_int_equal(auth_check(a, "Beareradmin-0123456789abcdef", &who), AUTH_SCHEME);
    assert_int_equal(auth_check(a, "Bearer admin-0123456789abcde", &who), AUTH_INVALID);
    assert_int_equal(auth_check(a, "Bearer admin-0123456789abcdefX", &who), AUTH_INVALID);
    assert_int_equal(auth_check(a, "Bearer admin-0123456789abcdeF", &who), AUTH_INVALID);
    auth_destroy(&a);
}

static void test_bad_entries_are_named(void **state)
{
    static const struct {
        const char *text, *says;
    } cases[] = {
        {"{\"tokens\": []}", "no tokens"},
        {"{\"tokens\": {}}", "must be"},
        {"{\"tokens\": [], \"x\": 1}", "must be"},
        {"[1]", "must be"},
        {"{\"tokens\": [", "not valid JSON"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"role\": \"admin\"}, 7]}",
         "tokens[1]: each entry"},
        {"{\"tokens\": [{\"token\": \"short\", \"role\": \"admin\"}]}", "tokens[0]: token must be 16"},
        {"{\"tokens\": [{\"token\": \"has space 0123456789\", \"role\": \"admin\"}]}",
         "character 4"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\"}]}", "exactly one"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"role\": \"admin\", \"team\": "
         "\"x\"}]}", "exactly one"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"role\": \"root\"}]}",
         "role must be"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"team\": \"\"}]}", "team must be"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"role\": \"admin\", \"name\": "
         "\"a b\"}]}", "name must be"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"role\": \"admin\", \"to\": 1}]}",
         "unknown field 'to'"},
        {"{\"tokens\": [{\"token\": \"admin-0123456789abcdef\", \"role\": \"admin\"}, {\"token\": "
         "\"admin-0123456789abcdef\", \"team\": \"t\"}]}", "tokens[1]: the same token as tokens[0]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "";
        struct auth *a = auth_load(write_file("bad.json", cases[i].text), err, sizeof err);
        if (a != NULL || strstr(err, cases[i].says) == NULL)
            fail_msg("case %zu: wanted an error saying '%s', got '%s'", i, cases[i].says, err);
        assert_null(strstr(err, "admin-0123456789abcdef")); /* a token is never in a message */
    }
    char err[512];
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none.json", dir);
    assert_null(auth_load(missing, err, sizeof err));
    assert_non_null(strstr(err, "cannot read auth file"));
}

static void test_client_header_from_file_then_environment(void **state)
{
    char err[300], *line = NULL;
    unsetenv("SHOAL_TOKEN");
    assert_int_equal(auth_client_header(NULL, &line, err, sizeof err), 0);
    assert_null(line);
    setenv("SHOAL_TOKEN", "env-token-0123456789", 1);
    assert_int_equal(auth_client_header(NULL, &line, err, sizeof err), 0);
    assert_string_equal(line, "Authorization: Bearer env-token-0123456789");
    free(line);
    const char *f = write_file("token", "file-token-0123456789\n");
    assert_int_equal(auth_client_header(f, &line, err, sizeof err), 0);
    assert_string_equal(line, "Authorization: Bearer file-token-0123456789");
    free(line);
    f = write_file("token", "bad token\r\nInjected: yes\n");
    assert_int_equal(auth_client_header(f, &line, err, sizeof err), -1);
    assert_null(line);
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none", dir);
    assert_int_equal(auth_client_header(missing, &line, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot read token file"));
    unsetenv("SHOAL_TOKEN");
}

static void test_new_tokens_are_random_and_well_formed(void **state)
{
    char a[44], b[44];
    assert_int_equal(auth_new_token(a), 0);
    assert_int_equal(auth_new_token(b), 0);
    assert_int_equal(strlen(a), 43);
    assert_string_not_equal(a, b);
    char text[200], err[300];
    snprintf(text, sizeof text, "{\"tokens\": [{\"token\": \"%s\", \"role\": \"admin\"}]}", a);
    struct auth *x = auth_load(write_file("new.json", text), err, sizeof err);
    assert_non_null(x);
    char hdr[80];
    snprintf(hdr, sizeof hdr, "Bearer %s", a);
    struct auth_caller who;
    assert_int_equal(auth_check(x, hdr, &who), AUTH_OK);
    auth_destroy(&x);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens_are_recognised),
        cmocka_unit_test(test_other_headers_are_refused_with_their_reason),
        cmocka_unit_test(test_bad_entries_are_named),
        cmocka_unit_test(test_client_header_from_file_then_environment),
        cmocka_unit_test(test_new_tokens_are_random_and_well_formed),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = rc ? rc : 1;
    return rc;
}
