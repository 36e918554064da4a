/* follow.c — the control-plane follower of shoal-router (see follow.h).
 *
 * One thread, one keep-alive connection (src/common/httpc.h). The state the admin thread reads
 * for /metrics is kept in atomics; everything else belongs to the thread. */
#include "router/follow.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/buf.h"
#include "common/httpc.h"
#include "common/log.h"
#include "router/reload.h"

#define FOLLOW_BACKOFF_MIN_MS 100
#define FOLLOW_REGISTER_TIMEOUT_MS 2000
/* Polls that bring nothing new are paced to at most one per this many ms, in case a control
 * plane answers `after=V` at once instead of holding it. */
#define FOLLOW_IDLE_PACE_MS 100

struct follow {
    struct router *r;
    struct httpc *http;
    char *base; /* the URL without its trailing '/' */
    pthread_t thread;
    bool running;         /* the thread was started */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;        /* under lock */
    /* read by /metrics: atomics */
    uint64_t polls, failures, applied;
    uint64_t last_ok_ms;  /* monotonic ms of the last answer; 0 before the first */
    int up;               /* 1 answering, 0 not, -1 not asked yet */
    /* the thread's own */
    uint64_t refused;     /* newest version refused: poll after it, not fetch it again */
    bool registered;
    char last_err[512];   /* the last refusal logged, so a repeated one is logged once */
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

bool follow_url_ok(const char *url)
{
    if (url == NULL) return false;
    if (!strncmp(url, "http://", 7)) return url[7] != 0 && url[7] != '/';
    if (!strncmp(url, "https://", 8)) return url[8] != 0 && url[8] != '/';
    return false;
}

static char *follow_base(const char *url)
{
    char *b = strdup(url);
    if (b == NULL) return NULL;
    size_t n = strlen(b);
    while (n > 0 && b[n - 1] == '/') b[--n] = 0;
    return b;
}

/* Send --token-file's token (or SHOAL_TOKEN's) with every request of `h`, for a control plane
 * that runs with --auth-file. 0, or -1 with err. */
static int follow_auth(struct httpc *h, const struct router_config *cfg, char *err,
                       size_t errlen)
{
    char *line = NULL, msg[400];
    if (auth_client_header(cfg->token_file, &line, msg, sizeof msg) < 0) {
        snprintf(err, errlen, "--token-file: %s", msg);
        return -1;
    }
    int rc = line && httpc_add_header(h, line) < 0 ? -1 : 0;
    if (rc < 0) snprintf(err, errlen, "out of memory");
    free(line);
    return rc;
}

/* The version a document names, when it is JSON with an integer version; 0 otherwise. */
static uint64_t follow_peek_version(const char *text, size_t len)
{
    json_t *root = json_loadb(text, len, 0, NULL);
    json_t *v = root ? json_object_get(root, "version") : NULL;
    uint64_t out = 0;
    if (json_is_integer(v) && json_integer_value(v) > 0) out = (uint64_t)json_integer_value(v);
    json_decref(root);
    return out;
}

/* Parse a reply's document; on failure err says why (naming the field). */
static int follow_parse(const struct httpc_reply *rep, struct topo **out, char *err,
                        size_t errlen)
{
    return topo_parse(buf_start(&rep->body), buf_used(&rep->body), 0, out, err, errlen);
}

int follow_first(const struct router_config *cfg, struct topo **out, char *err, size_t errlen)
{
    *out = NULL;
    char *base = follow_base(cfg->control);
    struct httpc *h = httpc_create(0);
    if (base == NULL || h == NULL) {
        free(base);
        httpc_destroy(&h);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (follow_auth(h, cfg, err, errlen) < 0) {
        free(base);
        httpc_destroy(&h);
        return -1;
    }
    struct httpc_reply rep;
    httpc_reply_init(&rep);
    uint64_t deadline = mono_ms() + cfg->control_wait_ms, after = 0, backoff = 0;
    char url[1100], msg[512];
    bool told = false;
    int rc = -1;
    snprintf(err, errlen, "no answer within --control-wait-ms %llu",
             (unsigned long long)cfg->control_wait_ms);
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= deadline) break;
        uint64_t left = deadline - now;
        if (after)
            snprintf(url, sizeof url, "%.1000s/v1/topology?after=%llu", base,
                     (unsigned long long)after);
        else
            snprintf(url, sizeof url, "%.1000s/v1/topology", base);
        int got = httpc_get(h, url, (unsigned)left, &rep, msg, sizeof msg);
        if (got == 0 && rep.status == 200) {
            if (follow_parse(&rep, out, msg, sizeof msg) == 0) {
                rc = 0;
                break;
            }
            /* an invalid document: wait for a newer one (the last error is reported) */
            snprintf(err, errlen, "topology from %s: %s", base, msg);
            uint64_t v = follow_peek_version(buf_start(&rep.body), buf_used(&rep.body));
            if (v > after) {
                after = v;
                log_error("topology from the control plane refused, waiting for a newer one: %s",
                          msg);
                continue;
            }
        } else if (got == 0 && rep.status == 304) {
            /* no newer version yet: ask again, paced in case the server does not hold */
            uint64_t took = mono_ms() - now;
            if (took < FOLLOW_IDLE_PACE_MS) usleep((useconds_t)(FOLLOW_IDLE_PACE_MS - took) * 1000);
            continue;
        } else {
            if (rep.status) snprintf(msg, sizeof msg, "%.400s answered HTTP %ld", url, rep.status);
            snprintf(err, errlen, "control plane %s: %s", base, msg);
            if (!told) log_notice("waiting for the control plane at %s: %s", base, msg);
            told = true;
        }
        backoff = backoff ? backoff * 2 : FOLLOW_BACKOFF_MIN_MS;
        if (backoff > cfg->control_backoff_max_ms) backoff = cfg->control_backoff_max_ms;
        now = mono_ms();
        if (now >= deadline) break;
        uint64_t nap = backoff < deadline - now ? backoff : deadline - now;
        usleep((useconds_t)(nap * 1000));
    }
    httpc_reply_release(&rep);
    httpc_destroy(&h);
    free(base);
    return rc;
}

