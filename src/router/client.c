/* client.c — application connections: read, parse, dispatch, keep replies in order, write
 * (see client.h).
 *
 * Requests are parsed with src/protocol exactly as shoal-node parses them, so malformed input
 * gets the node's (memcached's) error lines without a round trip. Commands about keys go to
 * route.c, stats and dumps to statsmerge.c; the rest (version, mn, quit, ...) are answered
 * here, in order behind the replies still awaited from nodes. */
#include "router/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/options.h"
#include "router/route.h"
#include "router/statsmerge.h"
#include "router/upstream.h"
#include "router/worker.h"

#define CLIENT_READ_CHUNK 16384
#define CLIENT_BUF_KEEP (64 * 1024)
/* A closed client's buffer at least this large gives its pages back as it is freed. */
#define CLIENT_BUF_GIVE_BACK (64 * 1024)

static const char oom_reply[] = "SERVER_ERROR out of memory\r\n";

struct client *client_create(struct rworker *w, int fd)
{
    struct client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        close(fd);
        return NULL;
    }
    c->evkind = EV_CLIENT;
    c->w = w;
    c->fd = fd;
    c->last_in_ms = c->last_out_ms = c->req_start_ms = w->now_ms;
    buf_init(&c->rbuf);
    buf_init(&c->wbuf);
    buf_init(&c->lline);
    c->evmask = EPOLLIN | EPOLLRDHUP;
    struct epoll_event ev = {.events = c->evmask, .data.ptr = c};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(fd);
        free(c);
        return NULL;
    }
    c->next = w->clients;
    if (w->clients) w->clients->prev = c;
    w->clients = c;
    connlist_add(&w->r->conns, &c->listed, fd, (uint32_t)(w->now_ms / 1000));
    return c;
}

/* Free a closed client's buffer; a large one's pages go back to the system first. Freed to
 * the allocator alone they would stay resident until the next malloc_trim (at most once a
 * second, membudget.h), and the sweep closes hundreds of 1 MB slowloris buffers in that time,
 * faster than new ones reuse them: RSS reached twice --buffers-max. The chunk's first page is
 * kept, where the allocator writes its own bookkeeping on free. */
