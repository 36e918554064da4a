/* clock.c — process clock and memcached's expiry-time conversion (see clock.h). */
#include "common/clock.h"

static struct timespec clock_start;
static time_t clock_unix_start;

void clock_setup(void)
{
    clock_gettime(CLOCK_MONOTONIC, &clock_start);
    /* Offset by 2 so clock_now() never returns 0 (never) or 1 (already expired). */
    clock_unix_start = time(NULL) - 2;
}

uint32_t clock_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint32_t)(ts.tv_sec - clock_start.tv_sec) + 2;
}

uint64_t clock_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t clock_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int64_t clock_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

struct timespec clock_deadline(uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    return ts;
}

int clock_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc) return rc;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

time_t clock_epoch(void) { return clock_unix_start; }

uint32_t clock_exptime(int64_t exptime, uint32_t now)
{
    if (exptime == 0) return 0;
    if (exptime < 0) return 1;
    if (exptime > CLOCK_REL_MAX) {
        if (exptime <= (int64_t)clock_unix_start + 1) return 1;
        int64_t rel = exptime - (int64_t)clock_unix_start;
        return rel > UINT32_MAX ? UINT32_MAX : (uint32_t)rel;
    }
    return now + (uint32_t)exptime;
}

int64_t clock_ttl_left(uint32_t exptime, uint32_t now)
{
    if (exptime == 0) return -1;
    return exptime > now ? (int64_t)(exptime - now) : 0;
}
