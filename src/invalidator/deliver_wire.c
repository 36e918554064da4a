/* deliver_wire.c — the invalidator's connection to one cluster: connect to its routers in order,
 * send a batch of deletes as quiet meta deletes closed by `mn`, and learn which keys the cluster
 * did not take.
 *
 * With `q`, a shoal-node, a shoal-router and memcached answer `md <key> q` with nothing when the
 * key was deleted, `NF` when it was not there (the key is gone either way), and an error line
 * (`CLIENT_ERROR ...`, `SERVER_ERROR ...`) that names no key. So the quiet pass tells only
 * whether every key went; when an error came back, the keys are sent again without `q`, one reply
 * per key in order, which ties each error to its key (a delete done twice is still one delete).
 * Then a `CLIENT_ERROR` (a key the cluster will never take) is dropped and counted, and anything
 * else (`SERVER_ERROR`, such as a router's node being down) is retried by the caller. */
#include "invalidator/deliver_int.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/log.h"
#include "protocol/protocol.h"

#define WIRE_LINE_MAX 4096

int wire_key_form(const char *key, size_t nkey)
{
    if (nkey == 0) return -1;
    bool plain = nkey <= PROTO_KEY_MAX;
    for (size_t i = 0; plain && i < nkey; i++) {
        unsigned char ch = (unsigned char)key[i];
        if (ch <= ' ' || ch == 0x7f) plain = false;
    }
    if (plain) return 0;
    /* base64 of n bytes is 4*ceil(n/3) characters, which must fit a key token */
    return (nkey + 2) / 3 * 4 <= PROTO_KEY_MAX ? 1 : -1;
}

/* Split "host:port" or "[v6]:port". */
static int split_addr(const char *addr, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || !colon[1]) return -1;
    const char *h = addr;
    size_t hn = (size_t)(colon - addr);
    if (hn >= 2 && h[0] == '[' && h[hn - 1] == ']') h++, hn -= 2;
    if (hn == 0 || hn >= hcap || strlen(colon + 1) >= pcap) return -1;
    memcpy(host, h, hn);
    host[hn] = 0;
    strcpy(port, colon + 1);
    return 0;
}

