/* buf.h — growable byte buffer used for connection input and output.
 *
 * Bytes live in data[off, len); consumers advance `off` and producers append at `len`.
 * Every growth is checked: an allocation failure returns -1 and leaves the buffer as it was,
 * so callers on the request path can answer with an error instead of aborting. */
#ifndef SHOAL_COMMON_BUF_H
#define SHOAL_COMMON_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct buf {
    char *data;
    size_t off; /* first unconsumed byte */
    size_t len; /* end of valid bytes */
    size_t cap;
};

void buf_init(struct buf *b);
void buf_release(struct buf *b);
/* Make room for `n` more bytes at the end (compacting consumed bytes first). 0 or -1. */
int buf_reserve(struct buf *b, size_t n);
int buf_append(struct buf *b, const void *p, size_t n);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append the decimal form of v. */
int buf_append_u64(struct buf *b, uint64_t v);
int buf_append_i64(struct buf *b, int64_t v);
/* Drop consumed bytes; shrink the allocation when it is mostly unused and above `keep`. */
void buf_compact(struct buf *b, size_t keep);

static inline size_t buf_used(const struct buf *b) { return b->len - b->off; }
static inline char *buf_start(const struct buf *b) { return b->data + b->off; }
static inline void buf_consume(struct buf *b, size_t n)
{
    b->off += n;
    if (b->off == b->len) b->off = b->len = 0;
}
static inline int buf_append_str(struct buf *b, const char *s) { return buf_append(b, s, strlen(s)); }

/* Write the decimal form of v into out (at least 20 bytes); returns its length. */
size_t fmt_u64(char *out, uint64_t v);

#endif
