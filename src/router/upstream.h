/* upstream.h — a worker's connections to one node: a wait queue, a window of outstanding
 * requests, and a few multiplexed connections.
 *
 * Requests from every client of the worker are appended to a connection's output buffer and
 * written once per event-loop batch, so a burst from many clients costs one write. memcached
 * answers in order on a connection, so each connection keeps a FIFO of the fragments it sent
 * and the next complete reply belongs to the head, if it fits that request (reply_fits; a
 * reply of another kind means the node is not trusted on the connection, which fails as below;
 * one of the request's kind that echoes another key or opaque fails that request alone, and an
 * `mn` sent behind the requests on the connection tells whether the node's replies had shifted,
 * the node's fault, or the request was answered as the router did not foresee, the client's:
 * docs/router.md, "Whose fault a reply is"). A request that gets no
 * reply within timeout_ms of being sent fails with SERVER_ERROR; since later replies on that
 * connection could no longer be matched, the connection is closed and the requests behind it
 * fail too (never mismatched). Requests beyond the window wait in the router, not in the node,
 * in a queue fair between clients (upqueue.h); one that waits timeout_ms there fails too, not
 * as the node's fault (window_timeouts). The window is a sliding one (the paper's incast
 * control): it halves on a timeout and grows by one for each window's worth of replies, up to
 * upstream_window; and it holds no more than upstream_window_bytes of replies at the node's
 * average reply size (upnode_room).
 *
 * Health: after down_after consecutive failures (a timeout, a lost or refused connection, a
 * reply no request explains; never anything a client's request made the node answer) the
 * worker marks the node down, and every other worker adopts that (failover.h). Requests are
 * then routed elsewhere by the caller (the gutter pool) and never wait on the node; one probe
 * (`version`) every probe_ms tells when it answers again. Each worker counts the failures of
 * its own connections. A node that missed writes meanwhile is repaired before this worker
 * reads its keys from it again (replica.h for a replicated pool, outage.h for a sharded one).
 * A request the node fails (refused, reset, timed out) may be retried on the gutter pool before
 * its client is answered (failover.h). */
#ifndef SHOAL_ROUTER_UPSTREAM_H
#define SHOAL_ROUTER_UPSTREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/buf.h"
#include "router/request.h"
#include "router/router.h"
#include "router/nodestats.h"
#include "router/repairlog.h"
#include "router/topo.h"
#include "router/upqueue.h"

#define UPSTREAM_CONNS_MAX 16

enum upconn_state { UP_DOWN, UP_CONNECTING, UP_READY };

struct upconn {
    int evkind; /* EV_UPCONN */
    struct upnode *un;
    struct upconn *dirty_next;
    bool in_dirty, epollout;
    enum upconn_state state;
    int fd;
    struct buf wbuf, rbuf;
    size_t rscan;                   /* reply_length() progress of the head's reply */
    struct frag *sent, *sent_tail;  /* awaiting replies, oldest first */
    uint32_t nsent;
    /* a reply that did not echo its request (upstream.c, upconn_suspect): an `mn` was sent
     * behind the requests then on the connection, and the node's MN must come after exactly
     * sync_left more replies, or the node's replies have shifted */
    bool syncing;
    uint32_t sync_left;
    uint32_t suspects;              /* requests failed alone meanwhile, the client's fault once
                                     * the MN is where it belongs */
    uint64_t queued, written;       /* bytes put in wbuf, and sent, since it connected: a
                                     * request reached the node when written > its qstart */
};

