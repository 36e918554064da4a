/* conn.c — connection I/O and the request loop (see conn.h). */
#include "node/conn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/cmd.h"
#include "node/cmd_dump.h"
#include "node/cmd_store.h"
#include "node/repl.h"
#include "node/repl_wire.h"

#define CONN_READ_CHUNK 16384
/* Values with at least this much left to come are read straight into their item or staging
 * buffer when the input buffer is empty. */
#define CONN_DIRECT_READ 8192
/* Buffers larger than this are freed when the connection goes idle. */
#define CONN_BUF_KEEP (64 * 1024)

static void conn_update_events(struct conn *c)
{
    struct epoll_event ev = {.data.ptr = c};
    /* While paused, leave out EPOLLRDHUP too: level-triggered, a half-closed peer would
     * otherwise be reported again and again while we cannot read. */
    ev.events = (c->paused ? 0 : EPOLLIN | EPOLLRDHUP) | (c->epollout ? EPOLLOUT : 0);
    epoll_ctl(c->w->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

struct conn *conn_create(struct worker *w, int fd)
{
    struct conn *c = calloc(1, sizeof *c);
    if (c == NULL) {
        close(fd);
        return NULL;
    }
    c->w = w;
    c->node = w->node;
    c->fd = fd;
    c->state = CONN_LINE;
    c->last_in_ms = c->last_out_ms = w->now_ms;
    buf_init(&c->rbuf);
    buf_init(&c->wbuf);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(fd);
        free(c);
        return NULL;
    }
    c->next = w->conns;
    if (w->conns) w->conns->prev = c;
    w->conns = c;
    connlist_add(&w->node->conns, &c->listed, fd, clock_now());
    return c;
}

void conn_destroy(struct conn *c)
{
    struct worker *w = c->w;
    connlist_remove(&w->node->conns, &c->listed);
    epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->it) store_free(c->node->store, c->it);
    conn_stage_free(c);
    dump_free(&c->dump);
    if (c->prev) c->prev->next = c->next;
    else w->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    buf_release(&c->rbuf);
    buf_release(&c->wbuf);
    free(c->pline);
    membudget_release(&c->node->budget, &c->acct);
    free(c);
    __atomic_fetch_sub(&w->node->curr_conns, 1, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&w->nconns, 1, __ATOMIC_RELAXED);
}

bool conn_out_room(const struct conn *c, size_t n)
{
    return buf_used(&c->wbuf) + n <= c->node->cfg.out_max;
}

void conn_reply(struct conn *c, const char *s, size_t n)
{
    if (buf_append(&c->wbuf, s, n) < 0) {
        c->w->m.conn_oom++;
        c->state = CONN_CLOSE;
    }
}

void conn_reply_str(struct conn *c, const char *s) { conn_reply(c, s, strlen(s)); }

/* Keep the pending request valid while more input arrives: copy its line into the connection
 * and move every pointer that pointed into the old line. */
static int conn_keep_request(struct conn *c, const char *line, size_t len, struct proto_req *req)
{
    if (c->plinecap < len + 1) {
        char *p = realloc(c->pline, len + 1);
        if (p == NULL) return -1;
        c->pline = p;
        c->plinecap = len + 1;
    }
    memcpy(c->pline, line, len);
    c->preq = *req;
    const char *lo = line, *hi = line + len;
#define REBASE(ptr)                                                                              \
    do {                                                                                         \
        if ((ptr) >= lo && (ptr) <= hi) (ptr) = c->pline + ((ptr) - lo);                        \
    } while (0)
    struct proto_req *r = &c->preq;
    if (req->key == req->keybuf) r->key = r->keybuf;
    else REBASE(r->key);
    REBASE(r->keys);
    REBASE(r->keys_end);
    REBASE(r->arg);
    REBASE(r->meta.opaque);
    for (int i = 0; i < r->meta.nflags; i++) REBASE(r->meta.flag[i].tok);
#undef REBASE
    return 0;
}

size_t conn_socket_queued(const struct conn *c)
{
    int queued = 0;
    return ioctl(c->fd, FIONREAD, &queued) == 0 && queued > 0 ? (size_t)queued : 0;
}

