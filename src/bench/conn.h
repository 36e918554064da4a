/* conn.h — one shoal-bench client connection: socket, send batch, reply parser.
 *
 * A connection keeps a FIFO of the requests it has sent and not yet seen answered; memcached's
 * text protocol answers in order, so each parsed reply completes the FIFO head. Requests are
 * appended to one send buffer and flushed with a single send() per batch. The socket is
 * non-blocking; a partial send leaves the rest queued and arms EPOLLOUT on the connection's
 * epoll set. Nothing here allocates after bench_conn_init().
 *
 * Each request carries its key and tags (measured or not, scan or not), so a reply is counted
 * in the statistics of the phase its request was sent in, and in cache-aside mode a get that
 * misses leaves its key in the connection's miss queue for the worker to send the set. */
#ifndef SHOAL_BENCH_CONN_H
#define SHOAL_BENCH_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "bench/keys.h"
#include "bench/stats.h"

enum bench_op { BENCH_OP_GET, BENCH_OP_SET };

/* Tags of a request (bench_req.flags). */
#define BENCH_REQ_MEASURED 1u /* counted in sink[1] of bench_conn_parse(), else in sink[0] */
#define BENCH_REQ_SCAN 2u /* a get of a cache-aside scan, or the set loading its miss */

struct bench_req {
    uint64_t sent_ns;
    uint64_t key;
    uint8_t op;
    uint8_t flags;
};

/* A missed key whose loading set is not sent yet (cache-aside). */
struct bench_miss {
    uint64_t key;
    uint8_t flags; /* the get's tags, which the set inherits */
};

struct bench_conn {
    int fd; /* -1 when closed */
    int epfd; /* epoll set the connection is registered in, -1 if none */
    bool want_out; /* EPOLLOUT currently armed */
    bool value_seen; /* parsing a get reply that had a VALUE */
    unsigned reopens; /* times this connection was reopened after a failure */
    bool split; /* --split: sockets stamp arrivals; rx_ns is the last read's first byte's */
    uint64_t rx_ns; /* CLOCK_MONOTONIC ns, 0 if unknown */
    int64_t rt_to_mono; /* CLOCK_MONOTONIC minus CLOCK_REALTIME, taken when the socket opened */
    char lost_why[96]; /* set when bench_conn_parse() fails: what broke the framing */
    uint64_t skip; /* value bytes (incl. trailing CRLF) still to consume; 0: expecting a line */

    struct bench_req *fifo;
    unsigned cap, head, count;

    /* cache-aside only (NULL otherwise): misses awaiting their set, at most cap of them */
    struct bench_miss *miss;
    unsigned miss_head, miss_count;

    char *wbuf;
    size_t wcap, wpos, wlen;

    char *rbuf;
    size_t rcap, rpos, rlen;
};

/* Allocate buffers for up to `depth` requests in flight, and with `cache_aside` a miss queue
 * of the same depth. Returns 0 or -1 (out of memory). */
int bench_conn_init(struct bench_conn *c, unsigned depth, const struct bench_keys *k,
                    bool cache_aside);
void bench_conn_free(struct bench_conn *c);

/* Open a TCP connection (non-blocking, TCP_NODELAY) within `timeout_ms`. On failure returns
 * -1 with errno set (ETIMEDOUT on timeout) and leaves the connection closed. */
int bench_conn_open(struct bench_conn *c, const struct sockaddr *sa, socklen_t salen,
                    int timeout_ms);

/* Register with an epoll set (EPOLLIN; data.ptr = c). Returns 0 or -1 with errno. */
int bench_conn_watch(struct bench_conn *c, int epfd);

/* Close the socket and forget everything in flight; those requests count as lost in `st`.
 * Queued misses stay: their sets go out on the reopened connection. */
void bench_conn_close(struct bench_conn *c, struct bench_stats *st);

/* Queue one request with BENCH_REQ_* `flags`; the caller ensures count < cap. */
static inline void bench_conn_push(struct bench_conn *c, const struct bench_keys *k,
                                   enum bench_op op, uint64_t key, unsigned flags,
                                   uint64_t now_ns)
{
    c->wlen += op == BENCH_OP_GET ? bench_keys_write_get(k, key, c->wbuf + c->wlen)
                                  : bench_keys_write_set(k, key, c->wbuf + c->wlen);
    unsigned tail = c->head + c->count;
    if (tail >= c->cap) tail -= c->cap;
    c->fifo[tail].sent_ns = now_ns;
    c->fifo[tail].key = key;
    c->fifo[tail].op = (uint8_t)op;
    c->fifo[tail].flags = (uint8_t)flags;
    c->count++;
}

/* Take the oldest queued miss; the caller ensures miss_count > 0. */
static inline struct bench_miss bench_conn_pop_miss(struct bench_conn *c)
{
    struct bench_miss m = c->miss[c->miss_head];
    if (++c->miss_head == c->cap) c->miss_head = 0;
    c->miss_count--;
    return m;
}

/* Make room for a batch of new requests: drops already-sent bytes from the send buffer. */
void bench_conn_compact_wbuf(struct bench_conn *c);

/* Send what is queued. Returns 0 (all sent, or the rest waits for EPOLLOUT) or -1 with errno
 * if the connection is broken. */
int bench_conn_flush(struct bench_conn *c);

/* Read what the socket has. Returns bytes read (> 0), 0 if nothing was ready, or -1 if the
 * connection is closed or broken (errno set; 0 for an orderly close by the server). */
ssize_t bench_conn_read(struct bench_conn *c);

/* Parse buffered replies, completing requests at `now_ns`; *completed gets how many (errors
 * included). A request is counted in sink[1] if it was pushed with BENCH_REQ_MEASURED, else
 * in sink[0] (the two may be the same); latencies of successful measured requests go to that
 * sink's hist when `record` is set. With a miss queue, each get answered without a VALUE
 * queues its key. Returns 0, or -1 if the connection has lost its framing (unparseable or
 * unrequested reply, CLIENT_ERROR, ERROR) and must be reopened; the error is already counted
 * (in the sink of the oldest request in flight) and described in c->lost_why. */
int bench_conn_parse(struct bench_conn *c, uint64_t now_ns, struct bench_stats *const sink[2],
                     bool record, unsigned *completed);

#endif
