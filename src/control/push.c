/* push.c — namespace settings pushed to nodes' admin ports (see push.h), over the shared
 * HTTP client (common/httpc: one client for the push thread, which keeps a connection to the
 * node it last pushed to, never goes through a proxy, and sends --token-file's token). */
#include "control/push.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/httpc.h"
#include "common/log.h"
#include "control/control.h"
#include "control/model.h"

struct push_entry {
    char *node, *admin, *ns;
    char *want;   /* body to PUT; NULL: DELETE */
    int keep;     /* the model wants the node to hold it (else: remove, then forget) */
    char *have;   /* body last PUT successfully; NULL: not known */
    int absent;   /* removed, confirmed */
    uint64_t share;
    unsigned failures; /* in a row */
    uint64_t next_ms;
    char error[200];
};

struct pusher {
    struct control *c;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    struct httpc *http; /* the push thread's */
    struct push_entry *v;
    size_t n, cap;
    json_t *index; /* "node/ns" -> position in v: a change touches every entry, so no scans */
    int stop;
    int paused; /* --etcd: not the leader, so nothing is sent (push_pause) */
    /* The model's namespaces and pools objects as of the last push_notify (references; NULL:
     * none yet, or all to be recomputed). Values are never changed in place once installed
     * (model.h), so a namespace whose value and pool value are the same as then wants the same. */
    json_t *seen_nss, *seen_pools;
};

static int needs_work(const struct push_entry *e)
{
    return e->want ? (e->have == NULL || strcmp(e->have, e->want) != 0) : !e->absent;
}

static void entry_free(struct push_entry *e)
{
    free(e->node);
    free(e->admin);
    free(e->ns);
    free(e->want);
    free(e->have);
}

/* The node-side settings of a namespace (shoal-node's PUT /v1/namespaces/<name> body). */
static char *node_body(const json_t *ns, uint64_t share)
{
    json_t *o = json_pack("{s:I,s:O,s:O,s:O,s:O,s:O,s:O}", "memory", (json_int_t)share,
                          "default_ttl", json_object_get(ns, "default_ttl"), "max_ttl",
                          json_object_get(ns, "max_ttl"), "eviction",
                          json_object_get(ns, "eviction"), "lease_ttl",
                          json_object_get(ns, "lease_ttl"), "stale_ttl",
                          json_object_get(ns, "stale_ttl"), "lease_period",
                          json_object_get(ns, "lease_period"));
    char *s = o ? json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static void entry_key(char *key, size_t cap, const char *node, const char *ns)
{
    snprintf(key, cap, "%s/%s", node, ns);
}

static struct push_entry *find(struct pusher *p, const char *node, const char *ns)
{
    char key[MODEL_ADDR_MAX + MODEL_NAME_MAX + 2];
    entry_key(key, sizeof key, node, ns);
    json_t *i = json_object_get(p->index, key);
    return i ? &p->v[json_integer_value(i)] : NULL;
}

/* Forget entry i (its key leaves the index; the last entry takes its place). */
static void remove_at(struct pusher *p, size_t i)
{
    char key[MODEL_ADDR_MAX + MODEL_NAME_MAX + 2];
    entry_key(key, sizeof key, p->v[i].node, p->v[i].ns);
    json_object_del(p->index, key);
    entry_free(&p->v[i]);
    if (i != --p->n) {
        p->v[i] = p->v[p->n];
        entry_key(key, sizeof key, p->v[i].node, p->v[i].ns);
        json_object_set_new(p->index, key, json_integer((json_int_t)i));
    }
}

/* Want `body` (or removal when NULL) for ns on node. Caller holds p->mu. */
static void want(struct pusher *p, const char *node, const char *admin, const char *ns,
                 char *body, uint64_t share, int keep)
{
    struct push_entry *e = find(p, node, ns);
    if (e == NULL) {
        if (p->n == p->cap) {
            size_t nc = p->cap ? p->cap * 2 : 64;
            struct push_entry *nv = realloc(p->v, nc * sizeof *nv);
            if (nv == NULL) {
                free(body);
                log_error("out of memory tracking pushes; node %s namespace %s not pushed", node, ns);
                return;
            }
            p->v = nv;
            p->cap = nc;
        }
        char key[MODEL_ADDR_MAX + MODEL_NAME_MAX + 2];
        entry_key(key, sizeof key, node, ns);
        e = &p->v[p->n];
        memset(e, 0, sizeof *e);
        e->node = strdup(node);
        e->ns = strdup(ns);
        if (e->node == NULL || e->ns == NULL ||
            json_object_set_new(p->index, key, json_integer((json_int_t)p->n)) < 0) {
            entry_free(e);
            free(body);
            log_error("out of memory tracking pushes; node %s namespace %s not pushed", node, ns);
            return;
        }
        p->n++;
    }
    if (admin && (e->admin == NULL || strcmp(e->admin, admin))) {
        free(e->admin);
        e->admin = strdup(admin);
    }
    if ((body == NULL) != (e->want == NULL) || (body && strcmp(body, e->want))) {
        e->failures = 0;
        e->next_ms = 0;
        e->error[0] = 0;
    }
    free(e->want);
    e->want = body;
    e->keep = keep;
    e->share = share;
}

/* Want namespace `name` (value ns) on every node of its pool with an admin address. */
static void want_ns(struct pusher *p, const json_t *m, const json_t *pools, const char *name,
                    const json_t *ns)
{
    const char *pname = json_string_value(json_object_get(ns, "pool"));
    const json_t *pool = json_object_get(pools, pname ? pname : "");
    uint64_t share = model_ns_share(m, name);
    char *body = NULL; /* the same for every node of the pool: rendered once */
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(pool, "nodes"), i, n) {
        const char *admin = json_string_value(json_object_get(n, "admin"));
        if (admin == NULL) continue;
        if (body == NULL && (body = node_body(ns, share)) == NULL) break;
        char *mine = strdup(body);
        if (mine) want(p, json_string_value(json_object_get(n, "node")), admin, name, mine,
                       share, 1);
    }
    free(body);
}

