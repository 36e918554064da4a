/* follow.c — the control-plane follower loop shared by shoal-router and shoal-node (see
 * follow.h).
 *
 * One thread, one keep-alive connection (src/common/httpc.h). The state the admin thread reads
 * for /metrics is kept in atomics; everything else belongs to the thread. */
#include "common/auth.h"
#include "common/follow.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/httpc.h"
#include "common/log.h"

#define FOLLOW_BACKOFF_MIN_MS 100
#define FOLLOW_REGISTER_TIMEOUT_MS 2000
/* Polls that bring nothing new are paced to at most one per this many ms, in case a control
 * plane answers `after=V` at once instead of holding it. */
#define FOLLOW_IDLE_PACE_MS 100
/* A version that could not be applied (FOLLOW_FAILED: out of memory, say) is polled past, not
 * fetched again at once; after this long it is tried again, in case the cause has gone. */
#define FOLLOW_FAILED_RETRY_MS 30000

struct follower {
    struct follow_spec spec;
    struct httpc *http;
    char *bases[FOLLOW_URLS_MAX]; /* the URLs of --control, without trailing '/' */
    size_t nbases, cur;           /* cur: the one followed now (the thread's own) */
    unsigned misses;              /* failures in a row, over every member (the thread's own) */
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
    uint64_t failed;      /* newest version that failed to apply: polled past until ... */
    uint64_t failed_until_ms; /* ... this monotonic time, then tried again */
    bool registered;
    bool auth_noted;      /* a registration refused for want of a token was logged */
    char last_err[512];   /* the last refusal logged, so a repeated one is logged once */
};

#define BASE(f) ((f)->bases[(f)->cur])

uint64_t follow_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static bool one_url_ok(const char *url, size_t n)
{
    if (n > 7 && !strncmp(url, "http://", 7)) return url[7] != '/' && url[7] != ',';
    if (n > 8 && !strncmp(url, "https://", 8)) return url[8] != '/' && url[8] != ',';
    return false;
}

bool follow_url_ok(const char *url)
{
    if (url == NULL || *url == 0) return false;
    size_t count = 0;
    for (const char *p = url;; p++) {
        size_t n = strcspn(p, ",");
        if (!one_url_ok(p, n) || ++count > FOLLOW_URLS_MAX) return false;
        p += n;
        if (*p == 0) return true;
    }
}

char *follow_base(const char *url)
{
    char *b = strndup(url, strcspn(url, ","));
    if (b == NULL) return NULL;
    size_t n = strlen(b);
    while (n > 0 && b[n - 1] == '/') b[--n] = 0;
    return b;
}

size_t follow_bases(const char *list, char **out, size_t max)
{
    size_t k = 0;
    for (const char *p = list; p && k < max;) {
        if ((out[k] = follow_base(p)) == NULL) {
            while (k > 0) free(out[--k]);
            return 0;
        }
        k++;
        p = strchr(p, ',');
        if (p) p++;
    }
    return k;
}

json_t *follow_doc_parse(const char *text, size_t len, uint64_t in_use, uint64_t *version,
                         enum follow_take *rc, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    *rc = FOLLOW_INVALID;
    if (root == NULL) {
        snprintf(err, errlen, "not JSON: %s (line %d)", je.text, je.line);
        return NULL;
    }
    json_t *v = json_object_get(root, "version");
    if (!json_is_integer(v) || json_integer_value(v) < 1) {
        snprintf(err, errlen, "version: must be an integer >= 1");
    } else if ((uint64_t)json_integer_value(v) <= in_use) {
        *rc = FOLLOW_SAME;
    } else {
        *version = (uint64_t)json_integer_value(v);
        return root;
    }
    json_decref(root);
    return NULL;
}

uint64_t follow_peek_version(const char *text, size_t len)
{
    json_t *root = json_loadb(text, len, 0, NULL);
    json_t *v = root ? json_object_get(root, "version") : NULL;
    uint64_t out = 0;
    if (json_is_integer(v) && json_integer_value(v) > 0) out = (uint64_t)json_integer_value(v);
    json_decref(root);
    return out;
}

