/* dbaside.c — `shoal-bench aside-db`: cache-aside load with a counting database stand-in and a
 * staleness check, see dbaside.h.
 *
 * Deliberately simple: one blocking connection per thread, one request in flight, so each step
 * of the cache-aside protocol happens in a known order (the point is correctness of what is
 * served during a failover, not peak throughput; --rate keeps the load steady).
 *
 * The staleness rule, exact for this process's own traffic:
 *   db[k]     the stand-in's version of key k (bumped by the writer)
 *   acked[k]  the highest version whose cache delete was acknowledged
 *   busy[k]   fills of k in flight (a miss's load-and-set and its check)
 * A get sent while busy[k] == 0 that returns version v < acked[k] (both read before sending)
 * served a stale value. A fill raises busy[k] before reading db[k] and lowers it only once its
 * set is acknowledged and db[k] is seen unchanged, or (changed: the classic cache-aside race
 * of a set landing after the writer's delete) once it has deleted its own set again; a fill
 * whose set's fate is unknown (timeout, SERVER_ERROR: the node may still apply it) leaves
 * busy[k] raised for the rest of the run (the key is "unchecked"), so the check never blames
 * the cache for a race of the benchmark's own making. */
#include "bench/dbaside.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench/mono.h"
#include "bench/rng.h"
#include "bench/zipf.h"

#define PROG "shoal-bench aside-db"
#define DA_RBUF (64 * 1024)
#define DA_MAX_VALUE 16000
#define DA_MAX_STALE_MSGS 20
#define DA_MAX_BACKLOG_NS (100 * 1000 * 1000LL) /* --rate: a stalled thread does not burst */

struct da_opts {
    char host[256], port[16];
    unsigned threads;
    uint64_t rate, keys, write_rate, seed;
    const char *prefix;
    double theta, duration;
    unsigned value_size, ttl, report_ms, timeout_ms;
    bool prefill;
};

/* Per-thread counters; the main thread reads them (relaxed) for the reports. */
struct da_counts {
    _Atomic uint64_t gets, hits, misses, errors, get_errors, db_reads, stale, fills, fill_races,
        unchecked, writes, write_errors;
} __attribute__((aligned(64)));

struct da_conn {
    int fd;
    char rbuf[DA_RBUF];
    size_t rpos, rlen;
};

enum da_res { DA_OK, DA_MISS, DA_SERVER_ERR, DA_IO_ERR };

static struct da_opts g_o;
static struct sockaddr_storage g_addr;
static socklen_t g_addrlen;
static struct bench_zipf g_zipf;
static uint64_t g_scatter;
static _Atomic uint32_t *g_db, *g_acked, *g_busy;
static _Atomic bool g_stop;
static _Atomic unsigned g_stale_msgs;
static char g_pad[DA_MAX_VALUE];
static volatile sig_atomic_t g_signalled;

static void on_signal(int sig)
{
    (void)sig;
    g_signalled = 1;
}

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static uint64_t pick_key(struct bench_rng *r)
{
    uint64_t rank = bench_zipf_next(&g_zipf, r);
    return (uint64_t)(((unsigned __int128)rank * g_scatter) % g_o.keys);
}

/* ---- one blocking connection ---- */

