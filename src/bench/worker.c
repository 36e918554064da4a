/* worker.c — shoal-bench's per-thread epoll load loop, see worker.h. */
#include "bench/worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "bench/mono.h"

/* A connection that keeps failing is given up rather than reopened in a tight loop. */
#define WORKER_MAX_REOPENS 10
#define WORKER_CONNECT_MS 2000
/* Upper bound on how late a worker notices a phase change when the server is silent. */
#define WORKER_WAIT_MS 20
#define WORKER_EVENTS 256
#define WORKER_MAX_MSGS 3

int bench_worker_init(struct bench_worker *w, unsigned id, const struct bench_ctx *ctx,
                      unsigned nconns)
{
    const struct bench_opts *o = ctx->o;
    memset(w, 0, sizeof(*w));
    w->id = id;
    w->ctx = ctx;
    w->nconns = nconns;
    bench_rng_seed(&w->rng, o->seed, id);
    bench_seq_init(&w->seq, o, &ctx->keys, &ctx->zipf, id, o->threads);
    bench_stats_init(&w->unmeasured);
    bench_stats_init(&w->measured_st);
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (w->epfd < 0) {
        fprintf(stderr, "shoal-bench: epoll_create1: %s\n", strerror(errno));
        return -1;
    }
    unsigned depth = o->pipeline;
    if (o->prefill && ctx->prefill_depth > depth) depth = ctx->prefill_depth;
    w->conns = calloc(nconns, sizeof(*w->conns));
    if (!w->conns) goto oom;
    for (unsigned i = 0; i < nconns; i++) w->conns[i].fd = -1; /* safe to free at any point */
    for (unsigned i = 0; i < nconns; i++)
        if (bench_conn_init(&w->conns[i], depth, &ctx->keys, o->mode == BENCH_MODE_CACHE_ASIDE) <
            0)
            goto oom;
    for (unsigned i = 0; i < nconns; i++) w->conns[i].split = o->split;
    return 0;
oom:
    fprintf(stderr,
            "shoal-bench: out of memory for %u connections of depth %u; lower --conns, "
            "--pipeline or --value-size\n",
            nconns, depth);
    return -1;
}

void bench_worker_free(struct bench_worker *w)
{
    if (w->conns)
        for (unsigned i = 0; i < w->nconns; i++) bench_conn_free(&w->conns[i]);
    free(w->conns);
    w->conns = NULL;
    if (w->epfd >= 0) close(w->epfd);
    w->epfd = -1;
}

int bench_worker_connect(struct bench_worker *w)
{
    const struct bench_ctx *ctx = w->ctx;
    for (unsigned i = 0; i < w->nconns; i++) {
        struct bench_conn *c = &w->conns[i];
        if (bench_conn_open(c, (const struct sockaddr *)&ctx->addr, ctx->addrlen,
                            WORKER_CONNECT_MS) < 0)
            return -1;
        if (bench_conn_watch(c, w->epfd) < 0) return -1;
    }
    w->live = w->nconns;
    return 0;
}

static void say(struct bench_worker *w, const struct bench_conn *c, const char *what,
                const char *why)
{
    if (w->msgs >= WORKER_MAX_MSGS) return;
    if (++w->msgs == WORKER_MAX_MSGS)
        fprintf(stderr,
                "shoal-bench: thread %u conn %u: %s (%s); further messages of this thread "
                "suppressed, see the error counts\n",
                w->id, (unsigned)(c - w->conns), what, why);
    else
        fprintf(stderr, "shoal-bench: thread %u conn %u: %s (%s)\n", w->id,
                (unsigned)(c - w->conns), what, why);
}

