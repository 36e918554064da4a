/* lock.h — the mutexes of the storage engine (index shards and slab classes).
 *
 * A trylock by the thread that already holds the lock must fail with EBUSY (not deadlock, not
 * succeed): the engine relies on it to skip victims in the caller's own shard. Normal and
 * adaptive mutexes do that; adaptive spins briefly before sleeping, which suits critical
 * sections this short. */
#ifndef SHOAL_NODE_LOCK_H
#define SHOAL_NODE_LOCK_H

#include <pthread.h>

static inline int lock_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a)) return -1;
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    int rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return rc ? -1 : 0;
}

#endif
