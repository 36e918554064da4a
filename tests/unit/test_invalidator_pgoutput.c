/* test_invalidator_pgoutput.c — unit tests for the replication stream decoder
 * (src/invalidator/pgoutput.c): each pgoutput message kind decodes to its fields, streamed
 * changes carry their xid, every cut-short message is refused, unknown kinds and bad tuple
 * markers are refused, the replication frames and the standby status update have the wire
 * layout, LSNs print and parse as PostgreSQL writes them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "invalidator/pgoutput.h"

struct w {
    uint8_t b[1024];
    size_t n;
};

static void u8(struct w *w, uint8_t v) { w->b[w->n++] = v; }
static void u16(struct w *w, uint16_t v)
{
    u8(w, (uint8_t)(v >> 8));
    u8(w, (uint8_t)v);
}
static void u32(struct w *w, uint32_t v)
{
    u16(w, (uint16_t)(v >> 16));
    u16(w, (uint16_t)v);
}
static void u64(struct w *w, uint64_t v)
{
    u32(w, (uint32_t)(v >> 32));
    u32(w, (uint32_t)v);
}
static void str(struct w *w, const char *s)
{
    memcpy(w->b + w->n, s, strlen(s) + 1);
    w->n += strlen(s) + 1;
}
static void text(struct w *w, const char *s)
{
    u8(w, 't');
    u32(w, (uint32_t)strlen(s));
    memcpy(w->b + w->n, s, strlen(s));
    w->n += strlen(s);
}

static struct pgo_msg *msg(void)
{
    static struct pgo_msg *m;
    if (m == NULL) m = malloc(sizeof *m);
    return m;
}

/* Every proper prefix of a good message is refused. */
static void assert_prefixes_refused(const struct w *w, int in_stream)
{
    for (size_t i = 0; i < w->n; i++)
        assert_int_equal(pgo_decode(w->b, i, in_stream, msg()), -1);
}

static void test_begin_and_commit(void **state)
{
    struct w w = {0};
    u8(&w, 'B');
    u64(&w, 0x100000200ull);
    u64(&w, 777);
    u32(&w, 42);
    struct pgo_msg *m = msg();
    assert_int_equal(pgo_decode(w.b, w.n, 0, m), 0);
    assert_int_equal(m->kind, PGO_BEGIN);
    assert_int_equal(m->lsn, 0x100000200ull);
    assert_int_equal(m->ts, 777);
    assert_int_equal(m->xid, 42);
    assert_prefixes_refused(&w, 0);

    struct w c = {0};
    u8(&c, 'C');
    u8(&c, 0);
    u64(&c, 0x500);
    u64(&c, 0x580);
    u64(&c, 999);
    assert_int_equal(pgo_decode(c.b, c.n, 0, m), 0);
    assert_int_equal(m->kind, PGO_COMMIT);
    assert_int_equal(m->lsn, 0x500);
    assert_int_equal(m->end_lsn, 0x580);
    assert_int_equal(m->ts, 999);
    assert_prefixes_refused(&c, 0);
}

static void test_relation_columns(void **state)
{
    struct w w = {0};
    u8(&w, 'R');
    u32(&w, 16384);
    str(&w, "public");
    str(&w, "products");
    u8(&w, 'f');
    u16(&w, 2);
    u8(&w, 1);
    str(&w, "id");
    u32(&w, 23);
    u32(&w, 0xffffffffu);
    u8(&w, 0);
    str(&w, "sku");
    u32(&w, 25);
    u32(&w, 0xffffffffu);
    struct pgo_msg *m = msg();
    assert_int_equal(pgo_decode(w.b, w.n, 0, m), 0);
    assert_int_equal(m->relid, 16384);
    assert_string_equal(m->nspname, "public");
    assert_string_equal(m->relname, "products");
    assert_int_equal(m->replident, 'f');
    assert_int_equal(m->ncols, 2);
    assert_string_equal(m->cols[1].name, "sku");
    assert_int_equal(m->cols[0].flags, 1);
    assert_int_equal(m->cols[0].typmod, -1);
    assert_prefixes_refused(&w, 0);
}

