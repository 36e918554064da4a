/* membudget.c — the client-buffer budget and giving freed memory back (see membudget.h). */
#include "common/membudget.h"

#include <malloc.h>

void membudget_setup_allocator(void)
{
    /* Setting the threshold also turns off glibc's raising it after each free of a mapped
     * block, which would otherwise put every later large buffer on the heap for good. */
    mallopt(M_MMAP_THRESHOLD, MEMBUDGET_MMAP);
}

void membudget_init(struct membudget *b, uint64_t max)
{
    b->max = max;
    b->used = b->freed = b->trim_ms = 0;
}

void membudget_release(struct membudget *b, uint64_t *acct)
{
    if (*acct == 0) return;
    __atomic_sub_fetch(&b->used, *acct, __ATOMIC_RELAXED);
    if (*acct > MEMBUDGET_TRIM_CONN) __atomic_add_fetch(&b->freed, *acct, __ATOMIC_RELAXED);
    *acct = 0;
}

void membudget_trim(struct membudget *b, uint64_t now_ms)
{
    if (!membudget_trim_due(b)) return;
    uint64_t last = __atomic_load_n(&b->trim_ms, __ATOMIC_RELAXED);
    if (now_ms < last + 1000) return;
    /* one thread trims; the others carry on */
    if (!__atomic_compare_exchange_n(&b->trim_ms, &last, now_ms, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&b->freed, 0, __ATOMIC_RELAXED);
    malloc_trim(0);
}

uint64_t membudget_idle_period(uint64_t partial_timeout_ms)
{
    uint64_t p = partial_timeout_ms / 4;
    return p < MEMBUDGET_SWEEP_OVER_MS       ? MEMBUDGET_SWEEP_OVER_MS
           : p > MEMBUDGET_SWEEP_IDLE_MAX_MS ? MEMBUDGET_SWEEP_IDLE_MAX_MS
                                             : p;
}

void membudget_pick_start(struct membudget_pick *p, const struct membudget *b, uint64_t conns,
                          uint64_t now_ms)
{
    *p = (struct membudget_pick){0};
    p->floor = membudget_used(b) / (2 * (conns ? conns : 1));
    p->now_ms = now_ms;
}

void membudget_pick_offer(struct membudget_pick *p, void *conn, uint64_t bytes, uint64_t weight,
                          const char *blame, uint64_t since_ms)
{
    if (!blame || bytes == 0 || bytes < p->floor) return;
    if (p->now_ms - since_ms >= MEMBUDGET_STALL_MS) {
        if (p->stalled == NULL || weight > p->stalled_weight)
            p->stalled = conn, p->stalled_weight = weight, p->why_stalled = blame;
    } else if (p->moving == NULL || weight > p->moving_weight) {
        p->moving = conn, p->moving_weight = weight, p->why_moving = blame;
    }
}

void *membudget_pick_victim(const struct membudget_pick *p, const char **why)
{
    *why = p->stalled ? p->why_stalled : p->why_moving;
    return p->stalled ? p->stalled : p->moving;
}
