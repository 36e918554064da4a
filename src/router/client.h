/* client.h — one application connection to shoal-router: read, parse with src/protocol,
 * dispatch each request to its node(s), and write replies back in request order.
 *
 * Nothing here is destroyed or written from inside another object's callback: completions only
 * mark the client dirty, and the worker services dirty clients at the end of each batch (run
 * newly readable requests, send queued replies, close when done). */
#ifndef SHOAL_ROUTER_CLIENT_H
#define SHOAL_ROUTER_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/uring.h"
#include "protocol/longget.h"
#include "router/request.h"
#include "router/router.h"

#define EV_CLIENT 1
#define EV_UPCONN 2

struct client {
    int evkind; /* EV_CLIENT: first, so epoll data can tell clients from upstreams */
    struct client *next, *prev; /* worker's list */
    struct client *dirty_next;
    struct client *batch_next;  /* the worker's list of clients serviced in this pass */
    struct rworker *w;
    int fd;
    bool in_dirty;
    bool eof;       /* peer finished sending: no more reads */
    bool dead;      /* socket failed: destroy at the next service */
    bool closing;   /* quit or a fatal error: close once the output is written */
    bool epollout, paused;
    uint32_t evmask;              /* events registered with epoll now */
    uint64_t swallow;             /* data bytes of a refused storage command still to drop */
    struct buf rbuf, wbuf;
    struct rreq *head, *tail;     /* requests in flight, in arrival order */
    uint32_t npending;
    uint64_t held;                /* reply bytes kept for requests not yet moved to wbuf */
    uint64_t req_bytes;           /* bytes of its requests in flight (line and data, as read)
                                   * until their replies leave: they count as `held` does, so a
                                   * client pipelining to a stalled node, or while a catch-up
                                   * holds its requests or a moved-retry parks them, is paused at
                                   * its share instead of having the router read on */
    struct lget lget;             /* a get line over --line-max being routed in parts */
    bool lget_failed;             /* a part of it was answered with an error: drop the rest */
    struct buf lline;             /* the line built for its current part */
    struct connlist_ent listed;   /* its entry in the router's `stats conns` list */
    uint64_t acct;                /* bytes it accounts in the router's budget (client_budget.c) */
    uint64_t last_in_ms;          /* when it last sent a byte (the worker's now_ms) */
    uint64_t req_start_ms;        /* when the request it is sending began (its first byte read
                                   * into an empty buffer, or the one before it completed) */
    uint64_t unread_ms;           /* when the budget's sweep found bytes it sent unread in its
                                   * socket: the router was behind then, not the client */
    uint64_t req_need;            /* bytes of input that request needs, when its data block is
                                   * still arriving (0: not known) */
    uint64_t last_out_ms;         /* when it last took a byte of its replies */
};

/* Take an accepted non-blocking socket. NULL (fd closed) when memory runs out. */
struct client *client_create(struct rworker *w, int fd);
/* epoll readiness. Never destroys the client; marks it dirty. With `ring`, the read is queued
 * there (into rbuf's spare room, which nothing else touches until the worker has run the ring
 * and called client_read_done); without, it is done at once. */
void client_event(struct client *c, uint32_t events, struct uring *ring);
/* The result of a read of the client's socket: bytes, 0 at EOF, or -errno. */
void client_read_done(struct client *c, int res);
/* End-of-batch work, in two halves so that the worker can send the replies of many clients
 * with one system call in between:
 *   client_prepare: run buffered requests and move finished replies to wbuf. Returns false
 *     when the client was destroyed (it had failed).
 *   client_wants_send: whether wbuf holds bytes a send may take now.
 *   client_send_done: account for a send of wbuf the worker made (bytes or -errno); -1 when
 *     the connection failed. wbuf must not change between the send's start and this call.
 *   client_finish: send what is left (`sent` < 0: the connection failed), resume paused input,
 *     destroy the client when it is finished, and set its epoll events. */
bool client_prepare(struct client *c);
bool client_wants_send(const struct client *c);
int client_send_done(struct client *c, int res);
void client_finish(struct client *c, int sent);
void client_mark_dirty(struct client *c);
/* Move finished requests at the head of the FIFO into the output. */
void client_drain(struct client *c);
/* Append a request to the FIFO of requests awaiting their replies. */
void client_enqueue(struct client *c, struct rreq *rq);
/* Answer locally, in order behind anything still in flight. Allocation failure closes the
 * connection (its reply stream could no longer be trusted). */
void client_local(struct client *c, const char *s, size_t n);
void client_local_str(struct client *c, const char *s);
/* Answer SERVER_ERROR out of memory (in order) and count it. */
void client_oom(struct client *c);
/* Long gets (client_lget.c). client_lget_begin: the input buffer holds a line over --line-max
 * from `start` (`avail` bytes): when it is a get line, take its verb and route it in parts from
 * now on (true); false when it is not one. client_lget_step: route what the buffer holds of it;
 * false when nothing can be done until more input arrives. client_lget_filter: the reply of
 * one of its parts is leaving (client_drain): take off its END, or drop it after an error. */
bool client_lget_begin(struct client *c, const char *start, size_t avail);
bool client_lget_step(struct client *c);
void client_lget_filter(struct client *c, struct rreq *rq);
/* The client-buffer budget (client_budget.c, common/membudget.h). client_budget_account: bring
 * the client's share up to date (after its buffers, held replies or requests in flight
 * changed). client_budget_sweep: the worker's check between batches: when the budget is over,
 * close its clients holding the most by their own doing; close those whose incomplete request
 * saw no byte for --partial-timeout-ms; hand freed memory back. client_budget_wait_ms: `wait`
 * (epoll's timeout, -1 for none) shortened to when the sweep is due again. */
void client_budget_account(struct client *c);
void client_budget_sweep(struct rworker *w);
/* What a request in flight costs at least until it is answered: the request, one fragment and
 * the smallest buffer for its line (buf.c), counted in the budget per request pending. */
#define CLIENT_PENDING_COST (sizeof(struct rreq) + sizeof(struct frag) + 2048)
int client_budget_wait_ms(const struct rworker *w, int wait);
/* Destroy unconditionally (worker shutdown). */
void client_destroy(struct client *c);

#endif
