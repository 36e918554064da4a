/* upstream.c — connections from one worker to one node: connect, batch writes, match replies
 * in order, enforce the window and the per-request timeout (see upstream.h). */
#include "router/upstream.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "router/catchup.h"
#include "router/client.h"
#include "router/failover.h"
#include "router/replyframe.h"
#include "router/replica.h"

#define UPSTREAM_READ_CHUNK 65536
#define UPSTREAM_BUF_KEEP (256 * 1024)
#define FRAG_LINE_KEEP 4096 /* a sent request's buffer above this is shrunk to its line */
#define UPSTREAM_TURN_BYTES 65536 /* replies a client's turn in the wait queue lasts, about */
#define UPSTREAM_TURN_MAX 64

static void upnode_pump(struct upnode *un);

/* Mark the node down in this worker (`why`, for the log): requests go around it from now on,
 * it is probed, and its connections are closed at the next pump (abandon), their requests
 * retried on the gutter pool or failed, before any later one can overtake them there. */
static void upnode_mark_down(struct upnode *un, const char *why)
{
    struct rworker *w = un->w;
    un->down = true;
    un->mending = true;
    un->abandon = true;
    if (un->stat) NODESTAT_ADD(un->stat->down, 1);
    un->next_probe_ms = w->now_ms + w->r->cfg.probe_ms;
    w->m.nodes_marked_down++;
    log_notice("worker %d: node %s marked down %s; probing every %llu ms", w->id, un->node.addr,
               why, (unsigned long long)w->r->cfg.probe_ms);
    catchup_begin(w, un); /* its copies-2 keys are read from their replicas from now on */
}

/* One more consecutive failure; at down_after the node is marked down, for every worker. */
static void upnode_failure(struct upnode *un)
{
    struct rworker *w = un->w;
    if (un->destroying || un->down) return;
    if (++un->fails < w->r->cfg.down_after) return;
    char why[64];
    snprintf(why, sizeof why, "after %u consecutive failures", un->fails);
    upnode_mark_down(un, why);
    failover_publish(un, true);
}

static void upnode_mark_up(struct upnode *un, const char *why)
{
    un->fails = 0;
    un->down = false;
    if (un->stat) NODESTAT_ADD(un->stat->down, -1);
    un->w->m.nodes_marked_up++;
    log_notice("worker %d: node %s %s", un->w->id, un->node.addr, why);
    replica_node_up(un);
}

static void upnode_success(struct upnode *un, bool probe)
{
    un->fails = 0;
    un->last_reply_ms = un->w->now_ms;
    if (un->down && probe) {
        upnode_mark_up(un, "answers again");
        failover_publish(un, false);
    }
}

void upnode_adopt(struct upnode *un, bool down)
{
    if (un->destroying || un->down == down) return;
    if (!down) {
        upnode_mark_up(un, "answers again (another worker's probe)");
        return;
    }
    upnode_mark_down(un, "by another worker");
    upnode_pump(un); /* which abandons its connections now */
}

struct upnode *upnode_create(struct rworker *w, const struct topo_node *node)
{
    struct upnode *un = calloc(1, sizeof *un);
    if (un == NULL) return NULL;
    un->w = w;
    un->node = *node;
    struct nodestat *ns = nodestats_get(&w->r->nodes, node->addr);
    un->stat = ns ? &ns->slots[w->id] : NULL;
    un->health = ns ? &ns->health : NULL;
    un->nstat = ns;
    w->health_seen = UINT64_MAX; /* look at its epoch at the next failover_sync */
    un->nconns = (uint32_t)w->r->cfg.upstream_conns;
    un->window = (uint32_t)w->r->cfg.upstream_window;
    upqueue_init(&un->wait);
    repairlog_init(&un->repair, (uint32_t)w->r->cfg.repair_log);
    for (uint32_t i = 0; i <= un->nconns; i++) { /* and the dump connection */
        struct upconn *uc = &un->conns[i];
        uc->evkind = EV_UPCONN;
        uc->un = un;
        uc->fd = -1;
        uc->state = UP_DOWN;
        buf_init(&uc->wbuf);
        buf_init(&uc->rbuf);
    }
    un->next = w->upnodes;
    w->upnodes = un;
    return un;
}

bool upnode_idle(const struct upnode *un)
{
    /* nor while the worker waits for its catch-up (catchup.h): that wait ends with it */
    return upqueue_empty(&un->wait) && un->dwait == NULL && un->outstanding == 0 &&
           un->held == NULL && un->catchup_wait == 0;
}

/* f has left a connection's sent queue (answered or failed): it no longer holds its client's
 * requests on a stand-in connection (upnode_pick). */
static void upnode_unstray(struct upnode *un, struct frag *f)
{
    if (f->stray) un->strays[f->stray - 1]--;
    f->stray = 0;
}

/* f failed on un by the node's own fault (refused, reset, timed out) and is no longer in any of
 * its queues; `sent`: its bytes reached the node. Retried on the gutter pool when it may be
 * (failover.h): true, and the caller forgets it; the node's figures count the failure. */
static bool upnode_failover(struct upnode *un, struct frag *f, bool sent, bool timed_out)
{
    if (f->failover == FAILOVER_NONE || !failover_retry(un, f, sent)) return false;
    if (un->stat) NODESTAT_ADD(*(timed_out ? &un->stat->timeouts : &un->stat->errors), 1);
    return true;
}