static void client_buf_give_back(struct buf *b)
{
    if (b->cap >= CLIENT_BUF_GIVE_BACK) {
        uintptr_t page = 4096;
        uintptr_t lo = ((uintptr_t)b->data + page) & ~(page - 1);
        uintptr_t hi = ((uintptr_t)b->data + b->cap) & ~(page - 1);
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
    buf_release(b);
}

void client_destroy(struct client *c)
{
    struct rworker *w = c->w;
    /* A request failed synchronously while this client was being serviced may have put it
     * back on the dirty list: take it off, or the worker would service freed memory. */
    if (c->in_dirty) {
        for (struct client **pp = &w->dirty; *pp; pp = &(*pp)->dirty_next)
            if (*pp == c) {
                *pp = c->dirty_next;
                break;
            }
    }
    connlist_remove(&w->r->conns, &c->listed);
    epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    while (c->head) {
        struct rreq *rq = c->head;
        c->head = rq->next;
        rreq_destroy(rq);
    }
    if (c->prev) c->prev->next = c->next;
    else w->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    client_buf_give_back(&c->rbuf);
    client_buf_give_back(&c->wbuf);
    client_buf_give_back(&c->lline);
    membudget_release(&w->r->budget, &c->acct);
    free(c);
    __atomic_fetch_sub(&w->r->curr_conns, 1, __ATOMIC_RELAXED);
}

void client_mark_dirty(struct client *c)
{
    if (c->in_dirty) return;
    c->in_dirty = true;
    c->dirty_next = c->w->dirty;
    c->w->dirty = c;
}

/* Account for one read of the client's socket: bytes, 0 at EOF or -errno. */
void client_read_done(struct client *c, int res)
{
    if (res > 0) {
        if (buf_used(&c->rbuf) == 0) c->req_start_ms = c->w->now_ms;
        c->rbuf.len += (size_t)res;
        c->w->m.bytes_read += (uint64_t)res;
        c->last_in_ms = c->w->now_ms;
    } else if (res == 0) {
        c->eof = true; /* half-closed: still answer what it sent */
    } else if (res != -EAGAIN && res != -EWOULDBLOCK && res != -EINTR) {
        c->dead = true;
    }
}

void client_event(struct client *c, uint32_t events, struct uring *ring)
{
    client_mark_dirty(c);
    if (events & (EPOLLERR | EPOLLHUP)) {
        c->dead = true;
        return;
    }
    if (!(events & (EPOLLIN | EPOLLRDHUP)) || c->paused || c->eof || c->closing) return;
    if (buf_reserve(&c->rbuf, CLIENT_READ_CHUNK) < 0) {
        c->w->m.out_of_memory++;
        c->dead = true;
        return;
    }
    char *dst = c->rbuf.data + c->rbuf.len;
    size_t room = c->rbuf.cap - c->rbuf.len;
    if (ring && uring_recv(ring, c->fd, dst, room, c) == 0) return; /* client_read_done later */
    ssize_t n = read(c->fd, dst, room);
    client_read_done(c, n >= 0 ? (int)n : -errno);
}

void client_enqueue(struct client *c, struct rreq *rq)
{
    rq->next = NULL;
    if (c->tail) c->tail->next = rq;
    else c->head = rq;
    c->tail = rq;
    c->npending++;
    rq->lget_part = c->lget.cmd != CMD_NONE;
}

void client_drain(struct client *c)
{
    while (c->head && c->head->done) {
        struct rreq *rq = c->head;
        c->head = rq->next;
        if (c->head == NULL) c->tail = NULL;
        c->npending--;
        c->held -= rq->held_bytes;
        c->req_bytes -= rq->in_bytes;
        if (rq->lget_part) client_lget_filter(c, rq);
        if (!rq->direct && buf_used(&rq->reply) &&
            buf_append(&c->wbuf, buf_start(&rq->reply), buf_used(&rq->reply)) < 0) {
            c->w->m.out_of_memory++;
            c->closing = true; /* the reply stream would be corrupt */
        }
        if (rq->kind == RQ_QUIT) c->closing = true;
        rreq_destroy(rq);
    }
}

void client_local(struct client *c, const char *s, size_t n)
{
    c->w->m.cmd_local++;
    if (c->head == NULL && c->lget.cmd == CMD_NONE) { /* a long get's parts are filtered */
        if (buf_append(&c->wbuf, s, n) < 0) {
            c->w->m.out_of_memory++;
            c->closing = true;
        }
        return;
    }
    struct rreq *rq = rreq_create(c, RQ_LOCAL, CMD_NONE);
    if (rq == NULL || buf_append(&rq->reply, s, n) < 0) {
        if (rq) rreq_destroy(rq);
        c->w->m.out_of_memory++;
        c->closing = true;
        return;
    }
    rq->done = true;
    client_enqueue(c, rq);
}

void client_local_str(struct client *c, const char *s) { client_local(c, s, strlen(s)); }

void client_oom(struct client *c)
{
    c->w->m.out_of_memory++;
    client_local(c, oom_reply, sizeof oom_reply - 1);
}

/* Parse and route one request line. `avail` counts the bytes buffered from the line's start.
 * Returns the bytes consumed, or 0 when the line must wait: a storage command's data block is
 * not all here, or a metadump waits for the answers to earlier requests (c->paused set). */
static size_t client_run_line(struct client *c, char *line, size_t len, size_t avail)
{
    struct rworker *w = c->w;
    struct router_config *cfg = &w->r->cfg;
    struct proto_req req;
    const char *err = NULL;
    size_t used = len + 1;
    /* a NUL ends the line for the node as for memcached: forward only what it will read, so
     * replies are matched against the request the node answers */
    const char *nul = memchr(line, '\0', len);
    if (nul != NULL) len = (size_t)(nul - line);
    enum proto_status st = proto_parse(line, len, cfg->item_max, &req, &err);
    if (st == PROTO_ERR_TOO_LARGE) {
        if (req.cmd == CMD_MS || !req.noreply)
            client_local_str(c, "SERVER_ERROR object too large for cache\r\n");
        c->swallow = (uint64_t)req.nbytes + 2;
        return used;
    }
    if (st == PROTO_ERR_CLOSE) { /* an HTTP request: closed with no reply, as memcached does */
        w->m.protocol_errors++;
        c->closing = true;
        return used;
    }
    if (st != PROTO_OK) {
        w->m.protocol_errors++;
        /* as the node: a text command's errors are silent under noreply, meta's never */
        if (!(req.noreply && req.cmd < CMD_MG && st != PROTO_ERR_UNKNOWN)) {
            client_local_str(c, err);
            client_local(c, "\r\n", 2);
        }
        if (st == PROTO_ERR_CLIENT_SWALLOW) c->swallow = (uint64_t)req.nbytes + 2;
        return used;
    }
    switch (req.cmd) {
    case CMD_SET: case CMD_ADD: case CMD_REPLACE: case CMD_APPEND: case CMD_PREPEND:
    case CMD_CAS: case CMD_MS: {
        size_t need = (size_t)req.nbytes + 2;
        if (avail - used < need) {
            c->req_need = used + need; /* what it will hold: client_budget.c weighs it */
            return 0;
        }
        w->m.cmd_set++;
        if (!route_admit(c, req.key, req.nkey, (uint64_t)req.nbytes,
                          req.noreply && req.cmd != CMD_MS))
            return used + need;
        if (!route_replicate(c, &req, line, len, line + used, need))
            route_forward(c, &req, line, len, line + used, need);
        return used + need;
    }
    case CMD_GET: case CMD_GETS: case CMD_GAT: case CMD_GATS:
        route_get(c, &req, line, len);
        break;
    case CMD_MG:
        w->m.cmd_get++;
        if (route_admit(c, req.key, req.nkey, 0, false)) route_forward(c, &req, line, len, NULL, 0);
        break;
    case CMD_DELETE: case CMD_INCR: case CMD_DECR: case CMD_TOUCH:
    case CMD_MD: case CMD_MA: case CMD_ME:
        w->m.cmd_other++;
        if (!route_admit(c, req.key, req.nkey, 0, req.noreply && req.cmd < CMD_MG)) break;
        if (!route_replicate(c, &req, line, len, NULL, 0))
            route_forward(c, &req, line, len, NULL, 0);
        break;
    case CMD_FLUSH_ALL:
        w->m.cmd_other++;
        route_all(c, &req, line, len);
        break;
    case CMD_FLUSH_NS:
        w->m.cmd_other++;
        route_flush_ns(c, &req, line, len);
        break;
    case CMD_MN:
        client_local(c, "MN\r\n", 4);
        break;
    case CMD_VERSION:
        client_local_str(c, "VERSION " ROUTER_WIRE_VERSION "\r\n");
        break;
    case CMD_VERBOSITY:
        if (!req.noreply) client_local(c, "OK\r\n", 4);
        break;
    case CMD_STATS:
        statsmerge_stats(c, &req);
        break;
    case CMD_SHUTDOWN:
        client_local_str(c, "ERROR: shutdown not enabled\r\n");
        break;
    case CMD_CACHE_MEMLIMIT:
        if (!req.noreply)
            client_local_str(c, "CLIENT_ERROR cache_memlimit is a node setting; "
                                "shoal-router holds no items\r\n");
        break;
    case CMD_LRU_CRAWLER: /* metadump asks every node; the other forms tune nothing a router has */
        if (req.narg >= 8 && !memcmp(req.arg, "metadump", 8) && (req.narg == 8 || req.arg[8] == ' ')) {
            /* the dump goes on each node's dump connection, which would overtake this client's
             * earlier requests: start it once they are answered, so it sees their writes */
            if (c->npending > 0) {
                c->paused = true; /* client_finish runs the line again as replies drain */
                return 0;
            }
            statsmerge_lru_crawler(c, line, len);
            break;
        }
        /* fall through */
    case CMD_SLABS: case CMD_LRU: case CMD_WATCH: {
        bool silent; /* the same constant answers as a node's */
        const char *r = proto_tune_reply(&req, &silent);
        if (!silent) {
            client_local_str(c, r);
            client_local(c, "\r\n", 2);
        }
        break;
    }
    case CMD_QUIT: {
        struct rreq *rq = rreq_create(c, RQ_QUIT, req.cmd);
        if (rq == NULL) {
            c->closing = true;
            break;
        }
        rq->done = true;
        client_enqueue(c, rq);
        c->closing = true; /* read nothing more; close once earlier replies are out */
        break;
    }
    default:
        client_local_str(c, "ERROR\r\n");
        break;
    }
    return used;
}

/* Run complete requests from the input buffer while the client's window allows. */
static void client_process(struct client *c)
{
    struct router_config *cfg = &c->w->r->cfg;
    size_t soft = cfg->out_max / 4;
    /* client buffers over half their budget: no more requests while about a reply waits */
    bool pressed = soft > MEMBUDGET_PRESSED_OUT && membudget_pressed(&c->w->r->budget);
    if (pressed) soft = MEMBUDGET_PRESSED_OUT;
    bool was_paused = c->paused;
    c->paused = false;
    if (buf_used(&c->rbuf) > 0) connlist_touch(&c->listed, (uint32_t)(c->w->now_ms / 1000));
    while (!c->closing && !c->dead) {
        /* replies held behind a slower one count too, or a stalled head would let a client
         * that does not read send requests without bound */
        uint64_t waiting = buf_used(&c->wbuf) + c->held + c->req_bytes;
        /* ...and, pressed, what its requests in flight cost until answered */
        uint64_t cost = pressed ? (uint64_t)c->npending * CLIENT_PENDING_COST : 0;
        if (c->npending >= cfg->client_pending || waiting + cost > soft) {
            if (pressed && !was_paused && c->npending < cfg->client_pending &&
                waiting <= cfg->out_max / 4)
                c->w->m.conns_paused_budget++;
            c->paused = true;
            return;
        }
        size_t avail = buf_used(&c->rbuf);
        if (avail == 0) return;
        if (c->swallow) {
            size_t n = avail < c->swallow ? avail : (size_t)c->swallow;
            buf_consume(&c->rbuf, n);
            c->swallow -= n;
            continue;
        }
        if (c->lget.cmd != CMD_NONE) {
            if (!client_lget_step(c)) return; /* wait for more of the line */
            continue;
        }
        char *start = buf_start(&c->rbuf);
        if ((unsigned char)start[0] == 0x80) { /* binary protocol: as shoal-node (conn.c) */
            c->w->m.protocol_errors++;
            client_local_str(c, "ERROR\r\n");
            c->closing = true;
            return;
        }
        char *nl = memchr(start, '\n', avail);
        if (nl == NULL || (size_t)(nl - start) > cfg->line_max) {
            if (nl == NULL && avail <= cfg->line_max) return; /* wait for the rest */
            if (client_lget_begin(c, start, avail)) continue; /* a get line: routed in parts */
            c->w->m.protocol_errors++;
            client_local_str(c, "CLIENT_ERROR line too long\r\n");
            c->closing = true;
            return;
        }
        struct rreq *last = c->tail;
        size_t used = client_run_line(c, start, (size_t)(nl - start), avail);
        if (used == 0) return; /* data block still arriving */
        if (c->tail && c->tail != last) { /* its bytes live in its fragments until answered */
            c->tail->in_bytes = used;
            c->req_bytes += used;
        }
        buf_consume(&c->rbuf, used);
        c->req_start_ms = c->w->now_ms;
        c->req_need = 0;
    }
}

static void client_set_events(struct client *c)
{
    uint32_t want = ((c->paused || c->eof || c->closing) ? 0 : EPOLLIN | EPOLLRDHUP) |
                    (c->epollout ? EPOLLOUT : 0);
    if (want == c->evmask) return;
    c->evmask = want;
    struct epoll_event ev = {.events = want, .data.ptr = c};
    epoll_ctl(c->w->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Send queued output. -1 when the connection failed. */
static int client_flush(struct client *c)
{
    while (buf_used(&c->wbuf) > 0) {
        ssize_t n = send(c->fd, buf_start(&c->wbuf), buf_used(&c->wbuf), MSG_NOSIGNAL);
        if (n > 0) {
            c->w->m.bytes_written += (uint64_t)n;
            c->last_out_ms = c->w->now_ms;
            buf_consume(&c->wbuf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->epollout = true;
            return 0;
        }
        return -1;
    }
    c->epollout = false;
    buf_compact(&c->wbuf, CLIENT_BUF_KEEP);
    return 0;
}

bool client_prepare(struct client *c)
{
    if (c->dead) {
        client_destroy(c);
        return false;
    }
    client_process(c);
    client_drain(c);
    client_budget_account(c); /* before other clients' requests run in this batch */
    return true;
}

bool client_wants_send(const struct client *c)
{
    return buf_used(&c->wbuf) > 0 && !c->epollout;
}

int client_send_done(struct client *c, int res)
{
    if (res > 0) {
        c->w->m.bytes_written += (uint64_t)res;
        c->last_out_ms = c->w->now_ms;
        buf_consume(&c->wbuf, (size_t)res);
        return 0;
    }
    if (res == -EAGAIN || res == -EWOULDBLOCK || res == -EINTR) return 0; /* flushed again */
    return -1;
}

void client_finish(struct client *c, int sent)
{
    if (sent < 0 || client_flush(c) < 0) goto destroy;
    /* output drained below the soft limit: requests already buffered may run now */
    if (c->paused && buf_used(&c->wbuf) == 0 && c->npending < c->w->r->cfg.client_pending) {
        client_process(c);
        if (client_flush(c) < 0) goto destroy;
    }
    if ((c->closing || c->eof) && c->npending == 0 && buf_used(&c->wbuf) == 0) goto destroy;
    if (buf_used(&c->rbuf) == 0) buf_compact(&c->rbuf, CLIENT_BUF_KEEP);
    client_budget_account(c);
    client_set_events(c);
    /* what `stats conns` shows for it until it is serviced again */
    connlist_set_state(&c->listed, c->closing ? CONNLIST_CLOSING
                                   : buf_used(&c->wbuf) > 0 ? CONNLIST_WRITE
                                   : c->npending > 0 ? CONNLIST_IO_QUEUE
                                   : c->swallow > 0 ? CONNLIST_SWALLOW : CONNLIST_READ);
    return;
destroy:
    client_destroy(c);
}