/* Drop a failed connection and try to open a fresh one. Returns false if it was given up. */
static bool reopen(struct bench_worker *w, struct bench_conn *c, struct bench_stats *st,
                   const char *why)
{
    const struct bench_ctx *ctx = w->ctx;
    bench_conn_close(c, st);
    if (c->reopens++ < WORKER_MAX_REOPENS &&
        bench_conn_open(c, (const struct sockaddr *)&ctx->addr, ctx->addrlen, WORKER_CONNECT_MS) ==
            0) {
        if (bench_conn_watch(c, w->epfd) == 0) {
            say(w, c, "connection reopened", why);
            return true;
        }
        bench_conn_close(c, NULL);
    }
    bench_stats_error(st, BENCH_ERR_CONN, why, strlen(why));
    say(w, c, "connection given up", why);
    w->live--;
    return false;
}

/* Queue the next request of the --ratio mix on `c`, timed from `due_ns`. */
static void push_mixed(struct bench_worker *w, struct bench_conn *c, uint64_t due_ns)
{
    const struct bench_ctx *ctx = w->ctx;
    const struct bench_opts *o = ctx->o;
    const uint64_t mix = (uint64_t)o->ratio_set + o->ratio_get;
    enum bench_op op = bench_rng_below(&w->rng, mix) < o->ratio_set ? BENCH_OP_SET : BENCH_OP_GET;
    uint64_t key = o->dist == BENCH_DIST_ZIPF
                       ? bench_keys_scatter(&ctx->keys, bench_zipf_next(&ctx->zipf, &w->rng))
                       : bench_rng_below(&w->rng, ctx->keys.n);
    bench_conn_push(c, &ctx->keys, op, key, BENCH_REQ_MEASURED, due_ns);
}

/* Closed loop: top the connection up to --pipeline. With --rate, issue_due() sends instead. */
static void fill_run(struct bench_worker *w, struct bench_conn *c, uint64_t now)
{
    const struct bench_opts *o = w->ctx->o;
    if (o->rate || o->pipeline - c->count < o->refill_min) return;
    bench_conn_compact_wbuf(c);
    for (unsigned n = c->count; n < o->pipeline; n++) push_mixed(w, c, now);
}

/* Cache-aside: first the sets loading the connection's misses (a miss's set always goes out
 * before the connection's next get), then gets of the sequence up to --pipeline in flight.
 * count + miss_count never exceeds --pipeline: a queued miss took the slot of its get. */
static void fill_aside(struct bench_worker *w, struct bench_conn *c, uint64_t now)
{
    const struct bench_ctx *ctx = w->ctx;
    const struct bench_opts *o = ctx->o;
    bench_conn_compact_wbuf(c);
    while (c->miss_count && c->count < o->pipeline) {
        struct bench_miss m = bench_conn_pop_miss(c);
        struct bench_stats *st = (m.flags & BENCH_REQ_MEASURED) ? &w->measured_st : &w->unmeasured;
        st->c.sets_issued++;
        bench_conn_push(c, &ctx->keys, BENCH_OP_SET, m.key, m.flags, now);
    }
    if (o->pipeline - c->count < o->refill_min) return;
    while (c->count < o->pipeline) {
        unsigned flags;
        if (o->requests) {
            if (w->gets_issued >= w->get_limit) break;
            flags = w->gets_issued >= w->get_warm ? BENCH_REQ_MEASURED : 0;
            if (w->gets_issued == w->get_warm)
                atomic_store_explicit(&w->measure_start_ns, now, memory_order_relaxed);
        } else {
            flags = w->measuring ? BENCH_REQ_MEASURED : 0;
        }
        w->gets_issued++;
        bool scan;
        uint64_t key = bench_seq_next(&w->seq, &scan);
        bench_conn_push(c, &ctx->keys, BENCH_OP_GET, key, flags | (scan ? BENCH_REQ_SCAN : 0),
                        now);
    }
}

static void fill_prefill(struct bench_worker *w, struct bench_conn *c, uint64_t now)
{
    const struct bench_ctx *ctx = w->ctx;
    bench_conn_compact_wbuf(c);
    for (unsigned n = c->count; n < ctx->prefill_depth && w->pf_next < w->pf_end; n++)
        bench_conn_push(c, &ctx->keys, BENCH_OP_SET, w->pf_next++, BENCH_REQ_MEASURED, now);
}

