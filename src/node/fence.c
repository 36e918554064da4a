/* fence.c — slot leases, node side (see fence.h): the renewal thread, the fenced slots of the
 * document in use, and the request-path check's slow half.
 *
 * Writers of the fields workers read: the renewal thread (valid_until, stale) and the
 * follower thread (slot[], armed, stale), both under run->mu so that `stale` always compares
 * the newest document with the newest lease. When a renewal brings a newer version, `stale`
 * is set before `valid_until` moves, so a node never serves a moment on an old document with a
 * new lease. */
#include "node/fence.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/follow.h"
#include "common/httpc.h"
#include "common/log.h"
#include "node/node.h"

struct fence_run {
    struct fence *f;
    struct httpc *http;
    char *bases[FOLLOW_URLS_MAX];
    size_t nbases, cur; /* cur: the control URL renewed with now (the thread's own) */
    char advertise[300];
    uint64_t renew_ms;
    pthread_t th;
    bool running;
    pthread_mutex_t mu; /* guards the fields below, and the writes of f's hot fields */
    pthread_cond_t cv;
    bool stopping;
    uint64_t doc_version;   /* topology version in use */
    uint64_t lease_version; /* "version" of the newest lease granted */
    uint64_t lease_ms;      /* "lease_ms" of the last lease granted */
    uint64_t last_sent;     /* when the last successful renewal was sent */
    unsigned nslots;        /* slots fenced while the lease is not valid */
    bool fencing;           /* logged as fencing */
    bool failing;           /* renewals logged as failing */
    long noted_status;      /* a refusal (4xx) logged once */
    /* read by /metrics: atomics */
    uint64_t renewals, failures;
};

bool fence_refuses_slot(struct fence *f, const char *key, size_t nkey)
{
    if (!__atomic_load_n(&f->slot[slot_of_key(key, nkey)], __ATOMIC_RELAXED)) return false;
    /* a precise clock, not the batch's: the lease's end is a hard line */
    if (!__atomic_load_n(&f->stale, __ATOMIC_ACQUIRE) &&
        clock_mono_ms() < __atomic_load_n(&f->valid_until, __ATOMIC_ACQUIRE))
        return false;
    __atomic_fetch_add(&f->refusals, 1, __ATOMIC_RELAXED);
    return true;
}

/* Log a start or end of fencing. Under r->mu. */
static void review_locked(struct fence_run *r, uint64_t now)
{
    struct fence *f = r->f;
    bool stale = f->stale, expired = now >= f->valid_until;
    bool fencing = r->nslots > 0 && (stale || expired);
    if (fencing == r->fencing) return;
    r->fencing = fencing;
    if (!fencing) {
        log_notice("lease: fencing ends, %u slots served again (lease valid %llu ms more, "
                   "topology version %llu)", r->nslots,
                   (unsigned long long)(f->valid_until - now), (unsigned long long)r->doc_version);
    } else if (stale) {
        log_warn("lease: fencing %u slots (primary of ranges with a replica): the lease's "
                 "topology version %llu is newer than version %llu in use; their reads and "
                 "writes answer SERVER_ERROR slot lease expired until it arrives", r->nslots,
                 (unsigned long long)r->lease_version, (unsigned long long)r->doc_version);
    } else if (f->valid_until == 0) {
        log_warn("lease: fencing %u slots (primary of ranges with a replica): no lease granted "
                 "yet; their reads and writes answer SERVER_ERROR slot lease expired", r->nslots);
    } else {
        log_warn("lease: fencing %u slots (primary of ranges with a replica): the lease ran out "
                 "(last renewed %llu ms ago); their reads and writes answer SERVER_ERROR slot "
                 "lease expired until a renewal succeeds", r->nslots,
                 (unsigned long long)(now - r->last_sent));
    }
}

void fence_apply_doc(struct fence *f, json_t *doc, const char *advertise, uint64_t version)
{
    struct fence_run *r = f->run;
    uint8_t *want = calloc(SLOT_COUNT, 1);
    unsigned n = 0;
    const char *pname;
    json_t *p;
    json_object_foreach(json_object_get(doc, "pools"), pname, p) {
        size_t i;
        json_t *rg;
        json_array_foreach(json_object_get(p, "slots"), i, rg) {
            const char *node = json_string_value(json_object_get(rg, "node"));
            const char *replica = json_string_value(json_object_get(rg, "replica"));
            json_int_t from = json_integer_value(json_object_get(rg, "from"));
            json_int_t to = json_integer_value(json_object_get(rg, "to"));
            if (node == NULL || strcmp(node, advertise) || replica == NULL || !*replica ||
                from < 0 || to >= SLOT_COUNT)
                continue;
            for (json_int_t s = from; s <= to && want; s++) want[s] = 1;
        }
    }
    pthread_mutex_lock(&r->mu);
    if (want == NULL) { /* out of memory: fence everything that was, and keep serving the rest */
        log_error("lease: out of memory applying topology version %llu; fenced slots unchanged",
                  (unsigned long long)version);
    } else {
        for (unsigned s = 0; s < SLOT_COUNT; s++) {
            n += want[s];
            if (f->slot[s] != want[s]) __atomic_store_n(&f->slot[s], want[s], __ATOMIC_RELAXED);
        }
        r->nslots = n;
    }
    r->doc_version = version;
    __atomic_store_n(&f->stale, (uint8_t)(r->lease_version > version), __ATOMIC_RELEASE);
    __atomic_store_n(&f->armed, (uint8_t)(r->nslots > 0), __ATOMIC_RELEASE);
    review_locked(r, clock_mono_ms());
    pthread_mutex_unlock(&r->mu);
    free(want);
}

