/* conn.c — client connection and incremental reply parser of shoal-bench, see conn.h. */
#include "bench/conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

/* Longest reply line accepted; far above any VALUE line (key <= 250 bytes) or error text. */
#define CONN_RBUF (64 * 1024)
/* Refuse VALUE lengths no memcached-compatible server can send, instead of skipping forever. */
#define CONN_MAX_VALUE (1ULL << 40)

int bench_conn_init(struct bench_conn *c, unsigned depth, const struct bench_keys *k,
                    bool cache_aside)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->epfd = -1;
    c->cap = depth;
    c->wcap = (size_t)depth * bench_keys_max_request(k);
    c->rcap = CONN_RBUF;
    c->fifo = calloc(depth, sizeof(*c->fifo));
    c->wbuf = malloc(c->wcap);
    c->rbuf = malloc(c->rcap);
    if (cache_aside) c->miss = calloc(depth, sizeof(*c->miss));
    if (!c->fifo || !c->wbuf || !c->rbuf || (cache_aside && !c->miss)) {
        bench_conn_free(c);
        return -1;
    }
    return 0;
}

void bench_conn_free(struct bench_conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->fifo);
    free(c->wbuf);
    free(c->rbuf);
    free(c->miss);
    c->miss = NULL;
    c->fifo = NULL;
    c->wbuf = c->rbuf = NULL;
}

int bench_conn_open(struct bench_conn *c, const struct sockaddr *sa, socklen_t salen,
                    int timeout_ms)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, sa, salen) < 0) {
        if (errno != EINPROGRESS) goto fail;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r;
        do r = poll(&p, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        if (r < 0) goto fail;
        if (r == 0) {
            errno = ETIMEDOUT;
            goto fail;
        }
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0) goto fail;
        if (soerr) {
            errno = soerr;
            goto fail;
        }
    }
    int one = 1;
    /* Without NODELAY, Nagle would hold a batch back waiting for the previous one's ACK. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (c->split) {
        /* the kernel stamps each arriving segment in CLOCK_REALTIME; latencies are monotonic */
        if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) < 0) goto fail;
        struct timespec rt, mono;
        clock_gettime(CLOCK_REALTIME, &rt);
        clock_gettime(CLOCK_MONOTONIC, &mono);
        c->rt_to_mono = ((int64_t)mono.tv_sec - rt.tv_sec) * 1000000000LL +
                        ((int64_t)mono.tv_nsec - rt.tv_nsec);
    }
    c->fd = fd;
    c->want_out = false;
    return 0;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

int bench_conn_watch(struct bench_conn *c, int epfd)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) return -1;
    c->epfd = epfd;
    return 0;
}

void bench_conn_close(struct bench_conn *c, struct bench_stats *st)
{
    if (c->fd >= 0) close(c->fd); /* also removes it from the epoll set */
    c->fd = -1;
    c->epfd = -1;
    c->want_out = false;
    if (st) st->c.err[BENCH_ERR_LOST] += c->count;
    c->head = c->count = 0;
    c->wpos = c->wlen = 0;
    c->rpos = c->rlen = 0;
    c->skip = 0;
    c->value_seen = false;
}

void bench_conn_compact_wbuf(struct bench_conn *c)
{
    if (c->wpos == c->wlen) {
        c->wpos = c->wlen = 0;
    } else if (c->wpos) {
        memmove(c->wbuf, c->wbuf + c->wpos, c->wlen - c->wpos);
        c->wlen -= c->wpos;
        c->wpos = 0;
    }
}

static int set_want_out(struct bench_conn *c, bool on)
{
    if (c->want_out == on) return 0;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(c->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0) return -1;
    c->want_out = on;
    return 0;
}

int bench_conn_flush(struct bench_conn *c)
{
    while (c->wpos < c->wlen) {
        ssize_t n = send(c->fd, c->wbuf + c->wpos, c->wlen - c->wpos, MSG_NOSIGNAL);
        if (n > 0) {
            c->wpos += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return set_want_out(c, true);
        if (n == 0) errno = EPIPE;
        return -1;
    }
    c->wpos = c->wlen = 0;
    return set_want_out(c, false);
}

ssize_t bench_conn_read(struct bench_conn *c)
{
    /* Keep only an unfinished line; bytes of a skipped value are never kept. */
    if (c->rpos == c->rlen) {
        c->rpos = c->rlen = 0;
    } else if (c->rpos) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    for (;;) {
        ssize_t n;
        if (c->split) {
            struct iovec iov = {.iov_base = c->rbuf + c->rlen, .iov_len = c->rcap - c->rlen};
            union {
                char buf[CMSG_SPACE(sizeof(struct timespec))];
                struct cmsghdr align;
            } ctl;
            struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                                .msg_controllen = sizeof(ctl.buf)};
            n = recvmsg(c->fd, &mh, 0);
            c->rx_ns = 0;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); n > 0 && cm; cm = CMSG_NXTHDR(&mh, cm))
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
                    struct timespec ts;
                    memcpy(&ts, CMSG_DATA(cm), sizeof(ts));
                    c->rx_ns = (uint64_t)((int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec +
                                          c->rt_to_mono);
                }
        } else {
            n = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
        }
        if (n > 0) {
            c->rlen += (size_t)n;
            return n;
        }
        if (n == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return -1;
    }
}

