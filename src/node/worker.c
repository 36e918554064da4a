/* worker.c — per-thread event loops: accept, hand each new connection to the least-loaded
 * worker, dispatch readiness to connections, stop. */
#include "node/worker.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/net.h"
#include "node/conn.h"

#define WORKER_EVENTS 256
#define WORKER_ACCEPT_BATCH 32
/* A batch of fewer connections than this is not followed by a yield: at low concurrency the
 * worker blocks in epoll_wait anyway, and the system call would cost a few percent per request
 * (measured 7-9% at one connection on an uncontended pair of cores). */
#define WORKER_YIELD_MIN_CONNS 4

/* Markers in epoll data for the three non-connection fds. */
static char worker_listen_tag, worker_wake_tag, worker_hand_tag;

static const char too_many[] = "ERROR Too many open connections\r\n";

/* Close this worker's connections whose peers have already gone (EOF not yet handled), so
 * they stop counting against -c. Called only at the connection limit. */
static void worker_reap_closed(struct worker *w)
{
    for (struct conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        char b;
        if (recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0) conn_destroy(c);
    }
}

#define WORKER_REAP_MS 100

/* Is there room for one more connection? A peer that disconnected a moment ago may still be
 * counted until its worker sees the EOF, so at the limit this worker reaps its own such
 * connections and rechecks, but at most once per WORKER_REAP_MS and without waiting. A refused
 * connection must cost next to nothing: a burst past -c otherwise fills the listen backlog and
 * the kernel drops SYNs, stalling each client behind them for the 1 s SYN retransmit. Measured
 * with 3,000 held connects at -c 1024: when every refusal reaped (a MSG_PEEK per connection)
 * and slept 2 ms, 200-899 listen overflows and a slowest connect of 1.01-1.04 s. */
static bool worker_conn_room(struct worker *w)
{
    struct node *n = w->node;
    for (bool reaped = false;; reaped = true) {
        uint64_t cur = __atomic_add_fetch(&n->curr_conns, 1, __ATOMIC_RELAXED);
        if (cur <= n->cfg.conn_limit) return true;
        __atomic_fetch_sub(&n->curr_conns, 1, __ATOMIC_RELAXED);
        /* now_ms: when this batch began (worker_main) */
        if (reaped || w->now_ms - w->reaped_ms < WORKER_REAP_MS) return false;
        w->reaped_ms = w->now_ms;
        worker_reap_closed(w);
    }
}

static void worker_dispatch(struct worker *w, int fd);

static void worker_accept(struct worker *w)
{
    struct node *n = w->node;
    for (int i = 0; i < WORKER_ACCEPT_BATCH; i++) {
        int fd = net_accept(n->listen_fd, too_many, sizeof too_many - 1);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno == EMFILE) { /* net_accept told one client and closed it */
                __atomic_fetch_add(&n->rejected_conns, 1, __ATOMIC_RELAXED);
                log_warn_limited("connection refused: out of file descriptors (ulimit -n)");
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                log_warn_limited("accept failed: %s", strerror(errno));
            return;
        }
        if (!worker_conn_room(w)) {
            /* memcached's answer at its connection limit, then close */
            __atomic_fetch_add(&n->rejected_conns, 1, __ATOMIC_RELAXED);
            ssize_t wr = send(fd, too_many, sizeof too_many - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)wr;
            close(fd);
            log_info_limited("connection refused: limit -c %llu reached",
                             (unsigned long long)n->cfg.conn_limit);
            continue;
        }
        __atomic_fetch_add(&n->total_conns, 1, __ATOMIC_RELAXED);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        worker_dispatch(w, fd);
    }
}

/* Make `fd` a connection of `w` (the calling thread must be w's). `w->nconns` already counts it. */
static void worker_adopt(struct worker *w, int fd)
{
    if (conn_create(w, fd) == NULL) {
        __atomic_fetch_sub(&w->node->curr_conns, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&w->nconns, 1, __ATOMIC_RELAXED);
        w->m.conn_oom++;
    }
}

/* Give an accepted socket to the worker with the fewest connections, ties taken in turn (as
 * memcached's listener hands them round-robin). EPOLLEXCLUSIVE wakes whichever worker happens
 * to wait first, and that one accepts a whole burst, so without this a burst of connections
 * lands mostly on one worker (measured 28/22, and once 50/0, for 50 connections on 2 workers)
 * and that worker becomes the bottleneck. Another worker's sockets go through its queue and its
 * handfd; it creates the connection itself, since a worker's connection list is its own. */
