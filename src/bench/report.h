/* report.h — shoal-bench's final output: the human table and the optional JSON line.
 *
 * Cache-aside runs add a table of gets, hits and misses split into key gets and scan gets;
 * the headline miss ratio is that of the key (non-scan) gets, the one an eviction policy is
 * meant to protect, with the overall one next to it. */
#ifndef SHOAL_BENCH_REPORT_H
#define SHOAL_BENCH_REPORT_H

#include <stdio.h>

#include "bench/opts.h"
#include "bench/stats.h"

struct bench_report {
    const struct bench_opts *o;
    const struct bench_stats *st; /* measured phase, merged over threads */
    double elapsed_s; /* measured wall time */
    double warmup_s; /* warmup actually run */
    double client_cpu_s; /* this process's user+system CPU during the measured run */
    const struct bench_stats *warm; /* warmup, merged; its errors are noted apart */
    bool interrupted;
    double value_mean; /* mean value size over the key space (bench_keys_value_mean) */
};

/* Successful operations (get replies + STORED) in the measured window. */
uint64_t bench_report_ops(const struct bench_stats *st);

void bench_report_print(FILE *f, const struct bench_report *r);

#endif
