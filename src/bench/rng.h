/* rng.h — the per-thread pseudo-random generator of shoal-bench.
 *
 * splitmix64: one add and three multiply-xorshift rounds per draw, good enough statistically
 * for choosing keys and operations, and its state is one word so every thread owns one without
 * sharing cache lines. Not for anything that needs unpredictability. */
#ifndef SHOAL_BENCH_RNG_H
#define SHOAL_BENCH_RNG_H

#include <stdint.h>

struct bench_rng {
    uint64_t s;
};

static inline uint64_t bench_rng_next(struct bench_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Seeds differ per stream so threads with the same user seed draw unrelated sequences. */
static inline void bench_rng_seed(struct bench_rng *r, uint64_t seed, uint64_t stream)
{
    r->s = seed ^ (stream * 0xd1b54a32d192ed03ULL);
    (void)bench_rng_next(r);
}

/* Uniform in [0, n) for n >= 1, by the multiply-high reduction (bias < n / 2^64). */
static inline uint64_t bench_rng_below(struct bench_rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)bench_rng_next(r) * n) >> 64);
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double bench_rng_unit(struct bench_rng *r)
{
    return (double)(bench_rng_next(r) >> 11) * 0x1p-53;
}

#endif