static void test_update_with_old_row(void **state)
{
    struct w w = {0};
    u8(&w, 'U');
    u32(&w, 16384);
    u8(&w, 'O');
    u16(&w, 3);
    text(&w, "1");
    text(&w, "old");
    u8(&w, 'n');
    u8(&w, 'N');
    u16(&w, 3);
    text(&w, "1");
    text(&w, "new");
    u8(&w, 'u');
    struct pgo_msg *m = msg();
    assert_int_equal(pgo_decode(w.b, w.n, 0, m), 0);
    assert_int_equal(m->kind, PGO_UPDATE);
    assert_int_equal(m->old_kind, 'O');
    assert_int_equal(m->old.ncols, 3);
    assert_int_equal(m->old.vals[1].len, 3);
    assert_memory_equal(m->old.vals[1].data, "old", 3);
    assert_int_equal(m->old.vals[2].kind, 'n');
    assert_memory_equal(m->new.vals[1].data, "new", 3);
    assert_int_equal(m->new.vals[2].kind, 'u');
    assert_prefixes_refused(&w, 0);
}

static void test_update_without_old_row_and_insert_delete(void **state)
{
    struct pgo_msg *m = msg();
    struct w u = {0};
    u8(&u, 'U');
    u32(&u, 7);
    u8(&u, 'N');
    u16(&u, 1);
    text(&u, "x");
    assert_int_equal(pgo_decode(u.b, u.n, 0, m), 0);
    assert_int_equal(m->old_kind, 0);
    assert_int_equal(m->new.ncols, 1);

    struct w i = {0};
    u8(&i, 'I');
    u32(&i, 7);
    u8(&i, 'N');
    u16(&i, 1);
    text(&i, "y");
    assert_int_equal(pgo_decode(i.b, i.n, 0, m), 0);
    assert_int_equal(m->kind, PGO_INSERT);
    assert_prefixes_refused(&i, 0);

    struct w d = {0};
    u8(&d, 'D');
    u32(&d, 7);
    u8(&d, 'K');
    u16(&d, 1);
    text(&d, "z");
    assert_int_equal(pgo_decode(d.b, d.n, 0, m), 0);
    assert_int_equal(m->kind, PGO_DELETE);
    assert_int_equal(m->old_kind, 'K');
    assert_memory_equal(m->old.vals[0].data, "z", 1);
    assert_prefixes_refused(&d, 0);
    /* a delete must carry its old row */
    d.b[5] = 'N';
    assert_int_equal(pgo_decode(d.b, d.n, 0, m), -1);
}

static void test_streamed_change_carries_xid(void **state)
{
    struct w w = {0};
    u8(&w, 'I');
    u32(&w, 900); /* xid, inside a stream block */
    u32(&w, 7);
    u8(&w, 'N');
    u16(&w, 1);
    text(&w, "y");
    struct pgo_msg *m = msg();
    assert_int_equal(pgo_decode(w.b, w.n, 1, m), 0);
    assert_int_equal(m->xid, 900);
    assert_int_equal(m->relid, 7);
    /* read as not streamed, the xid would be taken for the relid and the tuple misread */
    assert_int_equal(pgo_decode(w.b, w.n, 0, m), -1);
    assert_prefixes_refused(&w, 1);
}

static void test_stream_control_messages(void **state)
{
    struct pgo_msg *m = msg();
    struct w s = {0};
    u8(&s, 'S');
    u32(&s, 900);
    u8(&s, 1);
    assert_int_equal(pgo_decode(s.b, s.n, 0, m), 0);
    assert_int_equal(m->xid, 900);
    assert_int_equal(m->flags, 1);

    uint8_t e = 'E';
    assert_int_equal(pgo_decode(&e, 1, 1, m), 0);
    assert_int_equal(m->kind, PGO_STREAM_STOP);

    struct w c = {0};
    u8(&c, 'c');
    u32(&c, 900);
    u8(&c, 0);
    u64(&c, 0x10);
    u64(&c, 0x20);
    u64(&c, 5);
    assert_int_equal(pgo_decode(c.b, c.n, 0, m), 0);
    assert_int_equal(m->kind, PGO_STREAM_COMMIT);
    assert_int_equal(m->end_lsn, 0x20);
    assert_prefixes_refused(&c, 0);

    struct w a = {0};
    u8(&a, 'A');
    u32(&a, 900);
    u32(&a, 901);
    assert_int_equal(pgo_decode(a.b, a.n, 0, m), 0);
    assert_int_equal(m->xid, 900);
    assert_int_equal(m->subxid, 901);
    assert_prefixes_refused(&a, 0);
}

