/* keys.h — the key space of shoal-bench and the request bytes sent for each key.
 *
 * Key i (0 <= i < n) is PREFIX followed by i in decimal, zero-padded to a fixed key size when
 * one is asked for; cache-aside scans use the cold indexes n..n_all-1 after them. Requests are
 * written straight into a connection's send buffer with a hand-rolled itoa, so the hot loop
 * never formats or allocates.
 *
 * Value sizes: one fixed size, or (--value-size MIN-MAX) a size per key drawn log-uniformly
 * from [MIN, MAX] by a hash of the key's index alone: P(size <= s) = ln((s+1)/MIN) /
 * ln((MAX+1)/MIN). So key i has the same size in every run, whatever the seed or server, and
 * small values are common and large ones rare (mean (MAX+1-MIN)/ln((MAX+1)/MIN), about 645 B
 * for 100-2048), as in measured cache traces. Sizes do not depend on popularity. */
#ifndef SHOAL_BENCH_KEYS_H
#define SHOAL_BENCH_KEYS_H

#include <stddef.h>
#include <stdint.h>

struct bench_opts;

struct bench_keys {
    uint64_t n; /* key space of the load (--keys) */
    uint64_t n_all; /* n plus the cold range scans read */
    const char *prefix;
    size_t prefix_len;
    unsigned pad_digits; /* 0: natural length */
    size_t max_key_len;
    uint64_t scatter_mult; /* coprime with n, so rank -> index is a bijection */
    char *value; /* value_len bytes followed by "\r\n"; sets send a prefix of it */
    size_t value_len; /* the largest value, without the "\r\n" */
    size_t value_min; /* == value_len: every value is value_len bytes */
    double value_log_span; /* ln((value_len + 1) / value_min) */
    char set_tail[32]; /* " 0 0 <value_len>\r\n", for fixed sizes */
    size_t set_tail_len;
};

/* Returns 0, or -1 if memory for the value could not be allocated. */
int bench_keys_init(struct bench_keys *k, const struct bench_opts *o);
void bench_keys_free(struct bench_keys *k);

/* Spread popularity ranks over the key space (rank * mult mod n) so the hottest keys are not
 * neighbours and do not share a shard or hash-table neighbourhood by accident. */
static inline uint64_t bench_keys_scatter(const struct bench_keys *k, uint64_t rank)
{
    return (uint64_t)(((unsigned __int128)rank * k->scatter_mult) % k->n);
}

/* The value size of key `idx` (see the top of this file); pure, so callers can recompute it. */
size_t bench_keys_value_len(const struct bench_keys *k, uint64_t idx);

/* Mean value size over the key space [0, n) (exact up to 1M keys, else over an even sample). */
double bench_keys_value_mean(const struct bench_keys *k);

/* Upper bound on the bytes one request of either kind takes. */
size_t bench_keys_max_request(const struct bench_keys *k);

/* Write the key for `idx` at dst; returns its length (at most max_key_len). */
size_t bench_keys_format(const struct bench_keys *k, uint64_t idx, char *dst);

/* Write "get <key>\r\n" / "set <key> 0 0 <n>\r\n<value>\r\n" at dst; return the length. */
size_t bench_keys_write_get(const struct bench_keys *k, uint64_t idx, char *dst);
size_t bench_keys_write_set(const struct bench_keys *k, uint64_t idx, char *dst);

#endif
