/* leader.c — the etcd election and the follower's sync (see leader.h). */
#include "control/leader.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "control/control.h"
#include "control/etcd.h"
#include "control/lease.h"
#include "control/model.h"
#include "control/poll.h"
#include "control/push.h"
#include "control/state.h"

struct ha {
    struct control *c;
    struct etcd *e; /* the thread's own client (the store has another) */
    char *leader_key, *state_key, *self_url;
    unsigned ttl, poll_ms;
    pthread_t th;
    bool started;

    /* the thread's own */
    int64_t lease;           /* while leader */
    uint64_t lease_deadline; /* monotonic ms: the lease surely lasts until then */
    uint64_t next_keepalive;

    pthread_mutex_t mu; /* the fields below */
    pthread_cond_t cv;  /* broadcast after every tick and on every change below */
    bool stop, kick;
    int leader;            /* atomic too: ha_is_leader reads it without mu */
    int64_t leader_rev;    /* create_revision of the leader key seen (0: none) */
    char leader_url[512];  /* its URL ("" while unknown) */
    uint64_t ticks;
};

static void set_leader_seen(struct ha *h, int leader, int64_t rev, const char *url)
{
    pthread_mutex_lock(&h->mu);
    h->leader_rev = rev;
    snprintf(h->leader_url, sizeof h->leader_url, "%s", url ? url : "");
    __atomic_store_n(&h->leader, leader, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Read the stored state and install it when newer than the one served. force: even when the
 * version is the same (a new leader adopts the stored model as it is). 0, or -1 (logged). */
static int refresh(struct ha *h, bool force)
{
    struct control *c = h->c;
    json_t *m = NULL;
    char err[400];
    if (state_load(c->store, &m, err, sizeof err) < 0) {
        CTL_INC(c, etcd_errors);
        log_warn_limited("cannot read the state from etcd: %s", err);
        return -1;
    }
    if (m == NULL) return 0; /* nothing stored yet: version 0 */
    struct model_err e;
    if (model_check(m, &e) != 0) {
        log_warn_limited("the state in etcd is not valid (%s: %s): keeping version %llu",
                         e.field, e.msg, (unsigned long long)c->version);
        json_decref(m);
        return -1;
    }
    uint64_t v = model_version(m);
    int installed = 0;
    /* change_mu: never in the middle of a change of this process's own (one whose save is
     * under way would otherwise install over this) */
    pthread_mutex_lock(&c->change_mu);
    pthread_mutex_lock(&c->lock);
    if (v > c->version || (force && v == c->version)) {
        if (control_install(c, m) == 0) installed = 1;
    } else if (v < c->version) {
        log_warn_limited("the state in etcd is at version %llu, behind the %llu served: "
                         "keeping %llu", (unsigned long long)v,
                         (unsigned long long)c->version, (unsigned long long)c->version);
    }
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&c->change_mu);
    if (!installed) {
        json_decref(m);
        return 0;
    }
    CTL_INC(c, state_refreshes);
    log_info("installed version %llu from etcd", (unsigned long long)v);
    poll_notify(c->poll, v);
    return 0;
}

static void step_down(struct ha *h, const char *why)
{
    struct control *c = h->c;
    state_etcd_guard(c->store, 0);
    push_pause(c->push);
    set_leader_seen(h, 0, 0, NULL);
    CTL_SET(c, leader, 0);
    CTL_INC(c, leader_losses);
    log_notice("no longer the leader: %s", why);
    if (h->lease) {
        char err[300];
        /* best effort: frees the leader key at once if the lease still exists */
        etcd_lease_revoke(h->e, h->lease, err, sizeof err);
        h->lease = 0;
    }
}

/* Parse a leader key's value: {"url": ...}. */
static void leader_url_of(const struct etcd_kv *kv, char *url, size_t n)
{
    url[0] = 0;
    json_t *o = kv->value ? json_loadb(kv->value, kv->len, 0, NULL) : NULL;
    const char *u = json_string_value(json_object_get(o, "url"));
    snprintf(url, n, "%s", u ? u : "");
    json_decref(o);
}

/* No leader key: try to become leader. */
static void campaign(struct ha *h)
{
    struct control *c = h->c;
    char err[400];
    int64_t lease;
    uint64_t granted = clock_mono_ms();
    if (etcd_lease_grant(h->e, h->ttl, &lease, err, sizeof err) < 0) {
        CTL_INC(c, etcd_errors);
        log_warn_limited("cannot campaign, no lease from etcd: %s", err);
        return;
    }
    json_t *val = json_pack("{s:s,s:i}", "url", h->self_url, "pid", (int)getpid());
    char *vs = val ? json_dumps(val, JSON_COMPACT) : NULL;
    json_decref(val);
    json_t *lk = etcd_b64(h->leader_key, strlen(h->leader_key));
    json_t *req = vs ? json_pack("{s:[{s:O,s:s,s:s}],s:[{s:{s:O,s:o,s:o}}],s:[{s:{s:O}}]}",
                                 "compare", "key", lk, "target", "CREATE", "create_revision",
                                 "0", "success", "request_put", "key", lk, "value",
                                 etcd_b64(vs, strlen(vs)), "lease", etcd_i64(lease), "failure",
                                 "request_range", "key", lk)
                     : NULL;
    json_decref(lk);
    free(vs);
    json_t *rep = NULL;
    int rc = req ? etcd_call(h->e, "/v3/kv/txn", req, &rep, err, sizeof err) : -1;
    json_decref(req);
    if (rc < 0 || !json_is_true(json_object_get(rep, "succeeded"))) {
        if (rc < 0) CTL_INC(c, etcd_errors);
        else {
            /* another won: learn where it is */
            const json_t *r0 = json_array_get(json_object_get(rep, "responses"), 0);
            struct etcd_kv kv;
            if (etcd_kv_from(json_object_get(r0, "response_range"), 0, &kv) == 0 && kv.exists) {
                char url[512];
                leader_url_of(&kv, url, sizeof url);
                set_leader_seen(h, 0, kv.create_rev, url);
            }
            etcd_kv_release(&kv);
        }
        json_decref(rep);
        etcd_lease_revoke(h->e, lease, err, sizeof err);
        return;
    }
    int64_t rev = etcd_revision(rep);
    json_decref(rep);
    h->lease = lease;
    h->lease_deadline = granted + h->ttl * 1000ull;
    h->next_keepalive = granted + h->ttl * 1000ull / 3;
    /* adopt the stored state before answering any write: it holds every acknowledged change */
    if (refresh(h, true) < 0) {
        log_warn("won the election but cannot read the state: resigning");
        etcd_lease_revoke(h->e, lease, err, sizeof err);
        h->lease = 0;
        return;
    }
    state_etcd_guard(c->store, rev);
    set_leader_seen(h, 1, rev, h->self_url);
    /* the last leader's lease table is gone: every node counts as renewed now, so none is
     * called lapsed (and promoted over) before a full lease has passed (lease.h) */
    lease_takeover(c->leases, clock_mono_ms());
    CTL_SET(c, leader, 1);
    CTL_INC(c, leader_elections);
    pthread_mutex_lock(&c->lock);
    uint64_t v = c->version;
    pthread_mutex_unlock(&c->lock);
    log_notice("now the leader (lease %llx, %u s), serving version %llu at %s",
               (unsigned long long)lease, h->ttl, (unsigned long long)v, h->self_url);
    push_resume(c->push); /* nodes get what the state says from the leader only */
}

static void keepalive(struct ha *h, uint64_t now)
{
    char err[300];
    int64_t left = 0;
    if (etcd_lease_keepalive(h->e, h->lease, &left, err, sizeof err) == 0) {
        if (left <= 0) {
            step_down(h, "the lease expired before it was renewed (stopped or cut off too long)");
            return;
        }
        h->lease_deadline = now + (uint64_t)left * 1000;
        h->next_keepalive = now + (uint64_t)left * 1000 / 3;
        return;
    }
    CTL_INC(h->c, etcd_errors);
    log_warn_limited("cannot renew the leader lease: %s", err);
    if (clock_mono_ms() >= h->lease_deadline)
        step_down(h, "the lease could not be renewed for its whole TTL");
    else
        h->next_keepalive = now + h->poll_ms;
}

/* One tick: renew the lease (leader), look at the leader and state keys, campaign or sync. */
static void tick(struct ha *h)
{
    struct control *c = h->c;
    char err[400];
    uint64_t now = clock_mono_ms();
    bool leader = __atomic_load_n(&h->leader, __ATOMIC_SEQ_CST);
    if (leader && state_etcd_lost(c->store)) {
        step_down(h, "a write found another leader's key in etcd");
        leader = false;
    }
    if (leader && now >= h->next_keepalive) {
        keepalive(h, now);
        leader = __atomic_load_n(&h->leader, __ATOMIC_SEQ_CST);
    }
    /* both keys' revisions in one read: a txn of two ranges with no compare */
    json_t *lk = etcd_b64(h->leader_key, strlen(h->leader_key));
    json_t *sk = etcd_b64(h->state_key, strlen(h->state_key));
    json_t *req = json_pack("{s:[{s:{s:O,s:b}},{s:{s:O,s:b}}]}", "success", "request_range",
                            "key", lk, "keys_only", 1, "request_range", "key", sk, "keys_only", 1);
    json_t *rep = NULL;
    int rc = req ? etcd_call(h->e, "/v3/kv/txn", req, &rep, err, sizeof err) : -1;
    json_decref(req);
    if (rc < 0) {
        json_decref(lk);
        json_decref(sk);
        CTL_INC(c, etcd_errors);
        log_warn_limited("cannot read from etcd (%s): serving version %llu meanwhile", err,
                         (unsigned long long)__atomic_load_n(&c->m.topology_version,
                                                             __ATOMIC_RELAXED));
        return;
    }
    json_decref(lk);
    json_decref(sk);
    const json_t *rs = json_object_get(rep, "responses");
    struct etcd_kv lkv, skv;
    etcd_kv_from(json_object_get(json_array_get(rs, 0), "response_range"), 0, &lkv);
    etcd_kv_from(json_object_get(json_array_get(rs, 1), "response_range"), 0, &skv);
    json_decref(rep);
    if (leader) {
        pthread_mutex_lock(&h->mu);
        int64_t mine = h->leader_rev;
        pthread_mutex_unlock(&h->mu);
        if (!lkv.exists || lkv.create_rev != mine) {
            step_down(h, lkv.exists ? "another process holds the leader key"
                                    : "the leader key is gone from etcd");
            leader = false;
        }
    }
    if (!leader) {
        pthread_mutex_lock(&h->mu);
        int64_t seen = h->leader_rev;
        pthread_mutex_unlock(&h->mu);
        if (!lkv.exists) {
            if (seen) set_leader_seen(h, 0, 0, NULL);
            campaign(h);
        } else if (lkv.create_rev != seen) {
            struct etcd_kv full;
            if (etcd_get(h->e, h->leader_key, false, &full, err, sizeof err) == 0 && full.exists) {
                char url[512];
                leader_url_of(&full, url, sizeof url);
                set_leader_seen(h, 0, full.create_rev, url);
                log_notice("the leader is %s", url[0] ? url : "(no URL in its key)");
            }
            etcd_kv_release(&full);
        }
    }
    if (state_etcd_stale(c->store, skv.exists ? skv.mod_rev : 0)) refresh(h, false);
    etcd_kv_release(&lkv);
    etcd_kv_release(&skv);
}

static void *ha_main(void *arg)
{
    struct ha *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        pthread_mutex_unlock(&h->mu);
        tick(h);
        pthread_mutex_lock(&h->mu);
        h->ticks++;
        pthread_cond_broadcast(&h->cv);
        if (h->stop) break;
        if (h->kick) {
            h->kick = false;
            continue;
        }
        uint64_t wake = clock_mono_ms() + h->poll_ms;
        if (h->leader && h->next_keepalive < wake) wake = h->next_keepalive;
        struct timespec ts = {(time_t)(wake / 1000), (long)(wake % 1000) * 1000000};
        while (!h->stop && !h->kick && pthread_cond_timedwait(&h->cv, &h->mu, &ts) == 0) {
        }
        h->kick = false;
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

struct ha *ha_create(struct control *c, char *err, size_t errlen)
{
    struct ha *h = calloc(1, sizeof *h);
    if (h == NULL) return snprintf(err, errlen, "out of memory"), NULL;
    h->c = c;
    h->ttl = (unsigned)c->cfg.etcd_lease_ttl;
    h->poll_ms = (unsigned)c->cfg.etcd_poll_ms;
    pthread_mutex_init(&h->mu, NULL);
    clock_cond_init_monotonic(&h->cv);
    if (asprintf(&h->leader_key, "%sleader", c->cfg.etcd_prefix) < 0) h->leader_key = NULL;
    if (asprintf(&h->state_key, "%sstate", c->cfg.etcd_prefix) < 0) h->state_key = NULL;
    if (h->leader_key && h->state_key &&
        (h->e = etcd_create(c->cfg.etcd, (unsigned)c->cfg.etcd_timeout_ms, err, errlen)))
        return h;
    if (h->leader_key == NULL || h->state_key == NULL) snprintf(err, errlen, "out of memory");
    ha_destroy(&h);
    return NULL;
}

int ha_start(struct ha *h, const char *self_url, char *err, size_t errlen)
{
    h->self_url = strdup(self_url);
    if (h->self_url == NULL) return snprintf(err, errlen, "out of memory"), -1;
    if (pthread_create(&h->th, NULL, ha_main, h) != 0)
        return snprintf(err, errlen, "cannot start the etcd election thread"), -1;
    h->started = true;
    return 0;
}

void ha_destroy(struct ha **hp)
{
    struct ha *h = *hp;
    if (h == NULL) return;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        etcd_cancel(h->e); /* a tick waiting on an unreachable etcd ends now */
        pthread_join(h->th, NULL);
        etcd_uncancel(h->e);
        if (ha_is_leader(h)) step_down(h, "shutting down (lease revoked, another takes over now)");
    }
    etcd_destroy(&h->e);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->leader_key);
    free(h->state_key);
    free(h->self_url);
    free(h);
    *hp = NULL;
}