/* Answer a fragment with a router error line; it is no longer in any queue. */
static void frag_fail(struct upnode *un, struct frag *f, const char *msg, size_t n)
{
    struct rworker *w = un->w;
    if (un->stat && !f->probe) NODESTAT_ADD(un->stat->errors, 1);
    if (!f->probe) SCOPESTAT_ADD(&w->r->scopes, w->id, f->pool, f->ns, errors);
    w->inflight--;
    frag_complete(f, msg, n, true);
}

static void upconn_set_events(struct upconn *uc)
{
    struct epoll_event ev = {.data.ptr = uc};
    ev.events = EPOLLIN | EPOLLRDHUP |
                ((uc->state == UP_CONNECTING || uc->epollout) ? EPOLLOUT : 0);
    epoll_ctl(uc->un->w->epfd, EPOLL_CTL_MOD, uc->fd, &ev);
}

/* Close the connection and fail every request sent on it: after a timeout or a lost
 * connection, later replies could no longer be matched to requests. `fault`: the node refused
 * the connection, reset it or timed out, and each request may be retried on the gutter pool
 * instead (failover.h); not for a reply the router refused, nor when the node leaves. */
static void upconn_close(struct upconn *uc, const char *why, bool timeout, bool fault)
{
    struct upnode *un = uc->un;
    struct rworker *w = un->w;
    uint64_t written = uc->written;
    uc->queued = uc->written = 0;
    if (uc->fd >= 0) {
        epoll_ctl(w->epfd, EPOLL_CTL_DEL, uc->fd, NULL);
        close(uc->fd);
    }
    uc->fd = -1;
    uc->state = UP_DOWN;
    uc->epollout = false;
    uc->rscan = 0;
    uc->syncing = false; /* the check ends with the connection; nothing left to shift */
    uc->sync_left = uc->suspects = 0;
    buf_release(&uc->wbuf);
    buf_release(&uc->rbuf);
    char msg[256];
    int n = snprintf(msg, sizeof msg, "SERVER_ERROR shoal-router: node %s %s\r\n",
                     un->node.addr, why);
    if (n < 0 || (size_t)n >= sizeof msg) n = (int)sizeof msg - 1;
    bool first = true;
    while (uc->sent) {
        struct frag *f = uc->sent;
        uc->sent = f->next;
        un->outstanding--;
        upnode_unstray(un, f);
        if (fault && upnode_failover(un, f, f->qstart < written, timeout && first)) {
            first = false;
            continue;
        }
        if (timeout && first) {
            w->m.upstream_timeouts++;
            if (un->stat) NODESTAT_ADD(un->stat->timeouts, 1);
            SCOPESTAT_ADD(&w->r->scopes, w->id, f->pool, f->ns, timeouts);
        } else {
            w->m.upstream_errors++;
        }
        if (timeout && !first) {
            static const char later[] =
                "SERVER_ERROR shoal-router: connection to node reset after an earlier timeout\r\n";
            frag_fail(un, f, later, sizeof later - 1);
        } else {
            frag_fail(un, f, msg, (size_t)n);
        }
        first = false;
    }
    uc->sent_tail = NULL;
    uc->nsent = 0;
    upnode_failure(un);
    if (timeout) { /* multiplicative decrease */
        un->window = un->window > 1 ? un->window / 2 : 1;
        un->grow = 0;
        w->m.window_shrinks++;
    } else {
        log_info_limited("node %s: %s", un->node.addr, why);
    }
}

static void upconn_fail(struct upconn *uc, const char *why, bool timeout)
{
    upconn_close(uc, why, timeout, false);
}

/* The node refused, reset or timed out (`timeout`) the connection. */
static void upconn_fault(struct upconn *uc, const char *why, bool timeout)
{
    upconn_close(uc, why, timeout, true);
}

/* Fail everything waiting for this node (it cannot be reached now); with `fault`, retry on
 * the gutter pool what may be (none of it was sent). */
static void upnode_fail_waiting(struct upnode *un, const char *why, bool fault)
{
    struct rworker *w = un->w;
    char msg[256];
    int n = snprintf(msg, sizeof msg, "SERVER_ERROR shoal-router: node %s %s\r\n",
                     un->node.addr, why);
    if (n < 0 || (size_t)n >= sizeof msg) n = (int)sizeof msg - 1;
    for (struct frag *f = upqueue_take_all(&un->wait), *next; f; f = next) {
        next = f->next;
        if (fault && upnode_failover(un, f, false, false)) continue;
        w->m.upstream_errors++;
        frag_fail(un, f, msg, (size_t)n);
    }
    while (un->dwait) {
        struct frag *f = un->dwait;
        un->dwait = f->next;
        w->m.upstream_errors++;
        frag_fail(un, f, msg, (size_t)n);
    }
    un->dwait_tail = NULL;
}

/* Start a non-blocking connect. 0 (connecting or connected), or -1 with errno. */
static int upconn_connect(struct upconn *uc)
{
    struct upnode *un = uc->un;
    struct rworker *w = un->w;
    int fd = socket(un->node.sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    w->m.upstream_connects++;
    int rc = connect(fd, (const struct sockaddr *)&un->node.sa, un->node.salen);
    if (rc < 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    uc->fd = fd;
    uc->state = rc == 0 ? UP_READY : UP_CONNECTING;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT, .data.ptr = uc};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int e = errno;
        close(fd);
        uc->fd = -1;
        uc->state = UP_DOWN;
        errno = e;
        return -1;
    }
    return 0;
}