/* Has the rest of a data block, `missing` bytes, already reached the socket's receive queue?
 * Then it is received, if not yet read, and may take item memory now. Asked only of blocks
 * large enough for a direct read (the system call is not worth it for less). */
static bool conn_block_queued(const struct conn *c, size_t missing)
{
    return missing >= CONN_DIRECT_READ && conn_socket_queued(c) >= missing;
}

/* Parse and run one request line. `avail` is what the input buffer holds from the line's start
 * (line, \n and anything after). Returns the bytes consumed. */
static size_t conn_run_line(struct conn *c, char *line, size_t len, size_t avail)
{
    struct proto_req req;
    const char *err = NULL;
    size_t used = len + 1;
    enum proto_status st = proto_parse(line, len, c->node->cfg.store.item_max, &req, &err);
    if (st == PROTO_ERR_TOO_LARGE) {
        c->w->m.store_too_large++;
        cmd_store_refuse(c, &req, "SERVER_ERROR object too large for cache\r\n");
        c->swallow = (uint64_t)req.nbytes + 2;
        c->state = CONN_SWALLOW;
        return used;
    }
    if (st == PROTO_ERR_CLOSE) { /* an HTTP request: closed with no reply, as memcached does */
        c->w->m.protocol_errors++;
        c->state = CONN_CLOSE;
        return used;
    }
    if (st != PROTO_OK) {
        c->w->m.protocol_errors++;
        /* memcached stays silent about a text command's errors when it ends in noreply;
         * meta commands always report them */
        if (!(req.noreply && req.cmd < CMD_MG && st != PROTO_ERR_UNKNOWN)) {
            conn_reply_str(c, err);
            conn_reply(c, "\r\n", 2);
        }
        if (st == PROTO_ERR_CLIENT_SWALLOW) { /* a refused store: its data is not commands */
            c->swallow = (uint64_t)req.nbytes + 2;
            c->state = CONN_SWALLOW;
        }
        return used;
    }
    if (!cmd_is_storage(req.cmd)) {
        cmd_run(c, &req);
        return used;
    }
    size_t need = (size_t)req.nbytes + 2;
    if (!cmd_store_check(c, &req)) {
        c->swallow = need;
        c->state = CONN_SWALLOW;
        return used;
    }
    if (avail - used >= need) { /* whole data block already here: the common, copy-once case */
        struct item *it = cmd_store_alloc(c, &req);
        if (it == NULL) {
            c->swallow = need;
            c->state = CONN_SWALLOW;
            return used;
        }
        const char *v = line + used;
        memcpy(item_value(it), v, (size_t)req.nbytes);
        cmd_store_finish(c, &req, it, v[req.nbytes] == '\r' && v[req.nbytes + 1] == '\n');
        return used + need;
    }
    if (conn_keep_request(c, line, len, &req) < 0) {
        c->w->m.conn_oom++;
        cmd_store_refuse(c, &req, "SERVER_ERROR out of memory storing object\r\n");
        c->swallow = need;
        c->state = CONN_SWALLOW;
        return used;
    }
    c->vgot = 0;
    /* A large block that has all reached the socket is read straight into its item; any other
     * is staged (conn_stage.c) until complete, so a client that never sends the rest holds no
     * item memory. */
    if (conn_block_queued(c, need - (avail - used))) {
        c->it = cmd_store_alloc(c, &c->preq);
        if (c->it == NULL) {
            c->swallow = need;
            c->state = CONN_SWALLOW;
            return used;
        }
    }
    c->state = CONN_VALUE;
    return used;
}

/* A request starting with 0x80 is the binary protocol, which shoal does not speak. memcached
 * built for text only answers such a line ERROR once a newline comes, and may run commands found
 * in its key or value bytes; we answer ERROR at once and close, as nothing after it can be
 * framed. Returns true when the connection is to close. */
static bool conn_binary_request(struct conn *c, const char *start)
{
    if ((unsigned char)start[0] != 0x80) return false;
    c->w->m.protocol_errors++;
    conn_reply_str(c, "ERROR\r\n");
    c->state = CONN_CLOSE;
    return true;
}

