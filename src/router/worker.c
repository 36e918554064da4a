/* worker.c — shoal-router's event loops: accept, dispatch readiness, adopt new topology
 * tables, finish each batch by writing to nodes and clients, check timeouts. */
#include "router/worker.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/net.h"
#include "router/catchup.h"
#include "router/client.h"
#include "router/dellog.h"
#include "router/failover.h"
#include "router/request.h"
#include "router/upstream.h"

#define WORKER_EVENTS 256
#define WORKER_ACCEPT_BATCH 32
#define WORKER_TICK_MS 5

const struct metric_desc router_metric_descs[] = {
#define X(name, kind, help) METRIC_DESC(struct router_metrics, name, kind, help),
    ROUTER_METRICS(X)
#undef X
};
const size_t ROUTER_NMETRICS = sizeof router_metric_descs / sizeof router_metric_descs[0];

static char worker_listen_tag, worker_wake_tag, worker_kick_tag;
static const char too_many[] = "ERROR Too many open connections\r\n";

static uint64_t worker_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

void router_metrics_sum(struct router *r, struct router_metrics *out)
{
    memset(out, 0, sizeof *out);
    for (uint64_t i = 0; i < r->cfg.threads; i++)
        metrics_sum((uint64_t *)out, (const uint64_t *)&r->workers[i].m,
                    sizeof *out / sizeof(uint64_t));
    out->client_buffer_bytes = membudget_used(&r->budget);
    out->moved_kept_bytes = __atomic_load_n(&r->keep.used, __ATOMIC_RELAXED);
}

/* Build this worker's node map for the table published at generation `gen`: upstreams are
 * kept by address across tables, so a reload that keeps a node keeps its connections and the
 * requests in flight on them. Nodes no longer listed are retired once idle. */
static void worker_adopt(struct rworker *w, uint64_t gen)
{
    const struct topo *t = topo_current(&w->r->topo);
    struct upnode **map = calloc(t->nnodes, sizeof *map);
    int32_t *scratch = malloc(t->nnodes * sizeof *scratch);
    if (map == NULL || scratch == NULL) goto oom;
    for (struct upnode *un = w->upnodes; un; un = un->next) un->retired = true;
    for (uint32_t i = 0; i < t->nnodes; i++) {
        scratch[i] = -1;
        struct upnode *un = w->upnodes;
        while (un && strcmp(un->node.addr, t->nodes[i].addr)) un = un->next;
        if (un == NULL && (un = upnode_create(w, &t->nodes[i])) == NULL) goto oom;
        un->node = t->nodes[i]; /* the name may resolve differently now */
        un->retired = false;
        map[i] = un;
    }
    free(w->map);
    free(w->scratch);
    w->map = map;
    w->scratch = scratch;
    w->nmap = t->nnodes;
    w->topo = t;
    w->topo_gen = gen;
    return;
oom:
    for (struct upnode *un = w->upnodes; un; un = un->next) un->retired = false;
    free(map);
    free(scratch);
    free(w->map);
    free(w->scratch);
    w->map = NULL;
    w->scratch = NULL;
    w->nmap = 0;
    w->topo = NULL;
    w->m.out_of_memory++;
    log_error("worker %d: out of memory adopting topology version %llu", w->id,
              (unsigned long long)t->version);
}

bool worker_topology_ready(struct rworker *w) { return w->map != NULL; }

static void worker_accept(struct rworker *w)
{
    struct router *r = w->r;
    for (int i = 0; i < WORKER_ACCEPT_BATCH; i++) {
        int fd = net_accept(r->listen_fd, too_many, sizeof too_many - 1);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno == EMFILE) { /* net_accept told one client and closed it */
                __atomic_fetch_add(&r->rejected_conns, 1, __ATOMIC_RELAXED);
                log_warn_limited("connection refused: out of file descriptors (ulimit -n)");
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                log_warn_limited("accept failed: %s", strerror(errno));
            return;
        }
        uint64_t cur = __atomic_add_fetch(&r->curr_conns, 1, __ATOMIC_RELAXED);
        if (cur > r->cfg.conn_limit) {
            __atomic_fetch_sub(&r->curr_conns, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&r->rejected_conns, 1, __ATOMIC_RELAXED);
            ssize_t wr = send(fd, too_many, sizeof too_many - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)wr;
            close(fd);
            continue;
        }
        w->m.conns_total++;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (client_create(w, fd) == NULL) {
            __atomic_fetch_sub(&r->curr_conns, 1, __ATOMIC_RELAXED);
            w->m.out_of_memory++;
        }
    }
}

