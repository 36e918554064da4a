/* upqueue.h — a node's wait queue in a worker (requests not yet sent for want of room in its
 * window), fair between the clients that share the node.
 *
 * Sent in arrival order, one client's deep pipeline (a thousand gets queued in one read, before
 * any reply can show it does not read them) would hold every later client's request behind it
 * for as long as the node takes to answer them all. So each client has a flow of its own (keyed
 * by the pin that also picks its connection, upstream.c: its socket; 0 for the router's own
 * requests), kept in arrival order, and the window's free room is handed out in turns across
 * flows: first to flows that had nothing waiting (a client with one request in flight, as a
 * well-behaved one usually has), in the order they came, then round-robin over the others. A
 * turn is a few requests (the caller's quantum: upstream.c gives about 64 KB of replies, one
 * request of large values), so that a client's small pipelined requests still go out, and
 * their replies come back, together. A client's requests keep their order (one flow, one connection), so do the requests
 * in flight on a connection when they are retried (failover.h); there was never an order
 * between clients. */
#ifndef SHOAL_ROUTER_UPQUEUE_H
#define SHOAL_ROUTER_UPQUEUE_H

#include <stdbool.h>
#include <stdint.h>

struct frag;

struct upflow {
    struct upflow *next;        /* in the queue's fresh list or round, or its spares */
    struct upflow *hnext;       /* in its hash bucket */
    unsigned pin;
    uint32_t turn;              /* requests taken in its current turn */
    struct frag *head, *tail;   /* waiting, oldest first (linked through frag->next) */
};

struct upqueue {
    struct upflow **buckets;    /* the flows with requests waiting, by pin */
    uint32_t nbuckets, nflows;
    uint32_t nwait;             /* requests waiting, all flows */
    struct upflow *fresh, *fresh_tail; /* flows that had nothing waiting: served first */
    struct upflow *round, *round_tail; /* the others, served in turn */
    struct upflow *spare;       /* freed flows kept for reuse */
    uint32_t nspare;
};

void upqueue_init(struct upqueue *q);
/* Free its memory; the queue must be empty (upqueue_take_all). */
void upqueue_free(struct upqueue *q);
static inline bool upqueue_empty(const struct upqueue *q) { return q->nwait == 0; }
/* Append f at the end of pin's flow. 0, or -1 when memory ran out (f is not queued). */
int upqueue_push(struct upqueue *q, struct frag *f, unsigned pin);
/* The pin of the request upqueue_pop takes next (the queue must not be empty). */
static inline unsigned upqueue_next_pin(const struct upqueue *q)
{
    return q->fresh ? q->fresh->pin : q->round->pin;
}
/* Take the next request to send (see above) and its pin; NULL when none waits. A flow's turn
 * lasts `quantum` requests (at least one), or until it has none left. */
struct frag *upqueue_pop(struct upqueue *q, uint32_t quantum, unsigned *pin);
/* Take every request whose deadline_ms is at or before now_ms (each flow's are in deadline
 * order: it is set when they are queued), as a list through frag->next, each flow's in order. */
struct frag *upqueue_take_expired(struct upqueue *q, uint64_t now_ms);
/* Take every request, as a list through frag->next, each flow's in order. */
struct frag *upqueue_take_all(struct upqueue *q);

#endif