/* A primary's replication stream (repl.h): a first line opening with REPL_HELLO hands the
 * socket (a dup) and what was read of it to an applier thread, and this connection closes
 * without a reply. True when handed over. */
static bool conn_repl_handover(struct conn *c, const char *start, size_t avail)
{
    if (c->node->repl == NULL || avail < sizeof REPL_HELLO - 1 ||
        memcmp(start, REPL_HELLO, sizeof REPL_HELLO - 1) != 0)
        return false;
    int fd = dup(c->fd);
    if (fd >= 0) repl_adopt(c->node, fd, start, avail);
    buf_consume(&c->rbuf, avail);
    c->state = CONN_CLOSE;
    return true;
}

/* The value and its terminator are all in: store it, or answer why not. */
static void conn_value_done(struct conn *c)
{
    bool ok = !c->badchunk;
    c->badchunk = false;
    c->state = CONN_LINE;
    struct item *it = c->it;
    c->it = NULL;
    if (ok && it == NULL) { /* staged: only now, with every byte here, may the store make room */
        it = cmd_store_alloc(c, &c->preq);
        if (it) conn_stage_copy(c, it, (uint64_t)c->preq.nbytes);
    }
    conn_stage_free(c);
    if (ok && it == NULL) return; /* refused for want of memory, answered */
    cmd_store_finish(c, &c->preq, it, ok);
}

/* Where the next value bytes go: the item's value (allocated up front) or the staging buffer.
 * `buffered`: value bytes the input buffer holds beyond these. False when staging refused the
 * value (answered; the rest is being swallowed). */
static bool conn_value_room(struct conn *c, size_t buffered, char **dst, size_t *len)
{
    if (c->it == NULL && !conn_stage_room(c, buffered, dst, len)) return false;
    if (c->it == NULL) return true; /* staged */
    *dst = item_value(c->it) + c->vgot;
    *len = (size_t)((uint64_t)c->preq.nbytes - c->vgot);
    return true;
}

/* Feed buffered input to the value being received; finish the command when complete. */
static void conn_fill_value(struct conn *c)
{
    uint64_t nbytes = (uint64_t)c->preq.nbytes, need = nbytes + 2;
    size_t avail = buf_used(&c->rbuf), i = 0;
    const char *src = buf_start(&c->rbuf);
    /* bytes into the value proper, then up to two into the terminator check */
    while (i < avail && c->vgot < need) {
        if (c->vgot < nbytes) {
            char *dst;
            size_t room;
            if (!conn_value_room(c, avail - i, &dst, &room)) break; /* refused: swallowing */
            size_t n = room < avail - i ? room : avail - i;
            memcpy(dst, src + i, n);
            c->vgot += n, i += n;
        } else {
            size_t k = (size_t)(c->vgot - nbytes);
            if (src[i] != (k == 0 ? '\r' : '\n')) c->badchunk = true;
            c->vgot++, i++;
        }
    }
    buf_consume(&c->rbuf, i);
    if (c->state == CONN_VALUE && c->vgot == need) conn_value_done(c);
}

/* Run requests from the input buffer until it runs dry, output backs up, or the connection
 * is to close. */
