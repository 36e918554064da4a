/* test_deliver.c — unit tests for the invalidator's delivery (src/invalidator/deliver*.c) against
 * fake clusters: a thread in the test listening on a loopback port that answers `md`, `mn` and
 * `flush_all` as a shoal-node does (quiet mode hides HD) and logs what it deleted, and can be
 * told to refuse a key, fail one a number of times, or go away and come back on the same port.
 * They pin down commit order, the safe LSN, spilling and its replay (also after a restart), the
 * flush that replaces a backlog past its bound, error handling per key, base64 keys, failover,
 * one down cluster not holding another, and replay by slot. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/slot.h"
#include "invalidator/deliver.h"
#include "invalidator/deliver_int.h"
#include "protocol/protocol.h"

/* ---- a fake cluster ---- */

#define FK_MAX 4096
struct fake {
    int lfd, cfd;
    uint16_t port;
    pthread_t th;
    int running;
    volatile int stop;
    pthread_mutex_t lock;
    char *log[FK_MAX]; /* deleted keys in order; "<flush_all>", "<flush_ns NAME>" for flushes */
    size_t loglen[FK_MAX];
    int n;
    char refuse[64];   /* answered CLIENT_ERROR */
    char flaky[64];    /* answered SERVER_ERROR while flaky_left > 0 */
    int flaky_left;
    int mds;           /* md requests seen (all) */
    int flush_fail;    /* flush_all or flush_ns answered SERVER_ERROR this many more times */
    char no_ns[64];    /* flush_ns of this name answered CLIENT_ERROR unknown namespace */
};

static void fk_log(struct fake *f, const char *k, size_t n)
{
    pthread_mutex_lock(&f->lock);
    if (f->n < FK_MAX) {
        f->log[f->n] = malloc(n + 1);
        memcpy(f->log[f->n], k, n);
        f->log[f->n][n] = 0;
        f->loglen[f->n++] = n;
    }
    pthread_mutex_unlock(&f->lock);
}

static void fk_line(struct fake *f, int fd, char *line, size_t n)
{
    const char *reply = NULL;
    if (n == 2 && !memcmp(line, "mn", 2)) {
        reply = "MN\r\n";
    } else if (n == 9 && !memcmp(line, "flush_all", 9)) {
        pthread_mutex_lock(&f->lock);
        bool fail = f->flush_fail > 0;
        if (fail) f->flush_fail--;
        pthread_mutex_unlock(&f->lock);
        if (!fail) fk_log(f, "<flush_all>", 11);
        reply = fail ? "SERVER_ERROR shoal-router: node 127.0.0.1:1 is down\r\n" : "OK\r\n";
    } else if (n > 9 && !memcmp(line, "flush_ns ", 9)) {
        char name[300];
        snprintf(name, sizeof name, "<flush_ns %.*s>", (int)(n - 9), line + 9);
        pthread_mutex_lock(&f->lock);
        bool unknown = strlen(f->no_ns) == n - 9 && !memcmp(f->no_ns, line + 9, n - 9);
        bool fail = !unknown && f->flush_fail > 0;
        if (fail) f->flush_fail--;
        pthread_mutex_unlock(&f->lock);
        if (!fail && !unknown) fk_log(f, name, strlen(name));
        reply = unknown ? "CLIENT_ERROR unknown namespace\r\n"
                : fail  ? "SERVER_ERROR shoal-router: node 127.0.0.1:1 is down\r\n"
                        : "OK\r\n";
    } else if (n > 3 && !memcmp(line, "md ", 3)) {
        line[n] = 0;
        char *save, *tok = strtok_r(line + 3, " ", &save), *fl;
        char key[300];
        size_t nk = strlen(tok);
        bool b = false, q = false;
        while ((fl = strtok_r(NULL, " ", &save))) {
            if (!strcmp(fl, "b")) b = true;
            if (!strcmp(fl, "q")) q = true;
        }
        if (b) {
            int got = proto_base64_decode(tok, nk, key, sizeof key);
            nk = got < 0 ? 0 : (size_t)got;
        } else {
            memcpy(key, tok, nk);
        }
        key[nk] = 0;
        pthread_mutex_lock(&f->lock);
        f->mds++;
        bool refuse = !strcmp(key, f->refuse), flaky = !strcmp(key, f->flaky) && f->flaky_left > 0;
        if (flaky) f->flaky_left--;
        pthread_mutex_unlock(&f->lock);
        if (refuse) reply = "CLIENT_ERROR bad command line format\r\n";
        else if (flaky) reply = "SERVER_ERROR out of memory\r\n";
        else {
            fk_log(f, key, nk);
            reply = q ? NULL : "HD\r\n";
        }
    } else {
        reply = "ERROR\r\n";
    }
    if (reply) assert_true(send(fd, reply, strlen(reply), MSG_NOSIGNAL) >= 0 || 1);
}