static void upconn_mark_dirty(struct upconn *uc)
{
    if (uc->in_dirty) return;
    uc->in_dirty = true;
    uc->dirty_next = uc->un->w->dirty_up;
    uc->un->w->dirty_up = uc;
}

/* The connection for a request of the client pinned to `pin` (its socket; 0 for the router's
 * own requests): closed ones are opened first (so every connection of the node gets used), then
 * the pin's own connection is used. A node runs the requests of one connection in order but not
 * across connections, so a client's pipeline on a node stays on one: its get behind its set
 * sees the set. While the pin's connection cannot be had, the one with the fewest requests
 * outstanding stands in (the failed connection's requests were all answered with errors, so
 * none of them can be overtaken), and as long as requests sent on it are in flight the pin's
 * requests keep to it, even once their own connection is back: spread over several, or back on
 * their own while earlier ones are in flight on the stand-in, a get could overtake its set.
 * NULL when no connection can be had. */
static struct upconn *upnode_pick(struct upnode *un, unsigned pin)
{
    uint32_t own_i = pin % un->nconns;
    struct upconn *standin = &un->conns[un->standin[own_i]];
    /* a stand-in that failed has no strays left, but for those it is failing right now */
    if (un->strays[own_i] && standin->state != UP_DOWN) return standin;
    struct rworker *w = un->w;
    struct upconn *best = NULL;
    for (uint32_t i = 0; i < un->nconns; i++) {
        struct upconn *uc = &un->conns[i];
        if (uc->state == UP_DOWN) {
            if (w->now_ms < un->retry_at_ms && !un->down) continue; /* probes may retry */
            if (upconn_connect(uc) < 0) {
                w->m.upstream_connect_failures++;
                upnode_failure(un);
                un->retry_at_ms = w->now_ms + w->r->cfg.retry_ms;
                log_info_limited("node %s: connect failed: %s", un->node.addr, strerror(errno));
                continue;
            }
        }
        if (best == NULL || uc->nsent < best->nsent) best = uc;
    }
    struct upconn *own = &un->conns[own_i];
    return own->state != UP_DOWN ? own : best;
}

/* Once f's request is handed to a connection, keep only its line: the reply is checked
 * against it (reply_fits_want). A large storage value's buffer is given back meanwhile. */
static void frag_keep_line(struct frag *f)
{
    const char *p = buf_start(&f->out), *nl = memchr(p, '\n', buf_used(&f->out));
    if (nl == NULL) return;
    size_t n = (size_t)(nl - p) + 1;
    struct buf line;
    buf_init(&line);
    if (f->out.cap > FRAG_LINE_KEEP && buf_append(&line, p, n) == 0) {
        buf_release(&f->out);
        f->out = line;
    } else {
        f->out.len = f->out.off + n;
    }
}

/* Hand f's request to connection uc: it joins uc's sent queue. */
static void upconn_take(struct upconn *uc, struct frag *f)
{
    struct upnode *un = uc->un;
    struct rworker *w = un->w;
    f->qstart = uc->queued;
    uc->queued += buf_used(&f->out);
    reply_want_of(&f->want, buf_start(&f->out), buf_used(&f->out));
    if (f->quiet_batch) f->want.list = RLIST_QUIET;
    f->max_reply = reply_max_bytes(f->want.slots, w->r->cfg.item_max);
    /* a request that may be retried keeps its bytes until answered; one too large to keep
     * (window x value size) gives its value back now and is no longer retried, unless it may
     * meet a slot's handoff fence (movable, not moved yet or within its moved-retry window) and
     * fits --moved-keep-max */
    if ((f->failover != FAILOVER_NONE || f->movable) && buf_used(&f->out) > FAILOVER_KEEP_MAX) {
        /* a moved-retry sent again within its window may be parked again (failover.h) */
        bool eligible = f->movable && (!f->moved || w->now_ms < f->moved_until_ms);
        if (!eligible || !frag_keep(f, &w->r->keep, buf_used(&f->out))) {
            if (eligible) w->m.moved_keep_refused++;
            f->failover = FAILOVER_NONE;
            f->movable = false;
        }
    }
    if (f->failover == FAILOVER_NONE && !f->movable) frag_keep_line(f);
    f->next = NULL;
    if (uc->sent_tail) uc->sent_tail->next = f;
    else uc->sent = f;
    uc->sent_tail = f;
    uc->nsent++;
    un->outstanding++;
    w->m.upstream_requests++;
    f->sent_us = w->now_us;
    /* the node's time starts when it is sent: a wait in the router's queue is not its doing */
    f->deadline_ms = w->now_ms + w->r->cfg.timeout_ms;
    if (un->stat && !f->probe) NODESTAT_ADD(un->stat->requests, 1);
    upconn_mark_dirty(uc);
}