static void conn_process_run(struct conn *c)
{
    size_t soft = c->node->cfg.out_max / 4;
    /* client buffers over half their budget: no more requests while about a reply waits */
    bool pressed = soft > MEMBUDGET_PRESSED_OUT && membudget_pressed(&c->node->budget);
    if (pressed) soft = MEMBUDGET_PRESSED_OUT;
    if (buf_used(&c->rbuf) > 0) connlist_touch(&c->listed, clock_now());
    while (c->state != CONN_CLOSE) {
        if (buf_used(&c->wbuf) > soft) {
            if (!c->paused) {
                c->paused = true;
                if (pressed && buf_used(&c->wbuf) <= c->node->cfg.out_max / 4)
                    c->w->m.conns_paused_budget++;
                conn_update_events(c);
            }
            return;
        }
        /* a key dump answers in slices, one per drained output, before any later request */
        if (c->dump && !dump_continue(c)) return;
        size_t avail = buf_used(&c->rbuf);
        if (avail == 0) return;
        if (c->state == CONN_SWALLOW) {
            size_t n = avail < c->swallow ? avail : (size_t)c->swallow;
            buf_consume(&c->rbuf, n);
            c->swallow -= n;
            if (c->swallow == 0) c->state = CONN_LINE;
            continue;
        }
        if (c->state == CONN_VALUE) {
            conn_fill_value(c);
            continue;
        }
        if (c->state == CONN_LGET) {
            if (!conn_lget_step(c)) return; /* wait for more of the line */
            continue;
        }
        char *start = buf_start(&c->rbuf);
        if (conn_binary_request(c, start)) return;
        if (conn_repl_handover(c, start, avail)) return;
        char *nl = memchr(start, '\n', avail);
        if (nl == NULL || (size_t)(nl - start) > c->node->cfg.line_max) {
            if (nl == NULL && avail <= c->node->cfg.line_max) return; /* wait for the rest */
            if (conn_lget_begin(c, start, avail)) continue; /* a get line: taken in parts */
            c->w->m.conn_closed_line_too_long++;
            conn_reply_str(c, "CLIENT_ERROR line too long\r\n");
            c->state = CONN_CLOSE;
            return;
        }
        size_t used = conn_run_line(c, start, (size_t)(nl - start), avail);
        buf_consume(&c->rbuf, used);
    }
}

/* conn_process_run, then account what its replies took: at once, so that the connections
 * served next in the same batch see the budget as it is. */
static void conn_process(struct conn *c)
{
    conn_process_run(c);
    conn_budget_account(c);
}

/* Write queued output. Returns -1 when the connection must close. */
static int conn_flush(struct conn *c)
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
            if (!c->epollout) {
                c->epollout = true;
                conn_update_events(c);
            }
            return 0;
        }
        return -1;
    }
    buf_compact(&c->wbuf, CONN_BUF_KEEP);
    if (c->epollout || c->paused) {
        c->epollout = false;
        c->paused = false;
        conn_update_events(c);
    }
    return 0;
}

/* Where the next read goes: straight into the item or the staging buffer for the rest of a
 * large value (returns 1), else the input buffer, grown to take a chunk (returns 0). -1 when
 * the buffer cannot grow. */
static int conn_read_target(struct conn *c, char **dst, size_t *len)
{
    /* vgot also counts the \r\n after the value, so check it is still inside the value */
    if (c->state == CONN_VALUE && buf_used(&c->rbuf) == 0 &&
        c->vgot < (uint64_t)c->preq.nbytes &&
        (uint64_t)c->preq.nbytes - c->vgot >= CONN_DIRECT_READ) {
        /* a refused value is swallowed through the input buffer */
        if (conn_value_room(c, 0, dst, len)) return 1;
    }
    if (buf_reserve(&c->rbuf, CONN_READ_CHUNK) < 0) {
        c->w->m.conn_oom++;
        return -1;
    }
    *dst = c->rbuf.data + c->rbuf.len;
    *len = c->rbuf.cap - c->rbuf.len;
    return 0;
}

/* Account `n` > 0 bytes that a read put where conn_read_target said (`direct`: its 1). */
static void conn_read_got(struct conn *c, int direct, size_t n)
{
    c->w->m.bytes_read += (uint64_t)n;
    c->last_in_ms = c->w->now_ms;
    if (direct) c->vgot += (uint64_t)n;
    else c->rbuf.len += n;
}

/* Read once from the socket. Returns bytes read, 0 on EOF, -1 on error, -2 when nothing is
 * there now. */
static ssize_t conn_read(struct conn *c)
{
    char *dst;
    size_t len;
    int direct = conn_read_target(c, &dst, &len);
    if (direct < 0) return -1;
    ssize_t n = read(c->fd, dst, len);
    if (n > 0) conn_read_got(c, direct, (size_t)n);
    if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? -2 : -1;
    return n;
}

/* After a read (or none): send what is queued, run requests a drained output un-paused, and
 * close when due. May destroy the connection. */