static void worker_dispatch(struct worker *w, int fd)
{
    struct node *n = w->node;
    uint64_t nt = n->cfg.threads;
    uint64_t first = __atomic_fetch_add(&n->next_worker, 1, __ATOMIC_RELAXED);
    struct worker *to = w;
    uint64_t least = UINT64_MAX;
    for (uint64_t i = 0; i < nt; i++) {
        struct worker *cand = &n->workers[(first + i) % nt];
        uint64_t load = __atomic_load_n(&cand->nconns, __ATOMIC_RELAXED);
        if (load < least) to = cand, least = load;
    }
    __atomic_fetch_add(&to->nconns, 1, __ATOMIC_RELAXED);
    if (to == w) {
        worker_adopt(w, fd);
        return;
    }
    pthread_mutex_lock(&to->hand_lock);
    if (to->nhand == to->handcap) {
        size_t cap = to->handcap ? to->handcap * 2 : 16;
        int *p = realloc(to->hand, cap * sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&to->hand_lock);
            __atomic_fetch_sub(&to->nconns, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&w->nconns, 1, __ATOMIC_RELAXED);
            worker_adopt(w, fd); /* keep it here rather than drop it */
            return;
        }
        to->hand = p;
        to->handcap = cap;
    }
    to->hand[to->nhand++] = fd;
    pthread_mutex_unlock(&to->hand_lock);
    uint64_t one = 1;
    ssize_t wr = write(to->handfd, &one, sizeof one);
    (void)wr;
}

/* Adopt every socket other workers queued for this one. */
static void worker_take_handed(struct worker *w)
{
    uint64_t cnt;
    ssize_t rd = read(w->handfd, &cnt, sizeof cnt);
    (void)rd;
    int batch[64];
    for (;;) {
        size_t k = 0;
        pthread_mutex_lock(&w->hand_lock);
        while (k < sizeof batch / sizeof batch[0] && w->nhand > 0) batch[k++] = w->hand[--w->nhand];
        pthread_mutex_unlock(&w->hand_lock);
        if (k == 0) return;
        for (size_t i = 0; i < k; i++) worker_adopt(w, batch[i]);
    }
}

/* Run the reads queued on the ring by conn_event, then the sends their requests produced: two
 * system calls for the whole batch instead of two per connection. */
static void worker_run_ring(struct worker *w)
{
    struct uring *r = &w->ring;
    void *u;
    int res;
    if (r->queued == 0) return;
    if (uring_run(r) < 0) goto fail;
    while (uring_next(r, &u, &res) == 0) conn_read_done(u, res, r);
    if (r->queued == 0) return;
    if (uring_run(r) < 0) goto fail;
    while (uring_next(r, &u, &res) == 0) conn_send_done(u, res);
    return;
fail:
    /* The kernel holds our buffers and we cannot learn when it lets go of them. */
    log_error("worker %d: io_uring_enter failed: %s", w->id, strerror(errno));
    abort();
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct uring *ring = w->use_ring ? &w->ring : NULL;
    struct epoll_event evs[WORKER_EVENTS];
    for (;;) {
        ns_quiescent(&w->ns_seen); /* holds no namespace table while blocked */
        int k = epoll_wait(w->epfd, evs, WORKER_EVENTS, conn_budget_wait_ms(w));
        ns_online(&w->node->ns, &w->ns_seen);
        w->now_ms = clock_now_ms();
        if (k < 0) {
            if (errno == EINTR) continue;
            log_error("worker %d: epoll_wait failed: %s", w->id, strerror(errno));
            break;
        }
        /* Accepting (which may close other connections at -c) and stopping wait until the
         * batch's queued I/O is done, since queued I/O points into connections' buffers. */
        bool stop = false, accepting = false, handed = false;
        int served = 0;
        for (int i = 0; i < k; i++) {
            void *p = evs[i].data.ptr;
            if (p == &worker_wake_tag) stop = true;
            else if (p == &worker_listen_tag) accepting = true;
            else if (p == &worker_hand_tag) handed = true;
            else {
                conn_event(p, evs[i].events, ring);
                served++;
            }
        }
        if (ring) worker_run_ring(w);
        if (stop) break;
        if (accepting) worker_accept(w);
        if (handed) worker_take_handed(w);
        conn_budget_sweep(w); /* with no queued I/O left pointing into connections */
        /* A busy worker finds new requests in every epoll_wait and so never blocks: threads
         * waiting for its CPU (the other worker, the clients its replies just woke) then wait
         * for the scheduler tick to preempt it, 4 ms at HZ=250, and every connection behind
         * them with it. Handing the CPU over once per batch turns that into one batch's wait;
         * with nobody waiting, sched_yield returns at once. */
        if (served >= WORKER_YIELD_MIN_CONNS && w->node->cfg.worker_yield) sched_yield();
    }
    while (w->conns) conn_destroy(w->conns);
    ns_quiescent(&w->ns_seen);
    return NULL;
}