static void *fk_main(void *arg)
{
    struct fake *f = arg;
    char in[65536];
    size_t nin = 0;
    while (!f->stop) {
        struct pollfd p[2] = {{.fd = f->lfd, .events = POLLIN}, {.fd = f->cfd, .events = POLLIN}};
        if (poll(p, f->cfd >= 0 ? 2 : 1, 20) <= 0) continue;
        if (p[0].revents & POLLIN) {
            int fd = accept(f->lfd, NULL, NULL);
            if (fd >= 0) {
                if (f->cfd >= 0) close(f->cfd);
                f->cfd = fd;
                nin = 0;
            }
            continue;
        }
        if (f->cfd < 0 || !(p[1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t r = recv(f->cfd, in + nin, sizeof in - nin - 1, 0);
        if (r <= 0) {
            close(f->cfd);
            f->cfd = -1;
            continue;
        }
        nin += (size_t)r;
        size_t at = 0;
        char *nl;
        while ((nl = memchr(in + at, '\n', nin - at))) {
            size_t n = (size_t)(nl - in) - at;
            if (n && in[at + n - 1] == '\r') n--;
            fk_line(f, f->cfd, in + at, n);
            at = (size_t)(nl - in) + 1;
        }
        memmove(in, in + at, nin - at);
        nin -= at;
    }
    return NULL;
}

/* Listen on `port` (0: any free one). */
static void fk_start(struct fake *f, uint16_t port)
{
    if (!f->running && !f->port) {
        memset(f, 0, sizeof *f);
        pthread_mutex_init(&f->lock, NULL);
    }
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f->lfd, 8), 0);
    socklen_t len = sizeof a;
    getsockname(f->lfd, (struct sockaddr *)&a, &len);
    f->port = ntohs(a.sin_port);
    f->cfd = -1;
    f->stop = 0;
    f->running = 1;
    assert_int_equal(pthread_create(&f->th, NULL, fk_main, f), 0);
}

/* Go away: the listener and the connection close; the port is kept for fk_start. */
static void fk_stop(struct fake *f)
{
    if (!f->running) return;
    f->stop = 1;
    pthread_join(f->th, NULL);
    close(f->lfd);
    if (f->cfd >= 0) close(f->cfd);
    f->cfd = -1;
    f->running = 0;
}

static void fk_free(struct fake *f)
{
    fk_stop(f);
    for (int i = 0; i < f->n; i++) free(f->log[i]);
    f->n = 0;
}

static int fk_count(struct fake *f)
{
    pthread_mutex_lock(&f->lock);
    int n = f->n;
    pthread_mutex_unlock(&f->lock);
    return n;
}

/* A port nothing listens on (bound, then closed). */
static uint16_t dead_port(void)
{
    struct fake f = {0};
    fk_start(&f, 0);
    uint16_t p = f.port;
    fk_free(&f);
    return p;
}

static int fk_has_key(struct fake *f, const char *k)
{
    pthread_mutex_lock(&f->lock);
    int found = 0;
    for (int i = 0; i < f->n; i++) found += !strcmp(f->log[i], k);
    pthread_mutex_unlock(&f->lock);
    return found;
}

static int fk_mds(struct fake *f)
{
    pthread_mutex_lock(&f->lock);
    int n = f->mds;
    pthread_mutex_unlock(&f->lock);
    return n;
}

/* The fake logged "<prefix><i>" for i in [from, to) at positions at, at + 1, ... */
static void assert_logged(struct fake *f, int at, const char *prefix, int from, int to)
{
    for (int i = from; i < to; i++, at++) {
        char k[64];
        snprintf(k, sizeof k, "%s%d", prefix, i);
        assert_string_equal(f->log[at], k);
    }
}

/* Assert that `cond` comes to hold within 5 s (polled every 5 ms). */
#define AWAIT(cond) do { \
    for (int w_ = 0; w_ < 1000 && !(cond); w_++) usleep(5000); \
    assert_true(cond); \
} while (0)

