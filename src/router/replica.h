/* replica.h — keeping the replicas of a replicated pool alike: compare-and-swap across
 * replicas, and the repair of a replica that missed writes.
 *
 * Compare-and-swap (text cas; ms, md and ma with C): each replica has its own CAS values, so
 * the compare runs on one replica only, the one reads go to (the client's CAS came from it).
 * When it succeeds, the write without the compare goes to the other replicas, and the client
 * gets the compare's answer once they have answered too (all in sync, as plain replicated
 * writes). When it fails (EXISTS, NOT_FOUND) nothing else is sent; when its outcome is
 * unknown (a timeout, a lost connection; not an error of the node's own, which means it was
 * not applied) the key is logged for repair on the other replicas.
 *
 * Repair: each worker keeps, per node, a repair log (repairlog.h) of the keys of replicated
 * writes the node missed (skipped while marked down) or may have missed (a timeout there:
 * applied or not; an error of its own while another replica took the write, replica_fanout). A node with keys in its log takes no reads of this worker
 * (route_node picks another replica) until a delete of each key has been answered by it; the
 * deletes are sent one probe interval after the node is back (or after the failure), so that
 * requests it had received before a stall are applied first. A log that overflowed is
 * replaced by a flush_all of the node, and so is a client's flush_all that the node missed
 * (marked down, or failing), whatever its pools. The same log and repair serve a sharded
 * pool's node back from an outage (outage.h). */
#ifndef SHOAL_ROUTER_REPLICA_H
#define SHOAL_ROUTER_REPLICA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "protocol/protocol.h"
#include "router/client.h"
#include "router/lineedit.h"
#include "router/route.h"
#include "router/upstream.h"

enum replica_kind {
    REPL_WRITE,   /* a write to one replica: logged for repair there if it fails */
    REPL_OWNER,   /* a write to its owner in a sharded pool (outage.h): logged there only if
                   * the router failed it (a timeout, a lost connection: applied or not, and
                   * maybe late). The node's own answer, an error included, is the write's
                   * outcome: a client whose writes the node refuses (too large for its -I)
                   * must not fill the log and have the node flushed */
    REPL_COMPARE, /* the compare of a cas: on success, `then` goes to the other replicas */
    REPL_REPAIR,  /* a repair delete of the key */
    REPL_FLUSH,   /* a whole-node repair (flush_all) */
    REPL_FLUSH_ALL, /* a client's flush_all to one node: if it fails, the node is flushed when
                     * it can be repaired */
    REPL_CATCHUP, /* a batch of a failed primary's recent deletes to its slots' replica
                   * (catchup.h) */
};

struct replica_fanout;

/* What a fragment sent to a replica is for (frag->repl; freed with the fragment). */
struct replica_write {
    struct upnode *un;     /* the node it is sent to */
    enum replica_kind kind;
    struct replica_fanout *fan; /* REPL_WRITE of a client's write to every replica: the
                                 * replicas' answers, weighed together (replica_fanout_new) */
    struct buf then;       /* REPL_COMPARE: the request for the other replicas */
    struct replica_write *next; /* in the thread's pool of free ones (replica.c) */
    uint8_t nkey;
    char key[];            /* the key's bytes (decoded when sent base64): room for any key */
};

/* Can this worker read replicated keys from the node: up, and nothing left to repair? */
static inline bool replica_readable(const struct upnode *un)
{
    return !un->down && un->repairs_inflight == 0 && repairlog_clean(&un->repair);
}
/* The node of replicated pool `p` a read goes to: `home` (this router's replica) if readable,
 * else the first readable one in the pool's order, else the first one up (being repaired:
 * better than failing), else `home` (fails at once). */
uint32_t replica_read_node(struct rworker *w, const struct topo_pool *p, uint32_t home);

/* Is this write a compare-and-swap (text cas; ms, md, ma with C)? */
bool replica_is_compare(const struct proto_req *req);
/* A compare-and-swap to replicated pool `p` (see above). `cuts` are the request's TTL and
 * hold-off edits (lineedit.h), applied to the compare and to the write that follows. Answers the
 * client itself on any failure. */
void replica_compare(struct client *c, const struct proto_req *req, const char *line,
                     size_t len, const char *data, size_t ndata, const struct topo_pool *p,
                     const struct ledit_cut *cuts, int ncuts);
/* Mark fragment f as a `kind` write of `key` to node `un` (before it is submitted). -1 when
 * memory runs out. */
int replica_tag(struct frag *f, struct upnode *un, enum replica_kind kind, const char *key,
                size_t nkey);
void replica_write_free(struct replica_write *rw);
/* The answers of the `n` replicas a client's write goes to (route.c), to be set in each one's
 * replica_write (REPL_WRITE) before they are submitted; freed with the last of them. A
 * replica that refuses the write with an error of its own (SERVER_ERROR) is logged for repair
 * only if another replica took it: replicas that all refused alike (a value over their -I)
 * are still alike, and logging them would let a client fill the log with refused writes and
 * have every replica flushed. One the router failed (a timeout, a lost connection) is logged
 * at once, as any failed write. NULL when memory runs out. Each part joins it (before any is
 * submitted); it is freed when the last one that joined is answered or freed. */
struct replica_fanout *replica_fanout_new(uint32_t n);
void replica_fanout_join(struct replica_fanout *fan, struct replica_write *rw);
/* Free the replica_writes this thread keeps for reuse (at its exit). */
void replica_pool_drain(void);

/* Log `key` for repair on `un`: a write skipped because the node is down (`failed` false), or
 * one that failed there (`failed`: it may still be applied late, so the repair waits a probe
 * interval). */
void replica_log(struct upnode *un, const char *key, size_t nkey, bool failed);
/* A fragment with f->repl is answered (from frag_complete, before its request is looked at,
 * and also when the client has gone): log failures for repair, follow a compare. */
void replica_frag_done(struct frag *f, const char *reply, size_t n, bool failed);
/* A probe found the node marked down healthy: schedule its repair. */
void replica_node_up(struct upnode *un);
/* Send the node's repair when it is due (from the worker's timer, for a node whose log is not
 * clean): deletes of the logged keys, or a flush_all when the log overflowed. */
void replica_repair(struct upnode *un);

#endif