static int connect_one(const char *addr, uint64_t timeout_ms, char *why, size_t whylen)
{
    char host[256], port[16];
    if (split_addr(addr, host, sizeof host, port, sizeof port) < 0) {
        snprintf(why, whylen, "not host:port");
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai) {
        snprintf(why, whylen, "%s", gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    snprintf(why, whylen, "no address");
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen), err = 0;
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            rc = poll(&p, 1, (int)timeout_ms);
            socklen_t len = sizeof err;
            if (rc == 0) err = ETIMEDOUT;
            else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
            rc = err ? -1 : 0;
        } else if (rc < 0) {
            err = errno;
        }
        if (rc == 0) break;
        snprintf(why, whylen, "%s", strerror(err));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

int wire_connect(struct dcluster *c)
{
    for (size_t i = 0; i < c->nrouters; i++) {
        char why[128];
        int fd = connect_one(c->routers[i], c->d->cfg.timeout_ms, why, sizeof why);
        if (fd >= 0) {
            c->fd = fd;
            log_info("cluster %s: connected to %s", c->name, c->routers[i]);
            c->router_at = i;
            DC_COUNT(c, connects, 1);
            return 0;
        }
        DC_COUNT(c, connect_failures, 1);
        log_warn_limited("cluster %s: cannot connect to %s: %s", c->name, c->routers[i], why);
    }
    return -1;
}

void wire_close(struct dcluster *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Reads lines for a request in flight: called for each whole line (without \r\n) until it
 * returns 1 (done) or -1 (the connection cannot be trusted any more). */
typedef int (*line_fn)(void *ctx, const char *line, size_t n);

/* Send `out` and read lines, both at once (so a long batch never deadlocks against its own
 * replies), until `fn` says done. Gives up after timeout_ms without progress. 0 or -1. */
static int exchange(struct dcluster *c, struct buf *out, line_fn fn, void *ctx)
{
    char in[16384];
    size_t nin = 0;
    int done = 0;
    while (!done) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN | (buf_used(out) ? POLLOUT : 0)};
        int rc = poll(&p, 1, (int)c->d->cfg.timeout_ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) {
            if (rc == 0) DC_COUNT(c, timeouts, 1);
            log_warn_limited("cluster %s: %s: no answer within %llu ms", c->name,
                             c->routers[c->router_at], (unsigned long long)c->d->cfg.timeout_ms);
            return -1;
        }
        if (buf_used(out) && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = send(c->fd, buf_start(out), buf_used(out), MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EINTR) {
                log_warn_limited("cluster %s: %s: send: %s", c->name, c->routers[c->router_at],
                                 strerror(errno));
                return -1;
            }
            if (w > 0) buf_consume(out, (size_t)w);
        }
        if (!(p.revents & (POLLIN | POLLERR | POLLHUP))) continue;
        ssize_t r = recv(c->fd, in + nin, sizeof in - nin, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r <= 0) {
            log_warn_limited("cluster %s: %s: %s", c->name, c->routers[c->router_at],
                             r == 0 ? "closed the connection" : strerror(errno));
            return -1;
        }
        nin += (size_t)r;
        size_t at = 0;
        for (;;) {
            char *nl = memchr(in + at, '\n', nin - at);
            if (!nl) break;
            size_t n = (size_t)(nl - (in + at));
            if (n && in[at + n - 1] == '\r') n--;
            if (done) {
                char esc[128];
                log_warn_limited("cluster %s: %s: unexpected reply \"%s\" after the batch's end; "
                                 "reconnecting", c->name, c->routers[c->router_at],
                                 log_escape(esc, sizeof esc, in + at, n));
                return -1;
            }
            int got = fn(ctx, in + at, n);
            if (got < 0) return -1;
            if (got > 0) done = 1;
            at = (size_t)(nl - in) + 1;
        }
        if (at == 0 && nin == sizeof in) {
            log_warn_limited("cluster %s: %s: reply line over %zu bytes; reconnecting", c->name,
                             c->routers[c->router_at], sizeof in);
            return -1;
        }
        memmove(in, in + at, nin - at);
        nin -= at;
        if (done && (nin || buf_used(out))) {
            log_warn_limited("cluster %s: %s: bytes after the batch's end; reconnecting",
                             c->name, c->routers[c->router_at]);
            return -1;
        }
    }
    return 0;
}

static bool starts(const char *line, size_t n, const char *w)
{
    size_t k = strlen(w);
    return n >= k && !memcmp(line, w, k) && (n == k || line[k] == ' ');
}

/* Append `md <key>[ b]<tail>\r\n`; -1 without memory. */
static int put_md(struct buf *out, const char *key, size_t nkey, int form, const char *tail)
{
    char b64[PROTO_KEY_MAX + 4];
    if (form == 1) {
        int n = proto_base64_encode(key, nkey, b64, sizeof b64);
        if (n < 0) return -1;
        key = b64, nkey = (size_t)n;
    }
    if (buf_append(out, "md ", 3) < 0 || buf_append(out, key, nkey) < 0 ||
        (form == 1 && buf_append(out, " b", 2) < 0) || buf_append_str(out, tail) < 0)
        return -1;
    return 0;
}

struct quiet_ctx {
    struct dcluster *c;
    size_t errors;
};

static int quiet_line(void *vctx, const char *line, size_t n)
{
    struct quiet_ctx *q = vctx;
    if (n == 2 && !memcmp(line, "MN", 2)) return 1;
    if (starts(line, n, "NF")) return 0; /* not there: gone all the same */
    q->errors++;
    return 0;
}

struct loud_ctx {
    struct dcluster *c;
    struct bkey *keys;
    size_t n, next, failed;
};

