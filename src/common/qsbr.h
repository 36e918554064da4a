/* qsbr.h — quiescent-state reclamation for tables read without locks by event-loop workers
 * (the node's namespace table, the router's topology).
 *
 * Each reader owns one word: 0 while quiescent (blocked in epoll_wait, holding no table), else
 * the writer's generation + 1 at the moment it went online. A writer publishes a new table,
 * bumps the generation to g and waits until every reader is quiescent or went online after g
 * (word > g); then no reader can still hold the old table, and the writer frees it. Workers
 * finish a batch in micro- to milliseconds, so the wait is short. */
#ifndef SHOAL_COMMON_QSBR_H
#define SHOAL_COMMON_QSBR_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* A reader goes online (reads `*gen`) before it touches the table. */
static inline void qsbr_online(const uint64_t *gen, uint64_t *seen)
{
    __atomic_store_n(seen, __atomic_load_n(gen, __ATOMIC_SEQ_CST) + 1, __ATOMIC_SEQ_CST);
}

/* A reader goes quiescent before it blocks; it may keep no table pointer past this. */
static inline void qsbr_quiescent(uint64_t *seen) { __atomic_store_n(seen, 0, __ATOMIC_SEQ_CST); }

/* Writer, after storing the new table pointer: bump `*gen` and wait until none of the `n`
 * readers can hold the table it replaced. */
static inline void qsbr_synchronize(uint64_t *gen, uint64_t **seen, size_t n)
{
    uint64_t g = __atomic_add_fetch(gen, 1, __ATOMIC_SEQ_CST);
    for (size_t i = 0; i < n; i++) {
        for (unsigned spins = 0;; spins++) {
            uint64_t s = __atomic_load_n(seen[i], __ATOMIC_SEQ_CST);
            if (s == 0 || s > g) break;
            usleep(spins < 100 ? 50 : 1000);
        }
    }
}

#endif
