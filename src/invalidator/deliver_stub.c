/* deliver_stub.c — STAND-IN for delivery (deliver.h) until branch deliver is merged; delete
 * this file at that merge. One blocking connection per cluster, used from the reader's thread:
 * each commit's deletes go out as pipelined `md <key> q` lines closed by `mn`, and the commit
 * counts as applied when every cluster answered MN. A cluster that cannot be reached is retried
 * (each address in turn) for about 2 s while the reader waits, then the commit is refused (the
 * reader gets it again from PostgreSQL); nothing is buffered or spilled. A namespace flush is a `flush_all` (there is no per-namespace flush command yet).
 * Replay is not supported. Enough to run the log reader's tests end to end, no more. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/buf.h"
#include "invalidator/deliver.h"

struct stub_cluster {
    const struct deliver_cluster_cfg *cfg;
    int fd;
    size_t next; /* router to try next */
};

struct deliver {
    struct stub_cluster *c;
    size_t n;
    uint64_t batch_max;
    _Atomic uint64_t safe;
    _Atomic uint64_t deletes, batches, flushes;
    _Atomic int up;
    struct buf out;
};

static int dial(const char *addr)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof host) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0) return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

/* Send `b` and read until the `mn` (or flush_all's OK) reply; 0, or -1 (connection closed). */
static int exchange(struct stub_cluster *c, const struct buf *b, const char *end)
{
    size_t off = b->off;
    while (off < b->len) {
        ssize_t w = send(c->fd, b->data + off, b->len - off, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    char in[4096];
    size_t have = 0, elen = strlen(end);
    for (;;) {
        ssize_t r = recv(c->fd, in + have, sizeof in - have, 0);
        if (r <= 0) return -1;
        have += (size_t)r;
        /* whole lines: the end marker ends the exchange; others are errors on single keys
         * (which the stand-in ignores) */
        size_t start = 0;
        for (size_t i = 0; i < have; i++) {
            if (in[i] != '\n') continue;
            if (i + 1 - start == elen && !memcmp(in + start, end, elen)) return 0;
            start = i + 1;
        }
        memmove(in, in + start, have - start);
        have -= start;
        if (have == sizeof in) have = 0; /* a line longer than the buffer: not ours */
    }
}

/* Send b to every cluster; -1 when one stayed unreachable for about 2 s (the reader then
 * reconnects to PostgreSQL and gets the commit again, so it also notices a stop meanwhile). */
static int apply(struct deliver *d, const struct buf *b, const char *end)
{
    for (size_t i = 0; i < d->n; i++) {
        struct stub_cluster *c = &d->c[i];
        for (unsigned tries = 0;; tries++) {
            if (c->fd < 0) {
                c->fd = dial(c->cfg->routers[c->next % c->cfg->nrouters]);
                c->next++;
            }
            if (c->fd >= 0 && exchange(c, b, end) == 0) break;
            if (c->fd >= 0) close(c->fd);
            c->fd = -1;
            atomic_store(&d->up, 0);
            if (tries == 100) return -1;
            usleep(20000);
        }
    }
    atomic_store(&d->up, 1);
    return 0;
}

struct deliver *deliver_create(const struct deliver_cfg *cfg, char *err, size_t errlen)
{
    struct deliver *d = calloc(1, sizeof *d);
    if (d == NULL || (d->c = calloc(cfg->nclusters, sizeof *d->c)) == NULL) {
        free(d);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    d->n = cfg->nclusters;
    d->batch_max = cfg->batch_max ? cfg->batch_max : 512;
    for (size_t i = 0; i < d->n; i++) {
        d->c[i].cfg = &cfg->clusters[i];
        d->c[i].fd = -1;
    }
    buf_init(&d->out);
    atomic_store(&d->up, 1);
    return d;
}

void deliver_destroy(struct deliver *d)
{
    if (d == NULL) return;
    for (size_t i = 0; i < d->n; i++)
        if (d->c[i].fd >= 0) close(d->c[i].fd);
    buf_release(&d->out);
    free(d->c);
    free(d);
}

int deliver_commit(struct deliver *d, uint64_t end_lsn, int64_t commit_time_us,
                   const struct deliver_key *keys, size_t nkeys, int more)
{
    for (size_t i = 0; i < nkeys;) {
        d->out.off = d->out.len = 0;
        size_t k = 0;
        for (; k < d->batch_max && i < nkeys; k++, i++) {
            if (buf_append(&d->out, "md ", 3) < 0 ||
                buf_append(&d->out, keys[i].key, keys[i].nkey) < 0 ||
                buf_append(&d->out, " q\r\n", 4) < 0)
                return -1;
        }
        if (buf_append(&d->out, "mn\r\n", 4) < 0) return -1;
        if (apply(d, &d->out, "MN\r\n") < 0) return -1;
        atomic_fetch_add(&d->deletes, k);
        atomic_fetch_add(&d->batches, 1);
    }
    if (!more) atomic_store(&d->safe, end_lsn);
    return 0;
}

int deliver_flush(struct deliver *d, uint64_t end_lsn, int64_t commit_time_us,
                  const char *const *namespaces, size_t nns)
{
    d->out.off = d->out.len = 0;
    if (buf_append_str(&d->out, "flush_all\r\n") < 0) return -1;
    if (apply(d, &d->out, "OK\r\n") < 0) return -1;
    atomic_fetch_add(&d->flushes, 1);
    atomic_store(&d->safe, end_lsn);
    return 0;
}

uint64_t deliver_safe_lsn(struct deliver *d) { return atomic_load(&d->safe); }

long deliver_replay(struct deliver *d, const char *cluster, const uint16_t *slots, size_t nslots,
                    uint64_t since_s, char *err, size_t errlen)
{
    snprintf(err, errlen, "replay is not supported by the stand-in delivery (deliver_stub.c)");
    return -1;
}

void deliver_metrics(struct deliver *d, struct buf *out)
{
    buf_printf(out,
               "# TYPE shoal_invalidator_deletes_total counter\n"
               "shoal_invalidator_deletes_total %llu\n"
               "# TYPE shoal_invalidator_delete_batches_total counter\n"
               "shoal_invalidator_delete_batches_total %llu\n"
               "# TYPE shoal_invalidator_flushes_total counter\n"
               "shoal_invalidator_flushes_total %llu\n",
               (unsigned long long)atomic_load(&d->deletes),
               (unsigned long long)atomic_load(&d->batches),
               (unsigned long long)atomic_load(&d->flushes));
}

int deliver_healthy(struct deliver *d) { return atomic_load(&d->up); }
