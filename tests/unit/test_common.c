/* test_common.c — unit tests for src/common: byte buffer, option parsing, clock rules, io_uring
 * ring. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/log.h"
#include "common/membudget.h"
#include "common/clock.h"
#include "common/options.h"
#include "common/uring.h"

static void test_buf_append_and_consume(void **state)
{
    struct buf b;
    buf_init(&b);
    for (int i = 0; i < 10000; i++) assert_int_equal(buf_append(&b, "abc", 3), 0);
    assert_int_equal(buf_used(&b), 30000);
    buf_consume(&b, 29997);
    assert_memory_equal(buf_start(&b), "abc", 3);
    buf_consume(&b, 3);
    assert_int_equal(buf_used(&b), 0);
    assert_int_equal(b.off, 0); /* fully consumed buffers rewind */
    buf_release(&b);
}

static void test_buf_numbers(void **state)
{
    struct buf b;
    buf_init(&b);
    buf_append_u64(&b, 0);
    buf_append_str(&b, " ");
    buf_append_u64(&b, UINT64_MAX);
    buf_append_str(&b, " ");
    buf_append_i64(&b, INT64_MIN);
    buf_append_str(&b, " ");
    buf_printf(&b, "%s=%d", "x", 42);
    const char *want = "0 18446744073709551615 -9223372036854775808 x=42";
    assert_int_equal(buf_used(&b), strlen(want));
    assert_memory_equal(buf_start(&b), want, strlen(want));
    buf_release(&b);
}

static void test_buf_reserve_reuses_consumed_space(void **state)
{
    struct buf b;
    buf_init(&b);
    buf_reserve(&b, 100);
    size_t cap = b.cap;
    buf_append(&b, "0123456789", 10);
    buf_consume(&b, 5);
    assert_int_equal(buf_reserve(&b, cap - 5), 0);
    assert_int_equal(b.cap, cap); /* compacted, not grown */
    assert_memory_equal(buf_start(&b), "56789", 5);
    buf_release(&b);
}

static uint64_t o_port, o_size, o_verbose;
static bool o_flag;
static const char *o_name;
static const struct opt_def defs[] = {
    {"port", 'p', OPT_UINT, "11211", 0, 1, 65535, "port", &o_port, "tcp-port"},
    {"item_max", 'I', OPT_SIZE, "1m", 0, 1024, 1ull << 30, "item size", &o_size, NULL},
    {"verbose", 'v', OPT_COUNT, NULL, 0, 0, 0, "verbosity", &o_verbose, NULL},
    {"fast", 0, OPT_BOOL, "no", 0, 0, 0, "a flag", &o_flag, NULL},
    {"name", 0, OPT_STR, "x", 0, 0, 0, "a name", &o_name, NULL},
};
#define NDEFS (sizeof defs / sizeof defs[0])

static int parse(int argc, char **argv, char *err)
{
    struct opt_extra ex;
    return options_parse(defs, NDEFS, argc, argv, &ex, err, 256);
}

static void test_options_defaults_and_flags(void **state)
{
    char err[256];
    char *argv[] = {"prog", "-p", "22122", "-I2m", "-vv", "--fast", "--name=abc", NULL};
    assert_int_equal(parse(7, argv, err), 0);
    assert_int_equal(o_port, 22122);
    assert_int_equal(o_size, 2u << 20);
    assert_int_equal(o_verbose, 2);
    assert_true(o_flag);
    assert_string_equal(o_name, "abc");
    char *argv2[] = {"prog", NULL};
    assert_int_equal(parse(1, argv2, err), 0);
    assert_int_equal(o_port, 11211);
    assert_int_equal(o_size, 1u << 20);
    assert_false(o_flag);
}

static void test_options_alias_and_ignored_memcached_flags(void **state)
{
    char err[256];
    char *argv[] = {"prog", "--tcp-port", "1234", "-u", "root", "-o", "modern", "-A", NULL};
    assert_int_equal(parse(8, argv, err), 0);
    assert_int_equal(o_port, 1234);
}