static bool may_issue(const struct bench_worker *w, bool prefill)
{
    return prefill || !w->quota || w->measured < w->quota;
}

/* Send what is queued, after topping the connection up to its depth if `issue`; on failure
 * reopen and refill (bounded by WORKER_MAX_REOPENS per connection), since a fresh connection
 * with nothing in flight would never get another event. */
static void service(struct bench_worker *w, struct bench_conn *c, uint64_t now, bool prefill,
                    bool issue, struct bench_stats *st)
{
    for (;;) {
        if (issue) {
            if (prefill)
                fill_prefill(w, c, now);
            else if (w->ctx->o->mode == BENCH_MODE_CACHE_ASIDE)
                fill_aside(w, c, now);
            else
                fill_run(w, c, now);
        }
        if (bench_conn_flush(c) == 0) return;
        if (!reopen(w, c, st, strerror(errno))) return;
        issue = may_issue(w, prefill);
        now = bench_now_ns();
    }
}

static uint64_t in_flight(const struct bench_worker *w)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < w->nconns; i++) n += w->conns[i].count;
    return n;
}

/* Requests in flight plus misses whose set is not sent yet. */
static uint64_t outstanding(const struct bench_worker *w)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < w->nconns; i++) n += w->conns[i].count + w->conns[i].miss_count;
    return n;
}

/* Open loop: the next connection, round robin from the last one used, that can take a
 * request now (open, a --pipeline slot free); NULL if none can. */
static struct bench_conn *free_conn(struct bench_worker *w)
{
    const unsigned depth = w->ctx->o->pipeline;
    for (unsigned i = 0; i < w->nconns; i++) {
        if (++w->rate_cursor >= w->nconns) w->rate_cursor = 0;
        struct bench_conn *c = &w->conns[w->rate_cursor];
        if (c->fd >= 0 && c->count < depth) return c;
    }
    return NULL;
}

/* Open loop: send every request due by `now`, each on a free connection and timed from when
 * it was due, not from when it could go out: a request that waited for a free connection
 * (the server is behind) carries that wait in its latency. Requests stay due, in order, while
 * no connection is free. */
static void issue_due(struct bench_worker *w, uint64_t now, struct bench_stats *st)
{
    while (w->rate_due_ns <= (double)now && may_issue(w, false)) {
        struct bench_conn *c = free_conn(w);
        if (!c) return;
        bench_conn_compact_wbuf(c);
        push_mixed(w, c, (uint64_t)w->rate_due_ns);
        w->rate_due_ns += w->rate_gap_ns;
        service(w, c, now, false, false, st);
    }
}

/* epoll_wait with a nanosecond timeout (-1: forever), for the open loop's short gaps; falls
 * back to whole milliseconds, rounded up, on kernels without epoll_pwait2. */
static int wait_events(struct bench_worker *w, struct epoll_event *evs, int64_t timeout_ns)
{
    if (timeout_ns >= 0 && !w->no_pwait2) {
        struct timespec ts = {.tv_sec = timeout_ns / 1000000000,
                              .tv_nsec = timeout_ns % 1000000000};
        int n = epoll_pwait2(w->epfd, evs, WORKER_EVENTS, &ts, NULL);
        if (n >= 0 || errno != ENOSYS) return n;
        w->no_pwait2 = true;
    }
    int ms = timeout_ns < 0 ? -1 : (int)((timeout_ns + 999999) / 1000000);
    return epoll_wait(w->epfd, evs, WORKER_EVENTS, ms);
}

