/* outage.h — a node of a sharded pool on its way back from an outage.
 *
 * While a worker has a node marked down, the requests for its keys go to the gutter pool (or
 * fail at once), so a node that kept its data (stalled, paused, partitioned: not restarted)
 * holds the values from before every write and delete made meanwhile. So, as for the replicas
 * of a replicated pool (replica.h), the worker logs in the node's repair log (repairlog.h) the
 * key of every write (storage, cas, delete, incr/decr, touch, ms, md, ma) the node misses while
 * marked down, and of every write that failed on it (an error, a timeout: applied or not). Once
 * marked down the node is "mending": when a probe finds it healthy it takes none of its keys'
 * reads until a delete of each logged key has been answered (replica_repair, one probe
 * interval later), or the flush_all that replaces an overflowed log; with nothing logged it is
 * back in use at once.
 *
 * Writes, though, go to the node again as soon as its repair is under way (the log taken and
 * its deletes sent): logged into the gutter meanwhile, a steady stream of writes would keep the
 * log from ever being empty when the deletes have been answered, and the node would never come
 * back. A write that reaches the node after a delete of its key is fresh there; one that is
 * overtaken by it (another connection) leaves a miss.
 *
 * A write that fails on a node that is up (not yet marked down) is logged and repaired the same
 * way, but the node is not taken out of use for it; so is one retried on the gutter pool
 * (failover.h). "Fails" means the router gave up on it (a timeout, a lost connection): an
 * answer of the node's, a SERVER_ERROR included, is the write's outcome and logs nothing
 * (REPL_OWNER). Reads (get, gets, gat, gats, mg, me) are never
 * logged: they change no value on the gutter that the owner lacks (a TTL that gat or mg T sets
 * in the gutter concerns the gutter's copy only). */
#ifndef SHOAL_ROUTER_OUTAGE_H
#define SHOAL_ROUTER_OUTAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "router/request.h"
#include "router/upstream.h"

/* Can this worker send the node reads of its keys in a sharded pool: up, and not mending? */
static inline bool outage_reads(const struct upnode *un) { return !un->down && !un->mending; }
/* ...and writes: up, and not mending or its repair under way (see above). */
static inline bool outage_writes(const struct upnode *un)
{
    return !un->down && (!un->mending || un->repairs_inflight > 0);
}

/* A write of `key` (a sharded pool's) whose owner is `owner`, in fragment f going to node `to`:
 * logs the key for the owner when the owner misses it (`to` is another node, or the owner
 * cannot take writes and f fails at once), else marks f so that a failure logs it. -1 when
 * memory runs out. */
int outage_write(struct frag *f, struct upnode *owner, struct upnode *to, const char *key,
                 size_t nkey);
/* The node's repair may have ended (a probe found it healthy, or a repair request was
 * answered): a mending node that is up with nothing left to repair is back in use. */
void outage_check_mended(struct upnode *un);

#endif