/* Whether namespace `name` (value ns, NULL: gone) wants what it wanted at the last notify;
 * pools_same: no pool changed since. */
static bool ns_same(const struct pusher *p, const json_t *pools, bool pools_same,
                    const char *name, const json_t *ns)
{
    if (p->seen_nss == NULL || ns == NULL || json_object_get(p->seen_nss, name) != ns)
        return false;
    if (pools_same) return true;
    const char *pool = json_string_value(json_object_get(ns, "pool")) ?: "";
    return json_object_get(p->seen_pools, pool) == json_object_get(pools, pool);
}

void push_notify(struct pusher *p)
{
    struct control *c = p->c;
    pthread_mutex_lock(&c->lock);
    pthread_mutex_lock(&p->mu);
    json_t *nss = json_object_get(c->model, "namespaces");
    json_t *pools = json_object_get(c->model, "pools");
    /* only the namespaces that changed since the last notify are recomputed: a change costs
     * what it touches, not the model's size */
    json_t *changed = json_object();
    const char *name;
    json_t *ns;
    bool all = p->seen_nss == NULL || changed == NULL;
    if (!all) {
        bool pools_same = json_object_size(pools) == json_object_size(p->seen_pools);
        json_object_foreach(pools, name, ns)
            if (pools_same && json_object_get(p->seen_pools, name) != ns) pools_same = false;
        json_object_foreach(nss, name, ns)
            if (!ns_same(p, pools, pools_same, name, ns))
                json_object_set_new(changed, name, json_true());
        json_object_foreach(p->seen_nss, name, ns)
            if (json_object_get(nss, name) == NULL) json_object_set_new(changed, name, json_true());
    }
    size_t nchanged = all ? 0 : json_object_size(changed);
    const char *one = nchanged == 1 ? json_object_iter_key(json_object_iter(changed)) : NULL;
    for (size_t i = 0; i < p->n; i++)
        if (all || (one ? !strcmp(p->v[i].ns, one)
                        : nchanged && json_object_get(changed, p->v[i].ns)))
            p->v[i].keep = -1; /* not seen yet */
    if (all) {
        json_object_foreach(nss, name, ns) want_ns(p, c->model, pools, name, ns);
    } else {
        json_t *x;
        json_object_foreach(changed, name, x)
            if ((ns = json_object_get(nss, name)) != NULL) want_ns(p, c->model, pools, name, ns);
    }
    json_decref(changed);
    json_decref(p->seen_nss);
    json_decref(p->seen_pools);
    p->seen_nss = json_incref(nss);
    p->seen_pools = json_incref(pools);
    static const char zero[] = "{\"default_ttl\":0,\"eviction\":\"s3fifo\",\"lease_period\":0,"
                               "\"lease_ttl\":0,\"max_ttl\":0,\"memory\":0,\"stale_ttl\":0}";
    for (size_t i = 0; i < p->n; i++) {
        struct push_entry *e = &p->v[i];
        if (e->keep != -1) continue;
        /* no longer held there: removed; a node's default cannot be, so it is reset */
        want(p, e->node, NULL, e->ns, strcmp(e->ns, "default") ? NULL : strdup(zero), 0, 0);
    }
    for (size_t i = 0; i < p->n;) {
        if (!p->v[i].keep && !needs_work(&p->v[i])) {
            remove_at(p, i);
            continue;
        }
        i++;
    }
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&c->lock);
}

