/* keys.c — key naming and request encoding for shoal-bench, see keys.h. */
#include "bench/keys.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/opts.h"

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int bench_keys_init(struct bench_keys *k, const struct bench_opts *o)
{
    memset(k, 0, sizeof(*k));
    k->n = o->keys;
    k->n_all = bench_opts_all_keys(o);
    k->prefix = o->key_prefix;
    k->prefix_len = strlen(o->key_prefix);
    char tmp[24];
    int natural_digits = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)(k->n_all - 1));
    if (o->key_size) {
        k->pad_digits = (unsigned)(o->key_size - k->prefix_len);
        k->max_key_len = o->key_size;
    } else {
        k->max_key_len = k->prefix_len + (size_t)natural_digits;
    }

    /* Golden-ratio fraction of n: consecutive ranks land far apart. */
    uint64_t m = 1;
    if (k->n > 2) {
        m = (uint64_t)((double)k->n * 0.6180339887498949) | 1; /* < n for n > 2 */
        while (gcd_u64(m, k->n) != 1) m++; /* stops by n - 1 at the latest */
    }
    k->scatter_mult = m;

    k->value_len = o->value_size;
    k->value_min = o->value_min < o->value_size ? o->value_min : o->value_size;
    if (k->value_min < k->value_len)
        k->value_log_span = log(((double)k->value_len + 1.0) / (double)k->value_min);
    k->value = malloc(k->value_len + 2);
    if (!k->value) return -1;
    /* Printable, non-repeating at short periods, so compressing servers get no free lunch. */
    uint64_t x = 0x2545f4914f6cdd1dULL ^ o->seed;
    for (size_t i = 0; i < k->value_len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        k->value[i] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[x % 62];
    }
    memcpy(k->value + k->value_len, "\r\n", 2);
    k->set_tail_len =
        (size_t)snprintf(k->set_tail, sizeof(k->set_tail), " 0 0 %zu\r\n", k->value_len);
    return 0;
}

void bench_keys_free(struct bench_keys *k)
{
    free(k->value);
    k->value = NULL;
}

size_t bench_keys_value_len(const struct bench_keys *k, uint64_t idx)
{
    if (k->value_min == k->value_len) return k->value_len;
    /* splitmix64's finaliser: every index bit affects every output bit. */
    uint64_t h = idx + 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
    double u = (double)(h >> 11) * 0x1p-53; /* [0, 1) */
    double size = (double)k->value_min * exp(u * k->value_log_span); /* [min, max + 1) */
    size_t s = (size_t)size;
    if (s < k->value_min) s = k->value_min; /* rounding guards */
    if (s > k->value_len) s = k->value_len;
    return s;
}

double bench_keys_value_mean(const struct bench_keys *k)
{
    if (k->value_min == k->value_len) return (double)k->value_len;
    uint64_t samples = k->n < 1000000 ? k->n : 1000000;
    double sum = 0.0;
    for (uint64_t i = 0; i < samples; i++)
        sum += (double)bench_keys_value_len(k, (uint64_t)((unsigned __int128)i * k->n / samples));
    return sum / (double)samples;
}

size_t bench_keys_max_request(const struct bench_keys *k)
{
    size_t get = 4 + k->max_key_len + 2;
    size_t set = 4 + k->max_key_len + k->set_tail_len + k->value_len + 2;
    return get > set ? get : set;
}

/* Decimal digits of v into the end of buf[24]; returns where they start. */
static inline char *itoa_end(uint64_t v, char *buf_end)
{
    char *p = buf_end;
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return p;
}

size_t bench_keys_format(const struct bench_keys *k, uint64_t idx, char *dst)
{
    char digits[24];
    char *p = itoa_end(idx, digits + sizeof(digits));
    size_t nd = (size_t)(digits + sizeof(digits) - p);
    memcpy(dst, k->prefix, k->prefix_len);
    size_t len = k->prefix_len;
    if (k->pad_digits > nd) {
        memset(dst + len, '0', k->pad_digits - nd);
        len += k->pad_digits - nd;
    }
    memcpy(dst + len, p, nd);
    return len + nd;
}

size_t bench_keys_write_get(const struct bench_keys *k, uint64_t idx, char *dst)
{
    memcpy(dst, "get ", 4);
    size_t len = 4 + bench_keys_format(k, idx, dst + 4);
    memcpy(dst + len, "\r\n", 2);
    return len + 2;
}

size_t bench_keys_write_set(const struct bench_keys *k, uint64_t idx, char *dst)
{
    memcpy(dst, "set ", 4);
    size_t len = 4 + bench_keys_format(k, idx, dst + 4);
    if (k->value_min == k->value_len) {
        memcpy(dst + len, k->set_tail, k->set_tail_len);
        len += k->set_tail_len;
        memcpy(dst + len, k->value, k->value_len + 2);
        return len + k->value_len + 2;
    }
    size_t vlen = bench_keys_value_len(k, idx);
    char digits[24];
    char *p = itoa_end(vlen, digits + sizeof(digits));
    size_t nd = (size_t)(digits + sizeof(digits) - p);
    memcpy(dst + len, " 0 0 ", 5);
    len += 5;
    memcpy(dst + len, p, nd);
    len += nd;
    memcpy(dst + len, "\r\n", 2);
    len += 2;
    memcpy(dst + len, k->value, vlen);
    len += vlen;
    memcpy(dst + len, "\r\n", 2);
    return len + 2;
}
