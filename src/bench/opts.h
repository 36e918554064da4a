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

/* mixed: each request is a get or a set by --ratio. cache-aside: each request is a get, and a
 * miss is followed at once by a set of that key (the application loading it from its
 * database), so the server's hit ratio is what an application would see. */
enum bench_mode { BENCH_MODE_MIXED, BENCH_MODE_CACHE_ASIDE };

/* Bounds shared with the code that sizes buffers from these values. */
#define BENCH_MAX_THREADS 256
#define BENCH_MAX_CONNS 65536
#define BENCH_MAX_PIPELINE 4096
#define BENCH_MAX_KEY_LEN 250 /* memcached's limit */
#define BENCH_MAX_VALUE_SIZE (16u << 20)
#define BENCH_MAX_KEYS 1000000000000ULL
#define BENCH_MAX_RATE 1000000000ULL /* requests/s: one a nanosecond */

struct bench_opts {
    enum bench_mode mode;
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
    size_t value_size; /* largest value; every value has this size when value_min == it */
    size_t value_min; /* smallest value; below value_size: per-key log-uniform sizes */
    double duration; /* seconds; 0 with --prefill means "prefill only" */
    double warmup; /* seconds */
    bool prefill;
    bool json;
    bool split; /* also time each reply's arrival in the client's socket (SO_TIMESTAMPNS) */
    uint64_t seed;
    uint64_t max_requests; /* 0: unbounded */
    uint64_t rate; /* open loop: requests/s in all; 0: closed loop */

    /* cache-aside only */
    uint64_t requests; /* measured gets in total, replacing --duration; 0: timed run */
    uint64_t warmup_requests; /* gets before those, replacing --warmup (needs requests) */
    uint64_t scan_every; /* a thread starts a scan after this many of its key gets; 0: none */
    uint64_t scan_length; /* gets per scan */
    uint64_t scan_keys; /* size of the cold range scans walk: indexes keys..keys+scan_keys-1 */
};

/* Keys of every kind: the key space plus, with scans, the cold range after it. */
static inline uint64_t bench_opts_all_keys(const struct bench_opts *o)
{
    return o->keys + (o->scan_every ? o->scan_keys : 0);
}

/* Fill `o` from argv. Returns 0 to run, 1 when --help was printed (exit 0), -1 on a bad
 * argument (already reported on stderr; exit 2). */
int bench_opts_parse(struct bench_opts *o, int argc, char **argv);

#endif
