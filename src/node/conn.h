/* conn.h — one client connection of shoal-node: input parsing loop, value reception, output.
 *
 * A connection reads whatever the socket has, runs every complete request in its input buffer,
 * appends each reply to one output buffer in request order, and writes that buffer once per
 * batch (so a pipeline of N requests costs one read and one write; with the worker's io_uring,
 * the reads of all connections epoll reported ready go in one system call, and so do their
 * sends). Limits: a request line longer than line_max closes the connection after an error,
 * except a get/gets/gat/gats line, which is answered in parts as it arrives (conn_lget.c,
 * protocol/longget.h); new requests are not taken while
 * more than out_max/4 reply bytes wait to be sent, and a single reply that would push the
 * queue past out_max is refused with a SERVER_ERROR. A storage command's value that has not
 * all reached the input buffer or the socket with its line is staged in the connection
 * (conn_stage.c), within inflight_max for all connections together, and becomes an item only
 * once complete. */
#ifndef SHOAL_NODE_CONN_H
#define SHOAL_NODE_CONN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/uring.h"
#include "node/node.h"
#include "protocol/longget.h"
#include "protocol/protocol.h"

enum conn_state {
    CONN_LINE,    /* waiting for a request line */
    CONN_VALUE,   /* receiving a storage command's data block into `it` or `stage` */
    CONN_SWALLOW, /* discarding the data block of a refused storage command */
    CONN_LGET,    /* answering a get line over line_max as it arrives (`lget`) */
    CONN_CLOSE,   /* close once the output is written */
};

/* The chunks a value still arriving is received into (conn_stage.c): chunk i holds 16 KiB << i
 * bytes, the last one cut to the value's length. */
#define CONN_STAGE_CHUNKS 17
struct conn_stage {
    char *chunk[CONN_STAGE_CHUNKS];
    unsigned n;     /* chunks allocated */
    uint64_t bytes; /* their total size, counted in the node's inflight_bytes */
};

struct conn {
    struct conn *next, *prev;
    struct worker *w;
    struct node *node;
    int fd;
    enum conn_state state;
    bool epollout;  /* EPOLLOUT is registered */
    bool paused;    /* EPOLLIN is off while output drains */
    bool doomed;    /* closed at the worker's next sweep: its staged value was reclaimed */
    struct buf rbuf;
    struct buf wbuf;
    /* storage command in progress (CONN_VALUE): its value goes into `it` when the whole data
     * block had reached the socket as its line was parsed, else into `stage` until complete */
    struct item *it;
    struct conn_stage stage;
    uint64_t vgot;     /* value bytes received so far (then up to 2 of its \r\n) */
    bool badchunk;     /* the data block was not followed by \r\n */
    uint64_t swallow;  /* bytes left to discard (CONN_SWALLOW) */
    bool ring_direct;  /* the recv queued on the worker's io_uring reads into `it` or `stage` */
    bool ring_reading; /* a recv is queued on the worker's io_uring and not yet handled */
    uint64_t stage_busy_ms; /* the batch (now_ms) that found bytes unread in its socket */
    char *pline;       /* copy of the request line the pending request points into */
    size_t plinecap;
    struct proto_req preq;
    struct dump *dump; /* a key dump in progress (cmd_dump.c): runs before further requests */
    struct lget lget;  /* the get line over line_max being answered (CONN_LGET) */
    struct connlist_ent listed; /* its entry in the node's `stats conns` list */
    uint64_t acct;       /* bytes its buffers account in the node's budget (conn_budget.c) */
    uint64_t last_in_ms;  /* when it last sent a byte (the worker's now_ms) */
    uint64_t last_out_ms; /* when it last took a byte of its replies */
};

/* Create a connection for an accepted, non-blocking socket and register it with the worker's
 * epoll. Returns NULL (and closes fd) when memory runs out. */
