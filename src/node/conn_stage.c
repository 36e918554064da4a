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
 * current chunk. The chunks of every connection together are capped by --inflight-max. A
 * value that would pass the cap
 *   - goes into its item at once when the rest of it has all arrived (it needs no staging: a
 *     client that sends its values whole is never refused for the room half-sent ones hold;
 *     before, it was whenever its value reached us in parts while they held the cap);
 *   - else makes room by closing this worker's stalled stagers (a value that saw no byte for
 *     --inflight-stall-ms and has none unread in its socket), largest first;
 *   - else is refused with memcached's out-of-memory reply, and the rest of its data block is
 *     swallowed so the connection stays in step.
 * Past 7/8 of the cap every worker closes its stalled stagers after each batch too
 * (conn_budget.c), so the room they hold comes back whichever worker needs it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "node/cmd.h"
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

/* Drop the staged bytes and swallow the rest of the data block (the command is answered). */
static void stage_swallow(struct conn *c)
{
    conn_stage_free(c);
    c->swallow = (uint64_t)c->preq.nbytes + 2 - c->vgot;
    c->badchunk = false;
    c->state = CONN_SWALLOW;
}

/* Refuse the value being received: answer as memcached does when it has no memory for a
 * store, then swallow it. */
static void stage_refuse(struct conn *c)
{
    cmd_store_refuse(c, &c->preq, "SERVER_ERROR out of memory storing object\r\n");
    stage_swallow(c);
}

/* A connection whose staged value saw no byte for --inflight-stall-ms (at the batch's time),
 * on the face of it: the bytes may be here but not yet read (stage_quiet checks). */
static bool stage_stalled(const struct conn *c, uint64_t now, uint64_t stall_ms)
{
    return c->state == CONN_VALUE && c->stage.bytes > 0 && !c->doomed && !c->ring_reading &&
           c->stage_busy_ms != now && now - c->last_in_ms >= stall_ms;
}

/* Its client really sent nothing: no byte waits unread in its socket. A busy worker reads a
 * connection late, and the wait is then ours, not the client's; such a connection is passed
 * over for the rest of the batch. */
static bool stage_quiet(struct conn *c, uint64_t now)
{
    if (conn_socket_queued(c) == 0) return true;
    c->stage_busy_ms = now;
    return false;
}

/* One line for the connections a reclaim closed: under an attack there are hundreds. */
static void stage_log_closed(const struct worker *w, unsigned closed, const char *first,
                             uint64_t quiet_ms)
{
    const struct node *n = w->node;
    char more[48] = "";
    if (closed > 1) snprintf(more, sizeof more, " and %u more", closed - 1);
    log_warn("closing connection %s%s: its value has sent no byte for %llu ms or more while "
             "staged values held --inflight-max %llu bytes (--inflight-stall-ms %llu)",
             first, more, (unsigned long long)quiet_ms, (unsigned long long)n->cfg.inflight_max,
             (unsigned long long)n->cfg.inflight_stall_ms);
}