static size_t next_pending(const struct bkey *k, size_t n, size_t i)
{
    while (i < n && k[i].done) i++;
    return i;
}

static int loud_line(void *vctx, const char *line, size_t n)
{
    struct loud_ctx *l = vctx;
    l->next = next_pending(l->keys, l->n, l->next);
    if (l->next >= l->n) return -1;
    struct bkey *k = &l->keys[l->next++];
    char ek[96], el[160];
    if (starts(line, n, "HD") || starts(line, n, "NF")) {
        k->done = 1;
    } else if (starts(line, n, "CLIENT_ERROR")) {
        k->done = 1;
        DC_COUNT(l->c, keys_refused, 1);
        log_warn_limited("cluster %s: delete of key \"%s\" refused: \"%s\"; dropped", l->c->name,
                         log_escape(ek, sizeof ek, k->key, k->nkey),
                         log_escape(el, sizeof el, line, n));
    } else {
        l->failed++;
        DC_COUNT(l->c, server_errors, 1);
        log_warn_limited("cluster %s: delete of key \"%s\" failed: \"%s\"; retried", l->c->name,
                         log_escape(ek, sizeof ek, k->key, k->nkey),
                         log_escape(el, sizeof el, line, n));
    }
    return next_pending(l->keys, l->n, l->next) >= l->n ? 1 : 0;
}

enum batch_res wire_delete(struct dcluster *c, struct bkey *keys, size_t n)
{
    struct buf out;
    buf_init(&out);
    size_t pending = 0;
    for (size_t i = 0; i < n; i++) {
        if (keys[i].done) continue;
        int form = wire_key_form(keys[i].key, keys[i].nkey);
        if (form < 0) {
            char ek[96];
            keys[i].done = 1;
            DC_COUNT(c, keys_unsendable, 1);
            log_warn_limited("cluster %s: key \"%s\" (%u bytes) cannot be sent in a memcached "
                             "request; dropped", c->name,
                             log_escape(ek, sizeof ek, keys[i].key, keys[i].nkey),
                             (unsigned)keys[i].nkey);
            continue;
        }
        if (put_md(&out, keys[i].key, keys[i].nkey, form, " q\r\n") < 0) goto nomem;
        pending++;
    }
    if (!pending) {
        buf_release(&out);
        return BATCH_OK;
    }
    if (buf_append_str(&out, "mn\r\n") < 0) goto nomem;
    struct quiet_ctx q = {c, 0};
    if (exchange(c, &out, quiet_line, &q) < 0) goto down;
    if (!q.errors) {
        for (size_t i = 0; i < n; i++) keys[i].done = 1;
        buf_release(&out);
        return BATCH_OK;
    }
    DC_COUNT(c, quiet_errors, 1);
    out.off = out.len = 0;
    for (size_t i = 0; i < n; i++)
        if (!keys[i].done &&
            put_md(&out, keys[i].key, keys[i].nkey, wire_key_form(keys[i].key, keys[i].nkey),
                   "\r\n") < 0)
            goto nomem;
    struct loud_ctx l = {c, keys, n, 0, 0};
    if (exchange(c, &out, loud_line, &l) < 0) goto down;
    buf_release(&out);
    return l.failed ? BATCH_RETRY : BATCH_OK;
nomem:
    log_warn_limited("cluster %s: out of memory building a batch; retried", c->name);
    buf_release(&out);
    return BATCH_RETRY;
down:
    buf_release(&out);
    wire_close(c);
    return BATCH_DOWN;
}

/* The answers to a flush's lines, in order. */
struct flush_ctx {
    struct dcluster *c;
    const struct rec *r; /* the namespaces asked, for the log (NULL: flush_all) */
    uint32_t off;
    size_t want, got;
    size_t refused;      /* ERROR or CLIENT_ERROR: flush_all stands in */
    size_t failed;       /* anything else but OK: the flush is sent again */
};

