/* opts.h — shoal-bench's command line: the run configuration and its parser.
 *
 * bench_opts_parse() validates every value (ranges, cross-option constraints such as
 * --conns >= --threads) so later code can trust the struct; on bad input it prints one line
 * naming the option and what to pass instead. */
#ifndef SHOAL_BENCH_OPTS_H
#define SHOAL_BENCH_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum bench_dist { BENCH_DIST_UNIFORM, BENCH_DIST_ZIPF };

/* Bounds shared with the code that sizes buffers from these values. */
#define BENCH_MAX_THREADS 256
#define BENCH_MAX_CONNS 65536
#define BENCH_MAX_PIPELINE 4096
#define BENCH_MAX_KEY_LEN 250 /* memcached's limit */
#define BENCH_MAX_VALUE_SIZE (16u << 20)
#define BENCH_MAX_KEYS 1000000000000ULL

struct bench_opts {
    char host[256];
    char port[16];
    unsigned threads;
    unsigned conns;
    unsigned pipeline;
    unsigned refill_min; /* free slots needed before a connection is topped up */
    unsigned ratio_set;
    unsigned ratio_get;
    uint64_t keys;
    const char *key_prefix;
    size_t key_size; /* 0: natural length (prefix + decimal index) */
    enum bench_dist dist;
    double zipf_theta;
    size_t value_size;
    double duration; /* seconds; 0 with --prefill means "prefill only" */
    double warmup; /* seconds */
    bool prefill;
    bool json;
    uint64_t seed;
    uint64_t max_requests; /* 0: unbounded */
};

/* Fill `o` from argv. Returns 0 to run, 1 when --help was printed (exit 0), -1 on a bad
 * argument (already reported on stderr; exit 2). */
int bench_opts_parse(struct bench_opts *o, int argc, char **argv);

#endif