/* ---- a deliver for the test ---- */

/* One test's world: up to two clusters, "east" on fake router f[0] and "west" on f[1], the
 * deliver's configuration (spill files in a fresh temporary directory) and the deliver. Made by
 * fx_setup and undone by fx_teardown around every test that takes it as its state. */
struct fx {
    struct fake f[2];
    char dir[64];
    char addr[4][2][32];
    const char *routers[4][2];
    struct deliver_cluster_cfg cl[4];
    struct deliver_cfg cfg;
    struct deliver *d;
};

static int fx_setup(void **state)
{
    struct fx *x = calloc(1, sizeof *x);
    assert_non_null(x);
    strcpy(x->dir, "/tmp/test_deliver.XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    x->cfg.clusters = x->cl;
    x->cfg.nclusters = 1;
    x->cfg.spill_dir = x->dir;
    x->cfg.batch_max = 64;
    x->cfg.timeout_ms = 200;
    x->cfg.mem_max_bytes = 1 << 20;
    x->cfg.spill_max_bytes = 1 << 20;
    static const char *names[] = {"east", "west", "north", "south"};
    for (size_t i = 0; i < 4; i++) {
        x->cl[i].name = names[i];
        x->cl[i].routers = x->routers[i];
    }
    *state = x;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *x = *state;
    if (x->d) deliver_destroy(x->d);
    for (int i = 0; i < 2; i++) fk_free(&x->f[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", x->dir);
    assert_int_equal(system(cmd), 0);
    free(x);
    return 0;
}

/* Cluster i's routers: the given ports in order (p1 0: one router). */
static void fx_ports(struct fx *x, size_t i, uint16_t p0, uint16_t p1)
{
    snprintf(x->addr[i][0], sizeof x->addr[i][0], "127.0.0.1:%u", p0);
    x->routers[i][0] = x->addr[i][0];
    x->cl[i].nrouters = 1;
    if (p1) {
        snprintf(x->addr[i][1], sizeof x->addr[i][1], "127.0.0.1:%u", p1);
        x->routers[i][1] = x->addr[i][1];
        x->cl[i].nrouters = 2;
    }
}

enum { NONE = -1, DOWN = 0, UP = 1 };

/* Cluster east, and west unless NONE, each with its fake router: UP listens from now on, DOWN
 * has a port nothing listens on until fx_bring_up. */
static void fx_clusters(struct fx *x, int east, int west)
{
    int state[2] = {east, west};
    x->cfg.nclusters = west == NONE ? 1 : 2;
    for (size_t i = 0; i < x->cfg.nclusters; i++) {
        fk_start(&x->f[i], 0);
        if (state[i] == DOWN) fk_stop(&x->f[i]);
        fx_ports(x, i, x->f[i].port, 0);
    }
}

/* A DOWN cluster's fake router comes (back) up on its port. */
static void fx_bring_up(struct fx *x, int i)
{
    fk_start(&x->f[i], x->f[i].port);
}

/* Create the deliver from x->cfg (the first time, or again after fx_stop: a restart). */
static struct deliver *fx_start(struct fx *x)
{
    char err[256] = "";
    x->d = deliver_create(&x->cfg, err, sizeof err);
    if (!x->d) fprintf(stderr, "deliver_create: %s\n", err);
    assert_non_null(x->d);
    return x->d;
}

static void fx_stop(struct fx *x)
{
    deliver_destroy(x->d);
    x->d = NULL;
}

/* Commit keys "<prefix><i>" for i in [from, to), one per commit, LSN 100*(i+1). */
static void commit_range(struct deliver *d, const char *prefix, int from, int to)
{
    for (int i = from; i < to; i++) {
        char k[64];
        int n = snprintf(k, sizeof k, "%s%d", prefix, i);
        struct deliver_key key = {k, (size_t)n, "ns"};
        assert_int_equal(deliver_commit(d, 100 * (uint64_t)(i + 1), clock_wall_us(), &key, 1, 0), 0);
    }
}

/* The value of shoal_invalidator_cluster_<name>{cluster="<cluster>"}; UINT64_MAX if absent. */
static uint64_t metric(struct deliver *d, const char *cluster, const char *name)
{
    char series[160];
    snprintf(series, sizeof series, "shoal_invalidator_cluster_%s{cluster=\"%s\"} ", name, cluster);
    struct buf b;
    buf_init(&b);
    deliver_metrics(d, &b);
    buf_append(&b, "", 1);
    const char *p = strstr(b.data, series);
    uint64_t v = p ? strtoull(p + strlen(series), NULL, 10) : UINT64_MAX;
    buf_release(&b);
    return v;
}

static int metric_reaches(struct deliver *d, const char *cluster, const char *name, uint64_t v)
{
    uint64_t got = metric(d, cluster, name);
    return got != UINT64_MAX && got >= v;
}

static long file_size(struct fx *x, const char *cluster, const char *suffix)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s%s", x->dir, cluster, suffix);
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}
#define spill_size(x, c) file_size((x), (c), ".spill")
#define retry_size(x, c) file_size((x), (c), ".retry")

/* ---- tests ---- */

static void test_key_forms(void **state)
{
    char big[251];
    memset(big, 'k', sizeof big);
    assert_int_equal(wire_key_form("user:1", 6), 0);
    assert_int_equal(wire_key_form("caf\xc3\xa9", 5), 0);   /* UTF-8 goes as it is */
    assert_int_equal(wire_key_form("a b", 3), 1);           /* a space: base64 */
    assert_int_equal(wire_key_form("a\r\nb", 4), 1);
    assert_int_equal(wire_key_form("a\x7f", 2), 1);
    assert_int_equal(wire_key_form(big, 250), 0);
    assert_int_equal(wire_key_form(big, 251), -1);         /* no cache holds it */
    big[0] = ' ';
    assert_int_equal(wire_key_form(big, 186), 1);          /* 248 base64 characters */
    assert_int_equal(wire_key_form(big, 187), -1);         /* 252: over the key limit */
    assert_int_equal(wire_key_form("", 0), -1);
}

static void test_histogram_quantiles(void **state)
{
    struct dhist h = {0};
    for (int i = 1; i <= 1000; i++) dhist_record(&h, (uint64_t)i * 100); /* 100 µs .. 100 ms */
    uint64_t p50 = dhist_quantile(&h, 0.5), p99 = dhist_quantile(&h, 0.99);
    assert_true(p50 >= 50000 && p50 <= 50000 * 1.125 + 1);
    assert_true(p99 >= 99000 && p99 <= 99000 * 1.125 + 1);
    struct dhist e = {0};
    assert_int_equal(dhist_quantile(&e, 0.99), 0);
}

static void test_deletes_arrive_in_commit_order(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 200);
    AWAIT(fk_count(&x->f[0]) >= 200);
    assert_logged(&x->f[0], 0, "k", 0, 200);
    AWAIT(deliver_safe_lsn(d) >= 20000);
    assert_int_equal(deliver_safe_lsn(d), 20000);
    assert_int_equal(metric(d, "east", "deletes_total"), 200);
    assert_int_equal(metric(d, "east", "commits_total"), 200);
    assert_int_equal(metric(d, "east", "commit_to_delete_us_count"), 200);
    assert_int_equal(deliver_healthy(d), 1);
}

static void test_safe_lsn_waits_for_a_down_cluster(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, DOWN);
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 50);
    AWAIT(fk_count(&x->f[0]) >= 50); /* the live cluster is not held up */
    usleep(300000);
    assert_int_equal(deliver_safe_lsn(d), 0); /* west has applied nothing */
    assert_int_equal(deliver_healthy(d), 0);
    assert_int_equal(metric(d, "west", "up"), 0);
    assert_int_equal(metric(d, "west", "buffered_deletes"), 50);
    fx_bring_up(x, 1); /* it comes back */
    AWAIT(fk_count(&x->f[1]) >= 50);
    AWAIT(deliver_safe_lsn(d) >= 5000);
    assert_logged(&x->f[1], 0, "k", 0, 50);
}

