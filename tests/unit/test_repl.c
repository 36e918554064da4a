/* test_repl.c — unit tests of the replication stream's pieces that need no network: the frame
 * and handshake parser (src/node/repl_wire.c) and the backlog ring (src/node/repl_backlog.c):
 * frames round-trip, partial input asks for more, junk is refused, the ring keeps whole frames,
 * drops the oldest when full, and a reader that fell behind is told so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "node/repl_backlog.h"
#include "node/repl_wire.h"

static size_t item_frame(uint8_t *buf, const char *key, const char *val, uint64_t off)
{
    struct repl_rec r = {.key = key, .nkey = (uint8_t)strlen(key), .iflags = 4, .flags = 77,
                         .ttl = 30, .cas = 0x123456789aULL};
    size_t pl = repl_item_payload(r.nkey, strlen(val));
    repl_frame_header(buf, REPL_F_ITEM, (uint32_t)pl, off);
    repl_item_encode(buf + REPL_HDR, &r);
    memcpy(buf + REPL_HDR + REPL_ITEM_FIXED + r.nkey, val, strlen(val));
    return REPL_HDR + pl;
}

static void test_item_frame_round_trips(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = item_frame(buf, "rep:k", "hello", 99);
    struct repl_frame f;
    const char *why = NULL;
    assert_int_equal(repl_frame_parse(buf, n, 1024, &f, &why), (long)n);
    assert_int_equal(f.type, REPL_F_ITEM);
    assert_int_equal(f.offset, 99);
    struct repl_rec r;
    assert_int_equal(repl_rec_decode(&f, &r, &why), 0);
    assert_int_equal(r.nkey, 5);
    assert_memory_equal(r.key, "rep:k", 5);
    assert_int_equal(r.nbytes, 5);
    assert_memory_equal(r.value, "hello", 5);
    assert_int_equal(r.flags, 77);
    assert_int_equal(r.ttl, 30);
    assert_int_equal(r.iflags, 4);
    assert_true(r.cas == 0x123456789aULL);
}

static void test_partial_frame_asks_for_more(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = item_frame(buf, "k", "value", 1);
    struct repl_frame f;
    const char *why = NULL;
    for (size_t cut = 0; cut < n; cut++)
        assert_int_equal(repl_frame_parse(buf, cut, 1024, &f, &why), 0);
}

static void test_junk_and_oversized_frames_are_refused(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = item_frame(buf, "k", "value", 1);
    struct repl_frame f;
    const char *why = NULL;
    assert_int_equal(repl_frame_parse(buf, n, 4, &f, &why), -1); /* payload over the bound */
    assert_non_null(why);
    uint8_t junk[] = "GET / HTTP/1.1\r\n";
    why = NULL;
    assert_int_equal(repl_frame_parse(junk, sizeof junk - 1, 1024, &f, &why), -1);
    assert_non_null(why);
    buf[2] = 1; /* a reserved byte */
    assert_int_equal(repl_frame_parse(buf, n, 1024, &f, &why), -1);
    /* a record whose key length runs past its frame */
    uint8_t d[REPL_HDR + 3];
    repl_frame_header(d, REPL_F_DEL, 3, 5);
    d[REPL_HDR] = 9, d[REPL_HDR + 1] = 'a', d[REPL_HDR + 2] = 'b';
    assert_int_equal(repl_frame_parse(d, sizeof d, 1024, &f, &why), (long)sizeof d);
    struct repl_rec r;
    assert_int_equal(repl_rec_decode(&f, &r, &why), -1);
}

/* A progress frame carries the primary's clock or nothing; any other payload is refused. */
static void test_progress_frame_stamp_round_trips(void **state)
{
    (void)state;
    uint8_t buf[REPL_HDR + REPL_WALL_LEN + 1];
    repl_progress_encode(buf, 77, 1764658000123ull);
    struct repl_frame f;
    const char *why = NULL;
    assert_int_equal(repl_frame_parse(buf, REPL_HDR + REPL_WALL_LEN, 1024, &f, &why),
                     REPL_HDR + REPL_WALL_LEN);
    assert_int_equal(f.type, REPL_F_PROGRESS);
    assert_int_equal(f.offset, 77);
    uint64_t wall = 0;
    assert_int_equal(repl_progress_decode(&f, &wall, &why), 1);
    assert_int_equal(wall, 1764658000123ull);
    repl_frame_header(buf, REPL_F_PROGRESS, 0, 78);
    assert_int_equal(repl_frame_parse(buf, REPL_HDR, 1024, &f, &why), REPL_HDR);
    assert_int_equal(repl_progress_decode(&f, &wall, &why), 0);
    repl_frame_header(buf, REPL_F_PROGRESS, 1, 79);
    assert_int_equal(repl_frame_parse(buf, REPL_HDR + 1, 1024, &f, &why), REPL_HDR + 1);
    assert_int_equal(repl_progress_decode(&f, &wall, &why), -1);
}