static int conn_open(struct da_conn *c)
{
    c->rpos = c->rlen = 0;
    c->fd = socket(g_addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = g_o.timeout_ms / 1000, .tv_usec = g_o.timeout_ms % 1000 * 1000};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(c->fd, (struct sockaddr *)&g_addr, g_addrlen) < 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

static void conn_close(struct da_conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static int send_all(struct da_conn *c, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Make at least `n` unread bytes available. */
static int fill_to(struct da_conn *c, size_t n)
{
    if (c->rlen - c->rpos >= n) return 0;
    if (n > DA_RBUF) return -1;
    if (c->rpos) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    while (c->rlen < n) {
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, DA_RBUF - c->rlen, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c->rlen += (size_t)r;
    }
    return 0;
}

/* The next line without its CRLF (NUL-terminated in place), or NULL on an I/O error. */
static char *read_line(struct da_conn *c)
{
    for (;;) {
        char *s = c->rbuf + c->rpos;
        char *nl = memchr(s, '\n', c->rlen - c->rpos);
        if (nl) {
            size_t len = (size_t)(nl - s);
            if (len && s[len - 1] == '\r') len--;
            s[len] = '\0';
            c->rpos = (size_t)(nl - c->rbuf) + 1;
            return s;
        }
        if (fill_to(c, c->rlen - c->rpos + 1) < 0) return NULL;
    }
}

static int key_str(char *dst, uint64_t k)
{
    return sprintf(dst, "%s%" PRIu64, g_o.prefix, k);
}

/* get: DA_OK with *ver (a hit), DA_MISS, DA_SERVER_ERR (connection still usable) or
 * DA_IO_ERR (reconnect). */
static enum da_res op_get(struct da_conn *c, uint64_t k, uint32_t *ver)
{
    char req[300];
    int n = sprintf(req, "get ");
    n += key_str(req + n, k);
    n += sprintf(req + n, "\r\n");
    if (send_all(c, req, (size_t)n) < 0) return DA_IO_ERR;
    char *l = read_line(c);
    if (!l) return DA_IO_ERR;
    if (!strcmp(l, "END")) return DA_MISS;
    if (strncmp(l, "VALUE ", 6)) return strncmp(l, "SERVER_ERROR", 12) ? DA_IO_ERR : DA_SERVER_ERR;
    char *last = strrchr(l, ' ');
    unsigned long bytes = strtoul(last + 1, NULL, 10);
    if (bytes + 2 > DA_RBUF || fill_to(c, bytes + 2) < 0) return DA_IO_ERR;
    const char *v = c->rbuf + c->rpos;
    if (bytes < 2 || v[0] != 'v') return DA_IO_ERR; /* not our value: framing is lost */
    *ver = (uint32_t)strtoul(v + 1, NULL, 10);
    c->rpos += bytes + 2;
    l = read_line(c);
    if (!l || strcmp(l, "END")) return DA_IO_ERR;
    return DA_OK;
}

static enum da_res op_set(struct da_conn *c, uint64_t k, uint32_t ver)
{
    char req[DA_MAX_VALUE + 400], val[64];
    int vl = sprintf(val, "v%" PRIu32 " k%" PRIu64 " ", ver, k);
    size_t len = g_o.value_size > (unsigned)vl ? g_o.value_size : (unsigned)vl;
    int n = sprintf(req, "set ");
    n += key_str(req + n, k);
    n += sprintf(req + n, " 0 %u %zu\r\n", g_o.ttl, len);
    memcpy(req + n, val, (size_t)vl);
    memcpy(req + n + vl, g_pad, len - (size_t)vl);
    n += (int)len;
    n += sprintf(req + n, "\r\n");
    if (send_all(c, req, (size_t)n) < 0) return DA_IO_ERR;
    char *l = read_line(c);
    if (!l) return DA_IO_ERR;
    return strcmp(l, "STORED") ? DA_SERVER_ERR : DA_OK;
}

static enum da_res op_delete(struct da_conn *c, uint64_t k)
{
    char req[300];
    int n = sprintf(req, "delete ");
    n += key_str(req + n, k);
    n += sprintf(req + n, "\r\n");
    if (send_all(c, req, (size_t)n) < 0) return DA_IO_ERR;
    char *l = read_line(c);
    if (!l) return DA_IO_ERR;
    return strcmp(l, "DELETED") && strcmp(l, "NOT_FOUND") ? DA_SERVER_ERR : DA_OK;
}

/* After an I/O error: reconnect, waiting a little if that fails too. */
static void recover(struct da_conn *c)
{
    conn_close(c);
    if (conn_open(c) < 0) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* --rate pacing: wait until this thread's next request is due. */
static void pace(uint64_t *due, uint64_t gap)
{
    if (!gap) return;
    uint64_t now = bench_now_ns();
    if (*due > now) {
        struct timespec ts = {.tv_sec = (time_t)(*due / 1000000000ULL),
                              .tv_nsec = (long)(*due % 1000000000ULL)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    } else if (now - *due > DA_MAX_BACKLOG_NS) {
        *due = now;
    }
    *due += gap;
}

struct da_thread {
    pthread_t tid;
    unsigned id;
    struct da_counts n;
    struct da_conn c;
};

static void note_stale(uint64_t k, uint32_t v, uint32_t acked)
{
    if (atomic_fetch_add(&g_stale_msgs, 1) >= DA_MAX_STALE_MSGS) return;
    fprintf(stderr, PROG ": stale value: %s%" PRIu64 " served at version %" PRIu32
            ", version %" PRIu32 " was acknowledged deleted before the get (database has %" PRIu32
            ")\n", g_o.prefix, k, v, acked, atomic_load(&g_db[k]));
}

/* A miss: load from the stand-in, set, check the stand-in did not move meanwhile. */
static void fill(struct da_thread *t, uint64_t k)
{
    atomic_fetch_add(&g_busy[k], 1);
    uint32_t v = atomic_load(&g_db[k]);
    atomic_fetch_add_explicit(&t->n.db_reads, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->n.fills, 1, memory_order_relaxed);
    enum da_res r = op_set(&t->c, k, v);
    if (r != DA_OK) {
        atomic_fetch_add_explicit(&t->n.errors, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->n.unchecked, 1, memory_order_relaxed);
        if (r == DA_IO_ERR) recover(&t->c);
        return; /* busy[k] stays raised: the set may still land */
    }
    if (atomic_load(&g_db[k]) != v) {
        atomic_fetch_add_explicit(&t->n.fill_races, 1, memory_order_relaxed);
        r = op_delete(&t->c, k);
        if (r != DA_OK) {
            atomic_fetch_add_explicit(&t->n.errors, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->n.unchecked, 1, memory_order_relaxed);
            if (r == DA_IO_ERR) recover(&t->c);
            return;
        }
    }
    atomic_fetch_sub(&g_busy[k], 1);
}

static void *reader(void *arg)
{
    struct da_thread *t = arg;
    struct bench_rng rng;
    bench_rng_seed(&rng, g_o.seed, t->id);
    uint64_t gap = g_o.rate ? (uint64_t)(1e9 * g_o.threads / (double)g_o.rate) : 0;
    uint64_t due = bench_now_ns() + gap * t->id / g_o.threads;
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        pace(&due, gap);
        if (t->c.fd < 0) {
            recover(&t->c);
            if (t->c.fd < 0) {
                atomic_fetch_add_explicit(&t->n.errors, 1, memory_order_relaxed);
                continue;
            }
        }
        uint64_t k = pick_key(&rng);
        uint32_t busy = atomic_load(&g_busy[k]);
        uint32_t acked = atomic_load(&g_acked[k]);
        uint32_t v = 0;
        enum da_res r = op_get(&t->c, k, &v);
        atomic_fetch_add_explicit(&t->n.gets, 1, memory_order_relaxed);
        if (r == DA_OK) {
            atomic_fetch_add_explicit(&t->n.hits, 1, memory_order_relaxed);
            if (busy == 0 && v < acked) {
                atomic_fetch_add_explicit(&t->n.stale, 1, memory_order_relaxed);
                note_stale(k, v, acked);
            }
        } else if (r == DA_MISS) {
            atomic_fetch_add_explicit(&t->n.misses, 1, memory_order_relaxed);
            fill(t, k);
        } else {
            /* the application saw an error and reads the database instead (no fill) */
            atomic_fetch_add_explicit(&t->n.errors, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->n.get_errors, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->n.db_reads, 1, memory_order_relaxed);
            if (r == DA_IO_ERR) recover(&t->c);
        }
    }
    return NULL;
}

/* Bump a key in the stand-in, then delete it in the cache; an acknowledged delete publishes
 * the version to the staleness check. */
static void *writer(void *arg)
{
    struct da_thread *t = arg;
    struct bench_rng rng;
    bench_rng_seed(&rng, g_o.seed ^ 0x5752495445ULL, t->id);
    uint64_t gap = (uint64_t)(1e9 / (double)g_o.write_rate);
    uint64_t due = bench_now_ns();
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        pace(&due, gap);
        if (t->c.fd < 0) recover(&t->c);
        if (t->c.fd < 0) {
            atomic_fetch_add_explicit(&t->n.write_errors, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->n.errors, 1, memory_order_relaxed);
            continue;
        }
        uint64_t k = pick_key(&rng);
        uint32_t nv = atomic_fetch_add(&g_db[k], 1) + 1;
        atomic_fetch_add_explicit(&t->n.writes, 1, memory_order_relaxed);
        enum da_res r = op_delete(&t->c, k);
        if (r != DA_OK) {
            atomic_fetch_add_explicit(&t->n.write_errors, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->n.errors, 1, memory_order_relaxed);
            if (r == DA_IO_ERR) recover(&t->c);
            continue;
        }
        uint32_t a = atomic_load(&g_acked[k]);
        while (a < nv && !atomic_compare_exchange_weak(&g_acked[k], &a, nv)) {
        }
    }
    return NULL;
}

struct prefill_arg {
    pthread_t tid;
    uint64_t from, to;
    int rc;
};

/* The prefill leaves the cache as the load keeps it, not fuller: reads and writes pick keys by
 * one popularity, so every key is deleted at write_rate/rate times the rate it is read at and
 * refilled at its next read, and is present a fraction rate/(rate + write_rate) of the time.
 * A cache prefilled whole reaches that only after its coldest keys were each deleted and read
 * again (minutes), so the database reads crept up during the measurement (177/s in the baseline
 * against 196/s once settled, at 10,000 gets/s and 200 writes/s) and read as a failover's cost.
 * Each key is left out with the complementary probability, drawn from its number. */
static bool prefill_skips(uint64_t k)
{
    if (g_o.rate == 0 || g_o.write_rate == 0) return false;
    struct bench_rng r;
    bench_rng_seed(&r, g_o.seed ^ 0x50524546ULL, k);
    return bench_rng_unit(&r) < (double)g_o.write_rate / (double)(g_o.rate + g_o.write_rate);
}

static void *prefill(void *arg)
{
    struct prefill_arg *p = arg;
    struct da_conn *c = malloc(sizeof *c);
    p->rc = -1;
    if (!c) return NULL;
    if (conn_open(c) == 0) {
        uint64_t k = p->from;
        while (k < p->to && (prefill_skips(k) || op_set(c, k, 0) == DA_OK)) k++;
        if (k == p->to) p->rc = 0;
        conn_close(c);
    }
    free(c);
    return NULL;
}

static void sum(struct da_thread *ts, unsigned n, uint64_t out[12])
{
    memset(out, 0, 12 * sizeof(uint64_t));
    for (unsigned i = 0; i < n; i++) {
        _Atomic uint64_t *f = &ts[i].n.gets;
        for (int j = 0; j < 12; j++) out[j] += atomic_load_explicit(&f[j], memory_order_relaxed);
    }
}

static const char *const count_names[12] = {
    "gets", "hits", "misses", "errors", "get_errors", "db_reads", "stale", "fills", "fill_races",
    "unchecked", "writes", "write_errors"};

static void print_counts(const char *head, const uint64_t c[12], double secs)
{
    printf("{%s", head);
    for (int j = 0; j < 12; j++) printf(", \"%s\": %" PRIu64, count_names[j], c[j]);
    uint64_t answered = c[1] + c[2];
    printf(", \"hit_ratio\": %.4f, \"gets_per_s\": %.1f}\n", answered ? (double)c[1] / answered : 0,
           secs > 0 ? c[0] / secs : 0);
    fflush(stdout);
}

static double realtime_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options]\n"
            "Cache-aside reads through a memcached-protocol server (a shoal-router) against a\n"
            "counting database stand-in kept in this process, with a writer that bumps a key's\n"
            "version and then deletes it in the cache. Prints one JSON line per report interval\n"
            "(counts in the interval; \"ts\" is the wall clock at its end) and a summary line.\n"
            "A hit whose version is older than one whose delete was acknowledged before the get\n"
            "was sent counts as \"stale\"; keys with a fill of uncertain fate are left unchecked.\n"
            "  -s, --server HOST:PORT  (default 127.0.0.1:11211)\n"
            "  -t, --threads N         reader threads, one connection each (default 8)\n"
            "      --rate N            gets/s in all, paced per thread (default 0: closed loop)\n"
            "      --keys N            key space (default 100000)\n"
            "      --key-prefix STR    (default \"fo:\": the namespace fo)\n"
            "      --zipf-theta F      key popularity skew (default 0.99)\n"
            "      --value-size N      bytes per value, at least the version tag (default 100)\n"
            "      --ttl S             TTL of fills, so cold keys keep missing (default 0: none)\n"
            "      --write-rate N      writes/s: version bump + cache delete (default 50)\n"
            "      --prefill           set the keys at version 0 first (each but a fraction\n"
            "                          write-rate/(rate + write-rate), absent as the load keeps it)\n"
            "  -d, --duration S        seconds of load (default 10)\n"
            "      --report-ms N       report interval (default 1000)\n"
            "      --timeout-ms N      socket timeout per request (default 2000)\n"
            "      --seed N            (default 1)\n");
}