struct conn *conn_create(struct worker *w, int fd);
/* Handle readiness reported by epoll for this connection. May destroy it. With a ring `r`, the
 * socket read may be queued on it instead of done: then it returns true, and the caller must,
 * after uring_run, pass the read's result to conn_read_done. Otherwise (false) the event is
 * fully handled, and the connection may be gone. */
bool conn_event(struct conn *c, uint32_t events, struct uring *r);
/* The queued read completed with `res` (bytes, 0 at EOF, or -errno): run the requests it
 * brought. Returns true when it queued the replies' send on `r` (pass its result to
 * conn_send_done after the next uring_run); false when done, the connection may be gone. Until
 * then the connection's buffers are the kernel's: nothing else may touch them. */
bool conn_read_done(struct conn *c, int res, struct uring *r);
/* The queued send completed with `res`: finish the event as conn_event would. May destroy it. */
void conn_send_done(struct conn *c, int res);
/* Close the socket, free buffers and any value being received, unlink from the worker. */
void conn_destroy(struct conn *c);
/* Bytes its client sent that wait unread in the socket's receive queue (FIONREAD; 0 on error). */
size_t conn_socket_queued(const struct conn *c);

/* Reply helpers for command handlers: append to the output buffer. Allocation failure marks
 * the connection for closing (the reply stream would otherwise be corrupt). */
void conn_reply(struct conn *c, const char *s, size_t n);
void conn_reply_str(struct conn *c, const char *s);
/* Is there room for `n` more reply bytes under out_max? */
bool conn_out_room(const struct conn *c, size_t n);

/* Long gets (conn_lget.c). conn_lget_begin: the input buffer holds a line over line_max from
 * `start` (`avail` bytes): when it is a get line, take its verb and enter CONN_LGET (true);
 * false when it is not one. conn_lget_step: answer what the buffer holds of it; false when
 * nothing could be done until more input arrives. */
bool conn_lget_begin(struct conn *c, const char *start, size_t avail);
bool conn_lget_step(struct conn *c);

/* Staging of values still arriving (conn_stage.c); `c->preq` is the storage command and
 * `c->vgot` < its nbytes. conn_stage_room: where value byte vgot goes and how many bytes may
 * follow it there (*len > 0), allocating a chunk when needed. With no room under
 * --inflight-max, a value whose rest has all arrived (`buffered` bytes of it in the input
 * buffer, the others queued on the socket) moves into its item instead: `c->it` is then set and
 * *dst, *len are not (the caller takes the item's room). False when no room can be had: the
 * command has then been answered `SERVER_ERROR out of memory storing object` and the connection
 * is swallowing the rest of its data block (CONN_SWALLOW). conn_stage_copy: copy the first `n`
 * value bytes into `it`.
 * conn_stage_free: release the chunks (any time; idempotent).
 * conn_stage_reclaim: make room for `need` more staged bytes under `target` by closing this
 * worker's stalled stagers (conn_stage.c says which); they are destroyed by the worker's next
 * conn_budget_sweep. Returns how many it closed. */
bool conn_stage_room(struct conn *c, size_t buffered, char **dst, size_t *len);
unsigned conn_stage_reclaim(struct worker *w, const struct conn *self, uint64_t need,
                            uint64_t target);
void conn_stage_copy(const struct conn *c, struct item *it, uint64_t n);
void conn_stage_free(struct conn *c);

/* The client-buffer budget (conn_budget.c, common/membudget.h). conn_budget_account: bring the
 * connection's share of the budget up to date (after its buffers may have changed size).
 * conn_budget_sweep: a worker's check after each batch: close the connections whose staged
 * values were reclaimed, and its stalled stagers while staged values press --inflight-max; when
 * the budget is over, close its
 * connections that hold the most by the client's doing; close those whose incomplete request
 * saw no byte for --partial-timeout-ms; hand freed memory back. conn_budget_wait_ms: how long
 * the worker may block before the sweep is due again (-1: until an event). */
void conn_budget_account(struct conn *c);
void conn_budget_sweep(struct worker *w);
int conn_budget_wait_ms(const struct worker *w);

#endif
