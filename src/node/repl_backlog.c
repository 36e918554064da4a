/* repl_backlog.c — the ring of recent stream frames (see repl_backlog.h). */
#include "node/repl_backlog.h"

#include <stdlib.h>
#include <string.h>

#include "node/repl_wire.h"

int repl_backlog_init(struct repl_backlog *b, size_t cap)
{
    memset(b, 0, sizeof *b);
    if (cap < 4096) cap = 4096;
    if ((b->ring = malloc(cap)) == NULL) return -1;
    b->cap = cap;
    pthread_mutex_init(&b->lock, NULL);
    return 0;
}

void repl_backlog_free(struct repl_backlog *b)
{
    if (b->ring == NULL) return;
    free(b->ring);
    b->ring = NULL;
    pthread_mutex_destroy(&b->lock);
}

/* Copy n bytes in or out at stream offset `off` (wrapping). */
static void ring_put(struct repl_backlog *b, uint64_t off, const void *src, size_t n)
{
    size_t at = (size_t)(off % b->cap), first = b->cap - at < n ? b->cap - at : n;
    memcpy(b->ring + at, src, first);
    memcpy(b->ring, (const uint8_t *)src + first, n - first);
}

static void ring_get(const struct repl_backlog *b, uint64_t off, void *dst, size_t n)
{
    size_t at = (size_t)(off % b->cap), first = b->cap - at < n ? b->cap - at : n;
    memcpy(dst, b->ring + at, first);
    memcpy((uint8_t *)dst + first, b->ring, n - first);
}

/* Length of the frame held at `off` (header included). */
static size_t ring_frame_len(const struct repl_backlog *b, uint64_t off)
{
    uint8_t h[8];
    ring_get(b, off, h, 8);
    return REPL_HDR + ((size_t)h[4] | (size_t)h[5] << 8 | (size_t)h[6] << 16 | (size_t)h[7] << 24);
}

uint64_t repl_backlog_append(struct repl_backlog *b, uint8_t type, const struct repl_part *parts,
                             int n)
{
    size_t len = 0;
    for (int i = 0; i < n; i++) len += parts[i].n;
    size_t total = REPL_HDR + len;
    pthread_mutex_lock(&b->lock);
    uint64_t end = b->end + total;
    if (total > b->cap) { /* cannot be held: everyone loses their place */
        b->start = b->end = end;
        b->dropped++;
        pthread_mutex_unlock(&b->lock);
        return end;
    }
    while (end - b->start > b->cap) b->start += ring_frame_len(b, b->start);
    uint8_t h[REPL_HDR];
    repl_frame_header(h, type, (uint32_t)len, end);
    uint64_t at = b->end;
    ring_put(b, at, h, REPL_HDR);
    at += REPL_HDR;
    for (int i = 0; i < n; i++) {
        ring_put(b, at, parts[i].p, parts[i].n);
        at += parts[i].n;
    }
    b->end = end;
    pthread_mutex_unlock(&b->lock);
    return end;
}

long repl_backlog_read(struct repl_backlog *b, uint64_t *pos, uint8_t *dst, size_t cap)
{
    pthread_mutex_lock(&b->lock);
    if (*pos < b->start || *pos > b->end) {
        pthread_mutex_unlock(&b->lock);
        return -1;
    }
    size_t got = 0;
    uint64_t p = *pos;
    while (p < b->end) {
        size_t fl = ring_frame_len(b, p);
        if (got + fl > cap || p + fl > b->end) break;
        ring_get(b, p, dst + got, fl);
        got += fl;
        p += fl;
    }
    *pos = p;
    pthread_mutex_unlock(&b->lock);
    return (long)got;
}

uint64_t repl_backlog_end(struct repl_backlog *b)
{
    pthread_mutex_lock(&b->lock);
    uint64_t e = b->end;
    pthread_mutex_unlock(&b->lock);
    return e;
}

bool repl_backlog_holds(struct repl_backlog *b, uint64_t pos)
{
    pthread_mutex_lock(&b->lock);
    bool ok = pos >= b->start && pos <= b->end;
    if (ok && pos < b->end) {
        /* a replica's offset from a frame's end is a frame's start; any other (a peer's made-up
         * one) would have the sender read headers out of payload bytes and stall. A frame's
         * header carries its own end offset: one that does not name pos + its length is none. */
        uint8_t h[REPL_HDR];
        if (b->end - pos < REPL_HDR) {
            ok = false;
        } else {
            ring_get(b, pos, h, REPL_HDR);
            uint64_t len = (uint64_t)h[4] | (uint64_t)h[5] << 8 | (uint64_t)h[6] << 16 |
                           (uint64_t)h[7] << 24, end = 0;
            for (int i = 15; i >= 8; i--) end = end << 8 | h[i];
            ok = repl_type_stream(h[0]) && !h[1] && !h[2] && !h[3] &&
                 end == pos + REPL_HDR + len && end <= b->end;
        }
    }
    pthread_mutex_unlock(&b->lock);
    return ok;
}