/* A ring failure leaves the kernel holding buffers we cannot know it let go of. */
static void worker_ring_failed(struct rworker *w)
{
    log_error("worker %d: io_uring_enter failed: %s", w->id, strerror(errno));
    abort();
}

/* Run the client reads client_event queued on the ring (one system call for all of them). */
static void worker_run_reads(struct rworker *w)
{
    void *u;
    int res;
    if (!w->use_ring || w->ring.queued == 0) return;
    if (uring_run(&w->ring) < 0) worker_ring_failed(w);
    while (uring_next(&w->ring, &u, &res) == 0) client_read_done(u, res);
}

/* Service dirty clients and write to nodes until neither has more to do.
 *
 * Each pass runs the requests of every dirty client and moves finished replies to their
 * output, writes to the nodes, and only then sends the clients' replies: with the ring, in one
 * system call, since nothing can touch a client's output between those sends and their
 * completions (a node's failure, which completes requests of many clients at once, can only
 * happen before, in upstream_flush, or after, in client_finish). */
static void worker_finish_batch(struct rworker *w)
{
    for (int round = 0; round < 16 && (w->dirty || w->dirty_up); round++) {
        struct client *list = w->dirty, *ready = NULL;
        w->dirty = NULL;
        while (list) {
            struct client *c = list;
            list = c->dirty_next;
            c->in_dirty = false;
            if (!client_prepare(c)) continue;
            c->batch_next = ready;
            ready = c;
        }
        upstream_flush(w);
        if (w->use_ring) {
            for (struct client *c = ready; c; c = c->batch_next)
                if (client_wants_send(c) &&
                    uring_send(&w->ring, c->fd, buf_start(&c->wbuf), buf_used(&c->wbuf), c) < 0)
                    break; /* ring full: client_finish sends the rest itself */
            if (w->ring.queued) {
                void *u;
                int res;
                if (uring_run(&w->ring) < 0) worker_ring_failed(w);
                while (uring_next(&w->ring, &u, &res) == 0) {
                    struct client *c = u;
                    if (client_send_done(c, res) < 0) c->dead = true;
                }
            }
        }
        while (ready) {
            struct client *c = ready;
            ready = c->batch_next;
            client_finish(c, c->dead ? -1 : 0);
        }
    }
}

static void *worker_main(void *arg)
{
    struct rworker *w = arg;
    struct router *r = w->r;
    struct epoll_event evs[WORKER_EVENTS];
    struct uring *ring = w->use_ring ? &w->ring : NULL;
    uint64_t next_tick = 0;
    for (;;) {
        topo_quiescent(&w->topo_seen); /* holds no topology table while blocked */
        int timeout = w->dirty || w->dirty_up || w->catchup_due ? 0 : WORKER_TICK_MS;
        if (timeout && !w->inflight && !w->parked && !w->catchup_waits) { /* idle: until a probe or a repair is due (on a tick) */
            uint64_t idle = upstream_idle_ms(w, 1000);
            if (idle > WORKER_TICK_MS) timeout = (int)idle;
        }
        timeout = client_budget_wait_ms(w, timeout);
        int k = epoll_wait(w->epfd, evs, WORKER_EVENTS, timeout);
        topo_online(&r->topo, &w->topo_seen);
        w->now_us = worker_now_us();
        w->now_ms = w->now_us / 1000;
        uint64_t gen = topo_gen(&r->topo);
        if (gen != w->topo_gen) worker_adopt(w, gen);
        failover_sync(w); /* mark-downs of other workers, before any request is routed */
        dellog_sync(w);   /* replays after a promotion (needs the table just adopted) */
        if (w->parked) failover_unpark(w, false); /* moved-retry: sent under an older one */
        catchup_poll(w); /* requests held while replicas catch up (catchup.h) */
        if (k < 0) {
            if (errno == EINTR) continue;
            log_error("worker %d: epoll_wait failed: %s", w->id, strerror(errno));
            break;
        }
        for (int i = 0; i < k; i++) {
            void *p = evs[i].data.ptr;
            if (p == &worker_wake_tag) goto out;
            if (p == &worker_kick_tag) { /* another worker's catch-up: seen at the batch start */
                uint64_t v;
                ssize_t n = read(w->kickfd, &v, sizeof v);
                (void)n;
                continue;
            }
            if (p == &worker_listen_tag) worker_accept(w);
            else if (*(int *)p == EV_CLIENT) client_event(p, evs[i].events, ring);
            else upconn_event(p, evs[i].events);
        }
        worker_run_reads(w);
        worker_finish_batch(w);
        if (w->now_ms >= next_tick) {
            next_tick = w->now_ms + WORKER_TICK_MS;
            upstream_check_timeouts(w);
            if (w->parked) failover_unpark(w, true); /* those past --moved-wait-ms */
            catchup_poll(w); /* those past --catchup-wait-ms */
            worker_finish_batch(w);
        }
        client_budget_sweep(w); /* between batches: no client is being serviced */
    }
out:
    while (w->clients) client_destroy(w->clients);
    failover_unpark_all(w); /* their requests are gone now */
    w->dirty = NULL;
    w->dirty_up = NULL;
    while (w->upnodes) {
        struct upnode *un = w->upnodes;
        w->upnodes = un->next;
        upnode_destroy(un);
    }
    w->dirty_up = NULL;
    free(w->map);
    free(w->scratch);
    w->map = NULL;
    dellog_free(&w->dellog);
    request_pools_drain();
    topo_quiescent(&w->topo_seen);
    return NULL;
}

