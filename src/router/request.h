/* request.h — a client request in flight (struct rreq) and its pieces sent to nodes
 * (struct frag).
 *
 * A client's requests form a FIFO; each is answered locally, or by one fragment sent to the
 * key's node, or (multi-key get across nodes, flush_all) by several fragments whose replies are
 * merged when the last one arrives. Replies leave in FIFO order, so a slow node holds back only
 * the replies queued behind its own. A fragment outlives its request when the client
 * disconnects: the node's reply still has to be read off the shared connection, then is
 * dropped. */
#ifndef SHOAL_ROUTER_REQUEST_H
#define SHOAL_ROUTER_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/membudget.h"
#include "protocol/protocol.h"
#include "router/replyframe.h"

struct client;
struct upnode;
struct replica_write;

/* Bytes of large requests kept until answered for a moved-retry (failover.h, FAILOVER_KEEP_MAX):
 * at most `max` (--moved-keep-max) all workers together, and counted in the client-buffer
 * budget `mb` too (--buffers-max, the client_buffer_bytes gauge), which they may not push
 * past its limit. */
struct keepbudget {
    uint64_t max;
    uint64_t used; /* atomic */
    struct membudget *mb;
};

enum rreq_kind {
    RQ_LOCAL,    /* reply already in rq->reply */
    RQ_FORWARD,  /* one fragment; its reply is the client's reply (maybe suppressed) */
    RQ_MULTIGET, /* fragments per node; VALUE blocks merged in the client's key order */
    RQ_ALL,      /* same command to several nodes (flush_all; writes to a replicated pool) */
    RQ_CAS,      /* a compare on one replica, then the write to the others (replica.h); the
                  * compare's reply is the client's */
    RQ_QUIT,     /* close the connection once earlier replies are out */
    RQ_STATS,    /* stats to every node; the STAT lines merged (statsmerge.h) */
    RQ_DUMP,     /* a key dump from every node; the lines passed on as they come, one END */
};

struct frag {
    struct frag *next;      /* in the node's wait queue or a connection's sent queue */
    struct rreq *rq;        /* NULL once the client has gone */
    uint16_t idx;           /* position in rq->frags */
    bool failed;            /* reply holds a router SERVER_ERROR or a node's error line */
    bool completed;         /* answered: owned by rq now, no longer by a queue */
    bool probe;             /* a health probe of a node marked down (rq is NULL) */
    bool warm;              /* a lookup in the warm pool for a key its cold pool missed */
    bool exclusive;         /* a metadump: alone on its connection (upstream.h) */
    bool overflow;          /* RQ_STATS: its reply grew past STATSMERGE_REPLY_MAX; failed */
    bool held;              /* for a node back from an outage, not yet repaired (outage.h), and
                             * no gutter: fails at once like one for a node marked down */
    bool quiet_batch;       /* the router's batch of `md <key> q` lines closed by `mn` (dellog.c):
                             * its reply is a list (RLIST_QUIET) */
    bool quiet_mn;          /* a quiet ma sent with its q and an mn behind it (frag_quiet_mn):
                             * its reply is the node's answer, if any, then MN */
    bool hidden;            /* ...and the node answered only MN: q hid a hit. Its reply is an
                             * HD made up for the replica and merge logic; the client gets
                             * nothing */
    uint8_t stray;          /* sent on a connection standing in for its client's own: 1 + the
                             * own one's index (upstream.c); 0 when sent on its own */
    bool movable;           /* may be sent again to its slot's new owner when its node answers
                             * that the slot moved (failover.h, moved-retry); keeps its bytes
                             * as a retryable one does */
    bool moved;             /* ...it was: parked or sent again once already */
    bool via_replica;       /* sent to a slot's replica in place of its failed primary: held
                             * while a catch-up runs (catchup.h) */
    uint64_t moved_until_ms; /* set when first parked: its moved-retry window ends
                              * (--moved-wait-ms later); a refusal before then parks it again */
    uint64_t park_version;  /* parked: the topology version its node refused it under */
    uint64_t kept;          /* bytes of `out` reserved in `kb` (a large request kept: frag_keep) */
    struct keepbudget *kb;
    uint8_t failover;       /* may be retried on the gutter pool if its node fails it
                             * (failover.h): FAILOVER_NONE, _UNSENT or _ANY */
    uint64_t qstart;        /* where its bytes start in its connection's output stream: it
                             * reached the node when the connection wrote past that */
    int32_t pool, ns;       /* for per-pool/namespace figures: indices in the routing table,
                             * -1 when none (probes, flush_all) */
    uint64_t deadline_ms;
    uint64_t sent_us;       /* when it was handed to a connection (latency figures) */
    uint64_t max_reply;     /* the longest reply it may get (replyframe.h), set when sent */
    struct reply_want want; /* what its reply may be (replyframe.h), taken from its line when
                             * it is handed to a connection */
    struct buf out;         /* request bytes until they are handed to a connection; then
                             * its line, which `want` points into */
    struct buf reply;       /* the node's reply, when it cannot go straight to the client */
    struct replica_write *repl; /* a write to a replica, or a repair (replica.h); else NULL */
};