static void test_spilled_deletes_count_safe_and_replay_in_order(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, DOWN, NONE);
    x->cfg.mem_max_bytes = 1; /* everything past one record goes to disk */
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 300);
    AWAIT(deliver_safe_lsn(d) >= 30000); /* durably spilled: safe although the cluster is down */
    assert_true(spill_size(x, "east") > 0);
    assert_int_equal(metric(d, "east", "spilled_deletes"), 300);
    fx_bring_up(x, 0);
    AWAIT(fk_count(&x->f[0]) >= 300);
    assert_logged(&x->f[0], 0, "k", 0, 300);
    AWAIT(spill_size(x, "east") == 0); /* applied: the file is emptied */
}

static void test_restart_replays_the_spill_file_first(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, DOWN, NONE);
    x->cfg.mem_max_bytes = 1;
    struct deliver *d = fx_start(x);
    commit_range(d, "old", 0, 20);
    AWAIT(deliver_safe_lsn(d) >= 2000);
    fx_stop(x); /* a restart, with the cluster still down */
    fx_bring_up(x, 0);
    x->cfg.mem_max_bytes = 1 << 20;
    d = fx_start(x);
    assert_int_equal(deliver_safe_lsn(d), 2000); /* what the file holds is safe at once */
    /* the reader restarts from an older confirmed LSN: the commits the file has are not sent
     * twice; the new ones come after the file's */
    commit_range(d, "old", 10, 20);
    commit_range(d, "new", 20, 25);
    AWAIT(fk_count(&x->f[0]) >= 25);
    usleep(100000);
    assert_int_equal(fk_count(&x->f[0]), 25);
    assert_logged(&x->f[0], 0, "old", 0, 20);
    assert_logged(&x->f[0], 20, "new", 20, 25);
    assert_int_equal(metric(d, "east", "skipped_total"), 10);
    AWAIT(deliver_safe_lsn(d) >= 2500);
}

