/* bench-control-load.c — the followers of scripts/bench-control.sh: N HTTP connections to
 * shoal-control, each long-polling GET /v1/topology?after=V as src/common/follow.c does (one
 * poll at a time, after= the version it holds), on one epoll thread.
 *
 * It reads each answer's version from the X-Shoal-Version header (or, from a control plane
 * without it, from the end of the document, where "version" is the last key) and does not
 * parse the document: the figures are the control plane's, not a JSON parser's.
 *
 * Usage: bench-control-load HOST PORT N [gzip]
 * Prints, one line each, flushed:
 *   ready N                       every connection holds a version
 *   all V T_NS FIRST_NS           the last follower got version V (or newer) at T_NS, the first
 *                                 at FIRST_NS (CLOCK_MONOTONIC nanoseconds)
 *   stats BUSY_NS MAX_LOOP_NS BYTES ANSWERS ERRORS   on "stats" read from stdin: time spent
 *                                 handling events, the longest loop turn, body bytes read,
 *                                 200 answers, errors/reconnects (since the last "stats")
 * It exits when stdin closes. Build: cc -O2 -o X bench-control-load.c */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
    int fd;
    uint64_t version;   /* held */
    char hdr[4096];
    size_t hlen;
    int in_body;
    size_t body_left;
    int status;
    uint64_t hdr_version; /* from X-Shoal-Version, 0: none */
    char tail[64];        /* the body's last bytes, for a version without the header */
    size_t tlen;
    int retry;            /* reconnect/re-poll at the next tick */
};

static struct sockaddr_in addr;
static int ep, gzip_ok;
static struct conn *cs;
static int n;
static uint64_t *reached; /* reached[v]: followers holding v or newer */
static uint64_t *first_at;
static size_t vcap;
static uint64_t announced; /* every version up to this one was printed */
static uint64_t busy_ns, max_loop_ns, bytes, answers, errors;
static int ready_said;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void grow(uint64_t v)
{
    if (v < vcap) return;
    size_t nc = vcap ? vcap : 1024;
    while (nc <= v) nc *= 2;
    reached = realloc(reached, nc * sizeof *reached);
    first_at = realloc(first_at, nc * sizeof *first_at);
    if (!reached || !first_at) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(reached + vcap, 0, (nc - vcap) * sizeof *reached);
    memset(first_at + vcap, 0, (nc - vcap) * sizeof *first_at);
    vcap = nc;
}

static int send_poll(struct conn *c)
{
    char req[256];
    int len = snprintf(req, sizeof req,
                       "GET /v1/topology?after=%llu HTTP/1.1\r\nHost: control\r\n%s\r\n",
                       (unsigned long long)c->version,
                       gzip_ok ? "Accept-Encoding: gzip\r\n" : "");
    c->hlen = 0;
    c->in_body = 0;
    c->hdr_version = 0;
    c->tlen = 0;
    return send(c->fd, req, (size_t)len, MSG_NOSIGNAL) == len ? 0 : -1;
}