static void test_truncate_relids(void **state)
{
    struct w w = {0};
    u8(&w, 'T');
    u32(&w, 2);
    u8(&w, 1);
    u32(&w, 16384);
    u32(&w, 16390);
    struct pgo_msg *m = msg();
    assert_int_equal(pgo_decode(w.b, w.n, 0, m), 0);
    assert_int_equal(m->nrels, 2);
    assert_int_equal(pgo_truncate_relid(m, 0), 16384);
    assert_int_equal(pgo_truncate_relid(m, 1), 16390);
    assert_prefixes_refused(&w, 0);
    /* a count past the message is refused, not read */
    w.b[4] = 200;
    assert_int_equal(pgo_decode(w.b, w.n, 0, m), -1);
}

static void test_unknown_kind_and_bad_markers_refused(void **state)
{
    struct pgo_msg *m = msg();
    uint8_t z = 'Z';
    assert_int_equal(pgo_decode(&z, 1, 0, m), -1);
    assert_int_equal(pgo_decode(&z, 0, 0, m), -1);
    struct w w = {0};
    u8(&w, 'I');
    u32(&w, 7);
    u8(&w, 'N');
    u16(&w, 1);
    u8(&w, 'q'); /* not n, u, t or b */
    assert_int_equal(pgo_decode(w.b, w.n, 0, m), -1);
    struct w big = {0};
    u8(&big, 'I');
    u32(&big, 7);
    u8(&big, 'N');
    u16(&big, PGO_MAX_COLS + 1);
    assert_int_equal(pgo_decode(big.b, big.n, 0, m), -1);
    /* a relation name without its NUL */
    struct w r = {0};
    u8(&r, 'R');
    u32(&r, 1);
    memcpy(r.b + r.n, "public", 6);
    r.n += 6;
    assert_int_equal(pgo_decode(r.b, r.n, 0, m), -1);
}

static void test_frames_and_status_update(void **state)
{
    struct w w = {0};
    u8(&w, 'w');
    u64(&w, 0x1000);
    u64(&w, 0x2000);
    u64(&w, 123);
    u8(&w, 'E');
    struct pgo_frame f;
    assert_int_equal(pgo_frame_decode(w.b, w.n, &f), 0);
    assert_int_equal(f.kind, 'w');
    assert_int_equal(f.wal_start, 0x1000);
    assert_int_equal(f.wal_end, 0x2000);
    assert_int_equal(f.ndata, 1);
    assert_int_equal(f.data[0], 'E');
    assert_int_equal(pgo_frame_decode(w.b, 24, &f), -1);

    struct w k = {0};
    u8(&k, 'k');
    u64(&k, 0x3000);
    u64(&k, 9);
    u8(&k, 1);
    assert_int_equal(pgo_frame_decode(k.b, k.n, &f), 0);
    assert_int_equal(f.wal_end, 0x3000);
    assert_int_equal(f.reply_requested, 1);
    assert_int_equal(pgo_frame_decode(k.b, k.n - 1, &f), -1);
    uint8_t x = 'x';
    assert_int_equal(pgo_frame_decode(&x, 1, &f), -1);

    uint8_t out[34];
    assert_int_equal(pgo_status_update(out, 0x0102030405060708ull, 0x10, 0x20, 0x30, 1), 34);
    assert_int_equal(out[0], 'r');
    assert_int_equal(out[1], 0x01);
    assert_int_equal(out[8], 0x08);
    assert_int_equal(out[16], 0x10);
    assert_int_equal(out[24], 0x20);
    assert_int_equal(out[32], 0x30);
    assert_int_equal(out[33], 1);
}

static void test_lsn_text(void **state)
{
    char s[24];
    pgo_lsn_format(0x16B374D848ull, s, sizeof s);
    assert_string_equal(s, "16/B374D848");
    uint64_t v;
    assert_int_equal(pgo_lsn_parse("16/B374D848", &v), 0);
    assert_int_equal(v, 0x16B374D848ull);
    assert_int_equal(pgo_lsn_parse("16/B374D848x", &v), -1);
    assert_int_equal(pgo_lsn_parse("nope", &v), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_begin_and_commit),
        cmocka_unit_test(test_relation_columns),
        cmocka_unit_test(test_update_with_old_row),
        cmocka_unit_test(test_update_without_old_row_and_insert_delete),
        cmocka_unit_test(test_streamed_change_carries_xid),
        cmocka_unit_test(test_stream_control_messages),
        cmocka_unit_test(test_truncate_relids),
        cmocka_unit_test(test_unknown_kind_and_bad_markers_refused),
        cmocka_unit_test(test_frames_and_status_update),
        cmocka_unit_test(test_lsn_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
