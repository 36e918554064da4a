/* hist.h — log-linear latency histogram of shoal-bench (HDR-style buckets).
 *
 * Values are nanoseconds. Below 2^BENCH_HIST_SUB_BITS ns every value has its own bucket; above,
 * each power-of-two range is cut into 2^BENCH_HIST_SUB_BITS equal buckets, so a bucket is at
 * most 1/128 (0.78%) of its value wide and its midpoint is within 0.4% of any value in it.
 * Values of 2^37 ns (~137 s) and more land in the last bucket (max is still kept exactly).
 * Recording is a clz, a shift and an increment; each thread owns one histogram and they are
 * merged at the end. */
#ifndef SHOAL_BENCH_HIST_H
#define SHOAL_BENCH_HIST_H

#include <stdint.h>

#define BENCH_HIST_SUB_BITS 7
#define BENCH_HIST_SUB (1u << BENCH_HIST_SUB_BITS)
#define BENCH_HIST_MAX_EXP 36 /* values below 2^37 ns (~137 s) are bucketed accurately */
/* the exact range [0, SUB), then one group of SUB buckets per exponent SUB_BITS..MAX_EXP */
#define BENCH_HIST_BUCKETS (BENCH_HIST_SUB * (BENCH_HIST_MAX_EXP - BENCH_HIST_SUB_BITS + 2))

struct bench_hist {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t min_ns;
    uint64_t max_ns;
    uint64_t bucket[BENCH_HIST_BUCKETS];
};

void bench_hist_init(struct bench_hist *h);

static inline unsigned bench_hist_index(uint64_t v)
{
    if (v < BENCH_HIST_SUB) return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* floor(log2 v) >= SUB_BITS */
    if (e > BENCH_HIST_MAX_EXP) return BENCH_HIST_BUCKETS - 1;
    unsigned shift = e - BENCH_HIST_SUB_BITS;
    unsigned sub = (unsigned)(v >> shift) - BENCH_HIST_SUB;
    return BENCH_HIST_SUB + shift * BENCH_HIST_SUB + sub;
}

static inline void bench_hist_record(struct bench_hist *h, uint64_t ns)
{
    h->bucket[bench_hist_index(ns)]++;
    h->count++;
    h->sum_ns += ns;
    if (ns < h->min_ns) h->min_ns = ns;
    if (ns > h->max_ns) h->max_ns = ns;
}

/* Lowest value that maps to bucket `i`, and the bucket's width. */
uint64_t bench_hist_bucket_low(unsigned i);
uint64_t bench_hist_bucket_width(unsigned i);

void bench_hist_merge(struct bench_hist *dst, const struct bench_hist *src);

/* Value at percentile p in [0, 100] (the smallest bucket covering ceil(p% of count) values,
 * reported at its midpoint and clamped to [min, max]); 0 if the histogram is empty. */
double bench_hist_percentile(const struct bench_hist *h, double p);
double bench_hist_mean(const struct bench_hist *h);

#endif
