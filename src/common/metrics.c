/* metrics.c — render metric tables as memcached `stats` lines or Prometheus text. */
#include "common/metrics.h"

#include <stdbool.h>
#include <string.h>

#include "common/buf.h"

static uint64_t metric_value(const struct metric_desc *d, const void *vals)
{
    return *(const uint64_t *)((const char *)vals + d->offset);
}

void metrics_write_stats(struct buf *b, const struct metric_desc *d, size_t n, const void *vals)
{
    for (size_t i = 0; i < n; i++)
        buf_printf(b, "STAT %s %llu\r\n", d[i].name,
                   (unsigned long long)metric_value(&d[i], vals));
}

void metrics_write_prom(struct buf *b, const char *prefix, const struct metric_desc *d, size_t n,
                        const void *vals, const char *labels)
{
    for (size_t i = 0; i < n; i++) {
        const char *type = d[i].kind == METRIC_COUNTER ? "counter" : "gauge";
        /* Prometheus counters end in _total; a name that already does keeps its one */
        size_t len = strlen(d[i].name);
        bool has_total = len >= 6 && !strcmp(d[i].name + len - 6, "_total");
        const char *suffix = d[i].kind == METRIC_COUNTER && !has_total ? "_total" : "";
        buf_printf(b, "# HELP %s_%s%s %s\n# TYPE %s_%s%s %s\n", prefix, d[i].name, suffix,
                   d[i].help, prefix, d[i].name, suffix, type);
        if (labels && *labels)
            buf_printf(b, "%s_%s%s{%s} %llu\n", prefix, d[i].name, suffix, labels,
                       (unsigned long long)metric_value(&d[i], vals));
        else
            buf_printf(b, "%s_%s%s %llu\n", prefix, d[i].name, suffix,
                       (unsigned long long)metric_value(&d[i], vals));
    }
}
