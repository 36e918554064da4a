/* main.c — shoal-bench: load generator for memcached-text-protocol servers.
 *
 * The main thread parses options, opens every connection up front (so an unreachable server
 * fails fast with exit 1), optionally prefills the key space, then runs the workers through
 * warmup -> measure -> stop, keeping the clock itself, and prints the merged results. A
 * cache-aside run with --requests is counted instead of timed: the workers switch from warm-up
 * to measuring and stop by themselves, and the main thread only waits, reports progress and
 * takes the measured window from the workers' timestamps. */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/dbaside.h"
#include "bench/mono.h"
#include "bench/opts.h"
#include "bench/report.h"
#include "bench/worker.h"

/* Sets in flight per connection during --prefill, whatever --pipeline is: prefill is about
 * getting the data in quickly, not about the measured workload. */
#define MAIN_PREFILL_DEPTH 32
/* How often the main thread checks the clock, interrupts and finished workers. */
#define MAIN_TICK_NS (5 * 1000 * 1000ULL)

static volatile sig_atomic_t g_interrupted;

static void on_signal(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: let sleeps return early */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static int ensure_fd_limit(unsigned conns, unsigned threads)
{
    rlim_t need = (rlim_t)conns + threads + 32;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= need) return 0;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0 && want >= need) return 0;
    fprintf(stderr,
            "shoal-bench: --conns %u needs %llu open files but the limit is %llu; lower "
            "--conns or raise the limit (ulimit -n)\n",
            conns, (unsigned long long)need, (unsigned long long)want);
    return -1;
}

static int resolve(struct bench_ctx *ctx, const struct bench_opts *o)
{
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(o->host, o->port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "shoal-bench: cannot resolve --server host '%s': %s\n", o->host,
                gai_strerror(rc));
        return -1;
    }
    memcpy(&ctx->addr, res->ai_addr, res->ai_addrlen);
    ctx->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static double secs_since(uint64_t t0)
{
    return (double)(bench_now_ns() - t0) / 1e9;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
        (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static bool all_finished(struct bench_worker *w, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (!atomic_load_explicit(&w[i].finished, memory_order_acquire)) return false;
    return true;
}

/* Sleep until `deadline_ns`, returning early on a signal or when every worker has finished.
 * Returns the time it stopped waiting. */
static uint64_t wait_until(uint64_t deadline_ns, struct bench_worker *w, unsigned n)
{
    for (;;) {
        uint64_t now = bench_now_ns();
        if (now >= deadline_ns || g_interrupted || all_finished(w, n)) return now;
        uint64_t step = deadline_ns - now < MAIN_TICK_NS ? deadline_ns - now : MAIN_TICK_NS;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step};
        nanosleep(&ts, NULL);
    }
}

/* Every worker has sent its first measured get, or will never send one. */
static bool all_measuring(struct bench_worker *w, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (!atomic_load_explicit(&w[i].measure_start_ns, memory_order_relaxed) &&
            !atomic_load_explicit(&w[i].finished, memory_order_acquire) &&
            w[i].get_limit > w[i].get_warm)
            return false;
    return true;
}

/* Wait for a --requests run to finish (or an interrupt, which stops it), printing progress.
 * *cpu0 is read once every worker measures; *t0 is when the first one started measuring
 * (`start` if none did). Returns when the wait ended. */
static uint64_t wait_counted(struct bench_ctx *ctx, struct bench_worker *w, unsigned n,
                             uint64_t start, uint64_t *t0, double *cpu0)
{
    const struct bench_opts *o = ctx->o;
    uint64_t total = o->requests + o->warmup_requests;
    bool tty = isatty(STDERR_FILENO), measuring = false;
    uint64_t every = (tty ? 500 : 10000) * 1000000ULL;
    uint64_t next_print = start + every, now;
    *cpu0 = cpu_seconds();
    for (;;) {
        now = bench_now_ns();
        if (g_interrupted || all_finished(w, n)) break;
        if (!measuring && all_measuring(w, n)) {
            measuring = true;
            *cpu0 = cpu_seconds();
        }
        if (now >= next_print) {
            uint64_t sent = 0;
            for (unsigned i = 0; i < n; i++)
                sent += atomic_load_explicit(&w[i].gets_progress, memory_order_relaxed);
            fprintf(stderr, "%sgets sent: %" PRIu64 "/%" PRIu64 " (%.0f%%), %.1f s%s",
                    tty ? "\r" : "", sent, total, 100.0 * (double)sent / (double)total,
                    secs_since(start), tty ? "" : "\n");
            next_print = now + every;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)MAIN_TICK_NS};
        nanosleep(&ts, NULL);
    }
    if (tty && now >= start + every) fputc('\n', stderr);
    if (g_interrupted) atomic_store(&ctx->phase, BENCH_PHASE_STOP);
    *t0 = 0;
    for (unsigned i = 0; i < n; i++) {
        uint64_t s = atomic_load_explicit(&w[i].measure_start_ns, memory_order_relaxed);
        if (s && (!*t0 || s < *t0)) *t0 = s;
    }
    if (!*t0) *t0 = start;
    return now;
}