unsigned conn_stage_reclaim(struct worker *w, const struct conn *self, uint64_t need,
                            uint64_t target)
{
    struct node *n = w->node;
    uint64_t stall_ms = n->cfg.inflight_stall_ms;
    unsigned closed = 0;
    char first[sizeof ((struct connlist_ent *)0)->addr] = "";
    uint64_t quiet_ms = UINT64_MAX;
    uint64_t cur = __atomic_load_n(&n->inflight_bytes, __ATOMIC_RELAXED);
    while (stall_ms && cur + need > target) {
        struct conn *victim = NULL;
        for (struct conn *c = w->conns; c; c = c->next)
            if (c != self && stage_stalled(c, w->now_ms, stall_ms) &&
                (victim == NULL || c->stage.bytes > victim->stage.bytes))
                victim = c;
        if (victim == NULL) break;
        if (!stage_quiet(victim, w->now_ms)) continue;
        /* Its bytes leave the count in the same step that saw them still needed: workers
         * relieving the same pressure at once then close one holder between them, not one
         * each. On failure `cur` is the count as it is now; look again. */
        if (!__atomic_compare_exchange_n(&n->inflight_bytes, &cur, cur - victim->stage.bytes,
                                         false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            continue;
        cur -= victim->stage.bytes;
        victim->stage.bytes = 0; /* counted out above: conn_stage_free only frees the chunks */
        w->m.conns_closed_inflight++;
        if (closed++ == 0) snprintf(first, sizeof first, "%s", victim->listed.addr);
        if (w->now_ms - victim->last_in_ms < quiet_ms) quiet_ms = w->now_ms - victim->last_in_ms;
        /* Its chunks go now; the connection itself at the sweep, when no I/O of this batch can
         * point into it any more. Nothing else reads its stage: it is in CONN_CLOSE. */
        conn_stage_free(victim);
        victim->state = CONN_CLOSE;
        victim->doomed = true;
        w->doomed = true;
    }
    if (closed) stage_log_closed(w, closed, first, quiet_ms);
    return closed;
}

/* Count `clen` more staged bytes if they fit under --inflight-max. */
static bool stage_take(struct conn *c, uint64_t clen)
{
    uint64_t total = __atomic_add_fetch(&c->node->inflight_bytes, clen, __ATOMIC_RELAXED);
    if (total <= c->node->cfg.inflight_max) return true;
    __atomic_sub_fetch(&c->node->inflight_bytes, clen, __ATOMIC_RELAXED);
    return false;
}

/* Staging has no room, but when the rest of the value has all arrived (`buffered` bytes of it
 * in the input buffer, the others queued on the socket) it needs none: allocate its item now,
 * as for a value that arrives whole with its line, and move what was staged into it. So a
 * client that sends its values whole is not refused while clients that stop half way hold
 * the cap. True when it moved (c->it is set); false when the rest is not all here, or when the
 * store had no memory (answered, and the rest is being swallowed: c->state tells). */
static bool stage_to_item(struct conn *c, size_t buffered)
{
    uint64_t left = (uint64_t)c->preq.nbytes - c->vgot;
    if (left > buffered && conn_socket_queued(c) < left - buffered) return false;
    struct item *it = cmd_store_alloc(c, &c->preq); /* answers when it fails */
    if (it == NULL) {
        stage_swallow(c);
        return false;
    }
    conn_stage_copy(c, it, c->vgot);
    c->w->m.store_inflight_direct++;
    conn_stage_free(c);
    c->it = it;
    return true;
}

/* Room for a chunk of `clen` bytes: 1 when it is counted in; else, in this order, 2 when the
 * value moved into its item (the rest has arrived: no one is closed for a value that needs no
 * staging), 1 after closing stalled stagers made room, 0 when it was refused (answered; the
 * rest of its data block is being swallowed). */
static int stage_make_room(struct conn *c, uint64_t clen, size_t buffered)
{
    if (stage_take(c, clen)) return 1;
    if (stage_to_item(c, buffered)) return 2;
    if (c->state == CONN_SWALLOW) return 0; /* no memory for its item: answered */
    if (conn_stage_reclaim(c->w, c, clen, c->node->cfg.inflight_max) > 0 && stage_take(c, clen))
        return 1;
    c->w->m.store_inflight_refused++;
    stage_refuse(c);
    return 0;
}

bool conn_stage_room(struct conn *c, size_t buffered, char **dst, size_t *len)
{
    uint64_t nbytes = (uint64_t)c->preq.nbytes, start;
    unsigned i = stage_chunk_of(c->vgot, &start);
    uint64_t clen = stage_chunk_len(i, start, nbytes);
    if (i >= c->stage.n) { /* the previous chunks are full: add this one */
        int room = stage_make_room(c, clen, buffered);
        if (room != 1) return room == 2;
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

void conn_stage_copy(const struct conn *c, struct item *it, uint64_t n)
{
    uint64_t nbytes = (uint64_t)c->preq.nbytes, start = 0;
    char *v = item_value(it);
    for (unsigned i = 0; i < c->stage.n && start < n; i++) {
        uint64_t clen = stage_chunk_len(i, start, nbytes);
        if (clen > n - start) clen = n - start;
        memcpy(v + start, c->stage.chunk[i], (size_t)clen);
        start += clen;
    }
}