/* Sleep up to `ms` unless stopping. Returns true when the follower is stopping. */
static bool follow_wait(struct follower *f, uint64_t ms)
{
    struct timespec ts = clock_deadline(ms);
    pthread_mutex_lock(&f->lock);
    while (!f->stopping)
        if (pthread_cond_timedwait(&f->cond, &f->lock, &ts) == ETIMEDOUT) break;
    bool stop = f->stopping;
    pthread_mutex_unlock(&f->lock);
    return stop;
}

static bool follow_stopping(struct follower *f)
{
    pthread_mutex_lock(&f->lock);
    bool stop = f->stopping;
    pthread_mutex_unlock(&f->lock);
    return stop;
}

/* POST URL<register_path>. Returns -1 when no answer came or a 5xx did (the control plane is
 * unreachable or sick), 0 on any other answer: a control plane that does not know the call
 * (404, or 405 from shoal-control today) or refuses it still serves the topology. */
static int follow_register(struct follower *f, struct httpc_reply *rep, char *err, size_t errlen)
{
    const char *id = "?";
    char *body = f->spec.register_body(f->spec.ctx, &id);
    if (body == NULL) {
        snprintf(err, errlen, "out of memory");
        return 0; /* not the control plane's fault: do not count it as down */
    }
    char url[1100];
    snprintf(url, sizeof url, "%.1000s%s", BASE(f), f->spec.register_path);
    int rc = httpc_request(f->http, "POST", url, body, strlen(body), FOLLOW_REGISTER_TIMEOUT_MS,
                           rep, err, errlen);
    free(body);
    if (rc < 0) return -1;
    if (rep->status >= 500) {
        snprintf(err, errlen, "%.400s answered HTTP %ld", url, rep->status);
        return -1;
    }
    if (rep->status >= 200 && rep->status < 300)
        log_info("registered with the control plane %s as %s", BASE(f), id);
    else if (rep->status == 404 || rep->status == 405) /* no such call (yet) */
        log_info("the control plane %s has no %s: following without registering", BASE(f),
                 f->spec.register_path);
    else if (rep->status == 401 || rep->status == 403) { /* --auth-file there: expected */
        if (!f->auth_noted)
            log_info("the control plane %s takes registrations with an admin token only (HTTP "
                     "%ld): following without registering", BASE(f), rep->status);
        f->auth_noted = true; /* once: it answers the same each time it comes back */
    } else
        log_warn("the control plane %s refused the registration (HTTP %ld): following anyway",
                 BASE(f), rep->status);
    return 0;
}

/* No answer, or an error status: the control plane counts as away. `lost` (no answer at all:
 * it may come back as a new process) has the follower register again when it returns. */
static void follow_away(struct follower *f, const char *why, bool lost)
{
    __atomic_fetch_add(&f->failures, 1, __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&f->up, 0, __ATOMIC_RELAXED) != 0)
        log_warn("control plane %s unreachable: %s; serving topology version %llu meanwhile and "
                 "retrying", BASE(f), why, (unsigned long long)f->spec.version(f->spec.ctx));
    if (lost) f->registered = false;
}

static void follow_answered(struct follower *f)
{
    __atomic_store_n(&f->last_ok_ms, follow_mono_ms(), __ATOMIC_RELAXED);
    int was = __atomic_exchange_n(&f->up, 1, __ATOMIC_RELAXED);
    if (was == 0)
        log_notice("control plane %s answers again; following from topology version %llu",
                   BASE(f), (unsigned long long)f->spec.version(f->spec.ctx));
    else if (was < 0)
        log_notice("following the control plane %s from topology version %llu", BASE(f),
                   (unsigned long long)f->spec.version(f->spec.ctx));
}

/* A 200 reply: apply its document when newer. Returns true when it brought something new (a
 * version applied or refused). */