static int parse(int argc, char **argv)
{
    static const struct option lo[] = {
        {"server", 1, NULL, 's'},     {"threads", 1, NULL, 't'},   {"rate", 1, NULL, 'r'},
        {"keys", 1, NULL, 'k'},       {"key-prefix", 1, NULL, 'P'}, {"zipf-theta", 1, NULL, 'z'},
        {"value-size", 1, NULL, 'v'}, {"ttl", 1, NULL, 'T'},       {"write-rate", 1, NULL, 'w'},
        {"prefill", 0, NULL, 'f'},    {"duration", 1, NULL, 'd'},  {"report-ms", 1, NULL, 'R'},
        {"timeout-ms", 1, NULL, 'o'}, {"seed", 1, NULL, 'S'},      {"help", 0, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *server = "127.0.0.1:11211";
    g_o = (struct da_opts){.threads = 8, .keys = 100000, .write_rate = 50, .seed = 1,
                           .prefix = "fo:", .theta = 0.99, .duration = 10, .value_size = 100,
                           .report_ms = 1000, .timeout_ms = 2000};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "s:t:d:h", lo, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        switch (ch) {
        case 's': server = optarg; break;
        case 't': g_o.threads = (unsigned)strtoul(optarg, &end, 10); break;
        case 'r': g_o.rate = strtoull(optarg, &end, 10); break;
        case 'k': g_o.keys = strtoull(optarg, &end, 10); break;
        case 'P': g_o.prefix = optarg; break;
        case 'z': g_o.theta = strtod(optarg, &end); break;
        case 'v': g_o.value_size = (unsigned)strtoul(optarg, &end, 10); break;
        case 'T': g_o.ttl = (unsigned)strtoul(optarg, &end, 10); break;
        case 'w': g_o.write_rate = strtoull(optarg, &end, 10); break;
        case 'f': g_o.prefill = true; break;
        case 'd': g_o.duration = strtod(optarg, &end); break;
        case 'R': g_o.report_ms = (unsigned)strtoul(optarg, &end, 10); break;
        case 'o': g_o.timeout_ms = (unsigned)strtoul(optarg, &end, 10); break;
        case 'S': g_o.seed = strtoull(optarg, &end, 10); break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
        if (end && (*end || errno)) {
            fprintf(stderr, PROG ": bad number '%s'\n", optarg);
            return -1;
        }
    }
    if (optind < argc || g_o.threads < 1 || g_o.threads > 1024 || g_o.keys < 1 ||
        g_o.keys > 100000000 || g_o.write_rate < 1 || g_o.value_size > DA_MAX_VALUE ||
        g_o.report_ms < 10 || g_o.timeout_ms < 1 || !(g_o.duration > 0) ||
        strlen(g_o.prefix) > 200 || strpbrk(g_o.prefix, " \r\n")) {
        fprintf(stderr, PROG ": bad arguments: threads 1..1024, keys 1..1e8, write-rate >= 1, "
                        "value-size <= %d, report-ms >= 10, duration > 0, prefix without spaces\n",
                DA_MAX_VALUE);
        return -1;
    }
    const char *colon = strrchr(server, ':');
    if (!colon || colon == server) {
        fprintf(stderr, PROG ": --server takes HOST:PORT\n");
        return -1;
    }
    size_t hl = (size_t)(colon - server);
    if (server[0] == '[' && hl >= 2 && server[hl - 1] == ']') server++, hl -= 2;
    if (hl >= sizeof g_o.host || strlen(colon + 1) >= sizeof g_o.port) return -1;
    memcpy(g_o.host, server, hl);
    g_o.host[hl] = '\0';
    strcpy(g_o.port, colon + 1);
    return 0;
}

int bench_dbaside_main(int argc, char **argv)
{
    int prc = parse(argc, argv);
    if (prc) return prc > 0 ? 0 : 2;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    int gr = getaddrinfo(g_o.host, g_o.port, &hints, &res);
    if (gr) {
        fprintf(stderr, PROG ": cannot resolve %s: %s\n", g_o.host, gai_strerror(gr));
        return 1;
    }
    memcpy(&g_addr, res->ai_addr, res->ai_addrlen);
    g_addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    if (bench_zipf_init(&g_zipf, g_o.keys, g_o.theta) < 0) {
        fprintf(stderr, PROG ": --zipf-theta %g is outside [0, 1)\n", g_o.theta);
        return 2;
    }
    g_scatter = 0x9E3779B97F4A7C15ULL % g_o.keys;
    while (g_o.keys > 1 && (g_scatter == 0 || gcd(g_scatter, g_o.keys) != 1)) g_scatter++;
    if (g_o.keys == 1) g_scatter = 1;
    memset(g_pad, 'x', sizeof g_pad);
    g_db = calloc(g_o.keys, sizeof *g_db);
    g_acked = calloc(g_o.keys, sizeof *g_acked);
    g_busy = calloc(g_o.keys, sizeof *g_busy);
    struct da_thread *ts = calloc(g_o.threads + 1, sizeof *ts);
    if (!g_db || !g_acked || !g_busy || !ts) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (g_o.prefill) {
        uint64_t t0 = bench_now_ns();
        struct prefill_arg pa[16];
        unsigned np = g_o.threads < 16 ? g_o.threads : 16;
        for (unsigned i = 0; i < np; i++) {
            pa[i].from = g_o.keys * i / np;
            pa[i].to = g_o.keys * (i + 1) / np;
            pthread_create(&pa[i].tid, NULL, prefill, &pa[i]);
        }
        int bad = 0;
        for (unsigned i = 0; i < np; i++) {
            pthread_join(pa[i].tid, NULL);
            bad |= pa[i].rc;
        }
        if (bad) {
            fprintf(stderr, PROG ": prefill failed (server unreachable or refusing sets)\n");
            return 1;
        }
        printf("{\"prefilled\": %" PRIu64 ", \"seconds\": %.2f}\n", g_o.keys,
               (bench_now_ns() - t0) / 1e9);
        fflush(stdout);
    }

    for (unsigned i = 0; i <= g_o.threads; i++) {
        ts[i].id = i;
        ts[i].c.fd = -1;
        if (conn_open(&ts[i].c) < 0) {
            fprintf(stderr, PROG ": cannot connect to %s:%s: %s\n", g_o.host, g_o.port,
                    strerror(errno));
            return 1;
        }
    }
    uint64_t start = bench_now_ns();
    for (unsigned i = 0; i <= g_o.threads; i++)
        pthread_create(&ts[i].tid, NULL, i == g_o.threads ? writer : reader, &ts[i]);

    uint64_t prev[12] = {0}, cur[12], delta[12];
    uint64_t tick = (uint64_t)g_o.report_ms * 1000000ULL, next = start + tick;
    uint64_t end = start + (uint64_t)(g_o.duration * 1e9);
    while (!g_signalled) {
        uint64_t now = bench_now_ns();
        if (now >= next || now >= end) {
            sum(ts, g_o.threads + 1, cur);
            for (int j = 0; j < 12; j++) delta[j] = cur[j] - prev[j];
            memcpy(prev, cur, sizeof prev);
            char head[96];
            snprintf(head, sizeof head, "\"t\": %.3f, \"ts\": %.3f", (now - start) / 1e9,
                     realtime_s());
            print_counts(head, delta, tick / 1e9);
            next += tick;
            if (now >= end) break;
            continue;
        }
        uint64_t wait = (next < end ? next : end) - now;
        struct timespec tsl = {.tv_sec = (time_t)(wait / 1000000000ULL),
                               .tv_nsec = (long)(wait % 1000000000ULL)};
        nanosleep(&tsl, NULL);
    }
    atomic_store(&g_stop, true);
    for (unsigned i = 0; i <= g_o.threads; i++) pthread_join(ts[i].tid, NULL);
    uint64_t stopped = bench_now_ns();
    double secs = (stopped - start) / 1e9;
    sum(ts, g_o.threads + 1, cur);
    char head[96];
    /* what was answered between the last report and the stop: every request is in one line */
    bool rest = false;
    for (int j = 0; j < 12; j++) {
        delta[j] = cur[j] - prev[j];
        rest |= delta[j] != 0;
    }
    if (rest) {
        snprintf(head, sizeof head, "\"t\": %.3f, \"ts\": %.3f, \"partial\": true", secs,
                 realtime_s());
        print_counts(head, delta, tick / 1e9);
    }
    snprintf(head, sizeof head, "\"summary\": true, \"seconds\": %.3f", secs);
    print_counts(head, cur, secs);
    for (unsigned i = 0; i <= g_o.threads; i++) conn_close(&ts[i].c);
    free(ts);
    free(g_db);
    free(g_acked);
    free(g_busy);
    return 0;
}