/* Sleep up to `ms` unless stopping. Returns true when the follower is stopping. */
static bool follow_wait(struct follow *f, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&f->lock);
    while (!f->stopping)
        if (pthread_cond_timedwait(&f->cond, &f->lock, &ts) == ETIMEDOUT) break;
    bool stop = f->stopping;
    pthread_mutex_unlock(&f->lock);
    return stop;
}

static bool follow_stopping(struct follow *f)
{
    pthread_mutex_lock(&f->lock);
    bool stop = f->stopping;
    pthread_mutex_unlock(&f->lock);
    return stop;
}

/* POST URL/v1/routers {"id", "listen", "admin"}. Returns -1 when no answer came or a 5xx did
 * (the control plane is unreachable or sick), 0 on any other answer: a control plane that does
 * not know the call (404) or refuses it still serves the topology. */
static int follow_register(struct follow *f, struct httpc_reply *rep, char *err, size_t errlen)
{
    const struct router_config *cfg = &f->r->cfg;
    char host[256] = "", listen[300], admin[300], url[1100];
    const char *id = cfg->client_id;
    if (id == NULL) {
        gethostname(host, sizeof host - 1);
        id = host;
    }
    snprintf(listen, sizeof listen, "%.256s:%u", cfg->listen ? cfg->listen : "", f->r->bound_port);
    snprintf(admin, sizeof admin, "%.256s:%u", cfg->admin_listen ? cfg->admin_listen : "",
             f->r->admin_bound_port);
    json_t *doc = json_pack("{s:s, s:s, s:s?}", "id", id, "listen", listen, "admin",
                            f->r->admin_bound_port ? admin : NULL);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (body == NULL) {
        snprintf(err, errlen, "out of memory");
        return 0; /* not the control plane's fault: do not count it as down */
    }
    snprintf(url, sizeof url, "%.1000s/v1/routers", f->base);
    int rc = httpc_request(f->http, "POST", url, body, strlen(body), FOLLOW_REGISTER_TIMEOUT_MS,
                           rep, err, errlen);
    free(body);
    if (rc < 0) return -1;
    if (rep->status >= 500) {
        snprintf(err, errlen, "%.400s answered HTTP %ld", url, rep->status);
        return -1;
    }
    if (rep->status >= 200 && rep->status < 300)
        log_info("registered with the control plane %s as %s", f->base, id);
    else if (rep->status == 404)
        log_info("the control plane %s has no /v1/routers: following without registering",
                 f->base);
    else
        log_warn("the control plane %s refused the registration (HTTP %ld): following anyway",
                 f->base, rep->status);
    return 0;
}