static bool line_is(const char *line, size_t len, const char *word, size_t wlen)
{
    return len == wlen && memcmp(line, word, wlen) == 0;
}

static bool line_starts(const char *line, size_t len, const char *word, size_t wlen)
{
    return len >= wlen && memcmp(line, word, wlen) == 0;
}

#define IS(w) line_is(line, len, w, sizeof(w) - 1)
#define STARTS(w) line_starts(line, len, w, sizeof(w) - 1)

/* "VALUE <key> <flags> <bytes>[ <cas>]": returns <bytes>, or -1 if the line is malformed. */
static int64_t parse_value_line(const char *line, size_t len)
{
    size_t i = 6; /* after "VALUE " */
    while (i < len && line[i] != ' ') i++; /* key */
    if (i == 6 || i >= len) return -1;
    i++;
    size_t f = i;
    while (i < len && line[i] >= '0' && line[i] <= '9') i++; /* flags */
    if (i == f || i >= len || line[i] != ' ') return -1;
    i++;
    uint64_t bytes = 0;
    size_t b = i;
    while (i < len && line[i] >= '0' && line[i] <= '9') {
        bytes = bytes * 10 + (uint64_t)(line[i] - '0');
        if (bytes > CONN_MAX_VALUE) return -1;
        i++;
    }
    if (i == b || (i < len && line[i] != ' ')) return -1;
    return (int64_t)bytes;
}

/* Count a framing loss and say why in c->lost_why, for the reopen message. */
static void lose(struct bench_conn *c, struct bench_stats *st, enum bench_err e, const char *text,
                 size_t len)
{
    bench_stats_error(st, e, text, len);
    size_t n = 0;
    if (e == BENCH_ERR_PROTOCOL)
        n = (size_t)snprintf(c->lost_why, sizeof(c->lost_why), "bad reply: ");
    for (size_t i = 0; i < len && n + 1 < sizeof(c->lost_why); i++) {
        unsigned char ch = (unsigned char)text[i];
        c->lost_why[n++] = (ch >= ' ' && ch < 0x7f) ? (char)ch : '?'; /* untrusted bytes */
    }
    c->lost_why[n] = '\0';
}

/* Where the FIFO head (or, with nothing in flight, a measured request) is counted. */
static inline struct bench_stats *head_sink(const struct bench_conn *c,
                                            struct bench_stats *const sink[2])
{
    if (c->count == 0) return sink[1];
    return sink[(c->fifo[c->head].flags & BENCH_REQ_MEASURED) ? 1 : 0];
}

/* Pop the FIFO head, which must be of kind `op`, into *out; record its latency if it was
 * measured and `record` is set. Returns false, popping nothing, if the head is another kind. */
static inline bool complete(struct bench_conn *c, enum bench_op op, uint64_t now_ns,
                            struct bench_stats *const sink[2], bool record, struct bench_req *out)
{
    struct bench_req *r = &c->fifo[c->head];
    if (r->op != op) return false;
    if (record && (r->flags & BENCH_REQ_MEASURED)) {
        bench_hist_record(&sink[1]->hist, now_ns > r->sent_ns ? now_ns - r->sent_ns : 0);
        if (c->rx_ns) {
            uint64_t rx = c->rx_ns < r->sent_ns ? r->sent_ns : c->rx_ns > now_ns ? now_ns : c->rx_ns;
            bench_hist_record(&sink[1]->hist_server, rx - r->sent_ns);
            bench_hist_record(&sink[1]->hist_client, now_ns - rx);
        }
    }
    *out = *r;
    if (++c->head == c->cap) c->head = 0;
    c->count--;
    return true;
}

/* Count a get's reply and, on a miss with a miss queue, queue its key for the loading set. */
static void count_get(struct bench_conn *c, const struct bench_req *r, bool hit,
                      struct bench_stats *const sink[2])
{
    struct bench_counts *n = &sink[(r->flags & BENCH_REQ_MEASURED) ? 1 : 0]->c;
    bool scan = (r->flags & BENCH_REQ_SCAN) != 0;
    n->gets++;
    n->scan_gets += scan;
    if (hit) {
        n->hits++;
        n->scan_hits += scan;
        return;
    }
    n->misses++;
    n->scan_misses += scan;
    if (!c->miss) return;
    /* Room: every queued miss came from a get that has left the FIFO, and the worker keeps
     * count + miss_count <= cap. */
    unsigned tail = c->miss_head + c->miss_count;
    if (tail >= c->cap) tail -= c->cap;
    c->miss[tail].key = r->key;
    c->miss[tail].flags = r->flags;
    c->miss_count++;
}

