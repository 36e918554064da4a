/* zipf.h — Zipf-distributed ranks for shoal-bench's skewed key popularity.
 *
 * Rank 0 is the most popular. Sampling follows Gray et al., "Quickly generating billion-record
 * synthetic databases" (SIGMOD 1994): O(1) per draw (one pow()), with the normalising constant
 * zeta(n, theta) computed once at setup. The method is defined for 0 <= theta < 1. Ranks 0
 * and 1 get their exact probabilities; the rest come from a continuous approximation (at
 * theta 0.99, rank 2 is drawn ~17% too often, rank 9 ~2%, the tail within a few %), which is
 * the usual trade-off for O(1) sampling and the same skew YCSB-style tools produce. */
#ifndef SHOAL_BENCH_ZIPF_H
#define SHOAL_BENCH_ZIPF_H

#include <stdint.h>

#include "bench/rng.h"

struct bench_zipf {
    uint64_t n;
    double theta;
    double alpha; /* 1 / (1 - theta) */
    double zetan; /* sum over i = 1..n of i^-theta */
    double eta;
    double half_pow_theta; /* 0.5^theta: probability mass of rank 1 relative to rank 0 */
};

/* Prepare a sampler over ranks [0, n). Returns 0, or -1 if n == 0 or theta is outside
 * [0, 1). Setup costs O(min(n, 4M)) pow() calls; beyond that the sum is extrapolated. */
int bench_zipf_init(struct bench_zipf *z, uint64_t n, double theta);

/* One rank in [0, n); the sampler itself is read-only, so threads can share it. */
uint64_t bench_zipf_next(const struct bench_zipf *z, struct bench_rng *r);

/* Generalised harmonic number H(n, theta); exposed for tests. */
double bench_zipf_zeta(uint64_t n, double theta);

#endif