static void test_options_errors_name_the_option(void **state)
{
    char err[256];
    char *a1[] = {"prog", "-p", "70000", NULL};
    assert_int_equal(parse(3, a1, err), -1);
    assert_non_null(strstr(err, "port"));
    assert_non_null(strstr(err, "65535"));
    char *a2[] = {"prog", "-I", "12q", NULL};
    assert_int_equal(parse(3, a2, err), -1);
    assert_non_null(strstr(err, "item_max"));
    char *a3[] = {"prog", "--nope", NULL};
    assert_int_equal(parse(2, a3, err), -1);
    assert_non_null(strstr(err, "--nope"));
    char *a4[] = {"prog", "-p", NULL};
    assert_int_equal(parse(2, a4, err), -1);
}

static void test_options_config_file_and_precedence(void **state)
{
    char path[] = "/tmp/shoal-opt-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "# comment\nport = 3000\nitem_max = 64k\nname = fromfile\nfast\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char err[256];
    char *argv[] = {"prog", "-p", "4000", "--config", path, NULL};
    assert_int_equal(parse(5, argv, err), 0);
    assert_int_equal(o_port, 4000); /* command line wins over the file */
    assert_int_equal(o_size, 64 << 10);
    assert_string_equal(o_name, "fromfile");
    assert_true(o_flag);
    FILE *f = fopen(path, "w");
    fputs("bogus = 1\n", f);
    fclose(f);
    char *argv2[] = {"prog", "--config", path, NULL};
    assert_int_equal(parse(3, argv2, err), -1);
    assert_non_null(strstr(err, "line 1"));
    unlink(path);
}

static void test_options_write_stats(void **state)
{
    char err[256];
    char *argv[] = {"prog", "-p", "22122", "-I2m", "-v", "--fast", NULL};
    assert_int_equal(parse(6, argv, err), 0);
    struct buf b;
    buf_init(&b);
    assert_int_equal(options_write_stats(&b, defs, NDEFS), 0);
    assert_int_equal(buf_append(&b, "", 1), 0);
    assert_string_equal(buf_start(&b), "STAT port 22122\r\nSTAT item_max 2097152\r\n"
                                       "STAT verbose 1\r\nSTAT fast yes\r\nSTAT name x\r\n");
    o_name = NULL; /* a text option without a value */
    buf_release(&b);
    buf_init(&b);
    assert_int_equal(options_write_stats(&b, &defs[4], 1), 0);
    assert_memory_equal(buf_start(&b), "STAT name NULL\r\n", buf_used(&b));
    buf_release(&b);
}

static void test_clock_exptime_rules(void **state)
{
    clock_setup();
    uint32_t now = clock_now();
    assert_true(now >= 2);
    assert_int_equal(clock_exptime(0, now), 0);                 /* never */
    assert_int_equal(clock_exptime(-1, now), 1);                /* already expired */
    assert_int_equal(clock_exptime(100, now), now + 100);       /* relative */
    assert_int_equal(clock_exptime(CLOCK_REL_MAX, now), now + CLOCK_REL_MAX);
    time_t unix_now = clock_epoch() + now;
    assert_int_equal(clock_exptime(unix_now + 50, now), now + 50); /* absolute */
    assert_int_equal(clock_exptime(CLOCK_REL_MAX + 1, now), 1);    /* absolute, in the past */
    assert_int_equal(clock_ttl_left(0, now), -1);
    assert_int_equal(clock_ttl_left(now + 7, now), 7);
}

/* Sends and recvs queued on the ring complete in one uring_run, each with its own pointer;
 * a recv with nothing to read completes at once with -EAGAIN instead of waiting. */
/* A deadline on CLOCK_MONOTONIC is honoured: with a wall-clock condvar it would be decades in
 * the past and the wait would end at once. */
static void test_clock_cond_waits_until_a_monotonic_deadline(void **state)
{
    pthread_cond_t cv;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    assert_int_equal(clock_cond_init_monotonic(&cv), 0);
    struct timespec start, dl, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    dl = start;
    dl.tv_nsec += 60 * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&mu);
    int rc;
    while ((rc = pthread_cond_timedwait(&cv, &mu, &dl)) == 0) {
    }
    pthread_mutex_unlock(&mu);
    clock_gettime(CLOCK_MONOTONIC, &end);
    assert_int_equal(rc, ETIMEDOUT);
    int64_t waited_ms = (int64_t)(end.tv_sec - start.tv_sec) * 1000 +
                        (end.tv_nsec - start.tv_nsec) / 1000000;
    assert_true(waited_ms >= 55);
    assert_true(waited_ms < 5000);
    pthread_cond_destroy(&cv);
}