static bool follow_take(struct follower *f, const struct httpc_reply *rep, uint64_t in_use)
{
    char err[512] = "";
    const char *text = buf_start(&rep->body);
    size_t len = buf_used(&rep->body);
    switch (f->spec.take(f->spec.ctx, text, len, in_use, err, sizeof err)) {
    case FOLLOW_APPLIED:
        __atomic_fetch_add(&f->applied, 1, __ATOMIC_RELAXED);
        f->last_err[0] = 0;
        return true;
    case FOLLOW_SAME:
        return false;
    case FOLLOW_FAILED: {
        /* the hook logged it; poll past it (paced) rather than fetch it again at once */
        uint64_t v = follow_peek_version(text, len);
        if (v > in_use) {
            f->failed = v;
            f->failed_until_ms = follow_mono_ms() + FOLLOW_FAILED_RETRY_MS;
        }
        return false;
    }
    case FOLLOW_INVALID:
    default: {
        uint64_t v = follow_peek_version(text, len);
        bool fresh = strcmp(err, f->last_err) != 0 || v > f->refused;
        if (fresh) f->spec.refused(f->spec.ctx, err);
        snprintf(f->last_err, sizeof f->last_err, "%s", err);
        if (v > f->refused) f->refused = v;
        return fresh;
    }
    }
}

static void *follow_main(void *arg)
{
    struct follower *f = arg;
    struct httpc_reply rep;
    httpc_reply_init(&rep);
    uint64_t backoff = 0;
    char url[1100], err[512];
    while (!follow_stopping(f)) {
        uint64_t t0 = follow_mono_ms(), in_use = f->spec.version(f->spec.ctx);
        uint64_t after = in_use > f->refused ? in_use : f->refused;
        if (f->failed > after && t0 < f->failed_until_ms) after = f->failed;
        int rc = 0;
        bool progress = false, lost = false;
        if (!f->registered) {
            rc = follow_register(f, &rep, err, sizeof err);
            f->registered = rc == 0;
            lost = rc < 0 && rep.status == 0;
            if (rc == 0) follow_answered(f); /* up at once, not after the first poll's hold */
        }
        if (rc == 0) {
            snprintf(url, sizeof url, "%.1000s/v1/topology?after=%llu", BASE(f),
                     (unsigned long long)after);
            __atomic_fetch_add(&f->polls, 1, __ATOMIC_RELAXED);
            rc = httpc_get(f->http, url, f->spec.timeout_ms, &rep, err, sizeof err);
            lost = rc < 0;
        }
        if (httpc_cancelled(f->http)) break;
        if (rc == 0 && rep.status != 200 && rep.status != 304) {
            snprintf(err, sizeof err, "%.400s answered HTTP %ld", url, rep.status);
            rc = -1;
        }
        if (rc < 0) {
            follow_away(f, err, lost);
            if (f->nbases > 1) { /* the next member; it needs a registration of its own */
                f->cur = (f->cur + 1) % f->nbases;
                f->registered = false;
            }
            /* the members in turn without a pause, then back off before the next round */
            if (++f->misses % f->nbases != 0) continue;
            backoff = backoff ? backoff * 2 : FOLLOW_BACKOFF_MIN_MS;
            if (backoff > f->spec.backoff_max_ms) backoff = f->spec.backoff_max_ms;
            if (follow_wait(f, backoff)) break;
            continue;
        }
        backoff = 0;
        f->misses = 0;
        follow_answered(f);
        if (rep.status == 200) progress = follow_take(f, &rep, in_use);
        uint64_t took = follow_mono_ms() - t0;
        if (!progress && took < FOLLOW_IDLE_PACE_MS && follow_wait(f, FOLLOW_IDLE_PACE_MS - took))
            break;
    }
    httpc_reply_release(&rep);
    return NULL;
}

