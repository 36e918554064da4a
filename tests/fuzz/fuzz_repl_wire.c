/* fuzz_repl_wire.c — libFuzzer target for the replication stream's parser (src/node/repl_wire.c),
 * which reads whatever reaches a node's data port after the handshake word.
 *
 * The input is parsed as the replica's applier does: handshake lines, then frames with a small
 * payload bound, each decoded as a record. Invariants: a parse never takes more than it was
 * given nor a frame over the bound; a decoded record's key and value lie inside its frame; a
 * frame re-encoded from a decoded item record parses back to the same fields, as does a
 * progress frame's clock stamp. */
#include <stdlib.h>
#include <string.h>

#include "node/repl_wire.h"

#define MAXP 4096

static void check_record(const struct repl_frame *f)
{
    struct repl_rec r;
    const char *why = NULL;
    if (f->type == REPL_F_PROGRESS) { /* a stamp: none, or 8 bytes that encode back the same */
        uint64_t wall = 0;
        int st = repl_progress_decode(f, &wall, &why);
        if ((st < 0) != (f->len != 0 && f->len != REPL_WALL_LEN) || (st < 0 && why == NULL))
            abort();
        uint8_t p[REPL_HDR + REPL_WALL_LEN];
        repl_progress_encode(p, f->offset, wall);
        if (st == 1 && memcmp(p + REPL_HDR, f->payload, REPL_WALL_LEN)) abort();
        return;
    }
    if (repl_rec_decode(f, &r, &why) < 0) {
        if (why == NULL) abort();
        return;
    }
    const char *lo = (const char *)f->payload, *hi = lo + f->len;
    if (r.key && (r.key < lo || r.key + r.nkey > hi)) abort();
    if (r.value && (r.value < lo || r.value + r.nbytes > hi)) abort();
    if (f->type != REPL_F_ITEM && f->type != REPL_F_SNAP) return;
    uint8_t buf[REPL_HDR + MAXP];
    size_t pl = repl_item_payload(r.nkey, r.nbytes);
    if (REPL_HDR + pl > sizeof buf) abort();
    repl_frame_header(buf, f->type, (uint32_t)pl, f->offset);
    repl_item_encode(buf + REPL_HDR, &r);
    memcpy(buf + REPL_HDR + REPL_ITEM_FIXED + r.nkey, r.value, r.nbytes);
    struct repl_frame g;
    if (repl_frame_parse(buf, REPL_HDR + pl, MAXP, &g, &why) != (long)(REPL_HDR + pl)) abort();
    struct repl_rec s;
    if (repl_rec_decode(&g, &s, &why) < 0) abort();
    if (s.nkey != r.nkey || s.nbytes != r.nbytes || s.cas != r.cas || s.ttl != r.ttl ||
        s.flags != r.flags || s.iflags != r.iflags || memcmp(s.key, r.key, r.nkey) ||
        memcmp(s.value, r.value, r.nbytes))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
    /* handshake lines: the first three lines, each tried by every line parser */
    size_t off = 0;
    for (int i = 0; i < 3 && off < size; i++) {
        const uint8_t *nl = memchr(in + off, '\n', size - off);
        size_t len = nl ? (size_t)(nl - (in + off)) : size - off;
        char primary[301], id[17];
        uint64_t applied;
        bool refused, full;
        if (repl_hello_parse((const char *)in + off, len, primary, sizeof primary, id) == 0 &&
            (strlen(id) != 16 || strchr(primary, ':') == NULL))
            abort();
        repl_have_parse((const char *)in + off, len, id, &applied, &refused);
        repl_start_parse((const char *)in + off, len, &full, &applied);
        off += len + (nl != NULL);
    }
    /* frames: from the start, as if the handshake were done */
    off = 0;
    while (off < size) {
        struct repl_frame f;
        const char *why = NULL;
        long used = repl_frame_parse(in + off, size - off, MAXP, &f, &why);
        if (used < 0) {
            if (why == NULL) abort();
            break;
        }
        if (used == 0) break;
        if ((size_t)used > size - off || f.len > MAXP || (size_t)used != REPL_HDR + f.len) abort();
        check_record(&f);
        off += (size_t)used;
    }
    return 0;
}