bool ha_is_leader(struct ha *h) { return __atomic_load_n(&h->leader, __ATOMIC_SEQ_CST) != 0; }

static void deadline_ts(struct timespec *ts, unsigned wait_ms)
{
    uint64_t t = clock_mono_ms() + wait_ms;
    ts->tv_sec = (time_t)(t / 1000);
    ts->tv_nsec = (long)(t % 1000) * 1000000;
}

int ha_leader(struct ha *h, char *url, size_t n, unsigned wait_ms)
{
    struct timespec ts;
    deadline_ts(&ts, wait_ms);
    int rc = -1;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        if (h->stop) break;
        if (h->leader) {
            snprintf(url, n, "%s", h->self_url);
            rc = 1;
            break;
        }
        if (h->leader_url[0]) {
            snprintf(url, n, "%s", h->leader_url);
            rc = 0;
            break;
        }
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) != 0) break;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

void ha_await_version(struct ha *h, uint64_t v, unsigned wait_ms)
{
    struct timespec ts;
    deadline_ts(&ts, wait_ms);
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        /* the gauge, not c->lock: cheaper, and never behind a change being installed */
        if (__atomic_load_n(&h->c->m.topology_version, __ATOMIC_RELAXED) >= v) break;
        h->kick = true;
        pthread_cond_broadcast(&h->cv);
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) != 0) break;
    }
    pthread_mutex_unlock(&h->mu);
}
