/* hist.c — log-linear latency histogram, see hist.h for the bucket layout. */
#include "bench/hist.h"

#include <math.h>
#include <string.h>

void bench_hist_init(struct bench_hist *h)
{
    memset(h, 0, sizeof(*h));
    h->min_ns = UINT64_MAX;
}

uint64_t bench_hist_bucket_low(unsigned i)
{
    if (i < BENCH_HIST_SUB) return i;
    unsigned shift = (i - BENCH_HIST_SUB) / BENCH_HIST_SUB;
    unsigned sub = (i - BENCH_HIST_SUB) % BENCH_HIST_SUB;
    return (uint64_t)(BENCH_HIST_SUB + sub) << shift;
}

uint64_t bench_hist_bucket_width(unsigned i)
{
    if (i < BENCH_HIST_SUB) return 1;
    return 1ULL << ((i - BENCH_HIST_SUB) / BENCH_HIST_SUB);
}

void bench_hist_merge(struct bench_hist *dst, const struct bench_hist *src)
{
    for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++) dst->bucket[i] += src->bucket[i];
    dst->count += src->count;
    dst->sum_ns += src->sum_ns;
    if (src->min_ns < dst->min_ns) dst->min_ns = src->min_ns;
    if (src->max_ns > dst->max_ns) dst->max_ns = src->max_ns;
}

double bench_hist_percentile(const struct bench_hist *h, double p)
{
    if (h->count == 0) return 0.0;
    if (p >= 100.0) return (double)h->max_ns;
    uint64_t target = (uint64_t)ceil(p / 100.0 * (double)h->count);
    if (target < 1) target = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++) {
        seen += h->bucket[i];
        if (seen >= target) {
            double v =
                (double)bench_hist_bucket_low(i) + (double)(bench_hist_bucket_width(i) - 1) / 2.0;
            if (v < (double)h->min_ns) v = (double)h->min_ns;
            if (v > (double)h->max_ns) v = (double)h->max_ns;
            return v;
        }
    }
    return (double)h->max_ns;
}

double bench_hist_mean(const struct bench_hist *h)
{
    return h->count ? (double)h->sum_ns / (double)h->count : 0.0;
}