/* Send the next waiting dump when the dump connection is free (nothing in flight on it). */
static void upnode_pump_dump(struct upnode *un)
{
    struct rworker *w = un->w;
    struct upconn *uc = &un->conns[un->nconns];
    while (un->dwait && uc->sent == NULL) {
        if (uc->state == UP_DOWN && upconn_connect(uc) < 0) {
            w->m.upstream_connect_failures++;
            upnode_failure(un);
            char why[160];
            snprintf(why, sizeof why, "is unavailable: %s", strerror(errno));
            upnode_fail_waiting(un, why, false); /* the dumps; the others fail as they would */
            return;
        }
        struct frag *f = un->dwait;
        un->dwait = f->next;
        if (un->dwait == NULL) un->dwait_tail = NULL;
        if (buf_append(&uc->wbuf, buf_start(&f->out), buf_used(&f->out)) < 0) {
            static const char oom[] = "SERVER_ERROR out of memory\r\n";
            w->m.out_of_memory++;
            frag_fail(un, f, oom, sizeof oom - 1);
            continue;
        }
        upconn_take(uc, f);
    }
}

/* The node was just marked down: close its connections and retry on the gutter pool (or fail)
 * what was in flight on them and what waits for them, in the order sent, before any later
 * request routed to the gutter can overtake them there. Probes come later (next_probe_ms). */
static void upnode_abandon(struct upnode *un)
{
    un->abandon = false;
    for (uint32_t i = 0; i <= un->nconns; i++) /* and the dump connection */
        if (un->conns[i].state != UP_DOWN) upconn_fault(&un->conns[i], "was marked down", false);
    upnode_fail_waiting(un, "is down", true);
}

/* A get whose client closed before it was sent: nobody would read its reply, and sending it
 * anyway would make the clients still there wait behind it. (A write is still sent: its client
 * may count on it.) */
static bool frag_abandoned(const struct frag *f)
{
    if (f->rq || f->probe || f->repl) return false;
    size_t n = buf_used(&f->out);
    const char *p = buf_start(&f->out);
    return (n > 4 && !memcmp(p, "get ", 4)) || (n > 5 && !memcmp(p, "gets ", 5));
}

/* How many requests may be outstanding on the node now: the window, and no more than about
 * --upstream-window-bytes of replies at its recent average reply size (at least one). A request
 * sent waits for every reply before it on its connection: with 100 KB values a window of 512
 * is 51 MB to move first, seconds on a busy machine, which no other client should wait for;
 * those beyond wait in the router's queue instead, where they are served fairly (upqueue.h). */
static uint32_t upnode_room(const struct upnode *un)
{
    uint64_t avg = un->reply_avg16 / 16, most = un->w->r->cfg.upstream_window_bytes;
    if (avg == 0 || most / avg >= un->window) return un->window;
    return most / avg > 1 ? (uint32_t)(most / avg) : 1;
}

/* How many requests a client's turn in the wait queue lasts (upqueue.h): about
 * UPSTREAM_TURN_BYTES of replies at the node's average reply size, 1 .. UPSTREAM_TURN_MAX. One
 * request per turn is the fairest, but a client's pipeline then goes out (and its replies come
 * back) one request at a time among everyone else's, each reply a write of its own; a few KB
 * of replies per turn keep small requests batched and cost the others little. */
static uint32_t upnode_quantum(const struct upnode *un)
{
    uint64_t avg = un->reply_avg16 / 16;
    if (avg == 0 || UPSTREAM_TURN_BYTES / avg >= UPSTREAM_TURN_MAX) return UPSTREAM_TURN_MAX;
    return UPSTREAM_TURN_BYTES / avg > 1 ? (uint32_t)(UPSTREAM_TURN_BYTES / avg) : 1;
}

/* Send f, of the flow `pin`, on uc (upnode_pick's choice for that pin). */
static void upnode_send(struct upnode *un, struct upconn *uc, struct frag *f, unsigned pin)
{
    if (buf_append(&uc->wbuf, buf_start(&f->out), buf_used(&f->out)) < 0) {
        static const char oom[] = "SERVER_ERROR out of memory\r\n";
        un->w->m.out_of_memory++;
        frag_fail(un, f, oom, sizeof oom - 1);
        return;
    }
    uint32_t own_i = pin % un->nconns, uc_i = (uint32_t)(uc - un->conns);
    if (uc_i != own_i) { /* a stand-in: the pin's next requests follow it (upnode_pick) */
        f->stray = (uint8_t)(own_i + 1);
        un->strays[own_i]++;
        un->standin[own_i] = (uint8_t)uc_i;
    }
    upconn_take(uc, f);
}

/* Hand waiting fragments to connections while the window has room. */
static void upnode_pump(struct upnode *un)
{
    struct rworker *w = un->w;
    if (un->abandon) upnode_abandon(un);
    upnode_pump_dump(un);
    uint32_t room = upnode_room(un), quantum = upnode_quantum(un);
    while (!upqueue_empty(&un->wait) && un->outstanding < room) {
        unsigned pin = upqueue_next_pin(&un->wait);
        struct upconn *uc = upnode_pick(un, pin);
        if (uc == NULL) {
            upnode_fail_waiting(un, "is unavailable (connect failed; retrying shortly)", true);
            break;
        }
        struct frag *f = upqueue_pop(&un->wait, quantum, &pin);
        if (frag_abandoned(f)) { /* its client is gone (closed over --buffers-max, say) */
            w->inflight--;
            frag_destroy(f);
            continue;
        }
        upnode_send(un, uc, f, pin);
    }
    if (un->abandon) upnode_abandon(un); /* marked down by a connect failing just now */
}