static void loop(struct bench_worker *w, bool prefill)
{
    const struct bench_ctx *ctx = w->ctx;
    /* cache-aside replies are counted by their request's tag, mixed ones by the phase */
    const bool by_tag = !prefill && ctx->o->mode == BENCH_MODE_CACHE_ASIDE;
    const bool counted = by_tag && ctx->o->requests;
    struct epoll_event evs[WORKER_EVENTS];
    uint64_t pf_done = 0;

    w->measuring = !prefill && atomic_load(&ctx->phase) == BENCH_PHASE_MEASURE;
    const bool open_loop = !prefill && ctx->o->rate;
    uint64_t now = bench_now_ns();
    if (open_loop) {
        /* Threads share the rate evenly; each starts at a different offset into the first
         * gap so their sends interleave rather than land together. */
        w->rate_gap_ns = 1e9 * ctx->o->threads / (double)ctx->o->rate;
        w->rate_due_ns = (double)now + w->rate_gap_ns * w->id / ctx->o->threads;
        /* the default 50 us timer slack would delay every send by up to that much */
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    }
    for (unsigned i = 0; i < w->nconns; i++)
        if (w->conns[i].fd >= 0) service(w, &w->conns[i], now, prefill, true, &w->unmeasured);

    while (w->live > 0) {
        int phase = atomic_load_explicit(&ctx->phase, memory_order_relaxed);
        if (phase == BENCH_PHASE_STOP) break;
        bool measuring = !prefill && phase == BENCH_PHASE_MEASURE;
        w->measuring = measuring;
        /* where connection-level errors go */
        struct bench_stats *st = measuring ? &w->measured_st : &w->unmeasured;
        if (counted) st = w->gets_issued > w->get_warm ? &w->measured_st : &w->unmeasured;
        struct bench_stats *const sink[2] = {by_tag ? &w->unmeasured : st,
                                             by_tag ? &w->measured_st : st};
        const bool record = by_tag || measuring;
        if (prefill) {
            if (w->pf_next >= w->pf_end && in_flight(w) == 0) break;
        } else if (counted) {
            atomic_store_explicit(&w->gets_progress, w->gets_issued, memory_order_relaxed);
            if (w->gets_issued >= w->get_limit && outstanding(w) == 0) break;
        } else if (w->quota && w->measured >= w->quota) {
            break;
        }

        int64_t timeout_ns = WORKER_WAIT_MS * 1000000LL;
        if (open_loop) {
            now = bench_now_ns();
            issue_due(w, now, st);
            /* Sleep to the next due request, unless one is due and waits for a connection:
             * then only a reply can help. */
            if (w->rate_due_ns > (double)now && w->rate_due_ns - (double)now < (double)timeout_ns)
                timeout_ns = (int64_t)(w->rate_due_ns - (double)now);
        }
        int n = wait_events(w, evs, timeout_ns);
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "shoal-bench: thread %u: epoll_wait: %s\n", w->id, strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            struct bench_conn *c = evs[i].data.ptr;
            uint32_t ev = evs[i].events;
            if (c->fd < 0) continue;
            if (ev & EPOLLOUT) {
                service(w, c, now, prefill, false, st);
                if (c->fd < 0) continue;
            }
            if (!(ev & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
            ssize_t r = bench_conn_read(c);
            if (r == 0) continue;
            if (r < 0) {
                if (reopen(w, c, st, errno ? strerror(errno) : "closed by the server"))
                    service(w, c, bench_now_ns(), prefill, may_issue(w, prefill), st);
                continue;
            }
            now = bench_now_ns();
            unsigned done = 0;
            int prc = bench_conn_parse(c, now, sink, record, &done);
            if (measuring) w->measured += done;
            pf_done += done;
            if (prc < 0) {
                if (!reopen(w, c, st, c->lost_why)) continue;
            }
            service(w, c, now, prefill, may_issue(w, prefill), st);
        }
        if (prefill) atomic_store_explicit(&w->pf_done, pf_done, memory_order_relaxed);
    }
    atomic_store_explicit(&w->finished, true, memory_order_release);
}

void *bench_worker_prefill(void *arg)
{
    loop(arg, true);
    return NULL;
}

void *bench_worker_run(void *arg)
{
    loop(arg, false);
    return NULL;
}
