/* metrics.h — counters and gauges declared once per module, in an X-macro table.
 *
 * A module lists its metrics as X(name, KIND, "help") in one table. From that table come the
 * struct that holds the values, the `stats` lines on the data port and the Prometheus series on
 * the admin port, so a metric cannot be added in one place and forgotten in another. Values are
 * plain uint64_t; hot-path counters live in per-thread structs and are summed when read. */
#ifndef SHOAL_COMMON_METRICS_H
#define SHOAL_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct buf;

enum metric_kind { METRIC_COUNTER, METRIC_GAUGE };

struct metric_desc {
    const char *name;
    enum metric_kind kind;
    const char *help;
    size_t offset; /* of the uint64_t value inside the module's struct */
};

#define METRIC_FIELD(name, kind, help) uint64_t name;
#define METRIC_DESC(type, name, kind, help) {#name, METRIC_##kind, help, offsetof(type, name)}

/* Add every uint64_t of `src` into `dst`; both are structs made only of METRIC_FIELDs. */
static inline void metrics_sum(uint64_t *dst, const uint64_t *src, size_t nfields)
{
    for (size_t i = 0; i < nfields; i++) dst[i] += src[i];
}

/* Append "STAT <name> <value>\r\n" for each metric. */
void metrics_write_stats(struct buf *b, const struct metric_desc *d, size_t n, const void *vals);
/* Append Prometheus text format: HELP and TYPE lines, then "<prefix>_<name>{labels} value".
 * `labels` may be NULL or a string like `namespace="x"` (without braces). */
void metrics_write_prom(struct buf *b, const char *prefix, const struct metric_desc *d, size_t n,
                        const void *vals, const char *labels);

#endif