void upnode_submit(struct upnode *un, struct frag *f)
{
    struct rworker *w = un->w;
    if (catchup_hold(un, f)) return; /* sent when the catch-up of the replica is answered */
    f->next = NULL;
    f->park_version = w->topo ? w->topo->version : 0; /* routed by it (moved-retry) */
    f->deadline_ms = w->now_ms + w->r->cfg.timeout_ms;
    w->inflight++;
    if (!f->probe) SCOPESTAT_ADD(&w->r->scopes, w->id, f->pool, -1, requests);
    if ((un->down || f->held) && !f->probe) { /* never make a client wait on a node down */
        if (un->down && upnode_failover(un, f, false, false)) return;
        char msg[256];
        int n = snprintf(msg, sizeof msg, "SERVER_ERROR shoal-router: node %s is down%s\r\n",
                         un->node.addr, un->down ? "" : " (back, being repaired)");
        w->m.down_node_requests++;
        frag_fail(un, f, msg, (size_t)n);
        return;
    }
    if (f->exclusive) {
        if (un->dwait_tail) un->dwait_tail->next = f;
        else un->dwait = f;
        un->dwait_tail = f;
        upnode_pump_dump(un);
        return;
    }
    /* its client's flow (the router's own requests share pin 0): as upnode_pick's pin */
    unsigned pin = f->rq && f->rq->cl ? (unsigned)f->rq->cl->fd : 0;
    uint32_t room = upnode_room(un);
    bool no_conn = false;
    if (!un->abandon && upqueue_empty(&un->wait) && un->outstanding < room) {
        /* nobody waits and the window has room: what upnode_pump would do at once, without
         * passing f through the queue (a flow taken and given back per request) */
        upnode_pump_dump(un);
        struct upconn *uc = upnode_pick(un, pin);
        if (uc != NULL) {
            upnode_send(un, uc, f, pin);
            if (un->abandon) upnode_abandon(un); /* marked down by a connect failing now */
            return;
        }
        no_conn = true;
    }
    if (upqueue_push(&un->wait, f, pin) < 0) {
        static const char oom[] = "SERVER_ERROR out of memory\r\n";
        w->m.out_of_memory++;
        frag_fail(un, f, oom, sizeof oom - 1);
        return;
    }
    if (no_conn) { /* as upnode_pump does when it finds none, without a second connect */
        upnode_fail_waiting(un, "is unavailable (connect failed; retrying shortly)", true);
        if (un->abandon) upnode_abandon(un);
        return;
    }
    if (un->outstanding >= room) w->m.window_waits++;
    upnode_pump(un);
}

/* The first line of p (n bytes) without its \r\n, at most 80 bytes: for a log line. */
static int upconn_loggable(const char *p, size_t n)
{
    const char *cr = memchr(p, '\r', n);
    size_t k = cr ? (size_t)(cr - p) : n;
    return (int)(k < 80 ? k : 80);
}

/* The node answered f with a reply of another kind (or for other keys): it cannot be trusted
 * on this connection, and since a wrong or stray reply shifts every later one onto the wrong
 * request, the requests on it fail as for a reply that does not parse. */
static void upconn_mismatch(struct upconn *uc, struct frag *f, size_t len)
{
    struct upnode *un = uc->un;
    const char *req = buf_start(&f->out), *reply = buf_start(&uc->rbuf);
    un->w->m.upstream_protocol_errors++;
    char ereq[4 * 80 + 1], erep[4 * 80 + 1]; /* keys may hold control bytes */
    log_warn("node %s answered \"%s\" with \"%s\"; reconnecting", un->node.addr,
             log_escape(ereq, sizeof ereq, req, (size_t)upconn_loggable(req, buf_used(&f->out))),
             log_escape(erep, sizeof erep, reply, (size_t)upconn_loggable(reply, len)));
    upconn_fail(uc, "sent a reply that does not match its request", false);
}

/* A fragment leaves the head of uc's sent queue (answered, or failed alone): one reply fewer
 * before a pending sync's MN. */
static void upconn_pop(struct upconn *uc, struct frag *f)
{
    struct upnode *un = uc->un;
    uc->sent = f->next;
    if (uc->sent == NULL) uc->sent_tail = NULL;
    uc->nsent--;
    un->outstanding--;
    upnode_unstray(un, f);
    un->w->inflight--;
    if (uc->syncing && uc->sync_left > 0) uc->sync_left--;
}

/* The head fragment f got a reply of its kind that echoes another key or opaque
 * (reply_check_want: RFIT_ECHO). Either the client's request made the node answer in a way the
 * router did not foresee, or the node's replies have shifted onto the wrong requests. The
 * first is no fault of the node and must not cost anyone but that client (no reset of a
 * connection other clients share, nothing towards marking the node down); the second is. So
 * f fails alone, and an `mn` goes behind the requests already on the connection: memcached
 * answers in order, so its MN must come after exactly their replies (upconn_parse checks it;
 * one mn covers every suspect reply before it). Until then the replies that fit their requests
 * are passed on, as always: a shift that keeps fitting is found at the MN. The reply is still
 * the node's answer to a write (a replica's, or an owner's that a failure would have logged
 * for repair): the repair logic sees it as such, so a client's odd writes log nothing. */