int follow_auth(struct httpc *h, const char *token_file, char *err, size_t errlen)
{
    char *line = NULL, msg[400];
    if (auth_client_header(token_file, &line, msg, sizeof msg) < 0) {
        snprintf(err, errlen, "--token-file: %s", msg);
        return -1;
    }
    int rc = line && httpc_add_header(h, line) < 0 ? -1 : 0;
    if (rc < 0) snprintf(err, errlen, "out of memory");
    free(line);
    return rc;
}

struct follower *follower_create(const struct follow_spec *spec, char *err, size_t errlen)
{
    struct follower *f = calloc(1, sizeof *f);
    if (f == NULL || (f->nbases = follow_bases(spec->url, f->bases, FOLLOW_URLS_MAX)) == 0 ||
        (f->http = httpc_create(0)) == NULL) {
        for (size_t i = 0; f && i < f->nbases; i++) free(f->bases[i]);
        free(f);
        snprintf(err, errlen, "--control: out of memory");
        return NULL;
    }
    httpc_set_compressed(f->http, true); /* shoal-control gzips the topology for those who ask */
    if (follow_auth(f->http, spec->token_file, err, errlen) < 0) {
        httpc_destroy(&f->http);
        for (size_t i = 0; i < f->nbases; i++) free(f->bases[i]);
        free(f);
        return NULL;
    }
    f->spec = *spec;
    f->up = -1;
    pthread_mutex_init(&f->lock, NULL);
    clock_cond_init_monotonic(&f->cond);
    return f;
}

int follower_run(struct follower *f, char *err, size_t errlen)
{
    int rc = pthread_create(&f->thread, NULL, follow_main, f);
    if (rc != 0) {
        snprintf(err, errlen, "--control: cannot start the follower thread: %s", strerror(rc));
        return -1;
    }
    f->running = true;
    return 0;
}

void follower_stop(struct follower *f)
{
    if (f == NULL) return;
    pthread_mutex_lock(&f->lock);
    f->stopping = true;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock);
    httpc_cancel(f->http);
    if (f->running) pthread_join(f->thread, NULL);
    f->running = false;
}

void follower_free(struct follower **fp)
{
    struct follower *f = *fp;
    if (f == NULL) return;
    follower_stop(f);
    httpc_destroy(&f->http);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    for (size_t i = 0; i < f->nbases; i++) free(f->bases[i]);
    free(f);
    *fp = NULL;
}

void follower_metrics(struct follower *f, struct buf *out)
{
    const char *p = f->spec.metric_prefix;
    int up = __atomic_load_n(&f->up, __ATOMIC_RELAXED);
    uint64_t ok = __atomic_load_n(&f->last_ok_ms, __ATOMIC_RELAXED);
    buf_printf(out,
               "# HELP %s_control_up 1 when the control plane answered the last request, else 0\n"
               "# TYPE %s_control_up gauge\n%s_control_up %d\n",
               p, p, p, up > 0);
    buf_printf(out,
               "# HELP %s_control_polls topology requests sent to the control plane\n"
               "# TYPE %s_control_polls counter\n%s_control_polls %llu\n",
               p, p, p, (unsigned long long)__atomic_load_n(&f->polls, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP %s_control_failures requests to the control plane that got no answer or "
               "an error status\n# TYPE %s_control_failures counter\n%s_control_failures %llu\n",
               p, p, p, (unsigned long long)__atomic_load_n(&f->failures, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP %s_control_applied topology versions applied from the control plane\n"
               "# TYPE %s_control_applied counter\n%s_control_applied %llu\n",
               p, p, p, (unsigned long long)__atomic_load_n(&f->applied, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP %s_control_last_success_age_seconds seconds since the control plane last "
               "answered (+Inf: never)\n# TYPE %s_control_last_success_age_seconds gauge\n"
               "%s_control_last_success_age_seconds ",
               p, p, p);
    if (ok == 0)
        buf_printf(out, "+Inf\n");
    else
        buf_printf(out, "%.3f\n", (double)(follow_mono_ms() - ok) / 1000.0);
}
