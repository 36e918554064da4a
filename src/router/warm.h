/* warm.h — warm-up routes (the paper's §4.3 cold cluster warm-up): a pool may name a
 * `warm_from` pool; a get that misses in the cold pool is looked up in the warm one and, on a
 * hit, answered from it and added into the cold pool with the warm item's remaining TTL and
 * CAS. Deletes to a cold pool carry a 2-second hold-off (route.c), so an add racing a delete
 * fails instead of caching the old value. */
#ifndef SHOAL_ROUTER_WARM_H
#define SHOAL_ROUTER_WARM_H

#include <stdbool.h>
#include <stddef.h>

#include "router/request.h"

#define WARM_HOLDOFF_S 2

/* Every fragment of a warmable multi-get answered: look up the keys that missed in a cold
 * pool in its warm pool. Returns true when lookups are in flight (their answers complete the
 * request), false when the request can be merged now. */
bool warm_start(struct rreq *rq);
/* Turn a warm lookup's meta reply into a get fragment's reply in f->reply (a VALUE block and
 * END, or END for a miss or failure) and, on a hit, send the add into the cold pool. */
void warm_reply(struct frag *f, const char *reply, size_t n, bool failed);

#endif