struct upnode {
    struct upnode *next;
    struct rworker *w;
    struct topo_node node;          /* address (copied: outlives topology tables) */
    struct nodestat_slot *stat;     /* this worker's figures for the node (NULL: not kept) */
    bool retired;                   /* not in the current table: freed once idle */
    struct upqueue wait;            /* not yet sent: fair between clients (upqueue.h) */
    uint32_t outstanding;           /* sent, no reply yet */
    uint32_t window;                /* most outstanding now: AIMD in 1 .. upstream_window */
    uint32_t grow;                  /* replies since the window last grew */
    uint64_t reply_avg16;           /* its replies' average size x 16 (over about 16 replies;
                                     * 0 before the first): upnode_room */
    uint64_t retry_at_ms;           /* after a failed connect: fail fast until then */
    uint32_t fails;                 /* consecutive failures (reset by any reply) */
    bool down;                      /* marked down: only probes are sent to it */
    bool mending;                   /* marked down since its last repair (outage.h) */
    bool destroying;                /* failures while tearing down do not count */
    bool abandon;                   /* just marked down: close its connections and retry or
                                     * fail their requests (failover.h) */
    uint64_t *health;               /* its mark-down epoch, shared by the workers (failover.h);
                                     * NULL (no memory): this worker judges it alone */
    uint64_t health_seen;           /* the epoch this worker last acted on */
    struct nodestat *nstat;         /* its shared entry (health, catch-up); NULL: no memory */
    /* catch-up of its slots' replicas when it fails (catchup.h) */
    uint64_t last_reply_ms;         /* when it last answered this worker */
    bool catchup_spent;             /* an episode was started or joined since it last answered */
    uint64_t catchup_joined;        /* its episode count this worker last ran its catch-up for */
    uint64_t catchup_published;     /* ...and has published as done (its nodestat slot) */
    uint64_t catchup_wait;          /* the episode this worker waits for all to finish; 0: none */
    uint64_t catchup_until_ms;      /* ...and until when at most */
    uint64_t catchup_sent_ms;       /* when this worker last sent its catch-up (0: never) */
    struct frag *held, *held_tail;  /* requests to it held while an episode runs */
    uint64_t next_probe_ms;
    struct repairlog repair;        /* keys of replicated writes it missed (replica.h) */
    uint32_t repairs_inflight;      /* repair requests sent, not yet answered */
    uint64_t repair_at_ms;          /* no repair is sent before (replica_log) */
    uint32_t nconns;
    /* conns[nconns] is the node's dump connection: memcached refuses an `lru_crawler metadump`
     * pipelined behind other requests on its connection and hands the connection to its
     * crawler until the dump ends, so a dump (frag.exclusive) goes alone on a connection of
     * its own, one at a time, while the others carry on */
    struct upconn conns[UPSTREAM_CONNS_MAX + 1];
    struct frag *dwait, *dwait_tail; /* dumps waiting for the dump connection */
    /* per connection i: requests of clients pinned to it that are in flight on the connection
     * standin[i] instead (it was down when they were sent); upnode_pick */
    uint32_t strays[UPSTREAM_CONNS_MAX];
    uint8_t standin[UPSTREAM_CONNS_MAX];
};

struct upnode *upnode_create(struct rworker *w, const struct topo_node *node);
/* Close connections, fail everything queued (orphans only at shutdown), free. */
void upnode_destroy(struct upnode *un);
bool upnode_idle(const struct upnode *un);
/* Another worker marked the node down (`down`) or found it healthy: do the same here
 * (failover_sync). */
void upnode_adopt(struct upnode *un, bool down);
/* Is the node usable for requests (not marked down)? */
static inline bool upnode_up(const struct upnode *un) { return !un->down; }
/* Queue a fragment whose request bytes are in f->out, and send what the window allows (a
 * fragment marked exclusive: alone on the node's dump connection, when it is free). */
void upnode_submit(struct upnode *un, struct frag *f);
/* epoll readiness on an upstream connection. */
void upconn_event(struct upconn *uc, uint32_t events);
/* Write every connection with queued bytes (end of batch). */
void upstream_flush(struct rworker *w);
/* Fail requests past their deadline (called every few ms while requests are in flight). */
void upstream_check_timeouts(struct rworker *w);
/* How long a worker with nothing in flight may block, at most `most` ms: until the next probe of
 * a node marked down or the next repair falls due (upstream_check_timeouts sends them). */
uint64_t upstream_idle_ms(const struct rworker *w, uint64_t most);

#endif