/* Act on one reply line (without CRLF). Returns 1 if it completed a request, 0 if it did not
 * (a VALUE header), -1 if the connection lost its framing (error already counted). */
static int parse_line(struct bench_conn *c, const char *line, size_t len, uint64_t now_ns,
                      struct bench_stats *const sink[2], bool record)
{
    struct bench_stats *st = head_sink(c, sink);
    struct bench_req done;
    /* A reply with nothing asked, or anything but END after our single VALUE: the stream is
     * out of step with our FIFO. */
    if (c->count == 0 || (c->value_seen && !IS("END"))) goto unexpected;
    enum bench_op head_op = (enum bench_op)c->fifo[c->head].op;
    switch (line[0]) {
    case 'V':
        if (STARTS("VALUE ") && head_op == BENCH_OP_GET) {
            int64_t bytes = parse_value_line(line, len);
            if (bytes < 0) goto unexpected;
            c->skip = (uint64_t)bytes + 2;
            c->value_seen = true;
            return 0;
        }
        break;
    case 'E':
        if (IS("END")) {
            if (!complete(c, BENCH_OP_GET, now_ns, sink, record, &done)) goto unexpected;
            count_get(c, &done, c->value_seen, sink);
            c->value_seen = false;
            return 1;
        }
        if (IS("EXISTS")) goto not_stored;
        if (IS("ERROR") || STARTS("ERROR ")) {
            /* The server did not understand a command: later replies may not line up. */
            lose(c, st, BENCH_ERR_ERROR, line, len);
            return -1;
        }
        break;
    case 'S':
        if (IS("STORED")) {
            if (!complete(c, BENCH_OP_SET, now_ns, sink, record, &done)) goto unexpected;
            st->c.sets++;
            return 1;
        }
        if (STARTS("SERVER_ERROR")) {
            /* memcached swallows the value of a refused set, so framing survives. */
            complete(c, head_op, now_ns, sink, false, &done);
            bench_stats_error(st, BENCH_ERR_SERVER, line, len);
            return 1;
        }
        break;
    case 'N':
        if (IS("NOT_STORED") || IS("NOT_FOUND")) goto not_stored;
        break;
    case 'C':
        if (STARTS("CLIENT_ERROR")) {
            /* The server may now read our value bytes as commands: resynchronise. */
            lose(c, st, BENCH_ERR_CLIENT, line, len);
            return -1;
        }
        break;
    default:
        break;
    }
unexpected:
    lose(c, st, BENCH_ERR_PROTOCOL, line, len);
    return -1;
not_stored:
    if (!complete(c, BENCH_OP_SET, now_ns, sink, false, &done)) goto unexpected;
    bench_stats_error(st, BENCH_ERR_NOT_STORED, line, len);
    return 1;
}

int bench_conn_parse(struct bench_conn *c, uint64_t now_ns, struct bench_stats *const sink[2],
                     bool record, unsigned *completed)
{
    unsigned done = 0;
    int rc = 0;
    while (rc == 0) {
        size_t avail = c->rlen - c->rpos;
        if (c->skip) {
            if (!avail) break;
            if (c->skip > 2) {
                size_t take = avail < c->skip - 2 ? avail : (size_t)(c->skip - 2);
                c->rpos += take;
                c->skip -= take;
                continue;
            }
            if (c->rbuf[c->rpos] != (c->skip == 2 ? '\r' : '\n')) {
                lose(c, head_sink(c, sink), BENCH_ERR_PROTOCOL, "value not followed by CRLF",
                     26);
                rc = -1;
                break;
            }
            c->rpos++;
            c->skip--;
            continue;
        }
        const char *line = c->rbuf + c->rpos;
        const char *nl = memchr(line, '\n', avail);
        if (!nl) {
            if (avail == c->rcap) {
                lose(c, head_sink(c, sink), BENCH_ERR_PROTOCOL,
                     "reply line longer than 64 KiB", 29);
                rc = -1;
            }
            break;
        }
        size_t len = (size_t)(nl - line);
        c->rpos += len + 1;
        if (len == 0 || line[len - 1] != '\r') {
            lose(c, head_sink(c, sink), BENCH_ERR_PROTOCOL, line, len);
            rc = -1;
            break;
        }
        int r = parse_line(c, line, len - 1, now_ns, sink, record);
        if (r < 0)
            rc = -1;
        else
            done += (unsigned)r;
    }
    *completed = done;
    return rc;
}