int worker_setup(struct node *n, char *err, size_t errlen)
{
    n->workers = aligned_alloc(64, ((n->cfg.threads * sizeof *n->workers) + 63) & ~(size_t)63);
    if (n->workers) memset(n->workers, 0, n->cfg.threads * sizeof *n->workers);
    if (n->workers == NULL) {
        snprintf(err, errlen, "out of memory creating %llu workers",
                 (unsigned long long)n->cfg.threads);
        return -1;
    }
    for (uint64_t i = 0; i < n->cfg.threads; i++) {
        struct worker *w = &n->workers[i];
        w->node = n;
        w->id = (int)i;
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        w->handfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        pthread_mutex_init(&w->hand_lock, NULL);
        /* one recv or send per connection epoll may report at once */
        if (n->cfg.io_uring)
            w->use_ring = uring_init_batch(&w->ring, WORKER_EVENTS, i == 0,
                                           "one system call per socket read and send");
        if (w->epfd < 0 || w->wakefd < 0 || w->handfd < 0) {
            snprintf(err, errlen, "cannot create worker event loop: %s", strerror(errno));
            return -1;
        }
        struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = &worker_listen_tag};
        struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &worker_wake_tag};
        struct epoll_event hev = {.events = EPOLLIN, .data.ptr = &worker_hand_tag};
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, n->listen_fd, &ev) < 0 ||
            epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wakefd, &wev) < 0 ||
            epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->handfd, &hev) < 0) {
            snprintf(err, errlen, "cannot register worker fds: %s", strerror(errno));
            return -1;
        }
    }
    return 0;
}

int worker_start(struct node *n, char *err, size_t errlen)
{
    for (uint64_t i = 0; i < n->cfg.threads; i++) {
        if (pthread_create(&n->workers[i].thread, NULL, worker_main, &n->workers[i]) != 0) {
            snprintf(err, errlen, "cannot start worker thread %llu", (unsigned long long)i);
            return -1;
        }
    }
    return 0;
}

void worker_teardown(struct node *n)
{
    if (n->workers == NULL) return;
    for (uint64_t i = 0; i < n->cfg.threads; i++) {
        uint64_t one = 1;
        ssize_t wr = write(n->workers[i].wakefd, &one, sizeof one);
        (void)wr;
    }
    for (uint64_t i = 0; i < n->cfg.threads; i++) {
        pthread_join(n->workers[i].thread, NULL);
    }
    for (uint64_t i = 0; i < n->cfg.threads; i++) {
        struct worker *w = &n->workers[i];
        /* sockets handed over but not adopted before the stop */
        for (size_t k = 0; k < w->nhand; k++) {
            close(w->hand[k]);
            __atomic_fetch_sub(&n->curr_conns, 1, __ATOMIC_RELAXED);
        }
        free(w->hand);
        pthread_mutex_destroy(&w->hand_lock);
        close(w->epfd);
        close(w->wakefd);
        close(w->handfd);
        if (w->use_ring) uring_free(&w->ring);
    }
    free(n->workers);
    n->workers = NULL;
}

int node_ns_apply(void *node, uint16_t id, const struct ns_config *cfg, char *err, size_t errlen)
{
    struct node *n = node;
    if (cfg == NULL) return store_ns_configure(n->store, id, 0, STORE_POLICY_LRU) ? 507 : 0;
    uint64_t page = store_page_size(n->store), limit = store_memory(n->store);
    if (cfg->memory && (cfg->memory < page || cfg->memory > limit)) {
        snprintf(err, errlen,
                 "field 'memory' must be 0 (no quota) or from %llu (one segment) to %llu (-m) "
                 "bytes; got %llu",
                 (unsigned long long)page, (unsigned long long)limit,
                 (unsigned long long)cfg->memory);
        return 400;
    }
    if (store_ns_configure(n->store, id, cfg->memory, (enum store_policy)cfg->eviction)) {
        snprintf(err, errlen, "out of memory setting up the namespace's eviction state");
        return 507;
    }
    return 0;
}

void node_ns_metrics_sum(void *node, uint16_t id, struct ns_metrics *out)
{
    struct node *n = node;
    memset(out, 0, sizeof *out);
    for (uint64_t i = 0; i < n->cfg.threads; i++)
        metrics_sum((uint64_t *)out, (const uint64_t *)&n->workers[i].ns_m[id],
                    sizeof *out / sizeof(uint64_t));
}

void node_metrics_sum(struct node *n, struct node_metrics *out)
{
    memset(out, 0, sizeof *out);
    for (uint64_t i = 0; i < n->cfg.threads; i++)
        metrics_sum((uint64_t *)out, (const uint64_t *)&n->workers[i].m,
                    sizeof *out / sizeof(uint64_t));
    out->inflight_bytes = __atomic_load_n(&n->inflight_bytes, __ATOMIC_RELAXED);
    out->client_buffer_bytes = membudget_used(&n->budget);
}