static void test_torn_spill_tail_is_cut(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, DOWN, NONE);
    x->cfg.mem_max_bytes = 1;
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 5);
    AWAIT(deliver_safe_lsn(d) >= 500);
    fx_stop(x);
    long size = spill_size(x, "east");
    char path[128];
    snprintf(path, sizeof path, "%s/east.spill", x->dir);
    FILE *fp = fopen(path, "a");
    fputs("SHSPgarbage", fp); /* a record cut short by a crash */
    fclose(fp);
    d = fx_start(x);
    assert_int_equal(deliver_safe_lsn(d), 500);
    fx_stop(x);
    assert_int_equal(spill_size(x, "east"), size);
}

static void test_backlog_past_spill_bound_becomes_a_flush(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, DOWN, NONE);
    x->cfg.mem_max_bytes = 1;
    x->cfg.spill_max_bytes = 2000;
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 100);
    AWAIT(deliver_safe_lsn(d) >= 10000);
    AWAIT(metric_reaches(d, "east", "flush_replacements_total", 1));
    AWAIT(spill_size(x, "east") <= 2000);
    fx_bring_up(x, 0);
    AWAIT(fk_count(&x->f[0]) >= 1);
    usleep(200000);
    /* a flush of the keys' namespace first, then at most the deletes spilled after the last
     * replacement */
    assert_string_equal(x->f[0].log[0], "<flush_ns ns>");
    assert_int_equal(metric(d, "east", "flush_all_fallbacks_total"), 0);
    int n = fk_count(&x->f[0]);
    assert_true(n < 100);
    assert_logged(&x->f[0], 1, "k", 100 - n + 1, 100);
}