static void test_uring_send_recv_batch(void **state)
{
    struct uring r;
    if (uring_init(&r, 8) < 0) {
        print_message("io_uring unavailable here (%s): skipped\n", strerror(errno));
        skip();
    }
    int a[2], b[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    char buf_a[16] = {0}, buf_b[16] = {0};
    int tag_sa, tag_sb, tag_ra, tag_rb;
    assert_int_equal(uring_send(&r, a[0], "hello", 5, &tag_sa), 0);
    assert_int_equal(uring_send(&r, b[0], "world!", 6, &tag_sb), 0);
    assert_int_equal(uring_run(&r), 2);
    void *u;
    int res, seen = 0;
    while (uring_next(&r, &u, &res) == 0) {
        assert_true(u == &tag_sa || u == &tag_sb);
        assert_int_equal(res, u == &tag_sa ? 5 : 6);
        seen++;
    }
    assert_int_equal(seen, 2);
    assert_int_equal(uring_recv(&r, a[1], buf_a, sizeof buf_a, &tag_ra), 0);
    assert_int_equal(uring_recv(&r, b[1], buf_b, sizeof buf_b, &tag_rb), 0);
    assert_int_equal(uring_run(&r), 2);
    for (seen = 0; uring_next(&r, &u, &res) == 0; seen++) assert_int_equal(res, u == &tag_ra ? 5 : 6);
    assert_int_equal(seen, 2);
    assert_memory_equal(buf_a, "hello", 5);
    assert_memory_equal(buf_b, "world!", 6);
    assert_int_equal(uring_recv(&r, a[1], buf_a, sizeof buf_a, &tag_ra), 0); /* nothing there */
    assert_int_equal(uring_run(&r), 1);
    assert_int_equal(uring_next(&r, &u, &res), 0);
    assert_ptr_equal(u, &tag_ra);
    assert_int_equal(res, -EAGAIN);
    assert_int_equal(uring_next(&r, &u, &res), -1);
    /* never more requests than entries, counting completions not yet taken */
    for (unsigned i = 0; i < r.entries; i++)
        assert_int_equal(uring_recv(&r, a[1], buf_a, sizeof buf_a, &tag_ra), 0);
    assert_int_equal(uring_recv(&r, a[1], buf_a, sizeof buf_a, &tag_ra), -1);
    assert_int_equal(uring_run(&r), (int)r.entries);
    assert_int_equal(uring_recv(&r, a[1], buf_a, sizeof buf_a, &tag_ra), -1);
    for (seen = 0; uring_next(&r, &u, &res) == 0; seen++) assert_int_equal(res, -EAGAIN);
    assert_int_equal(seen, (int)r.entries);
    close(a[0]), close(a[1]), close(b[0]), close(b[1]);
    uring_free(&r);
}

/* Count the lines of `path` that contain `needle`. */
static int lines_with(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    if (f) fclose(f);
    return n;
}

static void test_log_limited_keeps_a_repeating_peer_quiet(void **state)
{
    char path[] = "/tmp/shoal-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(2);
    assert_true(dup2(fd, 2) >= 0);
    struct log_limit l = {0};
    for (int i = 0; i < 20; i++) log_limited(&l, LOG_WARN, "peer said garbage %d", i);
    l.window -= LOG_LIMIT_SECONDS; /* the next window */
    log_limited(&l, LOG_WARN, "peer said garbage again");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    assert_int_equal(lines_with(path, "peer said garbage"), LOG_LIMIT_LINES + 1);
    assert_int_equal(lines_with(path, "(15 like lines not logged"), 1);
    unlink(path);
}

/* Client bytes in log lines are escaped, so a key cannot forge a line or drive a terminal. */
static void test_log_escape(void **state)
{
    char out[64];
    assert_string_equal(log_escape(out, sizeof out, "get k", 5), "get k");
    assert_string_equal(log_escape(out, sizeof out, "a\nb\x1b[0m\\\x7f\xff\0", 11),
                        "a\\x0ab\\x1b[0m\\x5c\\x7f\\xff\\x00");
    assert_string_equal(log_escape(out, 6, "abcdefgh", 8), "abcde"); /* cut to fit */
    assert_string_equal(log_escape(out, 6, "ab\x01", 3), "ab"); /* an escape is never split */
    assert_string_equal(log_escape(out, 1, "abc", 3), "");
}

/* The line-level escaping every log line gets: control bytes, CR, LF, DEL and bytes above 0x7f
 * become \xNN; a backslash stays, so log_escape's output passes through unchanged. */
static void test_log_clean(void **state)
{
    char out[64];
    assert_int_equal(log_clean(out, sizeof out, "node a:1 down", 13), 13);
    assert_string_equal(out, "node a:1 down");
    assert_int_equal(log_clean(out, sizeof out, "a\r\nb\x01\x7f\xff\\x0a", 11), 11);
    assert_string_equal(out, "a\\x0d\\x0ab\\x01\\x7f\\xff\\x0a");
    assert_int_equal(log_clean(out, 4, "abcdef", 6), 3); /* cut to fit, NUL included */
    assert_string_equal(out, "abc");
    assert_int_equal(log_clean(out, 6, "ab\n", 3), 2); /* an escape is never split */
    assert_string_equal(out, "ab");
}

/* One call logs one line, however many CR/LF it holds, and a long message is cut to
 * LOG_LINE_MAX saying how much was cut. */
static void test_log_line_is_one_bounded_printable_line(void **state)
{
    char path[] = "/tmp/shoal-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(2);
    assert_true(dup2(fd, 2) >= 0);
    static char big[5000];
    for (size_t i = 0; i < sizeof big - 1; i++) big[i] = (char)(i % 2 ? '\n' : 0xff);
    log_msg(LOG_WARN, "short \r\nforged line\x1b[31m");
    log_msg(LOG_WARN, "long %s", big);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4 * LOG_LINE_MAX];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        size_t n = strlen(line);
        char *msg = strstr(line, "warn: ");
        assert_non_null(msg);
        msg += strlen("warn: ");
        assert_true(strlen(msg) <= LOG_LINE_MAX + 1); /* + the newline */
        for (size_t i = 0; i + 1 < n; i++) assert_true(line[i] >= 0x20 && line[i] < 0x7f);
        if (lines == 1) assert_string_equal(msg, "short \\x0d\\x0aforged line\\x1b[31m\n");
        if (lines == 2) {
            assert_non_null(strstr(msg, "long \\xff\\x0a\\xff"));
            assert_non_null(strstr(msg, " more bytes)\n"));
        }
    }
    fclose(f);
    unlink(path);
    assert_int_equal(lines, 2);
}

