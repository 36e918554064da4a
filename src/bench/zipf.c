/* zipf.c — Zipf rank sampler (Gray et al. 1994), see zipf.h for the contract. */
#include "bench/zipf.h"

#include <math.h>

/* Terms summed exactly; above this the tail comes from Euler-Maclaurin, whose error with
 * a 4M-term head is far below double precision's relative error on the total. */
#define ZIPF_EXACT_TERMS (1ULL << 22)

double bench_zipf_zeta(uint64_t n, double theta)
{
    uint64_t head = n < ZIPF_EXACT_TERMS ? n : ZIPF_EXACT_TERMS;
    double sum = 0.0;
    /* Smallest terms first keeps the rounding error of the running sum small. */
    for (uint64_t i = head; i >= 1; i--) sum += pow((double)i, -theta);
    if (n > head) {
        /* sum_{i=a}^{b} f(i) ~ integral_a^b f + (f(a)+f(b))/2 + (f'(b)-f'(a))/12 */
        double a = (double)(head + 1), b = (double)n;
        double integral = (pow(b, 1.0 - theta) - pow(a, 1.0 - theta)) / (1.0 - theta);
        double fa = pow(a, -theta), fb = pow(b, -theta);
        double dfa = -theta * pow(a, -theta - 1.0), dfb = -theta * pow(b, -theta - 1.0);
        sum += integral + (fa + fb) / 2.0 + (dfb - dfa) / 12.0;
    }
    return sum;
}

int bench_zipf_init(struct bench_zipf *z, uint64_t n, double theta)
{
    if (n == 0 || !(theta >= 0.0 && theta < 1.0)) return -1;
    z->n = n;
    z->theta = theta;
    z->alpha = 1.0 / (1.0 - theta);
    z->zetan = bench_zipf_zeta(n, theta);
    z->half_pow_theta = pow(0.5, theta);
    double zeta2 = 1.0 + z->half_pow_theta;
    /* With n <= 2 the two special cases in _next() cover every draw; eta is unused. */
    z->eta = n > 2 ? (1.0 - pow(2.0 / (double)n, 1.0 - theta)) / (1.0 - zeta2 / z->zetan) : 0.0;
    return 0;
}

uint64_t bench_zipf_next(const struct bench_zipf *z, struct bench_rng *r)
{
    double u = bench_rng_unit(r);
    double uz = u * z->zetan;
    if (uz < 1.0 || z->n == 1) return 0;
    if (uz < 1.0 + z->half_pow_theta || z->n == 2) return 1;
    uint64_t rank = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1.0, z->alpha));
    return rank < z->n ? rank : z->n - 1;
}