/* A 200's lease, applied. false when the body is not a lease. */
static bool take_lease(struct fence_run *r, const struct httpc_reply *rep, uint64_t sent)
{
    json_t *o = json_loadb(buf_start(&rep->body), buf_used(&rep->body), 0, NULL);
    json_t *lm = json_object_get(o, "lease_ms"), *v = json_object_get(o, "version");
    bool ok = json_is_integer(lm) && json_integer_value(lm) > 0 && json_is_integer(v) &&
              json_integer_value(v) >= 0;
    if (ok) {
        struct fence *f = r->f;
        pthread_mutex_lock(&r->mu);
        if ((uint64_t)json_integer_value(v) > r->lease_version)
            r->lease_version = (uint64_t)json_integer_value(v);
        r->lease_ms = (uint64_t)json_integer_value(lm);
        r->last_sent = sent;
        /* stale first: a newer version may say this node was promoted over */
        __atomic_store_n(&f->stale, (uint8_t)(r->lease_version > r->doc_version),
                         __ATOMIC_SEQ_CST);
        uint64_t until = sent + r->lease_ms;
        if (until > f->valid_until) __atomic_store_n(&f->valid_until, until, __ATOMIC_SEQ_CST);
        review_locked(r, clock_mono_ms());
        pthread_mutex_unlock(&r->mu);
    }
    json_decref(o);
    return ok;
}

/* One renewal try. true when a lease was granted. */
static bool renew_once(struct fence_run *r, struct httpc_reply *rep, char *err, size_t errlen)
{
    char url[1100];
    snprintf(url, sizeof url, "%.1000s/v1/leases", r->bases[r->cur]);
    json_t *o = json_pack("{s:s}", "node", r->advertise);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (body == NULL) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    uint64_t sent = clock_mono_ms(); /* before the request leaves: the lease counts from here */
    int rc = httpc_request(r->http, "POST", url, body, strlen(body), FENCE_TRY_MS, rep, err,
                           errlen);
    free(body);
    if (rc < 0) return false;
    if (rep->status == 200) {
        if (take_lease(r, rep, sent)) return true;
        snprintf(err, errlen, "%.400s answered 200 without a lease", url);
        return false;
    }
    snprintf(err, errlen, "%.400s answered HTTP %ld: %.*s", url, rep->status,
             (int)(buf_used(&rep->body) > 200 ? 200 : buf_used(&rep->body)),
             buf_used(&rep->body) ? buf_start(&rep->body) : "");
    while (strlen(err) && (err[strlen(err) - 1] == '\n')) err[strlen(err) - 1] = 0;
    if (rep->status >= 400 && rep->status < 500 && rep->status != r->noted_status) {
        r->noted_status = rep->status; /* 401/403 (token), 404 (no pool lists it): once */
        log_warn("lease: renewal refused: %s", err);
    }
    return false;
}

static void *renew_main(void *arg)
{
    struct fence_run *r = arg;
    struct httpc_reply rep;
    httpc_reply_init(&rep);
    char err[512];
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool stop = r->stopping;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
        uint64_t t0 = clock_mono_ms();
        bool ok = renew_once(r, &rep, err, sizeof err);
        if (httpc_cancelled(r->http)) break;
        if (ok) {
            __atomic_fetch_add(&r->renewals, 1, __ATOMIC_RELAXED);
            r->noted_status = 0;
            if (r->failing) log_notice("lease: renewed again with %s", r->bases[r->cur]);
            r->failing = false;
        } else {
            __atomic_fetch_add(&r->failures, 1, __ATOMIC_RELAXED);
            uint64_t now = clock_mono_ms(), until = r->f->valid_until;
            if (!r->failing)
                log_warn("lease: renewal failed (%s); the lease is valid %llu ms more", err,
                         (unsigned long long)(until > now ? until - now : 0));
            r->failing = true;
            /* no answer, or a 5xx (a standby names the leader with 503): the next member */
            if (r->nbases > 1 && (rep.status == 0 || rep.status >= 500))
                r->cur = (r->cur + 1) % r->nbases;
        }
        /* the next try renew_ms after this one began; wake at the lease's end to log it */
        uint64_t now = clock_mono_ms(), next = t0 + r->renew_ms;
        pthread_mutex_lock(&r->mu);
        review_locked(r, now);
        uint64_t until = r->f->valid_until;
        if (r->nslots && until > now && until < next) next = until;
        if (next > now && !r->stopping) {
            struct timespec ts = clock_deadline(next - now);
            while (!r->stopping && pthread_cond_timedwait(&r->cv, &r->mu, &ts) != ETIMEDOUT) {
            }
            review_locked(r, clock_mono_ms());
        }
        pthread_mutex_unlock(&r->mu);
    }
    httpc_reply_release(&rep);
    return NULL;
}

