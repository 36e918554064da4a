/* conn_stage.c — where a storage command's value waits while it is still arriving.
 *
 * A value that is all in the input buffer when its command line is parsed goes straight into
 * a new item (conn.c). Any other is received here first, and its item is allocated only once
 * every byte has come: a client that stops half way holds only what it sent, and the store
 * never evicts for bytes that have not arrived (issue 11, point 5; before, 64 clients each
 * declaring a 1 MB value and sending 1 KB of it evicted a 64 MB cache).
 *
 * The staging buffer is a chain of chunks that double in size (16 KiB, 32 KiB, ...), the last
 * one cut to the declared length. It grows with the bytes received (never more than twice
 * them plus 16 KiB), without copying what it holds, and a large read can land straight in the
 * current chunk. The chunks of every connection together are capped by --inflight-max: a
 * value that would pass the cap is refused with memcached's out-of-memory reply, and the rest
 * of its data block is swallowed so the connection stays in step. */
#include <stdlib.h>
#include <string.h>

#include "node/cmd_store.h"
#include "node/conn.h"

#define STAGE_FIRST ((uint64_t)16384)

_Static_assert((STAGE_FIRST << CONN_STAGE_CHUNKS) - STAGE_FIRST >= (1ull << 30),
               "the chunks must hold the largest item_max");

/* The chunk holding value byte `off`, and where that chunk starts. */
static unsigned stage_chunk_of(uint64_t off, uint64_t *start)
{
    unsigned i = 63u - (unsigned)__builtin_clzll(off / STAGE_FIRST + 1);
    *start = STAGE_FIRST * ((1ull << i) - 1);
    return i;
}

static uint64_t stage_chunk_len(unsigned i, uint64_t start, uint64_t nbytes)
{
    uint64_t len = STAGE_FIRST << i;
    return nbytes - start < len ? nbytes - start : len;
}

void conn_stage_free(struct conn *c)
{
    for (unsigned i = 0; i < c->stage.n; i++) free(c->stage.chunk[i]);
    if (c->stage.bytes) __atomic_sub_fetch(&c->node->inflight_bytes, c->stage.bytes, __ATOMIC_RELAXED);
    c->stage.n = 0;
    c->stage.bytes = 0;
}

/* Refuse the value being received: answer as memcached does when it has no memory for a
 * store, drop the staged bytes and swallow the rest of the data block. */
static void stage_refuse(struct conn *c)
{
    conn_stage_free(c);
    cmd_store_refuse(c, &c->preq, "SERVER_ERROR out of memory storing object\r\n");
    c->swallow = (uint64_t)c->preq.nbytes + 2 - c->vgot;
    c->badchunk = false;
    c->state = CONN_SWALLOW;
}

bool conn_stage_room(struct conn *c, char **dst, size_t *len)
{
    uint64_t nbytes = (uint64_t)c->preq.nbytes, start;
    unsigned i = stage_chunk_of(c->vgot, &start);
    uint64_t clen = stage_chunk_len(i, start, nbytes);
    if (i >= c->stage.n) { /* the previous chunks are full: add this one */
        uint64_t total = __atomic_add_fetch(&c->node->inflight_bytes, clen, __ATOMIC_RELAXED);
        if (total > c->node->cfg.inflight_max) {
            __atomic_sub_fetch(&c->node->inflight_bytes, clen, __ATOMIC_RELAXED);
            c->w->m.store_inflight_refused++;
            stage_refuse(c);
            return false;
        }
        char *p = malloc((size_t)clen);
        if (p == NULL) {
            __atomic_sub_fetch(&c->node->inflight_bytes, clen, __ATOMIC_RELAXED);
            c->w->m.conn_oom++;
            stage_refuse(c);
            return false;
        }
        c->stage.chunk[c->stage.n++] = p;
        c->stage.bytes += clen;
    }
    *dst = c->stage.chunk[i] + (c->vgot - start);
    *len = (size_t)(start + clen - c->vgot);
    return true;
}

void conn_stage_copy(const struct conn *c, struct item *it)
{
    uint64_t nbytes = (uint64_t)c->preq.nbytes, start = 0;
    char *v = item_value(it);
    for (unsigned i = 0; i < c->stage.n; i++) {
        uint64_t clen = stage_chunk_len(i, start, nbytes);
        memcpy(v + start, c->stage.chunk[i], (size_t)clen);
        start += clen;
    }
}