static void upconn_suspect(struct upconn *uc, struct frag *f, const char *reply, size_t len)
{
    struct upnode *un = uc->un;
    struct rworker *w = un->w;
    bool start = !uc->syncing;
    if (start && buf_append(&uc->wbuf, "mn\r\n", 4) < 0) { /* no check possible: as before */
        w->m.out_of_memory++;
        upconn_mismatch(uc, f, len);
        return;
    }
    const char *req = buf_start(&f->out);
    char ereq[4 * 80 + 1], erep[4 * 80 + 1];
    log_info_limited("node %s answered \"%s\" with \"%s\": failing that request alone",
                     un->node.addr,
                     log_escape(ereq, sizeof ereq, req,
                                (size_t)upconn_loggable(req, buf_used(&f->out))),
                     log_escape(erep, sizeof erep, reply, (size_t)upconn_loggable(reply, len)));
    upconn_pop(uc, f);
    if (start) { /* behind every request now on the connection, before any sent after */
        uc->syncing = true;
        uc->sync_left = uc->nsent;
        upconn_mark_dirty(uc);
    }
    uc->suspects++;
    if (f->repl) { /* the node's answer, for the repair logic; the client gets an error */
        replica_frag_done(f, reply, len, false);
        replica_write_free(f->repl);
        f->repl = NULL;
    }
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "SERVER_ERROR shoal-router: node %s sent a reply that does not match its "
                     "request\r\n", un->node.addr);
    if (n < 0 || (size_t)n >= sizeof msg) n = (int)sizeof msg - 1;
    if (!f->probe) SCOPESTAT_ADD(&w->r->scopes, w->id, f->pool, f->ns, errors);
    frag_complete(f, msg, (size_t)n, true);
}

/* A sync is due (syncing, no reply left before its MN): 1 when the MN was there (consumed: the
 * suspect replies were the requests' own fault), 0 when more bytes are needed, -1 when the
 * node's replies had shifted (the connection has failed, as for any reply no request
 * explains). */
static int upconn_sync(struct upconn *uc)
{
    struct rworker *w = uc->un->w;
    size_t have = buf_used(&uc->rbuf), k = have < 4 ? have : 4;
    if (memcmp(buf_start(&uc->rbuf), "MN\r\n", k) != 0) {
        w->m.upstream_protocol_errors++;
        log_warn_limited("node %s: replies shifted (its MN was not after the replies before "
                         "it); reconnecting", uc->un->node.addr);
        upconn_fail(uc, "sent replies that do not match their requests", false);
        return -1;
    }
    if (have < 4) return 0;
    buf_consume(&uc->rbuf, 4);
    uc->syncing = false;
    w->m.client_caused_reply_errors += uc->suspects;
    uc->suspects = 0;
    return 1;
}

/* The head fragment f is answered with a list of lines (reply_want.list: stats, dumps): pass
 * each whole line of the list on as it arrives (frag_part), so a dump of any size goes through
 * without being held, and each line of a dump pushes the fragment's deadline back (a long dump
 * is not a slow node). A stats reply is held and summed whole, so it keeps its deadline: one
 * that never ends times out instead of holding its client forever. Returns the length of the reply's last line (END, or the one line that is the whole
 * reply), left at the start of rbuf for the caller to complete f with; 0 when it has not
 * arrived; -1 when the connection failed (a line that cannot be in the reply). uc->rscan counts
 * the lines passed on. */
static long upconn_list(struct upconn *uc, struct frag *f)
{
    struct rworker *w = uc->un->w;
    for (;;) {
        size_t ll = 0;
        enum reply_lline k = reply_list_line(&f->want, buf_start(&uc->rbuf), buf_used(&uc->rbuf),
                                             uc->rscan == 0, &ll);
        if (k == RLL_MORE) return 0;
        if (k == RLL_END || k == RLL_ONE) return (long)ll;
        if (k == RLL_BAD) {
            upconn_mismatch(uc, f, ll ? ll : buf_used(&uc->rbuf));
            return -1;
        }
        frag_part(f, buf_start(&uc->rbuf), ll);
        buf_consume(&uc->rbuf, ll);
        uc->rscan++;
        if (f->want.list == RLIST_ITEM || f->want.list == RLIST_KEY)
            f->deadline_ms = w->now_ms + w->r->cfg.timeout_ms;
    }
}