struct fence *fence_create(struct node *n, char *err, size_t errlen)
{
    struct fence *f = calloc(1, sizeof *f);
    struct fence_run *r = f ? calloc(1, sizeof *r) : NULL;
    if (r == NULL || (r->nbases = follow_bases(n->cfg.control, r->bases, FOLLOW_URLS_MAX)) == 0 ||
        (r->http = httpc_create(64 * 1024)) == NULL) {
        for (size_t i = 0; r && i < r->nbases; i++) free(r->bases[i]);
        free(r);
        free(f);
        snprintf(err, errlen, "--control: out of memory for the lease renewer");
        return NULL;
    }
    f->run = r;
    r->f = f;
    r->renew_ms = n->cfg.lease_renew_ms;
    httpc_set_connect_timeout(r->http, FENCE_TRY_MS);
    if (follow_auth(r->http, n->cfg.token_file, err, errlen) < 0) {
        f->run = NULL;
        httpc_destroy(&r->http);
        for (size_t i = 0; i < r->nbases; i++) free(r->bases[i]);
        free(r);
        free(f);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    clock_cond_init_monotonic(&r->cv);
    return f;
}

int fence_start(struct fence *f, const char *advertise, char *err, size_t errlen)
{
    struct fence_run *r = f->run;
    snprintf(r->advertise, sizeof r->advertise, "%s", advertise);
    int rc = pthread_create(&r->th, NULL, renew_main, r);
    if (rc != 0) {
        snprintf(err, errlen, "--control: cannot start the lease renewer: %s", strerror(rc));
        return -1;
    }
    r->running = true;
    return 0;
}

void fence_free(struct fence **fp)
{
    struct fence *f = *fp;
    if (f == NULL) return;
    struct fence_run *r = f->run;
    pthread_mutex_lock(&r->mu);
    r->stopping = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    httpc_cancel(r->http);
    if (r->running) pthread_join(r->th, NULL);
    httpc_destroy(&r->http);
    for (size_t i = 0; i < r->nbases; i++) free(r->bases[i]);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    free(f);
    *fp = NULL;
}

void fence_metrics(struct fence *f, struct buf *out)
{
    struct fence_run *r = f->run;
    uint64_t now = clock_mono_ms();
    pthread_mutex_lock(&r->mu);
    uint64_t until = f->valid_until, version = r->lease_version;
    unsigned nslots = r->nslots;
    bool fencing = nslots > 0 && (f->stale || now >= until);
    pthread_mutex_unlock(&r->mu);
    bool valid = now < until;
    buf_printf(out,
               "# HELP shoal_node_lease_valid 1 while the slot lease from the control plane is "
               "valid\n# TYPE shoal_node_lease_valid gauge\nshoal_node_lease_valid %d\n"
               "# HELP shoal_node_lease_remaining_ms ms until the slot lease ends (0: ended)\n"
               "# TYPE shoal_node_lease_remaining_ms gauge\nshoal_node_lease_remaining_ms %llu\n"
               "# HELP shoal_node_lease_version topology version the last lease was granted at\n"
               "# TYPE shoal_node_lease_version gauge\nshoal_node_lease_version %llu\n",
               valid, (unsigned long long)(valid ? until - now : 0), (unsigned long long)version);
    buf_printf(out,
               "# HELP shoal_node_lease_slots slots fenced while the lease is not valid (primary "
               "of ranges with a replica)\n# TYPE shoal_node_lease_slots gauge\n"
               "shoal_node_lease_slots %u\n"
               "# HELP shoal_node_lease_fenced 1 while those slots' reads and writes are refused\n"
               "# TYPE shoal_node_lease_fenced gauge\nshoal_node_lease_fenced %d\n",
               nslots, fencing);
    buf_printf(out,
               "# HELP shoal_node_lease_refusals_total requests refused with SERVER_ERROR slot "
               "lease expired\n# TYPE shoal_node_lease_refusals_total counter\n"
               "shoal_node_lease_refusals_total %llu\n"
               "# HELP shoal_node_lease_renewals_total lease renewals granted\n"
               "# TYPE shoal_node_lease_renewals_total counter\n"
               "shoal_node_lease_renewals_total %llu\n"
               "# HELP shoal_node_lease_renewal_failures_total lease renewals that got no lease\n"
               "# TYPE shoal_node_lease_renewal_failures_total counter\n"
               "shoal_node_lease_renewal_failures_total %llu\n",
               (unsigned long long)__atomic_load_n(&f->refusals, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&r->renewals, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&r->failures, __ATOMIC_RELAXED));
}