static void test_refused_key_dropped_failed_key_retried(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    struct fake *f = &x->f[0];
    strcpy(f->refuse, "k3");
    strcpy(f->flaky, "k5");
    f->flaky_left = 2;
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 10);
    AWAIT(deliver_safe_lsn(d) >= 1000);
    AWAIT(fk_has_key(f, "k5"));
    /* every key but the refused one, k5 once it went through */
    assert_true(fk_has_key(f, "k5") >= 1);
    assert_int_equal(fk_has_key(f, "k3"), 0);
    assert_int_equal(metric(d, "east", "keys_refused_total"), 1);
    /* the first SERVER_ERROR is tied to k5 by the pass without q; the second comes in the quiet
     * retry, where it is only seen as an error of the batch */
    assert_int_equal(metric(d, "east", "server_errors_total"), 1);
    assert_int_equal(f->flaky_left, 0);
    assert_true(metric(d, "east", "quiet_errors_total") >= 1);
}

/* A key the cluster keeps failing (a router's node down) does not hold the cluster's later
 * deletes: it goes to the spill file (so the safe LSN may pass it) and is sent again from there,
 * also after a restart, until it goes through. */
static void test_failing_key_does_not_hold_later_deletes(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    struct fake *f = &x->f[0];
    strcpy(f->flaky, "k2");
    f->flaky_left = 1000000;
    x->cfg.batch_max = 4;
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 40);
    AWAIT(fk_has_key(f, "k39"));
    AWAIT(deliver_safe_lsn(d) >= 4000);
    assert_int_equal(fk_has_key(f, "k2"), 0);
    assert_true(retry_size(x, "east") > 0); /* k2, kept durably */
    assert_int_equal(spill_size(x, "east"), 0);
    AWAIT(metric_reaches(d, "east", "retried_keys_total", 1));
    AWAIT(metric_reaches(d, "east", "retry_deletes", 1));
    int mds = fk_mds(f);
    usleep(500000);
    assert_true(fk_mds(f) - mds < 40); /* rounds back off: no busy loop on a key that keeps failing */
    for (int i = 0, at = 0; i < 40; i++) { /* the others in order */
        char k[16];
        if (i == 2) continue;
        snprintf(k, sizeof k, "k%d", i);
        while (at < fk_count(f) && strcmp(f->log[at], k)) at++;
        assert_true(at < fk_count(f));
    }
    fx_stop(x); /* a restart while the key still fails */
    pthread_mutex_lock(&f->lock);
    f->flaky_left = 0;
    pthread_mutex_unlock(&f->lock);
    fx_start(x);
    AWAIT(fk_has_key(f, "k2"));
    AWAIT(retry_size(x, "east") == 0);
}

static void test_binary_keys_go_base64(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    struct deliver *d = fx_start(x);
    char huge[300];
    memset(huge, 'h', sizeof huge);
    struct deliver_key keys[] = {{"a b", 3, NULL}, {"c\r\nd", 4, NULL}, {huge, 300, NULL},
                                 {"plain", 5, NULL}};
    assert_int_equal(deliver_commit(d, 10, clock_wall_us(), keys, 4, 0), 0);
    AWAIT(deliver_safe_lsn(d) >= 10);
    assert_int_equal(fk_count(&x->f[0]), 3);
    assert_string_equal(x->f[0].log[0], "a b");
    assert_string_equal(x->f[0].log[1], "c\r\nd");
    assert_string_equal(x->f[0].log[2], "plain");
    assert_int_equal(metric(d, "east", "keys_unsendable_total"), 1);
}

