/* test_cli_args.c — the shoal CLI's command lines: sizes (64m, 1g, bytes), flags in either
 * form, positional arguments anywhere, "--" passing the rest on, and the refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/cli.h"

static void test_sizes_take_suffixes_in_powers_of_1024(void **state)
{
    uint64_t v;
    assert_int_equal(cli_parse_size("1048576", &v), 0);
    assert_int_equal(v, 1048576);
    assert_int_equal(cli_parse_size("64m", &v), 0);
    assert_int_equal(v, 64ull << 20);
    assert_int_equal(cli_parse_size("1g", &v), 0);
    assert_int_equal(v, 1ull << 30);
    assert_int_equal(cli_parse_size("512K", &v), 0);
    assert_int_equal(v, 512ull << 10);
    assert_int_equal(cli_parse_size("2GiB", &v), 0);
    assert_int_equal(v, 2ull << 30);
    assert_int_equal(cli_parse_size("3MB", &v), 0);
    assert_int_equal(v, 3ull << 20);
    assert_int_equal(cli_parse_size("0", &v), 0);
    assert_int_equal(v, 0);
}

static void test_bad_sizes_are_refused(void **state)
{
    uint64_t v = 7;
    const char *bad[] = {"", "m", "-1", "12q", "1.5g", "64 m", "1mm", "99999999999t", NULL};
    for (int i = 0; bad[i]; i++) assert_int_equal(cli_parse_size(bad[i], &v), -1);
    assert_int_equal(v, 7);
}

static const struct cli_flag flags[] = {
    {"memory", "SIZE", "m"},
    {"copies", "N", "c"},
    {"force", NULL, "f"},
    {NULL, NULL, NULL},
};
static const struct cli_cmd cmd = {"ns create", "NAME", "test", flags, 1, 1, NULL};

static void test_flags_in_both_forms_and_positionals_anywhere(void **state)
{
    char *argv[] = {"--memory", "64m", "feed", "--copies=2", "--force", "--json"};
    struct cli_args a;
    assert_int_equal(cli_parse(&cmd, 6, argv, &a), 0);
    assert_int_equal(a.npos, 1);
    assert_string_equal(a.pos[0], "feed");
    assert_string_equal(cli_flag(&cmd, &a, "memory"), "64m");
    assert_string_equal(cli_flag(&cmd, &a, "copies"), "2");
    assert_true(cli_switch(&cmd, &a, "force"));
    assert_true(cli_switch(&cmd, &a, "json"));
    assert_null(cli_flag(&cmd, &a, "control"));
}

static void test_double_dash_passes_the_rest_on(void **state)
{
    char *argv[] = {"feed", "--", "-t", "4", "--memory"};
    struct cli_args a;
    assert_int_equal(cli_parse(&cmd, 5, argv, &a), 0);
    assert_int_equal(a.nrest, 3);
    assert_string_equal(a.rest[0], "-t");
    assert_null(cli_flag(&cmd, &a, "memory"));
}

static void test_bad_command_lines_are_refused(void **state)
{
    struct cli_args a;
    char *unknown[] = {"feed", "--colour", "red"};
    assert_int_equal(cli_parse(&cmd, 3, unknown, &a), -1);
    char *novalue[] = {"feed", "--memory"};
    assert_int_equal(cli_parse(&cmd, 2, novalue, &a), -1);
    char *valued_switch[] = {"feed", "--force=yes"};
    assert_int_equal(cli_parse(&cmd, 2, valued_switch, &a), -1);
    char *missing[] = {"--memory", "1g"};
    assert_int_equal(cli_parse(&cmd, 2, missing, &a), -1);
    char *extra[] = {"feed", "more"};
    assert_int_equal(cli_parse(&cmd, 2, extra, &a), -1);
    char *help[] = {"-h"}; /* --help needs no positional arguments */
    assert_int_equal(cli_parse(&cmd, 1, help, &a), 0);
    assert_true(cli_switch(&cmd, &a, "help"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_take_suffixes_in_powers_of_1024),
        cmocka_unit_test(test_bad_sizes_are_refused),
        cmocka_unit_test(test_flags_in_both_forms_and_positionals_anywhere),
        cmocka_unit_test(test_double_dash_passes_the_rest_on),
        cmocka_unit_test(test_bad_command_lines_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