/* No answer, or an error status: the control plane counts as away. `lost` (no answer at all:
 * it may come back as a new process) has the router register again when it returns. */
static void follow_away(struct follow *f, const char *why, bool lost)
{
    __atomic_fetch_add(&f->failures, 1, __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&f->up, 0, __ATOMIC_RELAXED) != 0)
        log_warn("control plane %s unreachable: %s; serving topology version %llu meanwhile and "
                 "retrying", f->base, why, (unsigned long long)router_topology_version(f->r));
    if (lost) f->registered = false;
}

static void follow_answered(struct follow *f)
{
    __atomic_store_n(&f->last_ok_ms, mono_ms(), __ATOMIC_RELAXED);
    int was = __atomic_exchange_n(&f->up, 1, __ATOMIC_RELAXED);
    if (was == 0)
        log_notice("control plane %s answers again; following from topology version %llu",
                   f->base, (unsigned long long)router_topology_version(f->r));
    else if (was < 0)
        log_notice("following the control plane %s from topology version %llu", f->base,
                   (unsigned long long)router_topology_version(f->r));
}

/* A 200 reply: apply its document when newer. Returns true when it brought something new (a
 * version applied or refused). */
static bool follow_take(struct follow *f, const struct httpc_reply *rep, uint64_t in_use)
{
    char err[512];
    struct topo *t;
    if (follow_parse(rep, &t, err, sizeof err) < 0) {
        uint64_t v = follow_peek_version(buf_start(&rep->body), buf_used(&rep->body));
        bool fresh = strcmp(err, f->last_err) != 0 || v > f->refused;
        if (fresh) router_topology_refused(f->r, "the control plane", err);
        snprintf(f->last_err, sizeof f->last_err, "%s", err);
        if (v > f->refused) f->refused = v;
        return fresh;
    }
    if (t->version <= in_use) { /* held until its timeout: the same version again */
        topo_destroy(&t);
        return false;
    }
    if (router_apply_topology(f->r, t, "the control plane", err, sizeof err) == 0) {
        __atomic_fetch_add(&f->applied, 1, __ATOMIC_RELAXED);
        f->last_err[0] = 0;
    }
    return true;
}

static void *follow_main(void *arg)
{
    struct follow *f = arg;
    const struct router_config *cfg = &f->r->cfg;
    struct httpc_reply rep;
    httpc_reply_init(&rep);
    uint64_t backoff = 0;
    char url[1100], err[512];
    while (!follow_stopping(f)) {
        uint64_t t0 = mono_ms(), in_use = router_topology_version(f->r);
        uint64_t after = in_use > f->refused ? in_use : f->refused;
        int rc = 0;
        bool progress = false, lost = false;
        if (!f->registered) {
            rc = follow_register(f, &rep, err, sizeof err);
            f->registered = rc == 0;
            lost = rc < 0 && rep.status == 0;
            if (rc == 0) follow_answered(f); /* up at once, not after the first poll's hold */
        }
        if (rc == 0) {
            snprintf(url, sizeof url, "%.1000s/v1/topology?after=%llu", f->base,
                     (unsigned long long)after);
            __atomic_fetch_add(&f->polls, 1, __ATOMIC_RELAXED);
            rc = httpc_get(f->http, url, (unsigned)cfg->control_timeout_ms, &rep, err,
                           sizeof err);
            lost = rc < 0;
        }
        if (httpc_cancelled(f->http)) break;
        if (rc == 0 && rep.status != 200 && rep.status != 304) {
            snprintf(err, sizeof err, "%.400s answered HTTP %ld", url, rep.status);
            rc = -1;
        }
        if (rc < 0) {
            follow_away(f, err, lost);
            backoff = backoff ? backoff * 2 : FOLLOW_BACKOFF_MIN_MS;
            if (backoff > cfg->control_backoff_max_ms) backoff = cfg->control_backoff_max_ms;
            if (follow_wait(f, backoff)) break;
            continue;
        }
        backoff = 0;
        follow_answered(f);
        if (rep.status == 200) progress = follow_take(f, &rep, in_use);
        uint64_t took = mono_ms() - t0;
        if (!progress && took < FOLLOW_IDLE_PACE_MS && follow_wait(f, FOLLOW_IDLE_PACE_MS - took))
            break;
    }
    httpc_reply_release(&rep);
    return NULL;
}