static void test_fails_over_to_the_next_router(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    fx_ports(x, 0, dead_port(), x->f[0].port);
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 5);
    AWAIT(fk_count(&x->f[0]) >= 5);
    AWAIT(deliver_safe_lsn(d) >= 500);
    assert_int_equal(metric(d, "east", "router_index"), 1);
}

static void test_large_commit_in_parts_safe_only_when_whole(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, DOWN, NONE);
    x->cfg.mem_max_bytes = 1;
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 1); /* LSN 100 */
    struct deliver_key k = {"part", 4, NULL};
    assert_int_equal(deliver_commit(d, 900, clock_wall_us(), &k, 1, 1), 0);
    AWAIT(deliver_safe_lsn(d) >= 100);
    usleep(100000);
    assert_int_equal(deliver_safe_lsn(d), 100); /* the commit at 900 is not whole yet */
    assert_int_equal(deliver_commit(d, 900, clock_wall_us(), &k, 1, 0), 0);
    AWAIT(deliver_safe_lsn(d) >= 900);
    fx_bring_up(x, 0);
    AWAIT(fk_count(&x->f[0]) >= 3);
}

static void test_replay_sends_a_slots_recent_deletes_again(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    struct fake *f = &x->f[0];
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 100);
    AWAIT(fk_count(f) >= 100);
    uint16_t slot = slot_of_key("k7", 2);
    int in_slot = 0;
    for (int i = 0; i < 100; i++) {
        char k[16];
        int n = snprintf(k, sizeof k, "k%d", i);
        in_slot += slot_of_key(k, (size_t)n) == slot;
    }
    char err[128];
    assert_int_equal(deliver_replay(d, "nope", &slot, 1, 60, err, sizeof err), -1);
    uint16_t bad = 20000;
    assert_int_equal(deliver_replay(d, NULL, &bad, 1, 60, err, sizeof err), -1);
    assert_int_equal(deliver_replay(d, "east", &slot, 1, 60, err, sizeof err), in_slot);
    AWAIT(fk_count(f) >= 100 + in_slot);
    assert_string_equal(f->log[100], "k7");
    for (int i = 100; i < fk_count(f); i++)
        assert_int_equal(slot_of_key(f->log[i], f->loglen[i]), slot);
}

static void *replayer(void *arg)
{
    struct deliver *d = arg;
    uint16_t slots[64];
    for (int i = 0; i < 64; i++) slots[i] = (uint16_t)(i * 256);
    char err[64];
    for (int i = 0; i < 300; i++) assert_true(deliver_replay(d, NULL, slots, 64, 60, err, sizeof err) >= 0);
    return NULL;
}

/* Replays (the admin thread) and commits (the reader) queue at the same time. */
static void test_replay_while_committing(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, UP);
    struct deliver *d = fx_start(x);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, replayer, d), 0);
    commit_range(d, "k", 0, 3000);
    pthread_join(t, NULL);
    AWAIT(deliver_safe_lsn(d) >= 300000);
    fx_stop(x);
    assert_true(fk_count(&x->f[0]) >= 3000); /* the commits (and replays, not waited for) */
}

static void test_truncate_flush_in_order(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 3);
    const char *ns[] = {"catalog"};
    assert_int_equal(deliver_flush(d, 350, clock_wall_us(), ns, 1), 0);
    commit_range(d, "k", 3, 5);
    AWAIT(fk_count(&x->f[0]) >= 6);
    assert_string_equal(x->f[0].log[2], "k2");
    assert_string_equal(x->f[0].log[3], "<flush_ns catalog>");
    assert_string_equal(x->f[0].log[4], "k3");
    AWAIT(deliver_safe_lsn(d) >= 500);
}

static void test_failed_flush_is_sent_again_before_later_deletes(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    x->f[0].flush_fail = 3;
    struct deliver *d = fx_start(x);
    commit_range(d, "k", 0, 2);
    const char *ns[] = {"catalog"};
    assert_int_equal(deliver_flush(d, 250, clock_wall_us(), ns, 1), 0);
    commit_range(d, "k", 2, 4);
    AWAIT(deliver_safe_lsn(d) >= 400);
    assert_int_equal(x->f[0].flush_fail, 0);
    assert_int_equal(fk_count(&x->f[0]), 5);
    assert_string_equal(x->f[0].log[2], "<flush_ns catalog>");
    assert_string_equal(x->f[0].log[3], "k2");
    assert_int_equal(metric(d, "east", "flushes_total"), 1);
}

