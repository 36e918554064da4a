/* stats.h — what one shoal-bench thread counts while it runs.
 *
 * Each worker owns its bench_stats (no sharing, no atomics on the hot path); the main thread
 * reads them only after joining the workers. */
#ifndef SHOAL_BENCH_STATS_H
#define SHOAL_BENCH_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "bench/hist.h"

enum bench_err {
    BENCH_ERR_NOT_STORED, /* NOT_STORED / EXISTS / NOT_FOUND */
    BENCH_ERR_SERVER, /* SERVER_ERROR ... */
    BENCH_ERR_CLIENT, /* CLIENT_ERROR ... (connection is resynchronised) */
    BENCH_ERR_ERROR, /* ERROR (connection is resynchronised) */
    BENCH_ERR_PROTOCOL, /* a reply we cannot parse or did not ask for */
    BENCH_ERR_CONN, /* connection closed or reset by the server, or failed to reconnect */
    BENCH_ERR_LOST, /* requests in flight on a connection that had to be dropped */
    BENCH_ERR_COUNT
};

extern const char *const bench_err_names[BENCH_ERR_COUNT];

struct bench_counts {
    uint64_t gets; /* get replies (hit or miss) */
    uint64_t sets; /* STORED replies */
    uint64_t hits;
    uint64_t misses;
    /* cache-aside: the part of gets/hits/misses that scans read, and the sets sent to load
     * missed keys (one per miss; `sets` counts those the server stored) */
    uint64_t scan_gets;
    uint64_t scan_hits;
    uint64_t scan_misses;
    uint64_t sets_issued;
    uint64_t err[BENCH_ERR_COUNT];
};

#define BENCH_ERR_SAMPLE 160

struct bench_stats {
    struct bench_counts c;
    char err_sample[BENCH_ERR_SAMPLE]; /* first error text seen, for the report */
    struct bench_hist hist;
    /* with --split: send to arrival in the client's socket, and arrival to read */
    struct bench_hist hist_server, hist_client;
};

void bench_stats_init(struct bench_stats *s);
/* Count an error and keep its text if it is the first one. `text` need not be terminated. */
void bench_stats_error(struct bench_stats *s, enum bench_err e, const char *text, size_t len);
uint64_t bench_counts_errors(const struct bench_counts *c);
/* Add src into dst; dst keeps its own error sample if it has one. */
void bench_stats_merge(struct bench_stats *dst, const struct bench_stats *src);

#endif
