/* buf.c — growable byte buffer (see buf.h). */
#include "common/buf.h"

#include <stdio.h>
#include <stdlib.h>

void buf_init(struct buf *b) { b->data = NULL, b->off = b->len = b->cap = 0; }

void buf_release(struct buf *b)
{
    free(b->data);
    buf_init(b);
}

int buf_reserve(struct buf *b, size_t n)
{
    if (b->cap - b->len >= n) return 0;
    if (b->off > 0) { /* reclaim consumed space before growing */
        memmove(b->data, b->data + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->cap - b->len >= n) return 0;
    }
    size_t need = b->len + n;
    if (need < n) return -1;
    size_t cap = b->cap ? b->cap : 2048;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int buf_append(struct buf *b, const void *p, size_t n)
{
    if (n == 0) return 0; /* an empty buffer has no storage to copy into (or from) */
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(b, (size_t)n + 1) < 0) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

size_t fmt_u64(char *out, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

int buf_append_u64(struct buf *b, uint64_t v)
{
    if (buf_reserve(b, 20) < 0) return -1;
    b->len += fmt_u64(b->data + b->len, v);
    return 0;
}

int buf_append_i64(struct buf *b, int64_t v)
{
    if (v >= 0) return buf_append_u64(b, (uint64_t)v);
    if (buf_reserve(b, 21) < 0) return -1;
    b->data[b->len++] = '-';
    b->len += fmt_u64(b->data + b->len, (uint64_t)0 - (uint64_t)v);
    return 0;
}

void buf_compact(struct buf *b, size_t keep)
{
    if (b->off == b->len) b->off = b->len = 0;
    if (b->cap > keep && b->len == 0) {
        free(b->data);
        buf_init(b);
    }
}
