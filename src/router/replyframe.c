/* replyframe.c — where one node reply ends in a stream of them (see replyframe.h). */
#include "router/replyframe.h"

#include <stdbool.h>
#include <string.h>

long reply_token_num(const char *p, const char *end, int which)
{
    int t = 0;
    while (p < end) {
        const char *s = p;
        while (p < end && *p != ' ' && *p != '\r' && *p != '\n') p++;
        if (t == which) {
            if (p == s || p - s > 10) return -1;
            long v = 0;
            for (const char *q = s; q < p; q++) {
                if (*q < '0' || *q > '9') return -1;
                v = v * 10 + (*q - '0');
            }
            return v;
        }
        t++;
        if (p < end && *p == ' ') p++;
        else break;
    }
    return -1;
}

long reply_length(const char *p, size_t n, uint64_t max_value, uint64_t max_reply, size_t *scan)
{
    size_t pos = *scan;
    for (;;) {
        const char *nl = memchr(p + pos, '\n', n - pos);
        if (nl == NULL) return (n - pos > REPLY_LINE_MAX) ? -1 : 0;
        const char *line = p + pos;
        size_t ll = (size_t)(nl - line) + 1;
        bool value = ll >= 6 && !memcmp(line, "VALUE ", 6);
        bool va = !value && ll >= 3 && !memcmp(line, "VA ", 3);
        if (!value && !va) return (long)(pos + ll);
        long vlen = reply_token_num(line, nl + 1, value ? 3 : 1);
        if (vlen < 0 || (uint64_t)vlen > max_value) return -1;
        size_t need = pos + ll + (size_t)vlen + 2;
        if (need > max_reply) return -1;
        if (n < need) return 0;
        if (p[need - 2] != '\r' || p[need - 1] != '\n') return -1;
        if (va) return (long)need;
        pos = need;
        *scan = pos;
    }
}

static bool starts(const char *p, size_t n, const char *s)
{
    size_t k = strlen(s);
    return n >= k && !memcmp(p, s, k);
}

uint32_t reply_value_slots(const char *req, size_t n)
{
    const char *end = memchr(req, '\n', n), *p = req;
    if (end == NULL) end = req + n;
    int skip; /* tokens before the keys */
    if (starts(req, n, "get ") || starts(req, n, "gets ")) skip = 1;
    else if (starts(req, n, "gat ") || starts(req, n, "gats ")) skip = 2;
    else return 1;
    uint32_t tokens = 0;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\r')) p++;
        if (p == end) break;
        tokens++;
        while (p < end && *p != ' ' && *p != '\r') p++;
    }
    return tokens > (uint32_t)skip ? tokens - (uint32_t)skip : 1;
}