/* A connection's bytes move the sum as its buffers change; half is "pressed", all is "over",
 * and closing may stop at 7/8; a closed connection's bytes leave the sum and count as freed. */
static void test_membudget_thresholds(void **state)
{
    (void)state;
    struct membudget b;
    membudget_init(&b, 8 << 20);
    uint64_t a = 0, c = 0;
    membudget_account(&b, &a, 3 << 20);
    assert_int_equal(membudget_used(&b), 3 << 20);
    assert_false(membudget_pressed(&b));
    membudget_account(&b, &c, 2 << 20);
    assert_true(membudget_pressed(&b)); /* 5 of 8 MiB */
    assert_false(membudget_over(&b));
    membudget_account(&b, &a, 7 << 20); /* a grows to 7: 9 of 8 */
    assert_true(membudget_over(&b));
    assert_false(membudget_relieved(&b));
    membudget_account(&b, &a, 5 << 20); /* shrinks: 7 of 8, at the target */
    assert_false(membudget_over(&b));
    assert_true(membudget_relieved(&b));
    membudget_release(&b, &a);
    assert_int_equal(a, 0);
    assert_int_equal(membudget_used(&b), 2 << 20);
    assert_int_equal(b.freed, 5 << 20);
    membudget_release(&b, &a); /* idempotent */
    assert_int_equal(membudget_used(&b), 2 << 20);
    uint64_t small = 16384;
    membudget_account(&b, &small, 16384);
    membudget_release(&b, &small); /* a small connection's bytes are not counted for a trim */
    assert_int_equal(b.freed, 5 << 20);
    membudget_trim(&b, 5000); /* enough freed: trims and starts counting again */
    assert_int_equal(b.freed, 0);
    assert_int_equal(b.trim_ms, 5000);
}