/* One request on the push thread's client; 0 when the node answered 2xx (404 too for a
 * DELETE), else -1 with why. */
static int http_call(struct httpc *http, const char *method, const char *url, const char *body,
                     unsigned timeout_ms, char *err, size_t errlen)
{
    struct httpc_reply r;
    httpc_reply_init(&r);
    if (httpc_request(http, method, url, body, body ? strlen(body) : 0, timeout_ms, &r, err,
                      errlen) < 0) {
        httpc_reply_release(&r);
        return -1;
    }
    long status = r.status;
    if ((status >= 200 && status < 300) || (status == 404 && !strcmp(method, "DELETE"))) {
        httpc_reply_release(&r);
        return 0;
    }
    size_t n = buf_used(&r.body);
    const char *text = n ? buf_start(&r.body) : "";
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) n--;
    snprintf(err, errlen, "HTTP %ld %.*s", status, (int)(n < 150 ? n : 150), text);
    httpc_reply_release(&r);
    return -1;
}

static void *push_main(void *arg)
{
    struct pusher *p = arg;
    struct control *c = p->c;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        uint64_t now = clock_mono_ms(), next = UINT64_MAX;
        struct push_entry *e = NULL;
        uint64_t pending = 0;
        for (size_t i = 0; i < p->n; i++) {
            if (!needs_work(&p->v[i])) continue;
            pending++;
            if (p->v[i].next_ms <= now && e == NULL) e = &p->v[i];
            else if (p->v[i].next_ms < next) next = p->v[i].next_ms;
        }
        CTL_SET(c, push_pending, pending);
        if (p->paused) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        if (e == NULL) {
            if (next == UINT64_MAX) {
                pthread_cond_wait(&p->cv, &p->mu);
            } else {
                struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000};
                pthread_cond_timedwait(&p->cv, &p->mu, &ts);
            }
            continue;
        }
        char *node = strdup(e->node), *admin = e->admin ? strdup(e->admin) : NULL,
             *ns = strdup(e->ns), *body = e->want ? strdup(e->want) : NULL;
        int del = e->want == NULL;
        pthread_mutex_unlock(&p->mu);
        char url[600], err[200] = "out of memory";
        int rc = -1;
        if (node && admin && ns && (del || body)) {
            snprintf(url, sizeof url, "http://%s/v1/namespaces/%s", admin, ns);
            rc = http_call(p->http, del ? "DELETE" : "PUT", url, body,
                           (unsigned)c->cfg.push_timeout_ms, err, sizeof err);
        }
        pthread_mutex_lock(&p->mu);
        e = node && ns ? find(p, node, ns) : NULL;
        if (rc == 0) {
            CTL_INC(c, pushes);
            log_info("namespace %s %s on node %s", ns, del ? "removed" : "settings in place", node);
        } else if (!p->stop) { /* a push ended by push_destroy is no failure */
            CTL_INC(c, push_failures);
            log_warn_limited("push of namespace %s to node %s (admin %s) failed, will retry: %s",
                             ns ? ns : "?", node ? node : "?", admin ? admin : "?", err);
        }
        if (e) {
            if (rc == 0) {
                e->failures = 0;
                e->error[0] = 0;
                if (del) {
                    e->absent = 1;
                } else {
                    free(e->have);
                    e->have = body;
                    body = NULL;
                    e->absent = 0;
                }
                if (!e->keep && !needs_work(e)) remove_at(p, (size_t)(e - p->v)); /* done */
            } else {
                e->failures++;
                snprintf(e->error, sizeof e->error, "%s", err);
                uint64_t wait = 100ull << (e->failures < 16 ? e->failures - 1 : 15);
                if (wait > c->cfg.push_retry_ms) wait = c->cfg.push_retry_ms;
                e->next_ms = clock_mono_ms() + wait;
                /* the node is likely down: its other pushes wait as long, not in turn */
                for (size_t i = 0; i < p->n; i++)
                    if (p->v[i].admin && admin && !strcmp(p->v[i].admin, admin) &&
                        p->v[i].next_ms < e->next_ms)
                        p->v[i].next_ms = e->next_ms;
            }
        }
        free(node);
        free(admin);
        free(ns);
        free(body);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void push_pause(struct pusher *p)
{
    pthread_mutex_lock(&p->mu);
    p->paused = 1;
    pthread_mutex_unlock(&p->mu);
}