/* A namespace the cluster does not have (its keys are in `default` there), or a flush naming
 * none: flush_all stands in, counted. */
static void test_unknown_namespace_flush_falls_back_to_flush_all(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, UP, NONE);
    pthread_mutex_lock(&x->f[0].lock);
    strcpy(x->f[0].no_ns, "ghost");
    pthread_mutex_unlock(&x->f[0].lock);
    struct deliver *d = fx_start(x);
    const char *ns[] = {"catalog", "ghost"};
    assert_int_equal(deliver_flush(d, 150, clock_wall_us(), ns, 2), 0);
    assert_int_equal(deliver_flush(d, 250, clock_wall_us(), NULL, 0), 0);
    commit_range(d, "k", 2, 3);
    AWAIT(fk_count(&x->f[0]) >= 4);
    assert_string_equal(x->f[0].log[0], "<flush_ns catalog>");
    assert_string_equal(x->f[0].log[1], "<flush_all>");
    assert_string_equal(x->f[0].log[2], "<flush_all>");
    assert_string_equal(x->f[0].log[3], "k2");
    AWAIT(deliver_safe_lsn(d) >= 300);
    assert_int_equal(metric(d, "east", "flush_all_fallbacks_total"), 2);
}

static void test_bad_configs_refused(void **state)
{
    struct fx *x = *state;
    char err[256];
    assert_null(deliver_create(&x->cfg, err, sizeof err)); /* no routers */
    assert_non_null(strstr(err, "no routers"));
    x->routers[0][0] = "localhost";
    x->cl[0].nrouters = 1;
    assert_null(deliver_create(&x->cfg, err, sizeof err));
    assert_non_null(strstr(err, "host:port"));
    x->cfg.spill_dir = "/proc/nope/spill";
    x->routers[0][0] = "127.0.0.1:1";
    assert_null(deliver_create(&x->cfg, err, sizeof err));
    assert_non_null(strstr(err, "spill"));
}

static void test_second_process_on_a_spill_dir_refused(void **state)
{
    struct fx *x = *state;
    fx_clusters(x, DOWN, NONE);
    fx_start(x);
    char err[256];
    assert_null(deliver_create(&x->cfg, err, sizeof err));
    assert_non_null(strstr(err, "in use"));
}

#define FX_TEST(t) cmocka_unit_test_setup_teardown(t, fx_setup, fx_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_forms),
        cmocka_unit_test(test_histogram_quantiles),
        FX_TEST(test_deletes_arrive_in_commit_order),
        FX_TEST(test_safe_lsn_waits_for_a_down_cluster),
        FX_TEST(test_spilled_deletes_count_safe_and_replay_in_order),
        FX_TEST(test_restart_replays_the_spill_file_first),
        FX_TEST(test_torn_spill_tail_is_cut),
        FX_TEST(test_backlog_past_spill_bound_becomes_a_flush),
        FX_TEST(test_refused_key_dropped_failed_key_retried),
        FX_TEST(test_failing_key_does_not_hold_later_deletes),
        FX_TEST(test_binary_keys_go_base64),
        FX_TEST(test_fails_over_to_the_next_router),
        FX_TEST(test_large_commit_in_parts_safe_only_when_whole),
        FX_TEST(test_replay_sends_a_slots_recent_deletes_again),
        FX_TEST(test_truncate_flush_in_order),
        FX_TEST(test_replay_while_committing),
        FX_TEST(test_failed_flush_is_sent_again_before_later_deletes),
        FX_TEST(test_unknown_namespace_flush_falls_back_to_flush_all),
        FX_TEST(test_bad_configs_refused),
        FX_TEST(test_second_process_on_a_spill_dir_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