/* The pick: stalled connections before moving ones, the largest of each, never one whose bytes
 * are not its client's doing or that holds under half the average share. */
static void test_membudget_pick_order(void **state)
{
    (void)state;
    struct membudget b;
    membudget_init(&b, 8 << 20);
    uint64_t acct = 0;
    membudget_account(&b, &acct, 8 << 20); /* 8 MiB over 4 connections: the floor is 1 MiB */
    int small, moving_big, moving, stalled_small, stalled_big, innocent;
    struct membudget_pick p;
    const char *why;
    membudget_pick_start(&p, &b, 4, 1000);
    membudget_pick_offer(&p, &small, 512 << 10, 512 << 10, "r", 0); /* under the floor */
    membudget_pick_offer(&p, &innocent, 6 << 20, 6 << 20, NULL, 0);
    membudget_pick_offer(&p, &moving_big, 5 << 20, 5 << 20, "m", 1000 - MEMBUDGET_STALL_MS + 1);
    membudget_pick_offer(&p, &moving, 2 << 20, 2 << 20, "m", 990);
    assert_ptr_equal(membudget_pick_victim(&p, &why), &moving_big); /* none stalled */
    assert_string_equal(why, "m");
    membudget_pick_offer(&p, &stalled_small, 1 << 20, 1 << 20, "s", 1000 - MEMBUDGET_STALL_MS);
    membudget_pick_offer(&p, &stalled_big, 3 << 20, 3 << 20, "S", 0);
    assert_ptr_equal(membudget_pick_victim(&p, &why), &stalled_big);
    assert_string_equal(why, "S");
    membudget_pick_start(&p, &b, 4, 1000);
    membudget_pick_offer(&p, &small, 512 << 10, 512 << 10, "r", 0);
    assert_null(membudget_pick_victim(&p, &why));
    /* the order is by weight (the router's: bytes by how long held), the floor by bytes */
    membudget_pick_start(&p, &b, 4, 1000);
    membudget_pick_offer(&p, &stalled_big, 3 << 20, 3 << 20, "S", 0);
    membudget_pick_offer(&p, &stalled_small, 1 << 20, 9 << 20, "s", 0);
    membudget_pick_offer(&p, &small, 512 << 10, 64 << 20, "r", 0);
    assert_ptr_equal(membudget_pick_victim(&p, &why), &stalled_small);
    assert_int_equal(membudget_idle_period(0), MEMBUDGET_SWEEP_OVER_MS);
    assert_int_equal(membudget_idle_period(2000), 500);
    assert_int_equal(membudget_idle_period(60000), MEMBUDGET_SWEEP_IDLE_MAX_MS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf_append_and_consume),
        cmocka_unit_test(test_log_escape),
        cmocka_unit_test(test_log_clean),
        cmocka_unit_test(test_log_line_is_one_bounded_printable_line),
        cmocka_unit_test(test_buf_numbers),
        cmocka_unit_test(test_buf_reserve_reuses_consumed_space),
        cmocka_unit_test(test_options_defaults_and_flags),
        cmocka_unit_test(test_options_alias_and_ignored_memcached_flags),
        cmocka_unit_test(test_options_errors_name_the_option),
        cmocka_unit_test(test_options_config_file_and_precedence),
        cmocka_unit_test(test_options_write_stats),
        cmocka_unit_test(test_clock_exptime_rules),
        cmocka_unit_test(test_clock_cond_waits_until_a_monotonic_deadline),
        cmocka_unit_test(test_uring_send_recv_batch),
        cmocka_unit_test(test_log_limited_keeps_a_repeating_peer_quiet),
        cmocka_unit_test(test_membudget_thresholds),
        cmocka_unit_test(test_membudget_pick_order),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