void push_resume(struct pusher *p)
{
    pthread_mutex_lock(&p->mu);
    p->paused = 0;
    for (size_t i = 0; i < p->n; i++) {
        /* another leader may have pushed since: what this process sent proves nothing now */
        struct push_entry *e = &p->v[i];
        free(e->have);
        e->have = NULL;
        e->absent = 0;
        e->failures = 0;
        e->next_ms = 0;
        e->error[0] = 0;
    }
    json_decref(p->seen_nss); /* recompute every namespace */
    json_decref(p->seen_pools);
    p->seen_nss = p->seen_pools = NULL;
    pthread_mutex_unlock(&p->mu);
    push_notify(p);
}

json_t *push_status(struct pusher *p, const char *ns)
{
    json_t *o = json_object();
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; o && i < p->n; i++) {
        struct push_entry *e = &p->v[i];
        if (strcmp(e->ns, ns) || !e->keep) continue;
        json_t *s = json_pack("{s:I,s:b,s:i}", "share", (json_int_t)e->share, "in_place",
                              !needs_work(e), "failures", (int)e->failures);
        if (s && e->error[0]) json_object_set_new(s, "error", json_string(e->error));
        if (s) json_object_set_new(o, e->node, s);
    }
    pthread_mutex_unlock(&p->mu);
    return o;
}

struct pusher *push_create(struct control *c, char *err, size_t errlen)
{
    struct pusher *p = calloc(1, sizeof *p);
    if (p == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->c = c;
    /* node replies are a namespace's settings: small */
    if ((p->http = httpc_create(64 << 10)) == NULL) {
        free(p);
        snprintf(err, errlen, "cannot start the HTTP client for pushes (libcurl missing?)");
        return NULL;
    }
    /* a node that is down is noticed within a second, so the others' pushes are not held */
    httpc_set_connect_timeout(p->http, 1000);
    if ((p->index = json_object()) == NULL ||
        (c->auth_header && httpc_add_header(p->http, c->auth_header) < 0)) {
        json_decref(p->index);
        httpc_destroy(&p->http);
        free(p);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    clock_cond_init_monotonic(&p->cv);
    if (pthread_create(&p->th, NULL, push_main, p) != 0) {
        snprintf(err, errlen, "cannot start the push thread");
        json_decref(p->index);
        httpc_destroy(&p->http);
        free(p);
        return NULL;
    }
    return p;
}

void push_destroy(struct pusher **pp)
{
    struct pusher *p = *pp;
    if (p == NULL) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    httpc_cancel(p->http); /* a push in progress ends now, not at its timeout */
    pthread_join(p->th, NULL);
    httpc_destroy(&p->http);
    for (size_t i = 0; i < p->n; i++) entry_free(&p->v[i]);
    free(p->v);
    json_decref(p->index);
    json_decref(p->seen_nss);
    json_decref(p->seen_pools);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    *pp = NULL;
}