static void conn_event_end(struct conn *c)
{
    /* A flush that drains the output un-pauses the connection; requests already in the input
     * buffer must then run now, since no new socket data may ever come to wake us. */
    for (;;) {
        if (conn_flush(c) < 0) goto close;
        if (c->paused || c->state == CONN_CLOSE || buf_used(&c->wbuf) > 0) break;
        size_t before = buf_used(&c->rbuf);
        if (before == 0) break;
        conn_process(c);
        if (buf_used(&c->rbuf) == before && c->state != CONN_CLOSE) break; /* partial request */
    }
    if (c->state == CONN_CLOSE && buf_used(&c->wbuf) == 0) goto close;
    if (buf_used(&c->rbuf) == 0) buf_compact(&c->rbuf, CONN_BUF_KEEP);
    if (c->dump && !c->epollout) {
        /* the slice went out at once: come back through epoll for the next one, so other
         * connections of this worker get their turn between slices */
        c->epollout = true;
        conn_update_events(c);
    }
    conn_budget_account(c);
    /* what `stats conns` shows for it until its next event */
    connlist_set_state(&c->listed, c->state == CONN_CLOSE ? CONNLIST_CLOSING
                                   : buf_used(&c->wbuf) > 0 || c->dump ? CONNLIST_WRITE
                                   : c->state == CONN_VALUE ? CONNLIST_NREAD
                                   : c->state == CONN_SWALLOW ? CONNLIST_SWALLOW
                                   : CONNLIST_READ);
    return;
close:
    conn_destroy(c);
}

/* Handle the result of this event's read: n bytes, 0 on EOF, -1 on error, -2 for none. Returns
 * false when the connection was destroyed. */
static bool conn_after_read(struct conn *c, ssize_t n)
{
    if (n == 0 || n == -1) {
        /* Peer closed (or failed): run what it sent, send what we can, then close. */
        conn_process(c);
        conn_flush(c);
        conn_destroy(c);
        return false;
    }
    conn_process(c);
    return true;
}

bool conn_event(struct conn *c, uint32_t events, struct uring *r)
{
    /* Reset or fully shut down: nothing more can be sent, so nothing is worth running. */
    if (events & (EPOLLERR | EPOLLHUP)) {
        conn_destroy(c);
        return false;
    }
    if (events & EPOLLOUT) {
        if (conn_flush(c) < 0) {
            conn_destroy(c);
            return false;
        }
        if (buf_used(&c->wbuf) == 0) conn_process(c); /* resume paused input */
    }
    if ((events & (EPOLLIN | EPOLLRDHUP)) && !c->paused &&
        c->state != CONN_CLOSE) {
        if (r) {
            char *dst;
            size_t len;
            int direct = conn_read_target(c, &dst, &len);
            if (direct < 0) {
                conn_after_read(c, -1);
                return false;
            }
            if (uring_recv(r, c->fd, dst, len, c) == 0) {
                c->ring_direct = direct == 1;
                c->ring_reading = true;
                return true;
            }
        }
        if (!conn_after_read(c, conn_read(c))) return false;
    }
    conn_event_end(c);
    return false;
}

bool conn_read_done(struct conn *c, int res, struct uring *r)
{
    ssize_t n = res;
    c->ring_reading = false;
    if (res > 0) conn_read_got(c, c->ring_direct, (size_t)res);
    else if (res < 0) n = (res == -EAGAIN || res == -EWOULDBLOCK || res == -EINTR) ? -2 : -1;
    if (!conn_after_read(c, n)) return false;
    if (buf_used(&c->wbuf) > 0 && !c->epollout &&
        uring_send(r, c->fd, buf_start(&c->wbuf), buf_used(&c->wbuf), c) == 0)
        return true;
    conn_event_end(c);
    return false;
}

void conn_send_done(struct conn *c, int res)
{
    if (res > 0) {
        c->w->m.bytes_written += (uint64_t)res;
        c->last_out_ms = c->w->now_ms;
        buf_consume(&c->wbuf, (size_t)res);
    } else if (res != -EAGAIN && res != -EWOULDBLOCK && res != -EINTR) {
        conn_destroy(c); /* the peer is gone (EPIPE, ECONNRESET, ...) */
        return;
    }
    /* sends the rest of a partial write (or asks for EPOLLOUT), runs what is left, closes */
    conn_event_end(c);
}
