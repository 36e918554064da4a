/* lathist.h — the power-of-two latency histogram behind every latency series of the router's
 * /metrics (per node, per pool, per namespace): recording on the request path, summing over
 * workers, quantiles and the Prometheus summary text on the admin thread.
 *
 * A histogram has one writer (its worker thread), which updates it with relaxed stores, never
 * read-modify-write atomics; the admin thread reads it with relaxed loads and may see a bucket
 * one increment ahead of the sum, which a scrape tolerates. */
#ifndef SHOAL_ROUTER_LATHIST_H
#define SHOAL_ROUTER_LATHIST_H

#include <stdint.h>

struct buf;

/* Bucket b counts latencies in [2^b, 2^(b+1)) microseconds (b = 0 also counts 0 and 1); the
 * last one takes everything slower (from 2^23 us, about 8.4 s). */
#define LATHIST_BUCKETS 24

struct lathist {
    uint64_t b[LATHIST_BUCKETS];
    uint64_t sum_us; /* total of the latencies recorded, for the summary's _sum */
};

static inline int lathist_bucket(uint64_t us)
{
    int b = us < 2 ? 0 : 63 - __builtin_clzll(us);
    return b < LATHIST_BUCKETS ? b : LATHIST_BUCKETS - 1;
}

/* Record one latency. Only the histogram's owning thread may call it. */
static inline void lathist_record(struct lathist *h, uint64_t us)
{
    uint64_t *p = &h->b[lathist_bucket(us)];
    __atomic_store_n(p, *p + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&h->sum_us, h->sum_us + us, __ATOMIC_RELAXED);
}

/* acc += h, reading h with relaxed loads (h may be written meanwhile; acc is private). */
void lathist_add(struct lathist *acc, const struct lathist *h);
/* Latencies recorded. */
uint64_t lathist_count(const struct lathist *h);
/* The q-quantile (0 < q <= 1) as the upper bound of the bucket that holds it (2^(b+1) us, so at
 * most twice the true value); 0 for an empty histogram. */
uint64_t lathist_quantile(const struct lathist *h, double q);

/* "# HELP"/"# TYPE name summary" lines of a latency family. */
void lathist_render_head(struct buf *out, const char *name, const char *help);
/* One labelled summary of family `name`: name{label="value",quantile="0.5"|"0.9"|"0.99"},
 * name_sum{label="value"} and name_count{label="value"}. */
void lathist_render(struct buf *out, const char *name, const char *label, const char *value,
                    const struct lathist *h);

#endif