/* Match complete replies in rbuf to the fragments sent, oldest first. */
static void upconn_parse(struct upconn *uc)
{
    struct upnode *un = uc->un;
    struct rworker *w = un->w;
    while (buf_used(&uc->rbuf) > 0) {
        if (uc->syncing && uc->sync_left == 0) {
            int rc = upconn_sync(uc);
            if (rc < 0) return;
            if (rc == 0) break;
            continue;
        }
        if (uc->sent == NULL) {
            w->m.upstream_protocol_errors++;
            log_warn_limited("node %s sent bytes nobody asked for; reconnecting", un->node.addr);
            upconn_fail(uc, "sent an unexpected reply", false);
            return;
        }
        long len = uc->sent->want.list != RLIST_NONE
                       ? upconn_list(uc, uc->sent)
                       : reply_length(buf_start(&uc->rbuf), buf_used(&uc->rbuf),
                                      w->r->cfg.item_max, uc->sent->max_reply, &uc->rscan);
        if (len == 0) break;
        if (len < 0 && uc->state == UP_DOWN) return; /* upconn_list failed it */
        if (len < 0) {
            w->m.upstream_protocol_errors++;
            log_warn_limited("node %s sent a reply that does not parse; reconnecting", un->node.addr);
            upconn_fail(uc, "sent a reply that does not parse", false);
            return;
        }
        struct frag *f = uc->sent;
        size_t used = (size_t)len; /* the bytes of rbuf that answer f */
        static const char mn[] = "MN\r\n", hd[] = "HD\r\n";
        const char *reply = buf_start(&uc->rbuf);
        if (f->quiet_mn && len == 4 && !memcmp(reply, mn, 4)) {
            f->hidden = true; /* q hid a hit: an HD to the router, nothing to the client */
            reply = hd;
        } else {
            enum reply_fit fit = reply_check_want(&f->want, buf_start(&f->out), reply,
                                                  (size_t)len);
            if (fit == RFIT_BAD) {
                upconn_mismatch(uc, f, (size_t)len);
                return;
            }
            if (f->quiet_mn) { /* the node's answer, then the MN of the mn sent behind it */
                if (buf_used(&uc->rbuf) < (size_t)len + 4) break;
                if (memcmp(reply + len, mn, 4)) {
                    upconn_mismatch(uc, f, (size_t)len + 4);
                    return;
                }
                used += 4;
            }
            if (fit == RFIT_ECHO) {
                uc->rscan = 0;
                upconn_suspect(uc, f, reply, (size_t)len);
                if (uc->state == UP_DOWN) return;
                buf_consume(&uc->rbuf, used);
                continue;
            }
        }
        /* a refusal because the slot moved: sent again once a newer topology comes (failover.h),
         * so it keeps its bytes */
        bool park = f->movable && (!f->moved || w->now_ms < f->moved_until_ms) && !f->quiet_mn &&
                    failover_is_moved(reply, (size_t)len);
        /* its line is done with; a small buffer stays, for the fragment's reuse (request.c) */
        if (!park) frag_unkeep(f); /* answered: a kept large request's bytes go */
        if (park) {
        } else if (f->out.cap > FRAG_LINE_KEEP) {
            buf_release(&f->out);
        } else {
            buf_consume(&f->out, buf_used(&f->out));
        }
        upconn_pop(uc, f);
        if (f->want.list != RLIST_NONE && uc->rscan > 0) {
            /* the requests behind a dump waited for it, not for a slow node: their time starts
             * now (the dump's own deadline moved with each line) */
            for (struct frag *g = uc->sent; g; g = g->next)
                if (g->deadline_ms < w->now_ms + w->r->cfg.timeout_ms)
                    g->deadline_ms = w->now_ms + w->r->cfg.timeout_ms;
        }
        uc->rscan = 0;
        upnode_success(un, f->probe);
        /* it answers: a later failure needs a catch-up of its own (catchup.h); not a fenced
         * node's refusal, or each read falling back from it would start one */
        if (!park) un->catchup_spent = false;
        if (!f->probe) {
            uint64_t us = w->now_us - f->sent_us;
            if (un->stat) lathist_record(&un->stat->lat, us);
            scopestat_latency(&w->r->scopes, w->id, f->pool, -1, us);
        }
        un->reply_avg16 = un->reply_avg16 - un->reply_avg16 / 16 + used;
        if (un->window < w->r->cfg.upstream_window && ++un->grow >= un->window) {
            un->window++; /* additive increase: one per window of replies */
            un->grow = 0;
        }
        if (!park || !failover_park(un, f, reply, (size_t)len))
            frag_complete(f, reply, (size_t)len, false);
        buf_consume(&uc->rbuf, used);
    }
    if (buf_used(&uc->rbuf) == 0) buf_compact(&uc->rbuf, UPSTREAM_BUF_KEEP);
}

static void upconn_write(struct upconn *uc)
{
    struct rworker *w = uc->un->w;
    while (buf_used(&uc->wbuf) > 0) {
        ssize_t n = send(uc->fd, buf_start(&uc->wbuf), buf_used(&uc->wbuf), MSG_NOSIGNAL);
        if (n > 0) {
            buf_consume(&uc->wbuf, (size_t)n);
            uc->written += (uint64_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!uc->epollout) {
                uc->epollout = true;
                upconn_set_events(uc);
            }
            return;
        }
        char why[160];
        snprintf(why, sizeof why, "write failed: %s", strerror(errno));
        upconn_fault(uc, why, false);
        upnode_pump(uc->un);
        return;
    }
    buf_compact(&uc->wbuf, UPSTREAM_BUF_KEEP);
    if (uc->epollout) {
        uc->epollout = false;
        upconn_set_events(uc);
    }
    (void)w;
}