static int flush_line(void *vctx, const char *line, size_t n)
{
    struct flush_ctx *f = vctx;
    struct ritem it = {0};
    if (f->r) rec_next(f->r, &f->off, &it);
    if (!(n == 2 && !memcmp(line, "OK", 2))) {
        char el[160], en[80];
        bool refused = f->r && ((n == 5 && !memcmp(line, "ERROR", 5)) ||
                                (n >= 12 && !memcmp(line, "CLIENT_ERROR", 12)));
        if (refused) {
            f->refused++;
            log_warn("cluster %s: flush_ns %s answered \"%s\": flush_all stands in", f->c->name,
                     log_escape(en, sizeof en, it.ns, it.nns), log_escape(el, sizeof el, line, n));
        } else {
            f->failed++;
            log_warn_limited("cluster %s: %s%s answered \"%s\"; sent again until it is taken",
                             f->c->name, f->r ? "flush_ns " : "flush_all",
                             f->r ? log_escape(en, sizeof en, it.ns, it.nns) : "",
                             log_escape(el, sizeof el, line, n));
        }
    }
    return ++f->got == f->want;
}

/* Can `flush_ns <ns>` carry this name? One token of 1..250 bytes without control bytes. */
static bool ns_sendable(const char *ns, size_t n)
{
    if (n == 0 || n > 250) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)ns[i] <= ' ' || ns[i] == 0x7f) return false;
    return true;
}

/* Send `out` (one line per answer wanted) and classify the answers. */
static enum batch_res flush_send(struct dcluster *c, struct buf *out, struct flush_ctx *f)
{
    int rc = exchange(c, out, flush_line, f);
    buf_release(out);
    if (rc < 0) {
        wire_close(c);
        return BATCH_DOWN;
    }
    return f->failed ? BATCH_RETRY : BATCH_OK;
}

enum batch_res wire_flush(struct dcluster *c, const struct rec *r)
{
    struct buf out;
    buf_init(&out);
    struct flush_ctx f = {.c = c, .r = r};
    bool all = r->n == 0;
    uint32_t off = 0;
    struct ritem it;
    while (!all && rec_next(r, &off, &it)) {
        if (!ns_sendable(it.ns, it.nns)) {
            char en[80];
            log_warn("cluster %s: namespace \"%s\" cannot be sent in flush_ns: flush_all "
                     "stands in", c->name, log_escape(en, sizeof en, it.ns, it.nns));
            all = true;
            break;
        }
        if (buf_append_str(&out, "flush_ns ") < 0 || buf_append(&out, it.ns, it.nns) < 0 ||
            buf_append_str(&out, "\r\n") < 0)
            goto nomem;
        f.want++;
    }
    if (!all) {
        enum batch_res res = flush_send(c, &out, &f);
        if (res != BATCH_OK || f.refused == 0) return res;
        all = true; /* some namespace was refused */
    } else if (r->n == 0) {
        log_warn("cluster %s: a flush of no known namespace: flush_all", c->name);
    }
    buf_release(&out);
    DC_COUNT(c, flush_all_fallbacks, 1);
    f = (struct flush_ctx){.c = c, .want = 1};
    if (buf_append_str(&out, "flush_all\r\n") < 0) goto nomem;
    return flush_send(c, &out, &f);
nomem:
    buf_release(&out);
    return BATCH_RETRY;
}

static int probe_line(void *vctx, const char *line, size_t n)
{
    *(int *)vctx = n == 2 && !memcmp(line, "MN", 2);
    return 1;
}

enum batch_res wire_probe(struct dcluster *c)
{
    struct buf out;
    buf_init(&out);
    int ok = 0;
    if (buf_append_str(&out, "mn\r\n") < 0) {
        buf_release(&out);
        return BATCH_RETRY;
    }
    int rc = exchange(c, &out, probe_line, &ok);
    buf_release(&out);
    if (rc < 0 || !ok) {
        wire_close(c);
        return BATCH_DOWN;
    }
    return BATCH_OK;
}