static void test_handshake_lines(void **state)
{
    (void)state;
    char addr[301], id[17];
    const char *h = "shoal_repl 1 10.0.0.1:11211 00112233aabbccdd";
    assert_int_equal(repl_hello_parse(h, strlen(h), addr, sizeof addr, id), 0);
    assert_string_equal(addr, "10.0.0.1:11211");
    assert_string_equal(id, "00112233aabbccdd");
    const char *bad[] = {"shoal_repl 2 10.0.0.1:1 00112233aabbccdd",
                         "shoal_repl 1 10.0.0.1:1 00112233AABBCCDD",
                         "shoal_repl 1 nocolon 00112233aabbccdd",
                         "shoal_repl 1 10.0.0.1:1 00112233aabbccdd extra", "shoal_repl"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(repl_hello_parse(bad[i], strlen(bad[i]), addr, sizeof addr, id), -1);
    uint64_t off;
    bool refused, full;
    const char *have = "REPL HAVE - 0";
    assert_int_equal(repl_have_parse(have, strlen(have), id, &off, &refused), 0);
    assert_false(refused);
    assert_string_equal(id, "-");
    const char *no = "REPL REFUSED not a primary";
    assert_int_equal(repl_have_parse(no, strlen(no), id, &off, &refused), 0);
    assert_true(refused);
    const char *st = "REPL CONTINUE 1234";
    assert_int_equal(repl_start_parse(st, strlen(st), &full, &off), 0);
    assert_false(full);
    assert_int_equal(off, 1234);
    const char *st2 = "REPL SOMETHING 1";
    assert_int_equal(repl_start_parse(st2, strlen(st2), &full, &off), -1);
}

static uint64_t put(struct repl_backlog *b, size_t n, uint8_t fill)
{
    uint8_t k = 1, body[8192];
    memset(body, fill, n);
    body[0] = 1; /* a DEL-shaped payload: never decoded here */
    struct repl_part parts[2] = {{&k, 0}, {body, n}};
    return repl_backlog_append(b, REPL_F_DEL, parts, 2);
}

static void test_backlog_keeps_whole_frames_in_order(void **state)
{
    (void)state;
    struct repl_backlog b;
    assert_int_equal(repl_backlog_init(&b, 4096), 0);
    uint64_t e1 = put(&b, 100, 'a'), e2 = put(&b, 200, 'b');
    assert_int_equal(e1, REPL_HDR + 100);
    assert_int_equal(e2, e1 + REPL_HDR + 200);
    uint8_t out[8192];
    uint64_t pos = 0;
    assert_int_equal(repl_backlog_read(&b, &pos, out, REPL_HDR + 150), REPL_HDR + 100);
    assert_int_equal(pos, e1); /* the second frame did not fit: not cut */
    assert_int_equal(repl_backlog_read(&b, &pos, out, sizeof out), REPL_HDR + 200);
    struct repl_frame f;
    const char *why;
    assert_int_equal(repl_frame_parse(out, REPL_HDR + 200, 8192, &f, &why), REPL_HDR + 200);
    assert_int_equal(f.offset, e2);
    assert_int_equal(f.payload[5], 'b');
    assert_int_equal(repl_backlog_read(&b, &pos, out, sizeof out), 0);
    repl_backlog_free(&b);
}

static void test_backlog_full_drops_oldest_and_loses_a_slow_reader(void **state)
{
    (void)state;
    struct repl_backlog b;
    assert_int_equal(repl_backlog_init(&b, 4096), 0);
    uint64_t slow = 0, fast = 0;
    uint8_t out[8192];
    for (int i = 0; i < 100; i++) { /* wraps the ring many times */
        put(&b, 300 + (size_t)i, (uint8_t)i);
        long got = repl_backlog_read(&b, &fast, out, sizeof out);
        assert_int_equal(got, REPL_HDR + 300 + i);
        struct repl_frame f;
        const char *why;
        assert_int_equal(repl_frame_parse(out, (size_t)got, 8192, &f, &why), got);
        assert_int_equal(f.payload[7], (uint8_t)i); /* bytes intact across the wrap */
    }
    assert_int_equal(repl_backlog_read(&b, &slow, out, sizeof out), -1);
    assert_false(repl_backlog_holds(&b, 0));
    assert_true(repl_backlog_holds(&b, fast));
    assert_true(b.end - b.start <= 4096);
    /* a frame larger than the ring: not kept, everyone loses their place */
    put(&b, 5000, 'x');
    assert_int_equal(repl_backlog_read(&b, &fast, out, sizeof out), -1);
    assert_int_equal(b.dropped, 1);
    repl_backlog_free(&b);
}

/* A replica's offset is a frame's start or the end; a made-up one inside a frame is not held,
 * so its primary syncs it in full instead of reading headers out of payload bytes. */
static void test_backlog_holds_frame_starts_only(void **state)
{
    (void)state;
    struct repl_backlog b;
    assert_int_equal(repl_backlog_init(&b, 4096), 0);
    uint64_t prev = 0;
    for (int i = 0; i < 40; i++) { /* past a wrap: frames straddle the ring's end */
        uint64_t end = put(&b, 150 + (size_t)i, 'z');
        if (prev >= b.start) {
            assert_true(repl_backlog_holds(&b, prev));
            for (uint64_t off = prev + 1; off < end; off += 7) assert_false(repl_backlog_holds(&b, off));
        }
        assert_true(repl_backlog_holds(&b, end));
        assert_false(repl_backlog_holds(&b, end + 1));
        prev = end;
    }
    repl_backlog_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_item_frame_round_trips),
        cmocka_unit_test(test_partial_frame_asks_for_more),
        cmocka_unit_test(test_junk_and_oversized_frames_are_refused),
        cmocka_unit_test(test_progress_frame_stamp_round_trips),
        cmocka_unit_test(test_handshake_lines),
        cmocka_unit_test(test_backlog_keeps_whole_frames_in_order),
        cmocka_unit_test(test_backlog_full_drops_oldest_and_loses_a_slow_reader),
        cmocka_unit_test(test_backlog_holds_frame_starts_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