/* Share of `total` for the thread whose connections are [first, first + share) of `conns`;
 * the shares add up to exactly `total`. */
static uint64_t split(uint64_t total, unsigned first, unsigned share, unsigned conns)
{
    uint64_t lo = (uint64_t)((unsigned __int128)total * first / conns);
    uint64_t hi = (uint64_t)((unsigned __int128)total * (first + share) / conns);
    return hi - lo;
}

static int start_all(struct bench_worker *w, unsigned n, void *(*fn)(void *))
{
    for (unsigned i = 0; i < n; i++) {
        atomic_store(&w[i].finished, false);
        int rc = pthread_create(&w[i].tid, NULL, fn, &w[i]);
        if (rc) {
            fprintf(stderr, "shoal-bench: cannot start thread: %s\n", strerror(rc));
            return -(int)i - 1; /* caller joins the first i */
        }
    }
    return 0;
}

static void join_all(struct bench_worker *w, unsigned n)
{
    for (unsigned i = 0; i < n; i++) pthread_join(w[i].tid, NULL);
}

static int prefill(struct bench_ctx *ctx, struct bench_worker *w, unsigned n)
{
    const struct bench_opts *o = ctx->o;
    for (unsigned i = 0; i < n; i++) {
        w[i].pf_next = (uint64_t)((unsigned __int128)o->keys * i / n);
        w[i].pf_end = (uint64_t)((unsigned __int128)o->keys * (i + 1) / n);
    }
    uint64_t t0 = bench_now_ns();
    int rc = start_all(w, n, bench_worker_prefill);
    if (rc) {
        atomic_store(&ctx->phase, BENCH_PHASE_STOP);
        join_all(w, (unsigned)(-rc - 1));
        return -1;
    }
    bool tty = isatty(STDERR_FILENO);
    uint64_t next_print = t0 + (tty ? 200 : 1000) * 1000000ULL;
    for (;;) {
        uint64_t now = wait_until(next_print, w, n);
        if (g_interrupted) atomic_store(&ctx->phase, BENCH_PHASE_STOP);
        if (g_interrupted || all_finished(w, n)) break;
        uint64_t done = 0;
        for (unsigned i = 0; i < n; i++)
            done += atomic_load_explicit(&w[i].pf_done, memory_order_relaxed);
        fprintf(stderr, "%sprefill: %" PRIu64 "/%" PRIu64 " keys (%.0f%%), %.1f s%s",
                tty ? "\r" : "", done, o->keys, 100.0 * (double)done / (double)o->keys,
                secs_since(t0), tty ? "" : "\n");
        next_print = now + (tty ? 200 : 1000) * 1000000ULL;
    }
    join_all(w, n);
    double secs = secs_since(t0);
    struct bench_stats total;
    bench_stats_init(&total);
    for (unsigned i = 0; i < n; i++) {
        bench_stats_merge(&total, &w[i].unmeasured);
        bench_stats_init(&w[i].unmeasured);
    }
    uint64_t errors = bench_counts_errors(&total.c);
    fprintf(stderr,
            "%sprefill: %" PRIu64 " keys stored in %.2f s (%.0f sets/s), %" PRIu64 " errors%s%s\n",
            tty ? "\r" : "", total.c.sets, secs, (double)total.c.sets / (secs > 0 ? secs : 1e-9),
            errors, errors ? "; first: " : "", errors ? total.err_sample : "");
    if (g_interrupted) return -1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "aside-db")) return bench_dbaside_main(argc - 1, argv + 1);
    struct bench_opts o;
    int prc = bench_opts_parse(&o, argc, argv);
    if (prc > 0) return 0;
    if (prc < 0) return 2;
    install_signals();
    if (ensure_fd_limit(o.conns, o.threads) < 0) return 2;

    static struct bench_ctx ctx;
    ctx.o = &o;
    ctx.prefill_depth = MAIN_PREFILL_DEPTH;
    atomic_init(&ctx.phase, BENCH_PHASE_WARMUP);
    if (resolve(&ctx, &o) < 0) return 1;
    if (bench_keys_init(&ctx.keys, &o) < 0) {
        fprintf(stderr, "shoal-bench: out of memory for a %zu-byte value\n", o.value_size);
        return 1;
    }
    if (o.dist == BENCH_DIST_ZIPF && bench_zipf_init(&ctx.zipf, o.keys, o.zipf_theta) < 0) {
        fprintf(stderr, "shoal-bench: --zipf-theta %g is outside [0, 1)\n", o.zipf_theta);
        return 2;
    }

    struct bench_worker *w = calloc(o.threads, sizeof(*w));
    if (!w) {
        fprintf(stderr, "shoal-bench: out of memory\n");
        return 1;
    }
    int exit_code = 1;
    unsigned inited = 0, first_conn = 0;
    for (; inited < o.threads; inited++) {
        unsigned share = o.conns / o.threads + (inited < o.conns % o.threads);
        if (bench_worker_init(&w[inited], inited, &ctx, share) < 0) {
            bench_worker_free(&w[inited]);
            goto out;
        }
        /* Split --max-requests like the connections, so the threads finish together. */
        if (o.max_requests) {
            uint64_t q = (uint64_t)((unsigned __int128)o.max_requests * share / o.conns);
            w[inited].quota = q ? q : 1;
        }
        /* --requests and --warmup-requests: split exactly, so the total is what was asked. */
        w[inited].get_warm = split(o.warmup_requests, first_conn, share, o.conns);
        w[inited].get_limit = w[inited].get_warm + split(o.requests, first_conn, share, o.conns);
        first_conn += share;
    }
    for (unsigned i = 0; i < o.threads; i++) {
        if (bench_worker_connect(&w[i]) < 0) {
            fprintf(stderr,
                    "shoal-bench: cannot connect to %s:%s: %s; is the server running there? "
                    "(check --server)\n",
                    o.host, o.port, strerror(errno));
            goto out;
        }
    }

    if (o.prefill) {
        if (prefill(&ctx, w, o.threads) < 0) {
            if (g_interrupted) exit_code = 130;
            goto out;
        }
        unsigned live = 0;
        for (unsigned i = 0; i < o.threads; i++) live += w[i].live;
        if (live == 0) {
            fprintf(stderr, "shoal-bench: every connection to %s:%s was lost during prefill\n",
                    o.host, o.port);
            goto out;
        }
        if (o.duration == 0) {
            exit_code = 0;
            goto out;
        }
    }

    /* Warmup and measure run in one go so connections and server caches stay warm. */
    atomic_store(&ctx.phase, o.warmup > 0 ? BENCH_PHASE_WARMUP : BENCH_PHASE_MEASURE);
    uint64_t start = bench_now_ns();
    int src = start_all(w, o.threads, bench_worker_run);
    if (src) {
        atomic_store(&ctx.phase, BENCH_PHASE_STOP);
        join_all(w, (unsigned)(-src - 1));
        goto out;
    }
    uint64_t t0 = start, t1;
    double cpu0, cpu1;
    if (o.requests) {
        t1 = wait_counted(&ctx, w, o.threads, start, &t0, &cpu0);
        cpu1 = cpu_seconds();
    } else {
        if (o.warmup > 0) {
            t0 = wait_until(start + (uint64_t)(o.warmup * 1e9), w, o.threads);
            atomic_store(&ctx.phase, BENCH_PHASE_MEASURE);
        }
        cpu0 = cpu_seconds();
        t1 = wait_until(t0 + (uint64_t)(o.duration * 1e9), w, o.threads);
        cpu1 = cpu_seconds();
    }
    atomic_store(&ctx.phase, BENCH_PHASE_STOP);
    join_all(w, o.threads);

    static struct bench_stats total, warm;
    bench_stats_init(&total);
    bench_stats_init(&warm);
    unsigned live = 0;
    for (unsigned i = 0; i < o.threads; i++) {
        bench_stats_merge(&total, &w[i].measured_st);
        bench_stats_merge(&warm, &w[i].unmeasured);
        live += w[i].live;
    }
    struct bench_report rep = {
        .o = &o,
        .st = &total,
        .elapsed_s = (double)(t1 - t0) / 1e9,
        .warmup_s = (double)(t0 - start) / 1e9,
        .client_cpu_s = cpu1 - cpu0,
        .warm = &warm,
        .interrupted = g_interrupted != 0,
        .value_mean = bench_keys_value_mean(&ctx.keys),
    };
    bench_report_print(stdout, &rep);
    fflush(stdout);
    exit_code = g_interrupted ? 130 : 0; /* partial results are printed, but flagged */
    if (live == 0) {
        fprintf(stderr, "shoal-bench: every connection to %s:%s was lost; the run stopped early\n",
                o.host, o.port);
        exit_code = 1;
    }
    if (bench_report_ops(&total) == 0) {
        fprintf(stderr, "shoal-bench: no request completed successfully in the measured run\n");
        exit_code = 1;
    }

out:
    for (unsigned i = 0; i < inited; i++) bench_worker_free(&w[i]);
    free(w);
    bench_keys_free(&ctx.keys);
    return exit_code;
}
