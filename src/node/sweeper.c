/* sweeper.c — background thread that walks every owned segment each interval and hands linked
 * items to a visitor that reclaims the expired and flushed ones (see seg.h); it also trims pools
 * over a lowered quota and keeps the background reserve (seg_reserve).
 *
 * Lookups already drop dead items lazily; the sweeper marks dead the items nobody asks for, so
 * that cleaning reclaims their bytes before anything live is evicted. It works in small
 * batches, one pool lock at a time, so it never holds a lock for long. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "node/seg.h"

#define SWEEPER_BATCH 128 /* records visited per pool-lock hold */
/* Item memory walked per tick. A small store is swept whole every tick; a huge one a slice per
 * tick, so the sweeper never turns into a core spinning over terabytes (the CLOCK hand and
 * lookups reclaim dead items meanwhile). */
#define SWEEPER_BYTES_PER_TICK (256ull << 20)

#define SWEEPER_TICK_MS 1000u /* the tick callback's period, at most */

struct sweeper {
    struct segs *segs;
    seg_visit_fn fn;
    void (*tick)(void *);
    void *ctx;
    uint32_t interval_ms;
    uint32_t cursor; /* next segment to walk; the sweeper thread's own */
    uint64_t passes; /* walks that reached the last segment (relaxed atomic) */
    uint64_t clean;  /* of those, the ones no visit said SEG_MISSED in (relaxed atomic) */
    bool missed;     /* a visit of the pass under way said SEG_MISSED; the thread's own */
    bool stop; /* set under `lock`; also read without it (atomically) mid-pass */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
};

/* Segments a pool over its quota gives back per tick. */
#define SWEEPER_TRIM_SEGS 256
/* Segments cleaned ahead of need per tick, at most. */
#define SWEEPER_RESERVE_SEGS 8

static void sweeper_pass(struct sweeper *sw)
{
    seg_trim(sw->segs, SWEEPER_TRIM_SEGS, sw->fn, sw->ctx);
    uint32_t n = seg_count(sw->segs);
    uint64_t budget = SWEEPER_BYTES_PER_TICK / seg_size(sw->segs);
    if (budget == 0) budget = 1;
    if (budget > n) budget = n;
    for (uint64_t k = 0; k < budget; k++) {
        struct seg_pos pos = {.seg = sw->cursor < n ? sw->cursor : 0};
        sw->cursor = pos.seg + 1;
        do {
            if (__atomic_load_n(&sw->stop, __ATOMIC_RELAXED)) return;
        } while (seg_walk(sw->segs, &pos, SWEEPER_BATCH, sw->fn, sw->ctx, &sw->missed));
        if (sw->cursor >= n) {
            /* clean first: a reader of passes then clean never sees clean ahead of passes */
            if (!sw->missed) __atomic_fetch_add(&sw->clean, 1, __ATOMIC_RELAXED);
            sw->missed = false;
            __atomic_fetch_add(&sw->passes, 1, __ATOMIC_RELAXED);
        }
    }
}

static void *sweeper_main(void *arg)
{
    struct sweeper *sw = arg;
    /* Wake every min(interval, 1 s): the tick runs each time, the pass once per interval. */
    uint32_t step = sw->interval_ms < SWEEPER_TICK_MS ? sw->interval_ms : SWEEPER_TICK_MS;
    uint32_t since_pass = 0;
    pthread_mutex_lock(&sw->lock);
    while (!sw->stop) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        uint64_t ns = (uint64_t)deadline.tv_nsec + (uint64_t)step * 1000000u;
        deadline.tv_sec += (time_t)(ns / 1000000000u);
        deadline.tv_nsec = (long)(ns % 1000000000u);
        int rc = 0;
        while (!sw->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&sw->cond, &sw->lock, &deadline);
        if (sw->stop) break;
        pthread_mutex_unlock(&sw->lock);
        if (sw->tick) sw->tick(sw->ctx);
        seg_reserve(sw->segs, SWEEPER_RESERVE_SEGS, sw->fn, sw->ctx);
        since_pass += step;
        if (since_pass >= sw->interval_ms) {
            since_pass = 0;
            sweeper_pass(sw);
        }
        pthread_mutex_lock(&sw->lock);
    }
    pthread_mutex_unlock(&sw->lock);
    return NULL;
}

int sweeper_create(struct sweeper **out, struct segs *s, seg_visit_fn fn, void (*tick)(void *),
                   void *ctx, uint32_t interval_ms, char *err, size_t errlen)
{
    *out = NULL;
    struct sweeper *sw = calloc(1, sizeof *sw);
    if (!sw) {
        snprintf(err, errlen, "out of memory creating the sweeper");
        return -1;
    }
    sw->segs = s;
    sw->fn = fn;
    sw->tick = tick;
    sw->ctx = ctx;
    sw->interval_ms = interval_ms;
    /* Monotonic: a wall-clock step must not stall or rush the sweeper. */
    clock_cond_init_monotonic(&sw->cond);
    pthread_mutex_init(&sw->lock, NULL);
    int rc = pthread_create(&sw->thread, NULL, sweeper_main, sw);
    if (rc) {
        snprintf(err, errlen, "cannot start the sweeper thread: %s", strerror(rc));
        pthread_cond_destroy(&sw->cond);
        pthread_mutex_destroy(&sw->lock);
        free(sw);
        return -1;
    }
    *out = sw;
    return 0;
}

void sweeper_destroy(struct sweeper **swp)
{
    struct sweeper *sw = *swp;
    if (!sw) return;
    pthread_mutex_lock(&sw->lock);
    __atomic_store_n(&sw->stop, true, __ATOMIC_RELAXED);
    pthread_cond_signal(&sw->cond);
    pthread_mutex_unlock(&sw->lock);
    pthread_join(sw->thread, NULL);
    pthread_cond_destroy(&sw->cond);
    pthread_mutex_destroy(&sw->lock);
    free(sw);
    *swp = NULL;
}

uint64_t sweeper_passes(const struct sweeper *sw)
{
    return __atomic_load_n(&sw->passes, __ATOMIC_RELAXED);
}

uint64_t sweeper_clean_passes(const struct sweeper *sw)
{
    return __atomic_load_n(&sw->clean, __ATOMIC_RELAXED);
}
