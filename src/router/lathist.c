/* lathist.c — summing, quantiles and Prometheus text of latency histograms (see lathist.h). */
#include "router/lathist.h"

#include "common/buf.h"

void lathist_add(struct lathist *acc, const struct lathist *h)
{
    for (int b = 0; b < LATHIST_BUCKETS; b++)
        acc->b[b] += __atomic_load_n(&h->b[b], __ATOMIC_RELAXED);
    acc->sum_us += __atomic_load_n(&h->sum_us, __ATOMIC_RELAXED);
}

uint64_t lathist_count(const struct lathist *h)
{
    uint64_t n = 0;
    for (int b = 0; b < LATHIST_BUCKETS; b++) n += h->b[b];
    return n;
}

uint64_t lathist_quantile(const struct lathist *h, double q)
{
    uint64_t total = lathist_count(h), want = (uint64_t)((double)total * q), seen = 0;
    for (int b = 0; b < LATHIST_BUCKETS; b++) {
        seen += h->b[b];
        if (seen > want || (seen == total && seen)) return 2ull << b;
    }
    return 0;
}

void lathist_render_head(struct buf *out, const char *name, const char *help)
{
    buf_printf(out, "# HELP %s %s\n# TYPE %s summary\n", name, help, name);
}

void lathist_render(struct buf *out, const char *name, const char *label, const char *value,
                    const struct lathist *h)
{
    static const double qs[] = {0.5, 0.9, 0.99};
    for (size_t k = 0; k < sizeof qs / sizeof qs[0]; k++)
        buf_printf(out, "%s{%s=\"%s\",quantile=\"%g\"} %llu\n", name, label, value, qs[k],
                   (unsigned long long)lathist_quantile(h, qs[k]));
    buf_printf(out, "%s_sum{%s=\"%s\"} %llu\n%s_count{%s=\"%s\"} %llu\n", name, label, value,
               (unsigned long long)h->sum_us, name, label, value,
               (unsigned long long)lathist_count(h));
}