struct rreq {
    struct rreq *next;
    struct client *cl;
    enum rreq_kind kind;
    enum proto_cmd cmd;
    bool done;
    bool noreply;           /* text noreply: the node's reply is read and dropped */
    bool quiet;             /* meta q: drop the reply when it is the command's routine one */
    bool direct;            /* the reply went straight to the client's output */
    bool warmable;          /* RQ_MULTIGET with keys in a pool that warms from another */
    bool warmed;            /* warm-pool lookups were issued (or none were needed) */
    bool over;              /* RQ_DUMP: lines were dropped (--out-max); ends in an error */
    uint8_t merge;          /* RQ_STATS: how the nodes' lists are merged (statsmerge.h) */
    bool lget_part;         /* answers a part of a get line over --line-max (client_lget.c):
                             * its reply never goes straight to the client */
    bool lget_last;         /* ...the part that ends it, with the END */
    uint16_t nfrags, pending;
    uint64_t start_us;      /* the worker's clock when it was parsed (namespace latency) */
    uint64_t held_bytes;    /* reply bytes it counts in its client's `held` */
    uint64_t in_bytes;      /* request bytes it counts in its client's `req_bytes` */
    struct frag **frags;    /* nfrags pointers (frag1 for a single fragment) */
    struct frag *frag1;
    struct buf reply;       /* local or merged reply */
    /* RQ_MULTIGET: the keys as sent and, per key, the fragment that carries it */
    char *keys;
    size_t nkeys_bytes;
    uint16_t *keyfrag;
    uint32_t nkeys;
    uint16_t fcap;          /* room in frags (RQ_MULTIGET, RQ_CAS) */
    int64_t exptime;        /* gat/gats: the exptime as sent (warm-up fills obey it) */
    /* warm-up of an mg (warm.c): its line, kept to answer a warm hit in the client's flags */
    bool warm_mg;           /* an mg for a key whose pool warms from another */
    bool warm_gutter;       /* ...sent to the gutter pool: its owner is down */
    bool warm_lease;        /* ...with N and no R: a win on a vivified placeholder is warmed */
    bool warm_cas_added;    /* the router asked for c (a vivified placeholder's CAS) itself */
    char *mgline;
    size_t nmgline;
    uint64_t lease_cas;     /* CAS of the placeholder the cold pool vivified for it, 0: none */
    struct buf held;        /* the cold pool's answer while the warm pool is asked */
};

/* Allocate a request of `kind` (zeroed, buffers initialised); NULL when memory runs out. */
struct rreq *rreq_create(struct client *cl, enum rreq_kind kind, enum proto_cmd cmd);
/* Free the request; fragments still queued upstream are orphaned (their replies dropped). */
void rreq_destroy(struct rreq *rq);
/* Destroy a request none of whose fragments was submitted yet (they are destroyed with it),
 * as when building it failed halfway. */
void rreq_discard(struct rreq *rq);
/* Allocate a fragment for rq at index idx (rq->frags must have room). NULL on no memory. */
struct frag *frag_create(struct rreq *rq, uint16_t idx);

/* Quiet mode through the router. A quiet meta request's q is stripped before it goes to a
 * node (ledit_copy's drop), so the node always answers and the router drops the routine reply
 * itself (EN for mg, HD for ms/md). Not for ma: memcached answers HD (or VA) under q when N
 * created the counter, and hides it on a hit, which only the node can tell. So a quiet ma keeps
 * its q and goes with an mn behind it: the node's answer is whatever comes before MN.
 * frag_quiet_drop gives the letters to drop from req's line (NULL: none); frag_quiet_mn, after
 * the line (and its checks), adds the mn to f->out when req is a quiet ma (0, or -1 when memory
 * ran out). */
const char *frag_quiet_drop(const struct proto_req *req, bool quiet);
int frag_quiet_mn(struct frag *f, const struct proto_req *req);
/* Free the requests and fragments (and their replica tags) this thread keeps for reuse (at
 * its exit). */
void request_pools_drain(void);
void frag_destroy(struct frag *f);
/* Reserve `n` bytes in kb for f's request, kept past its hand-off to a connection; false when
 * that would take kb past its max or its client-buffer budget past --buffers-max. */
bool frag_keep(struct frag *f, struct keepbudget *kb, uint64_t n);
/* Give back what frag_keep reserved (none: nothing), as f's request bytes are released. */
void frag_unkeep(struct frag *f);

/* A node answered fragment f with the `n` bytes at `reply` (a whole reply), or the router
 * failed it (`failed`, reply is an error line with \r\n). Completes the request when it was
 * the last fragment; may write straight to the client. Frees f. */
void frag_complete(struct frag *f, const char *reply, size_t n, bool failed);

/* One line (n bytes with its line end) of a list reply (stats, dumps) to fragment f, before
 * the reply's last line completes f: a dump's line goes on towards the client at once (or is
 * dropped, past --out-max), a stats line is kept in f->reply for the merge. */
void frag_part(struct frag *f, const char *line, size_t n);

/* RQ_MULTIGET whose fragments all answered: set miss[i] for each key the replies lack.
 * Returns the number of misses. */
uint32_t multiget_misses(const struct rreq *rq, bool *miss);

#endif
