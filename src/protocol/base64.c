/* base64.c — RFC 4648 base64 (standard alphabet, padded) for meta commands' b-flag keys.
 *
 * Decoding is strict about length (a multiple of 4), alphabet and where '=' may appear, but like
 * memcached it does not insist that the bits padding leaves unused are zero ("AB==" decodes as
 * "AA==" does). */
#include <limits.h>
#include <stdint.h>

#include "protocol/protocol.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Value of one alphabet byte, or -1 ('=' included: callers handle padding themselves). */
static inline int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int proto_base64_encode(const char *in, size_t n, char *out, size_t outcap)
{
    if (n > (size_t)INT_MAX / 4 * 3) return -1; /* the length must fit the int we return */
    size_t need = (n + 2) / 3 * 4;
    if (need > outcap) return -1;
    const unsigned char *s = (const unsigned char *)in;
    char *o = out;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = alphabet[(v >> 6) & 63];
        *o++ = alphabet[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n) v |= (uint32_t)s[i + 1] << 8;
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    return (int)need;
}

int proto_base64_decode(const char *in, size_t n, char *out, size_t outcap)
{
    if (n % 4 != 0 || n > (size_t)INT_MAX) return -1;
    if (n == 0) return 0;
    const unsigned char *s = (const unsigned char *)in;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    size_t len = n / 4 * 3 - pad;
    if (len > outcap) return -1;
    unsigned char *o = (unsigned char *)out;
    for (size_t i = 0; i < n; i += 4) {
        bool last = i + 4 == n;
        int a = b64_value(s[i]), b = b64_value(s[i + 1]);
        int c = last && pad == 2 ? 0 : b64_value(s[i + 2]);
        int d = last && pad >= 1 ? 0 : b64_value(s[i + 3]);
        if ((a | b | c | d) < 0) return -1;
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        *o++ = (unsigned char)(v >> 16);
        if (last && pad == 2) break;
        *o++ = (unsigned char)(v >> 8);
        if (last && pad == 1) break;
        *o++ = (unsigned char)v;
    }
    return (int)len;
}
