/* forward.c — changes held on a follower and sent on to the leader (see forward.h). */
#include "control/forward.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/httpc.h"
#include "common/log.h"
#include "control/control.h"
#include "control/leader.h"

struct fwd_item {
    struct admin_held *h;
    char method[8];
    char *path, *body;
    char *auth; /* "Authorization: <as the client sent it>", or NULL */
    size_t len;
};

struct forwarder {
    struct control *c;
    struct httpc *http;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct fwd_item q[FORWARD_MAX];
    size_t head, n;
    bool stop;
};

static void answer_err(struct admin_held *h, int status, const char *rule, const char *msg)
{
    json_t *o = json_pack("{s:s,s:s,s:s}", "error", msg, "field", "leader", "rule", rule);
    char *s = o ? json_dumps(o, JSON_SORT_KEYS) : NULL;
    json_decref(o);
    if (s) {
        size_t n = strlen(s);
        char *t = realloc(s, n + 2);
        if (t) {
            memcpy(t + n, "\n", 2);
            s = t;
        }
    }
    admin_answer(h, status, s ? s : "", s ? strlen(s) : 0);
    free(s);
}

static void item_free(struct fwd_item *it)
{
    free(it->path);
    free(it->body);
    free(it->auth);
    memset(it, 0, sizeof *it);
}

/* Send one change to the leader and answer it. */
static void forward_one(struct forwarder *f, struct fwd_item *it)
{
    struct control *c = f->c;
    char url[1200], msg[900], err[400];
    /* wait for a leader in slices, so a shutdown is not held up by an election */
    uint64_t waited = 0, wait_ms = c->cfg.etcd_lease_ttl * 1000 + 2000;
    int who = -1;
    while ((who = ha_leader(c->ha, url, 512, 100)) < 0 && (waited += 100) < wait_ms &&
           !__atomic_load_n(&f->stop, __ATOMIC_SEQ_CST)) {
    }
    if (who < 0) {
        CTL_INC(c, forward_failures);
        answer_err(it->h, 503, "elected",
                   "no shoal-control is leader now (an election did not end in time, or etcd is "
                   "unreachable): nothing changed; send the change again");
        return;
    }
    /* who == 1: this process became leader while the change waited; it is sent to this
     * process's own listener, whose admin thread runs changes */
    size_t ul = strlen(url);
    snprintf(url + ul, sizeof url - ul, "%s", it->path);
    struct httpc_reply r;
    httpc_reply_init(&r);
    /* the client's own token goes along: the leader judges the caller (and a team token's
     * team) itself, as if the change had been sent to it */
    if (httpc_request_hdr(f->http, it->method, url, it->auth, it->len ? it->body : NULL, it->len,
                          (unsigned)c->cfg.etcd_timeout_ms * 3 + 5000, &r, err,
                          sizeof err) < 0) {
        CTL_INC(c, forward_failures);
        log_warn_limited("forwarding a change to the leader failed: %s", err);
        snprintf(msg, sizeof msg, "the leader did not answer (%.300s): the change may or may "
                 "not have been applied; read the state, then send it again if needed", err);
        answer_err(it->h, 503, "reachable", msg);
        httpc_reply_release(&r);
        return;
    }
    CTL_INC(c, writes_forwarded);
    if (r.status >= 200 && r.status < 300) {
        json_t *o = json_loadb(buf_start(&r.body), buf_used(&r.body), 0, NULL);
        json_int_t v = json_integer_value(json_object_get(o, "version"));
        json_decref(o);
        if (v > 0) ha_await_version(c->ha, (uint64_t)v, 2000);
    }
    admin_answer(it->h, (int)r.status, buf_used(&r.body) ? buf_start(&r.body) : "",
                 buf_used(&r.body));
    httpc_reply_release(&r);
}

static void *forward_main(void *arg)
{
    struct forwarder *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->stop && f->n == 0) pthread_cond_wait(&f->cv, &f->mu);
        if (f->stop) break;
        struct fwd_item it = f->q[f->head];
        memset(&f->q[f->head], 0, sizeof it);
        f->head = (f->head + 1) % FORWARD_MAX;
        f->n--;
        pthread_mutex_unlock(&f->mu);
        forward_one(f, &it);
        item_free(&it);
        pthread_mutex_lock(&f->mu);
    }
    /* shutting down: what still waits is answered, unsent */
    while (f->n > 0) {
        struct fwd_item *it = &f->q[f->head];
        answer_err(it->h, 503, "reachable", "shoal-control is shutting down: nothing changed");
        item_free(it);
        f->head = (f->head + 1) % FORWARD_MAX;
        f->n--;
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

struct forwarder *forward_create(struct control *c, char *err, size_t errlen)
{
    struct forwarder *f = calloc(1, sizeof *f);
    if (f == NULL || (f->http = httpc_create(0)) == NULL) {
        free(f);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    f->c = c;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (pthread_create(&f->th, NULL, forward_main, f) != 0) {
        httpc_destroy(&f->http);
        free(f);
        snprintf(err, errlen, "cannot start the forwarding thread");
        return NULL;
    }
    return f;
}

int forward_request(struct forwarder *f, const char *method, const char *path,
                    const char *body, size_t len, struct buf *out)
{
    static const char busy[] = "{\"error\": \"too many changes waiting for the leader; send "
                               "again after a pause\", \"field\": \"leader\", \"rule\": "
                               "\"forward_max\"}\n";
    static const char nomem[] = "{\"error\": \"out of memory\", \"field\": \"body\", \"rule\": "
                                "\"memory\"}\n";
    struct fwd_item it = {0};
    snprintf(it.method, sizeof it.method, "%s", method);
    it.path = strdup(path);
    it.body = malloc(len + 1);
    const char *auth = admin_authorization();
    bool auth_ok = auth == NULL || asprintf(&it.auth, "Authorization: %s", auth) >= 0;
    if (!auth_ok) it.auth = NULL;
    if (it.path == NULL || it.body == NULL || !auth_ok) {
        item_free(&it);
        buf_append_str(out, nomem);
        return 507;
    }
    memcpy(it.body, body, len);
    it.body[len] = 0;
    it.len = len;
    pthread_mutex_lock(&f->mu);
    if (f->n >= FORWARD_MAX || f->stop) {
        pthread_mutex_unlock(&f->mu);
        item_free(&it);
        CTL_INC(f->c, forward_failures);
        buf_append_str(out, busy);
        return 503;
    }
    it.h = admin_hold();
    if (it.h == NULL) {
        pthread_mutex_unlock(&f->mu);
        item_free(&it);
        buf_append_str(out, nomem);
        return 507;
    }
    f->q[(f->head + f->n) % FORWARD_MAX] = it;
    f->n++;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return ADMIN_HELD;
}

void forward_destroy(struct forwarder **fp)
{
    struct forwarder *f = *fp;
    if (f == NULL) return;
    pthread_mutex_lock(&f->mu);
    __atomic_store_n(&f->stop, true, __ATOMIC_SEQ_CST);
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    httpc_cancel(f->http);
    pthread_join(f->th, NULL);
    httpc_destroy(&f->http);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    *fp = NULL;
}
