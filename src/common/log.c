/* log.c — leveled one-line logging to stderr (see log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int log_level = LOG_NOTICE;
static const char *log_name = "shoal";

/* Copy s[0..n) into dst (NUL-terminated, within cap) with every byte outside printable ASCII,
 * and a backslash too when `backslash`, written as \xHH; stops before a byte that would not fit.
 * Returns how many bytes of s it took. */
static size_t escape_into(char *dst, size_t cap, const char *s, size_t n, bool backslash)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0, i = 0;
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool plain = c >= 0x20 && c < 0x7f && !(backslash && c == '\\');
        if (o + (plain ? 1 : 4) >= cap) break;
        if (plain) {
            dst[o++] = (char)c;
        } else {
            dst[o++] = '\\', dst[o++] = 'x', dst[o++] = hex[c >> 4], dst[o++] = hex[c & 15];
        }
    }
    dst[o] = '\0';
    return i;
}

char *log_escape(char *dst, size_t cap, const char *s, size_t n)
{
    escape_into(dst, cap, s, n, true);
    return dst;
}

size_t log_clean(char *dst, size_t cap, const char *s, size_t n)
{
    return escape_into(dst, cap, s, n, false);
}

void log_set_level(int level) { __atomic_store_n(&log_level, level, __ATOMIC_RELAXED); }
int log_get_level(void) { return __atomic_load_n(&log_level, __ATOMIC_RELAXED); }
void log_set_name(const char *name) { log_name = name; }

static void log_line(int level, const char *prefix, const char *fmt, va_list ap)
{
    static const char *names[] = {"error", "warn", "notice", "info", "debug"};
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    /* Whatever a caller formats (a peer's bytes, a name from a file), the line stays one
     * line of printable text no longer than LOG_LINE_MAX: a log reader or terminal never sees
     * a forged line, an escape sequence or a megabyte. */
    char raw[LOG_LINE_MAX + 1], line[LOG_LINE_MAX + 1];
    va_list copy;
    va_copy(copy, ap);
    int len = vsnprintf(raw, sizeof raw, fmt, copy);
    va_end(copy);
    if (len < 0) len = 0;
    size_t have = (size_t)len < sizeof raw ? (size_t)len : sizeof raw - 1;
    size_t took = log_clean(line, sizeof line - LOG_CUT_ROOM, raw, have);
    if (took < (size_t)len) {
        size_t o = strlen(line);
        snprintf(line + o, sizeof line - o, "... (%zu more bytes)", (size_t)len - took);
    }
    fprintf(stderr, "%s %s %s: %s%s\n", ts, log_name, names[level - LOG_ERROR], prefix, line);
}

void log_msg(int level, const char *fmt, ...)
{
    if (level > log_get_level()) return;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, "", fmt, ap);
    va_end(ap);
}

void log_limited(struct log_limit *l, int level, const char *fmt, ...)
{
    if (level > log_get_level()) return;
    long long now = (long long)time(NULL);
    long long window = __atomic_load_n(&l->window, __ATOMIC_RELAXED);
    unsigned dropped = 0;
    if (now - window >= LOG_LIMIT_SECONDS &&
        __atomic_compare_exchange_n(&l->window, &window, now, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
        __atomic_store_n(&l->lines, 0, __ATOMIC_RELAXED);
        dropped = __atomic_exchange_n(&l->dropped, 0, __ATOMIC_RELAXED);
    }
    if (__atomic_add_fetch(&l->lines, 1, __ATOMIC_RELAXED) > LOG_LIMIT_LINES) {
        __atomic_add_fetch(&l->dropped, 1, __ATOMIC_RELAXED);
        return;
    }
    char prefix[64] = "";
    if (dropped)
        snprintf(prefix, sizeof prefix, "(%u like lines not logged in %d s) ", dropped,
                 LOG_LIMIT_SECONDS);
    va_list ap;
    va_start(ap, fmt);
    log_line(level, prefix, fmt, ap);
    va_end(ap);
}
