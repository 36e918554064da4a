/* mono.h — monotonic nanosecond clock for shoal-bench's latency and run timing.
 *
 * CLOCK_MONOTONIC goes through the vDSO (no syscall); callers still read it once per batch of
 * requests, not per request, because it is called on every wakeup of the hot loop. */
#ifndef SHOAL_BENCH_MONO_H
#define SHOAL_BENCH_MONO_H

#include <stdint.h>
#include <time.h>

static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#endif
