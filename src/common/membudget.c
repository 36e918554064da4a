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
    if (__atomic_load_n(&b->freed, __ATOMIC_RELAXED) < MEMBUDGET_TRIM_BYTES) return;
    uint64_t last = __atomic_load_n(&b->trim_ms, __ATOMIC_RELAXED);
    if (now_ms < last + 1000) return;
    /* one thread trims; the others carry on */
    if (!__atomic_compare_exchange_n(&b->trim_ms, &last, now_ms, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&b->freed, 0, __ATOMIC_RELAXED);
    malloc_trim(0);
}
