/* seq.h — the sequence of keys one shoal-bench thread reads in cache-aside mode.
 *
 * The sequence depends only on the options and the thread's number, never on the server's
 * replies (the sets that load misses are inserted by the worker and draw nothing), so two
 * servers given the same seed and --threads are asked for exactly the same gets.
 *
 * Key gets follow --dist over the key space [0, --keys). With scans, after every
 * --scan-every key gets the thread reads --scan-length keys of the cold range
 * [--keys, --keys + --scan-keys) in index order: a one-pass sequential read of part of a table
 * that nothing else reads. The next scan goes on where this one stopped, wrapping at the end
 * of the range, so with a range much larger than the cache every scanned key is a miss that
 * pollutes the cache without being read again soon — the pattern scan-resistant eviction
 * policies are meant to withstand. Each thread starts its walk at its own offset
 * (thread * scan_keys / threads). */
#ifndef SHOAL_BENCH_SEQ_H
#define SHOAL_BENCH_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#include "bench/keys.h"
#include "bench/opts.h"
#include "bench/rng.h"
#include "bench/zipf.h"

struct bench_seq {
    struct bench_rng rng;
    const struct bench_keys *keys;
    const struct bench_zipf *zipf; /* NULL: uniform over the key space */
    uint64_t scan_every; /* 0: no scans */
    uint64_t scan_length;
    uint64_t scan_keys;
    uint64_t since_scan; /* key gets since the last scan started */
    uint64_t scan_left; /* gets left in the current scan */
    uint64_t scan_pos; /* next cold key, as an offset in [0, scan_keys) */
};

/* Set up thread `id` of `threads`; `zipf` is used when o->dist is zipf. */
void bench_seq_init(struct bench_seq *s, const struct bench_opts *o, const struct bench_keys *k,
                    const struct bench_zipf *zipf, unsigned id, unsigned threads);

/* The next key index to get; *scan tells whether it belongs to a scan. */
static inline uint64_t bench_seq_next(struct bench_seq *s, bool *scan)
{
    if (s->scan_every && s->scan_left == 0 && s->since_scan >= s->scan_every) {
        s->scan_left = s->scan_length;
        s->since_scan = 0;
    }
    if (s->scan_left) {
        s->scan_left--;
        uint64_t idx = s->keys->n + s->scan_pos;
        if (++s->scan_pos == s->scan_keys) s->scan_pos = 0;
        *scan = true;
        return idx;
    }
    s->since_scan++;
    *scan = false;
    return s->zipf ? bench_keys_scatter(s->keys, bench_zipf_next(s->zipf, &s->rng))
                   : bench_rng_below(&s->rng, s->keys->n);
}

#endif