struct follow *follow_create(struct router *r, char *err, size_t errlen)
{
    struct follow *f = calloc(1, sizeof *f);
    if (f == NULL || (f->base = follow_base(r->cfg.control)) == NULL ||
        (f->http = httpc_create(0)) == NULL) {
        if (f) free(f->base);
        free(f);
        snprintf(err, errlen, "--control: out of memory");
        return NULL;
    }
    if (follow_auth(f->http, &r->cfg, err, errlen) < 0) {
        httpc_destroy(&f->http);
        free(f->base);
        free(f);
        return NULL;
    }
    f->r = r;
    f->up = -1;
    pthread_mutex_init(&f->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&f->cond, &ca);
    pthread_condattr_destroy(&ca);
    return f;
}

int follow_run(struct follow *f, char *err, size_t errlen)
{
    int rc = pthread_create(&f->thread, NULL, follow_main, f);
    if (rc != 0) {
        snprintf(err, errlen, "--control: cannot start the follower thread: %s", strerror(rc));
        return -1;
    }
    f->running = true;
    return 0;
}

void follow_stop(struct follow **fp)
{
    struct follow *f = *fp;
    if (f == NULL) return;
    pthread_mutex_lock(&f->lock);
    f->stopping = true;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock);
    httpc_cancel(f->http);
    if (f->running) pthread_join(f->thread, NULL);
    httpc_destroy(&f->http);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    free(f->base);
    free(f);
    *fp = NULL;
}

void follow_metrics(struct follow *f, struct buf *out)
{
    int up = __atomic_load_n(&f->up, __ATOMIC_RELAXED);
    uint64_t ok = __atomic_load_n(&f->last_ok_ms, __ATOMIC_RELAXED);
    buf_printf(out,
               "# HELP shoal_router_control_up 1 when the control plane answered the last "
               "request, else 0\n# TYPE shoal_router_control_up gauge\nshoal_router_control_up %d\n",
               up > 0);
    buf_printf(out,
               "# HELP shoal_router_control_polls topology requests sent to the control plane\n"
               "# TYPE shoal_router_control_polls counter\nshoal_router_control_polls %llu\n",
               (unsigned long long)__atomic_load_n(&f->polls, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP shoal_router_control_failures requests to the control plane that got no "
               "answer or an error status\n# TYPE shoal_router_control_failures counter\n"
               "shoal_router_control_failures %llu\n",
               (unsigned long long)__atomic_load_n(&f->failures, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP shoal_router_control_applied topology versions applied from the control "
               "plane\n# TYPE shoal_router_control_applied counter\n"
               "shoal_router_control_applied %llu\n",
               (unsigned long long)__atomic_load_n(&f->applied, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP shoal_router_control_last_success_age_seconds seconds since the control "
               "plane last answered (+Inf: never)\n"
               "# TYPE shoal_router_control_last_success_age_seconds gauge\n"
               "shoal_router_control_last_success_age_seconds ");
    if (ok == 0)
        buf_printf(out, "+Inf\n");
    else
        buf_printf(out, "%.3f\n", (double)(mono_ms() - ok) / 1000.0);
}
