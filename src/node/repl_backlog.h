/* repl_backlog.h — the primary's replication backlog: the last --repl-backlog bytes of the
 * stream of changes (repl_wire.h frames), in a ring, offsets counted from the node's start.
 *
 * Workers append whole frames (one mutex hold, a memcpy; never waits on the network); each
 * sender copies whole frames out from its own position. When the ring is full the oldest
 * frames go: a sender whose position fell behind `start` has lost its place and must resync
 * its replica in full. A frame larger than the ring is not kept: the ring is emptied past it, so
 * every replica resyncs (an item must stay far below the ring's size to be streamed). */
#ifndef SHOAL_NODE_REPL_BACKLOG_H
#define SHOAL_NODE_REPL_BACKLOG_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct repl_backlog {
    pthread_mutex_t lock;
    uint8_t *ring;
    size_t cap;
    uint64_t start, end; /* stream offsets held: [start, end) */
    uint64_t dropped;    /* frames too large for the ring (counted, not kept) */
};

/* A ring of `cap` bytes (at least 4 KiB). 0, or -1 when memory ran out. */
int repl_backlog_init(struct repl_backlog *b, size_t cap);
void repl_backlog_free(struct repl_backlog *b);

/* Append a frame of type `type` whose payload is the concatenation of the `n` parts (header
 * written here, its offset the stream's end after it). Returns the new end offset. */
struct repl_part {
    const void *p;
    size_t n;
};
uint64_t repl_backlog_append(struct repl_backlog *b, uint8_t type, const struct repl_part *parts,
                             int n);
/* Copy whole frames from *pos into dst (cap bytes; at least one frame fits when cap is at least
 * the largest frame) and advance *pos. Returns the bytes copied (0: nothing new), or -1 when
 * *pos is no longer held (behind start, or not a frame boundary ahead of end). */
long repl_backlog_read(struct repl_backlog *b, uint64_t *pos, uint8_t *dst, size_t cap);
/* The stream's end offset now, and whether `pos` is still held (start <= pos <= end) and a
 * frame's start (or the end). */
uint64_t repl_backlog_end(struct repl_backlog *b);
bool repl_backlog_holds(struct repl_backlog *b, uint64_t pos);

#endif