int worker_setup(struct router *r, char *err, size_t errlen)
{
    size_t bytes = (r->cfg.threads * sizeof *r->workers + 63) & ~(size_t)63;
    r->workers = aligned_alloc(64, bytes);
    if (r->workers == NULL) {
        snprintf(err, errlen, "out of memory creating %llu workers",
                 (unsigned long long)r->cfg.threads);
        return -1;
    }
    memset(r->workers, 0, bytes);
    for (uint64_t i = 0; i < r->cfg.threads; i++) {
        struct rworker *w = &r->workers[i];
        w->r = r;
        w->id = (int)i;
        if (r->cfg.replay_window_s)
            dellog_init(&w->dellog, r->cfg.replay_log_bytes / r->cfg.threads);
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        w->kickfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (w->epfd < 0 || w->wakefd < 0 || w->kickfd < 0) {
            snprintf(err, errlen, "cannot create worker event loop: %s", strerror(errno));
            return -1;
        }
        /* one recv or send per client epoll may report at once */
        if (r->cfg.io_uring)
            w->use_ring = uring_init_batch(&w->ring, WORKER_EVENTS, i == 0,
                                           "one system call per client read and send");
        struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE,
                                 .data.ptr = &worker_listen_tag};
        struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &worker_wake_tag};
        struct epoll_event kev = {.events = EPOLLIN, .data.ptr = &worker_kick_tag};
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, r->listen_fd, &ev) < 0 ||
            epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wakefd, &wev) < 0 ||
            epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->kickfd, &kev) < 0) {
            snprintf(err, errlen, "cannot register worker fds: %s", strerror(errno));
            return -1;
        }
    }
    return 0;
}

int worker_start(struct router *r, char *err, size_t errlen)
{
    for (uint64_t i = 0; i < r->cfg.threads; i++) {
        if (pthread_create(&r->workers[i].thread, NULL, worker_main, &r->workers[i]) != 0) {
            snprintf(err, errlen, "cannot start worker thread %llu", (unsigned long long)i);
            return -1;
        }
    }
    return 0;
}

void worker_teardown(struct router *r)
{
    if (r->workers == NULL) return;
    for (uint64_t i = 0; i < r->cfg.threads; i++) {
        uint64_t one = 1;
        ssize_t wr = write(r->workers[i].wakefd, &one, sizeof one);
        (void)wr;
    }
    /* all joined before any kick fd closes: a worker may wake the others until it exits */
    for (uint64_t i = 0; i < r->cfg.threads; i++) pthread_join(r->workers[i].thread, NULL);
    for (uint64_t i = 0; i < r->cfg.threads; i++) {
        close(r->workers[i].epfd);
        close(r->workers[i].wakefd);
        close(r->workers[i].kickfd);
        if (r->workers[i].use_ring) uring_free(&r->workers[i].ring);
    }
    free(r->workers);
    r->workers = NULL;
}