static int open_conn(struct conn *c)
{
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    fcntl(c->fd, F_SETFL, O_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    return send_poll(c);
}

static void fail(struct conn *c)
{
    errors++;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->retry = 1;
}

/* A follower now holds v (from `old`). */
static void hold(struct conn *c, uint64_t v, uint64_t t)
{
    uint64_t old = c->version;
    if (v <= old) return;
    grow(v);
    for (uint64_t x = old + 1; x <= v; x++) {
        if (reached[x]++ == 0) first_at[x] = t;
    }
    c->version = v;
    /* every follower holds at least `announced`; print the versions all hold now */
    while (announced + 1 < vcap && reached[announced + 1] == (uint64_t)n) {
        announced++;
        if (announced > 0 && ready_said)
            printf("all %llu %llu %llu\n", (unsigned long long)announced,
                   (unsigned long long)t, (unsigned long long)first_at[announced]);
    }
}

static void check_ready(void)
{
    if (ready_said) return;
    for (int i = 0; i < n; i++)
        if (cs[i].version == 0) return;
    ready_said = 1;
    printf("ready %d\n", n);
    fflush(stdout);
}

static uint64_t tail_version(const struct conn *c)
{
    /* ..."version":123}\n */
    char t[65];
    memcpy(t, c->tail, c->tlen);
    t[c->tlen] = 0;
    char *p = strstr(t, "\"version\":");
    return p ? strtoull(p + 10, NULL, 10) : 0;
}

static void finish(struct conn *c, uint64_t t)
{
    if (c->status == 200) {
        answers++;
        uint64_t v = c->hdr_version ? c->hdr_version : tail_version(c);
        hold(c, v, t);
    } else if (c->status != 304) {
        errors++;
        c->retry = 1; /* 503 and the like: poll again at the next tick */
        return;
    }
    if (send_poll(c) < 0) fail(c);
}

static void body_bytes(struct conn *c, const char *p, size_t k)
{
    bytes += k;
    if (k >= sizeof c->tail) {
        memcpy(c->tail, p + k - sizeof c->tail, sizeof c->tail);
        c->tlen = sizeof c->tail;
    } else {
        size_t keep = c->tlen + k > sizeof c->tail ? sizeof c->tail - k : c->tlen;
        memmove(c->tail, c->tail + c->tlen - keep, keep);
        memcpy(c->tail + keep, p, k);
        c->tlen = keep + k;
    }
}

static void on_read(struct conn *c)
{
    static char buf[1 << 18];
    for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            fail(c);
            return;
        }
        uint64_t t = now_ns();
        size_t off = 0;
        while (off < (size_t)r) {
            if (!c->in_body) {
                size_t k = (size_t)r - off;
                if (k > sizeof c->hdr - 1 - c->hlen) k = sizeof c->hdr - 1 - c->hlen;
                memcpy(c->hdr + c->hlen, buf + off, k);
                c->hlen += k;
                c->hdr[c->hlen] = 0;
                char *end = strstr(c->hdr, "\r\n\r\n");
                if (end == NULL) {
                    if (c->hlen >= sizeof c->hdr - 1) {
                        fail(c);
                        return;
                    }
                    off += k;
                    continue;
                }
                size_t used = (size_t)(end + 4 - c->hdr) - (c->hlen - k);
                off += used;
                c->status = atoi(c->hdr + 9);
                c->body_left = 0;
                for (char *l = strstr(c->hdr, "\r\n"); l && l < end; l = strstr(l + 2, "\r\n")) {
                    if (!strncasecmp(l + 2, "Content-Length:", 15))
                        c->body_left = strtoull(l + 17, NULL, 10);
                    else if (!strncasecmp(l + 2, "X-Shoal-Version:", 16))
                        c->hdr_version = strtoull(l + 18, NULL, 10);
                }
                c->in_body = 1;
            }
            size_t k = (size_t)r - off;
            if (k > c->body_left) k = c->body_left;
            if (k) body_bytes(c, buf + off, k);
            c->body_left -= k;
            off += k;
            if (c->body_left == 0) {
                c->in_body = 0;
                finish(c, t);
                if (c->fd < 0 || c->retry) return;
            }
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s HOST PORT N [gzip]\n", argv[0]);
        return 2;
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[2]));
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    n = atoi(argv[3]);
    gzip_ok = argc > 4 && !strcmp(argv[4], "gzip");
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)n + 64) {
        rl.rlim_cur = rl.rlim_max < (rlim_t)n + 64 ? rl.rlim_max : (rlim_t)n + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    cs = calloc((size_t)n, sizeof *cs);
    fcntl(0, F_SETFL, O_NONBLOCK);
    struct epoll_event in = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &in);
    for (int i = 0; i < n; i++) {
        cs[i].fd = -1;
        if (open_conn(&cs[i]) < 0) fail(&cs[i]);
    }
    struct epoll_event evs[256];
    uint64_t last_sweep = now_ns();
    for (;;) {
        int k = epoll_wait(ep, evs, 256, 100);
        uint64_t t0 = now_ns();
        for (int i = 0; i < k; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c == NULL) {
                char line[64];
                ssize_t r = read(0, line, sizeof line);
                if (r == 0) return 0;
                if (r > 0 && !strncmp(line, "stats", 5)) {
                    printf("stats %llu %llu %llu %llu %llu\n", (unsigned long long)busy_ns,
                           (unsigned long long)max_loop_ns, (unsigned long long)bytes,
                           (unsigned long long)answers, (unsigned long long)errors);
                    busy_ns = max_loop_ns = bytes = answers = errors = 0;
                }
                continue;
            }
            if (c->fd >= 0) on_read(c);
        }
        if (t0 - last_sweep >= 100000000ull) {
            last_sweep = t0;
            for (int i = 0; i < n; i++)
                if (cs[i].retry) {
                    cs[i].retry = 0;
                    if (cs[i].fd < 0 ? open_conn(&cs[i]) < 0 : send_poll(&cs[i]) < 0)
                        fail(&cs[i]);
                }
        }
        check_ready();
        fflush(stdout);
        uint64_t d = now_ns() - t0;
        if (k > 0) busy_ns += d;
        if (d > max_loop_ns) max_loop_ns = d;
    }
}
