/* worker.h — a shoal-bench load thread: one epoll loop over its share of the connections.
 *
 * The main thread owns the run's timeline and publishes it through bench_ctx.phase; workers
 * only read it (once per wakeup), so the hot loop has no shared writes except the prefill
 * progress counter. A worker is started twice at most: once to prefill its slice of the key
 * space, once for the load run; its connections stay open in between.
 *
 * In cache-aside mode a worker sends the gets of its bench_seq and, on each connection, the
 * sets loading that connection's misses before any further get. With --requests the worker,
 * not the clock, decides what is measured: its first get_warm gets are warm-up, the next ones
 * up to get_limit are measured (each request is tagged when sent, so replies are counted in
 * the phase their get was sent in), and it stops once all of them and their sets are answered.
 * The phase then only serves to stop the run early.
 *
 * With --rate (mixed mode) the worker runs an open loop instead: its share of the rate is
 * evenly spaced in time, each due request goes out on the next connection with a free
 * --pipeline slot, and its latency is measured from when it was due, so time spent waiting
 * for a free connection (a server falling behind) is counted rather than hidden. */
#ifndef SHOAL_BENCH_WORKER_H
#define SHOAL_BENCH_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "bench/conn.h"
#include "bench/keys.h"
#include "bench/opts.h"
#include "bench/rng.h"
#include "bench/seq.h"
#include "bench/stats.h"
#include "bench/zipf.h"

enum bench_phase { BENCH_PHASE_WARMUP, BENCH_PHASE_MEASURE, BENCH_PHASE_STOP };

/* Read-only during a run, except `phase` (written by the main thread). */
struct bench_ctx {
    const struct bench_opts *o;
    struct bench_keys keys;
    struct bench_zipf zipf;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    unsigned prefill_depth;
    _Atomic int phase;
};

struct bench_worker {
    unsigned id;
    pthread_t tid;
    const struct bench_ctx *ctx;
    int epfd;
    struct bench_conn *conns;
    unsigned nconns;
    unsigned live; /* connections not given up on */
    struct bench_rng rng;
    struct bench_seq seq; /* cache-aside gets */
    bool measuring; /* the phase was MEASURE at the last wakeup */

    /* prefill: keys [pf_next, pf_end) still to send; pf_done is read by the main thread */
    uint64_t pf_next, pf_end;
    _Atomic uint64_t pf_done;

    uint64_t quota; /* measured replies after which to stop; 0: none */
    uint64_t measured; /* measured replies so far */
    /* cache-aside: gets sent so far; with --requests, the first get_warm are warm-up and the
     * worker sends get_limit in all. gets_progress and measure_start_ns (when the first
     * measured get was sent; 0: not yet) are read by the main thread. */
    uint64_t gets_issued, get_warm, get_limit;
    _Atomic uint64_t gets_progress;
    _Atomic uint64_t measure_start_ns;

    /* --rate (open loop): when the thread's next request is due, the gap between its requests
     * (fractional nanoseconds, so the rate does not drift), and the connection last used */
    double rate_due_ns, rate_gap_ns;
    unsigned rate_cursor;
    bool no_pwait2; /* the kernel lacks epoll_pwait2: wait in milliseconds */

    unsigned msgs; /* connection messages printed, to rate-limit them */
    _Atomic bool finished; /* the run loop returned (quota, all connections lost, or stop) */

    struct bench_stats unmeasured; /* prefill, warmup */
    struct bench_stats measured_st;
};

/* Allocate `nconns` connections for worker `id`, sized for depth max(pipeline, prefill).
 * Returns 0 or -1 (out of memory / epoll_create failed, reported). */
int bench_worker_init(struct bench_worker *w, unsigned id, const struct bench_ctx *ctx,
                      unsigned nconns);
void bench_worker_free(struct bench_worker *w);

/* Open every connection. Returns 0, or -1 with errno of the first failure. */
int bench_worker_connect(struct bench_worker *w);

/* Thread bodies (arg is the worker): set every key of [pf_next, pf_end) once; or drive the
 * configured mix until phase STOP, the quota (mixed) or get_limit (cache-aside --requests),
 * or the loss of every connection. */
void *bench_worker_prefill(void *arg);
void *bench_worker_run(void *arg);

#endif
