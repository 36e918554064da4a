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
#include "router/request.h"
#include "router/router.h"

#define EV_CLIENT 1
#define EV_UPCONN 2

struct client {
    int evkind; /* EV_CLIENT: first, so epoll data can tell clients from upstreams */
    struct client *next, *prev; /* worker's list */
    struct client *dirty_next;
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
};

/* Take an accepted non-blocking socket. NULL (fd closed) when memory runs out. */
struct client *client_create(struct rworker *w, int fd);
/* epoll readiness. Never destroys the client; marks it dirty. */
void client_event(struct client *c, uint32_t events);
/* End-of-batch work: run buffered requests, send replies, destroy when finished. */
void client_service(struct client *c);
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
/* Destroy unconditionally (worker shutdown). */
void client_destroy(struct client *c);

#endif
