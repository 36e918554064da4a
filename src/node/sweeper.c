/* sweeper.c — background thread that walks every assigned slab page each interval and hands
 * linked items to a visitor that reclaims the expired and flushed ones (see slab.h).
 *
 * Lookups already drop dead items lazily; the sweeper frees the memory of dead items nobody asks
 * for, so that a class reuses it before evicting live ones. It works in small batches, one class
 * lock at a time, so it never holds a lock for long. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "node/slab.h"

#define SWEEPER_BATCH 128 /* chunks visited per class-lock hold */
/* Page memory walked per tick. A small store is swept whole every tick; a huge one a slice per
 * tick, so the sweeper never turns into a core spinning over terabytes (the CLOCK hand and
 * lookups reclaim dead items meanwhile). */
#define SWEEPER_BYTES_PER_TICK (256ull << 20)

#define SWEEPER_TICK_MS 1000u /* the tick callback's period, at most */

struct sweeper {
    struct slab *slab;
    slab_visit_fn fn;
    void (*tick)(void *);
    void *ctx;
    uint32_t interval_ms;
    uint32_t cursor; /* next page to walk; the sweeper thread's own */
    bool stop; /* set under `lock`; also read without it (atomically) mid-pass */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
};

/* Pages a pool over its quota gives back per tick (1 MiB each by default). */
#define SWEEPER_TRIM_PAGES 64

static void sweeper_pass(struct sweeper *sw)
{
    slab_trim(sw->slab, SWEEPER_TRIM_PAGES, sw->fn, sw->ctx);
    uint32_t used = slab_pages_used(sw->slab);
    uint64_t budget = SWEEPER_BYTES_PER_TICK / slab_page_size(sw->slab);
    if (budget == 0) budget = 1;
    if (budget > used) budget = used;
    for (uint64_t k = 0; k < budget; k++) {
        uint32_t p = sw->cursor < used ? sw->cursor : 0;
        sw->cursor = p + 1;
        for (uint32_t i = 0; i != SLAB_NONE;) {
            if (__atomic_load_n(&sw->stop, __ATOMIC_RELAXED)) return;
            i = slab_walk_page(sw->slab, p, i, SWEEPER_BATCH, sw->fn, sw->ctx);
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

int sweeper_create(struct sweeper **out, struct slab *s, slab_visit_fn fn, void (*tick)(void *),
                   void *ctx, uint32_t interval_ms, char *err, size_t errlen)
{
    *out = NULL;
    struct sweeper *sw = calloc(1, sizeof *sw);
    if (!sw) {
        snprintf(err, errlen, "out of memory creating the sweeper");
        return -1;
    }
    sw->slab = s;
    sw->fn = fn;
    sw->tick = tick;
    sw->ctx = ctx;
    sw->interval_ms = interval_ms;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    /* Monotonic: a wall-clock step must not stall or rush the sweeper. */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sw->cond, &ca);
    pthread_condattr_destroy(&ca);
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
