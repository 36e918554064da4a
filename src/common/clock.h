/* clock.h — the process clock: whole seconds since start, and memcached's expiry rules.
 *
 * Items store times as 32-bit seconds on this clock, so a header needs 4 bytes per time, and a
 * lookup compares integers instead of calling into the kernel. clock_setup() starts the clock;
 * clock_now() is cheap (a coarse monotonic read). */
#ifndef SHOAL_COMMON_CLOCK_H
#define SHOAL_COMMON_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Longest relative expiry; larger values are absolute unix times (memcached's rule). */
#define CLOCK_REL_MAX (60 * 60 * 24 * 30)

void clock_setup(void);
/* Seconds since clock_setup(), starting at 2 so that 1 can stand for "already expired". */
uint32_t clock_now(void);
/* A monotonic clock in milliseconds, coarse (a few ms) and cheap: for timeouts and pacing. */
uint64_t clock_now_ms(void);
/* A precise monotonic clock in milliseconds (one clock_gettime): for timeouts and pacing off
 * the request path, where clock_now_ms's coarseness would show. */
uint64_t clock_mono_ms(void);
/* Unix time in microseconds (the wall clock, which can step): for timestamps compared with
 * another process's, such as a database commit's. */
int64_t clock_wall_us(void);
/* The CLOCK_MONOTONIC time `ms` from now: the deadline of a pthread_cond_timedwait on a
 * condition made by clock_cond_init_monotonic. */
struct timespec clock_deadline(uint64_t ms);
/* pthread_cond_init with CLOCK_MONOTONIC as the clock of pthread_cond_timedwait's deadline,
 * so a wall-clock step neither stalls nor rushes a timed wait: deadlines are then
 * clock_gettime(CLOCK_MONOTONIC) + the wait. 0, or pthread_cond_init's error. */
int clock_cond_init_monotonic(pthread_cond_t *cv);
/* Unix time at which the clock read 0. */
time_t clock_epoch(void);
/* Convert a client's exptime to the store clock: 0 stays 0 (never), negative is already
 * expired, up to 30 days is relative to now, larger is an absolute unix time. */
uint32_t clock_exptime(int64_t exptime, uint32_t now);
/* Seconds left until `exptime` (store clock), or -1 for never. */
int64_t clock_ttl_left(uint32_t exptime, uint32_t now);

#endif