void upconn_event(struct upconn *uc, uint32_t events)
{
    struct upnode *un = uc->un;
    struct rworker *w = un->w;
    if (uc->state == UP_DOWN) return; /* failed earlier in this batch: a stale event */
    if (uc->state == UP_CONNECTING) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(uc->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr == 0 && (events & EPOLLERR)) soerr = ECONNREFUSED;
        if (soerr != 0) {
            w->m.upstream_connect_failures++;
            un->retry_at_ms = w->now_ms + w->r->cfg.retry_ms;
            char why[160];
            snprintf(why, sizeof why, "is unavailable: %s", strerror(soerr));
            upconn_fault(uc, why, false);
            upnode_pump(un);
            return;
        }
        if (!(events & (EPOLLOUT | EPOLLIN))) return;
        uc->state = UP_READY;
        upconn_set_events(uc);
        upconn_mark_dirty(uc);
    }
    if (events & EPOLLIN) {
        for (int rounds = 0; rounds < 4; rounds++) {
            if (buf_reserve(&uc->rbuf, UPSTREAM_READ_CHUNK) < 0) {
                w->m.out_of_memory++;
                upconn_fail(uc, "reply could not be buffered (out of memory)", false);
                upnode_pump(un);
                return;
            }
            ssize_t n = read(uc->fd, uc->rbuf.data + uc->rbuf.len, uc->rbuf.cap - uc->rbuf.len);
            if (n > 0) {
                uc->rbuf.len += (size_t)n;
                upconn_parse(uc);
                if (uc->state == UP_DOWN) break;
                if ((size_t)n < UPSTREAM_READ_CHUNK) break;
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
            upconn_fault(uc, n == 0 ? "closed the connection" : "connection failed", false);
            break;
        }
    } else if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
        upconn_fault(uc, "closed the connection", false);
    }
    if (uc->state == UP_READY && (events & EPOLLOUT)) upconn_mark_dirty(uc);
    upnode_pump(un);
}

void upstream_flush(struct rworker *w)
{
    while (w->dirty_up) {
        struct upconn *uc = w->dirty_up;
        w->dirty_up = uc->dirty_next;
        uc->in_dirty = false;
        if (uc->state == UP_READY) upconn_write(uc);
    }
}

/* Send one `version` to a node marked down; its reply marks the node up. */
static void upnode_probe(struct upnode *un)
{
    struct frag *f = frag_create(NULL, 0);
    if (f == NULL || buf_append(&f->out, "version\r\n", 9) < 0) {
        if (f) frag_destroy(f);
        un->w->m.out_of_memory++;
        return;
    }
    f->probe = true;
    upnode_submit(un, f);
}

void upstream_check_timeouts(struct rworker *w)
{
    char why[96];
    snprintf(why, sizeof why, "timed out after %llu ms",
             (unsigned long long)w->r->cfg.timeout_ms);
    for (struct upnode **pp = &w->upnodes, *un; (un = *pp) != NULL;) {
        /* waited --timeout-ms in the router's queue, never sent: the node is not counted
         * against (its timeouts, --down-after), as it never had the request */
        for (struct frag *f = upqueue_take_expired(&un->wait, w->now_ms), *next; f; f = next) {
            next = f->next;
            if (frag_abandoned(f)) { /* nobody waits for it: dropped, as upnode_pump would */
                w->inflight--;
                frag_destroy(f);
                continue;
            }
            w->m.window_timeouts++;
            if (f->failover != FAILOVER_NONE && failover_retry(un, f, false)) continue;
            SCOPESTAT_ADD(&w->r->scopes, w->id, f->pool, f->ns, timeouts);
            char msg[256];
            int n = snprintf(msg, sizeof msg,
                             "SERVER_ERROR shoal-router: node %s timed out (request never sent: "
                             "window full)\r\n", un->node.addr);
            frag_fail(un, f, msg, (size_t)n);
        }
        for (uint32_t i = 0; i <= un->nconns; i++) { /* and the dump connection */
            struct upconn *uc = &un->conns[i];
            if (uc->sent && uc->sent->deadline_ms <= w->now_ms) {
                log_info_limited("node %s: request timed out; reconnecting", un->node.addr);
                upconn_fault(uc, why, true);
            }
        }
        if (un->down && !un->retired && w->now_ms >= un->next_probe_ms) {
            un->next_probe_ms = w->now_ms + w->r->cfg.probe_ms;
            upnode_probe(un);
        }
        if (!repairlog_clean(&un->repair)) replica_repair(un);
        upnode_pump(un);
        if (un->retired && upnode_idle(un)) {
            *pp = un->next;
            upnode_destroy(un);
            continue;
        }
        pp = &un->next;
    }
}

uint64_t upstream_idle_ms(const struct rworker *w, uint64_t most)
{
    uint64_t due = w->now_ms + most;
    for (const struct upnode *un = w->upnodes; un; un = un->next) {
        if (un->retired) continue; /* neither probed nor repaired */
        if (un->down && un->next_probe_ms < due) due = un->next_probe_ms;
        if (!un->down && !repairlog_clean(&un->repair) && un->repair_at_ms < due)
            due = un->repair_at_ms;
    }
    return due > w->now_ms ? due - w->now_ms : 0;
}

void upnode_destroy(struct upnode *un)
{
    un->destroying = true;
    for (uint32_t i = 0; i <= un->nconns; i++) {
        struct upconn *uc = &un->conns[i];
        if (uc->in_dirty) { /* unlink from the worker's dirty list */
            for (struct upconn **pp = &un->w->dirty_up; *pp; pp = &(*pp)->dirty_next)
                if (*pp == uc) {
                    *pp = uc->dirty_next;
                    break;
                }
        }
        upconn_fail(uc, "was removed from the topology", false);
    }
    upnode_fail_waiting(un, "was removed from the topology", false);
    catchup_drop_held(un);
    upqueue_free(&un->wait);
    repairlog_free(&un->repair);
    free(un);
}
