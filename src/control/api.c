/* api.c — shoal-control's HTTP/JSON API (see api.h). Handlers run on the admin listener's
 * threads (API_THREADS of them); changes are handed to the change thread (below), so no
 * listener thread waits for a state save. */
#include "control/api.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "control/control.h"
#include "control/failover.h"
#include "control/forward.h"
#include "control/leader.h"
#include "control/lease.h"
#include "control/dash.h"
#include "control/model.h"
#include "control/poll.h"
#include "control/push.h"
#include "control/render.h"
#include "control/state.h"
#include "control/topodoc.h"

static const struct metric_desc control_metric_descs[] = {
#define X(name, kind, help) METRIC_DESC(struct control_metrics, name, kind, help),
    CONTROL_METRICS(X)
#undef X
};

static void append_json(struct buf *out, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_SORT_KEYS) : NULL;
    if (s) {
        buf_append_str(out, s);
        buf_append_str(out, "\n");
    } else {
        buf_append_str(out, "{\"error\": \"out of memory\"}\n");
    }
    free(s);
    json_decref(o);
}

static int reply_err(struct buf *out, const struct model_err *e)
{
    append_json(out, json_pack("{s:s,s:s,s:s}", "error", e->msg, "field", e->field, "rule",
                               e->rule));
    return e->status;
}

static int fail(struct buf *out, int status, const char *field, const char *rule,
                const char *msg)
{
    struct model_err e;
    model_fail(&e, status, field, rule, "%s", msg);
    return reply_err(out, &e);
}

/* Make `model` (taken) and its rendered document `d` (taken) the ones served, and publish the
 * model's nodes and version to the lease table. Caller holds c->lock. */
static void install_locked(struct control *c, json_t *model, struct topo_doc *d)
{
    json_decref(c->model);
    topo_doc_unref(c->doc);
    c->model = model;
    c->doc = d;
    c->version = model_version(model);
    CTL_SET(c, topology_version, c->version);
    /* out of memory: renewals go on by the view before (a node the new model adds is answered
     * 404 until the next install) */
    if (c->leases && lease_publish(c->leases, model) < 0)
        log_error("out of memory publishing version %llu to the lease table",
                  (unsigned long long)c->version);
}

int control_install(struct control *c, json_t *model)
{
    size_t len;
    char *text = render_topology(c->render, model, &len);
    struct topo_doc *d = text ? topo_doc_new(text, len, model_version(model)) : NULL;
    if (d == NULL) return -1;
    install_locked(c, model, d);
    return 0;
}

enum op { OP_NS_CREATE, OP_NS_UPDATE, OP_NS_DELETE, OP_POOL_CREATE, OP_NODE_ADD, OP_NODE_REMOVE,
          OP_FN };

struct change {
    enum op op;
    const char *name, *node; /* from the path */
    const char *team;        /* a team token's team (may touch only its namespaces); NULL: admin */
    json_t *body;
    uint32_t moved;
    char created[80]; /* the name a create made */
    control_fn fn;    /* OP_FN: control's own change (control_change), on pool `name` */
    void *arg;
    bool keep_replicas; /* OP_FN: the pool's replicas are not re-planned after fn */
    const char *what;
};

/* A team token may create, change and delete only its own team's namespaces: the one it
 * touches must be its team's now (change, delete) and after (create, change). Checked on the
 * model the change applies to, under the lock, so nothing can slip in between. */
static int team_check(const json_t *m, const struct change *ch, struct model_err *e)
{
    const char *t = ch->team;
    if (ch->op != OP_NS_CREATE && ch->op != OP_NS_UPDATE && ch->op != OP_NS_DELETE)
        return model_fail(e, 403, "authorization", "admin",
                          "pools and nodes need an admin token; the token sent is team %s's", t);
    if (ch->op != OP_NS_CREATE) {
        const json_t *ns = json_object_get(json_object_get(m, "namespaces"), ch->name);
        const char *now = json_string_value(json_object_get(ns, "team"));
        if (ns && strcmp(now ? now : "", t))
            return model_fail(e, 403, "team", "own_team",
                              "namespace %s is %s%s%s; the token sent is team %s's and may "
                              "change only that team's namespaces", ch->name,
                              now && *now ? "team " : "of no team", now && *now ? now : "",
                              now && *now ? "'s" : "", t);
    }
    if (ch->op != OP_NS_DELETE && json_is_object(ch->body)) {
        const json_t *v = json_object_get(ch->body, "team");
        const char *want = json_string_value(v);
        if ((ch->op == OP_NS_CREATE || v) && (want == NULL || strcmp(want, t)))
            return model_fail(e, 403, "team", "own_team",
                              "the token sent is team %s's: the namespace's team must be "
                              "\"%s\"%s", t, t, v ? "" : " (give \"team\" in the body)");
    }
    return 0;
}

static int run_op(json_t *m, struct change *ch, struct model_err *e)
{
    const char *made = NULL;
    int st = 0;
    if (ch->team && (st = team_check(m, ch, e)) != 0) return st;
    switch (ch->op) {
    case OP_NS_CREATE: st = model_ns_create(m, ch->body, &made, e); break;
    case OP_NS_UPDATE: st = model_ns_update(m, ch->name, ch->body, e); break;
    case OP_NS_DELETE: st = model_ns_delete(m, ch->name, e); break;
    case OP_POOL_CREATE: st = model_pool_create(m, ch->body, &made, e); break;
    case OP_NODE_ADD: st = model_node_add(m, ch->name, ch->body, &ch->moved, e); break;
    case OP_NODE_REMOVE: st = model_node_remove(m, ch->name, ch->node, &ch->moved, e); break;
    case OP_FN: st = ch->fn(m, ch->arg, e); break;
    }
    if (st == 0 && made) snprintf(ch->created, sizeof ch->created, "%s", made);
    return st;
}

static const char *const op_names[] = {"namespace created", "namespace changed",
                                       "namespace removed", "pool created", "node added",
                                       "node removed", ""};

/* The namespace and the pool a change edits in place: deep copies in its fork of the model. */
static void touched(const struct change *ch, const char **ns, const char **pool)
{
    *ns = ch->op == OP_NS_UPDATE ? ch->name : NULL;
    *pool = ch->op == OP_NODE_ADD || ch->op == OP_NODE_REMOVE || ch->op == OP_FN ? ch->name
                                                                                 : NULL;
}

/* Apply one change: fork, change, replicas in line, check whole, store, install. 0, 304 (a
 * change of control's own that changed nothing: no version), or an HTTP status with `e`
 * filled (nothing changed). The fork shares every value the change does not touch with the
 * model served, so its cost follows the change, not the model's size: the check skips shared
 * values and the texts are rendered from each namespace's cached text. */
static int apply_core(struct control *c, struct change *ch, struct model_err *ep,
                      uint64_t *version_out)
{
    struct model_err e;
    char err[300];
    const char *tns, *tpool;
    touched(ch, &tns, &tpool);
    /* change_mu for the whole change, c->lock only to compute it and to install it: readers
     * (and the failover thread's reads) never wait for the save */
    pthread_mutex_lock(&c->change_mu);
    pthread_mutex_lock(&c->lock);
    json_t *next = model_fork(c->model, tns, tpool);
    int st = next ? run_op(next, ch, &e) : model_fail(&e, 507, "body", "memory", "out of memory");
    if (st == 0)
        st = model_replicas_sync(next, ch->keep_replicas ? NULL : tpool,
                                 c->fo ? failover_live : NULL, c->fo, &e);
    if (st == 0 && ch->op == OP_FN &&
        json_equal(json_object_get(next, "pools"), json_object_get(c->model, "pools")) &&
        json_equal(json_object_get(next, "namespaces"), json_object_get(c->model, "namespaces")))
        st = 304;
    if (st == 0) st = model_check_since(next, c->model, &e);
    uint64_t version = c->version + 1;
    struct topo_doc *d = NULL;
    char *state = NULL;
    size_t slen = 0;
    if (st == 0) {
        json_object_set_new(next, "version", json_integer((json_int_t)version));
        /* the document is rendered before the store is written, so nothing can fail after */
        size_t len = 0;
        char *text = render_topology(c->render, next, &len);
        d = text ? topo_doc_new(text, len, version) : NULL;
        state = d ? render_state(c->render, next, &slen) : NULL;
        if (state == NULL) st = model_fail(&e, 507, "body", "memory", "out of memory");
    }
    pthread_mutex_unlock(&c->lock);
    /* Stored without c->lock: `next` shares the values the change did not touch with the model
     * served, which readers may reference meanwhile (jansson's counts are atomic; neither side
     * changes a shared value). change_mu keeps every other install out until this one is in. */
    if (st == 0 && state_save(c->store, next, state, slen, err, sizeof err) < 0) {
        CTL_INC(c, state_write_failures);
        if (c->ha && (state_etcd_lost(c->store) || !ha_is_leader(c->ha)))
            CTL_INC(c, deposed_refusals);
        log_error("change refused, state not stored: %s", err);
        st = model_fail(&e, 503, "state", "stored", "the change could not be stored, so "
                        "nothing changed: %s", err);
    }
    if (st == 0) {
        CTL_INC(c, state_writes);
        pthread_mutex_lock(&c->lock);
        install_locked(c, next, d); /* next's "version" is `version` */
        next = NULL;
        d = NULL;
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&c->change_mu);
    topo_doc_unref(d);
    free(state);
    json_decref(next);
    if (st == 304) return 304;
    if (st) {
        CTL_INC(c, changes_refused);
        *ep = e;
        return st;
    }
    CTL_INC(c, changes_applied);
    log_notice("version %llu: %s %s%s%s", (unsigned long long)version,
               ch->op == OP_FN ? ch->what : op_names[ch->op],
               ch->created[0] ? ch->created : ch->name ? ch->name : "", ch->node ? " " : "",
               ch->node ? ch->node : "");
    poll_notify(c->poll, version);
    push_notify(c->push);
    if (version_out) *version_out = version;
    return 0;
}

static int apply(struct control *c, struct change *ch, struct buf *out)
{
    struct model_err e;
    int st = apply_core(c, ch, &e, NULL);
    return st ? reply_err(out, &e) : 0;
}

int control_change(struct control *c, const char *pool, const char *what, control_fn fn,
                   void *arg, struct model_err *e, uint64_t *version)
{
    struct change ch = {.op = OP_FN, .name = pool, .fn = fn, .arg = arg, .what = what};
    return apply_core(c, &ch, e, version);
}

int control_change_keeping_replicas(struct control *c, const char *pool, const char *what,
                                    control_fn fn, void *arg, struct model_err *e,
                                    uint64_t *version)
{
    struct change ch = {.op = OP_FN, .name = pool, .fn = fn, .arg = arg, .what = what,
                        .keep_replicas = true};
    return apply_core(c, &ch, e, version);
}

/* The body as JSON; NULL with the error written when it does not parse. An empty body is an
 * empty object. */
static json_t *parse_body(const char *body, size_t len, struct buf *out, int *st)
{
    if (len == 0) return json_object();
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (o == NULL) {
        char msg[300];
        snprintf(msg, sizeof msg, "the body is not valid JSON: %s (line %d column %d)", je.text,
                 je.line, je.column);
        *st = fail(out, 400, "body", "json", msg);
    }
    return o;
}

/* ---- namespaces ---------------------------------------------------------------------------- */

static json_t *ns_object(const json_t *m, const char *name)
{
    json_t *ns = json_deep_copy(json_object_get(json_object_get(m, "namespaces"), name));
    if (ns) json_object_set_new(ns, "name", json_string(name));
    return ns;
}

static int ns_reply(struct control *c, const char *name, int status, int with_push,
                    struct buf *out)
{
    pthread_mutex_lock(&c->lock);
    json_t *ns = ns_object(c->model, name);
    json_t *o = json_pack("{s:I,s:o*}", "version", (json_int_t)c->version, "namespace", ns);
    if (o && ns) json_object_set_new(o, "share", json_integer((json_int_t)model_ns_share(c->model, name)));
    pthread_mutex_unlock(&c->lock);
    if (o && with_push) json_object_set_new(o, "nodes", push_status(c->push, name));
    if (ns == NULL) {
        json_decref(o);
        char msg[120];
        snprintf(msg, sizeof msg, "no namespace %.64s", name);
        return fail(out, 404, "name", "exists", msg);
    }
    append_json(out, o);
    return status;
}

/* With --etcd, a change reaching a follower goes to the leader (forward.h): ADMIN_HELD or an
 * error status. -1: this process is the leader (or runs alone), so it handles the change.
 * A write calls it only between write_enter and write_leave. */
static int to_leader(struct control *c, const char *method, const char *prefix,
                     const char *rest, const char *body, size_t len, struct buf *out)
{
    if (!strcmp(method, "GET") || c->ha == NULL || ha_is_leader(c->ha)) return -1;
    char path[1100];
    snprintf(path, sizeof path, "%s%s", prefix, rest);
    return forward_request(c->fwd, method, path, body, len, out);
}

/* A write (any method but GET) enters before it touches ha, fwd or the state, and leaves when
 * its handler returns (a forwarded one is held by the forwarder by then, which answers it
 * itself). Returns false with 503 written when shutting down. */
static bool write_enter(struct control *c, const char *method, struct buf *out, int *st)
{
    if (!strcmp(method, "GET")) return true;
    pthread_mutex_lock(&c->gate);
    bool closing = c->closing;
    if (!closing) c->writers++;
    pthread_mutex_unlock(&c->gate);
    if (closing)
        *st = fail(out, 503, "state", "open", "shutting down: send the change to another "
                   "shoal-control, or again once this one is back");
    return !closing;
}

static void write_leave(struct control *c, const char *method)
{
    if (!strcmp(method, "GET")) return;
    pthread_mutex_lock(&c->gate);
    if (--c->writers == 0 && c->closing) pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->gate);
}

void control_close_writes(struct control *c)
{
    pthread_mutex_lock(&c->gate);
    c->closing = true;
    while (c->writers > 0) pthread_cond_wait(&c->idle, &c->gate);
    pthread_mutex_unlock(&c->gate);
}

/* ---- the change thread ----------------------------------------------------------------------
 * A change holds change_mu through its state save, which with etcd is a network round trip
 * (seconds while etcd elects a leader). Run on a listener thread it would stall every
 * connection that thread serves, a node's kept-alive lease renewals among them; so the
 * listener holds the request and this thread applies it and answers, one at a time in
 * arrival order (changes are serialized anyway). */

typedef int (*route_in_fn)(struct control *c, const char *method, const char *rest,
                           const char *body, size_t len, const struct auth_caller *who,
                           struct buf *out);

struct change_job {
    struct admin_held *h;
    route_in_fn fn;
    char method[8];
    char *rest, *body;
    size_t len;
    bool has_who;
    struct auth_caller who;
    struct change_job *next;
};

struct changer {
    struct control *c;
    pthread_t th;
    bool started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct change_job *head, **tail;
};

static void job_free(struct change_job *j)
{
    free(j->rest);
    free(j->body);
    free(j);
}

static void *changer_main(void *arg)
{
    struct changer *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->stop && g->head == NULL) pthread_cond_wait(&g->cv, &g->mu);
        struct change_job *j = g->head;
        if (j) {
            g->head = j->next;
            if (g->head == NULL) g->tail = &g->head;
        }
        pthread_mutex_unlock(&g->mu);
        if (j == NULL) return NULL; /* stopped with nothing queued */
        struct buf out;
        buf_init(&out);
        int st = j->fn(g->c, j->method, j->rest, j->body, j->len, j->has_who ? &j->who : NULL,
                       &out);
        if (st == ADMIN_HELD) st = 500; /* nothing here may hold: a bug, not a hang */
        admin_answer(j->h, st, out.data ? buf_start(&out) : "", buf_used(&out));
        buf_release(&out);
        write_leave(g->c, j->method);
        job_free(j);
    }
}

static struct changer *changer_create(struct control *c)
{
    struct changer *g = calloc(1, sizeof *g);
    if (g == NULL) return NULL;
    g->c = c;
    g->tail = &g->head;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->th, NULL, changer_main, g) != 0) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g);
        return NULL;
    }
    g->started = true;
    return g;
}

void api_stop(struct control *c)
{
    struct changer *g = c->chg;
    if (g == NULL) return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->th, NULL); /* it empties the queue first */
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
    c->chg = NULL;
}

/* Run a write on the change thread: the request is held and answered from there. Called
 * between write_enter and the matching write_leave, which the change thread then does.
 * Returns ADMIN_HELD, or -1 when it cannot be queued (no memory): run it here. */
static int change_queue(struct control *c, route_in_fn fn, const char *method, const char *rest,
                        const char *body, size_t len)
{
    struct changer *g = c->chg;
    struct change_job *j = g ? calloc(1, sizeof *j) : NULL;
    if (j == NULL) return -1;
    const struct auth_caller *who = admin_caller();
    snprintf(j->method, sizeof j->method, "%s", method);
    j->fn = fn;
    j->rest = strdup(rest);
    j->body = malloc(len + 1);
    if (j->rest == NULL || j->body == NULL || (j->h = admin_hold()) == NULL) {
        job_free(j);
        return -1;
    }
    memcpy(j->body, body, len);
    j->body[len] = 0;
    j->len = len;
    if (who) j->who = *who, j->has_who = true;
    pthread_mutex_lock(&g->mu);
    *g->tail = j;
    g->tail = &j->next;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return ADMIN_HELD;
}

/* A write (not GET) on a follower goes to the leader; on the leader (or alone) it is queued for
 * the change thread when `queue`; GETs, and writes that are not or cannot be queued, run
 * here. */
static int route_write(struct control *c, route_in_fn fn, const char *prefix, bool queue,
                       const char *method, const char *rest, const char *body, size_t len,
                       struct buf *out)
{
    int st = 0;
    if (!write_enter(c, method, out, &st)) return st;
    if (strcmp(method, "GET")) {
        st = to_leader(c, method, prefix, rest, body, len, out);
        if (st >= 0) { /* forwarded (held: the forwarder answers it) or refused */
            write_leave(c, method);
            return st;
        }
        /* queued: the change thread answers and leaves */
        if (queue && change_queue(c, fn, method, rest, body, len) == ADMIN_HELD)
            return ADMIN_HELD;
    }
    st = fn(c, method, rest, body, len, admin_caller(), out);
    write_leave(c, method);
    return st;
}

static int ns_route_in(struct control *c, const char *method, const char *rest,
                       const char *body, size_t len, const struct auth_caller *who,
                       struct buf *out);
static int pool_route_in(struct control *c, const char *method, const char *rest,
                         const char *body, size_t len, const struct auth_caller *who,
                         struct buf *out);

static int ns_route(void *ctx, const char *method, const char *rest, const char *body,
                    size_t len, struct buf *out)
{
    return route_write(ctx, ns_route_in, "/v1/namespaces", true, method, rest, body, len, out);
}

static int pool_route(void *ctx, const char *method, const char *rest, const char *body,
                      size_t len, struct buf *out)
{
    /* a drain is queued for the drain thread by failover_drain, which holds the request itself */
    size_t n = strlen(rest);
    bool drain = n > 6 && !strcmp(rest + n - 6, "/drain");
    return route_write(ctx, pool_route_in, "/v1/pools", !drain, method, rest, body, len, out);
}

static int ns_route_in(struct control *c, const char *method, const char *rest,
                       const char *body, size_t len, const struct auth_caller *who,
                       struct buf *out)
{
    CTL_INC(c, requests_namespaces);
    const char *name = rest[0] == '/' ? rest + 1 : rest;
    int st = 0;
    struct change ch = {0};
    if (*name == 0) {
        if (!strcmp(method, "GET")) {
            pthread_mutex_lock(&c->lock);
            json_t *all = json_object();
            const char *k;
            json_t *v;
            json_object_foreach(json_object_get(c->model, "namespaces"), k, v)
                json_object_set_new(all, k, ns_object(c->model, k));
            json_t *o = json_pack("{s:I,s:o}", "version", (json_int_t)c->version, "namespaces",
                                  all);
            pthread_mutex_unlock(&c->lock);
            append_json(out, o);
            return 200;
        }
        if (strcmp(method, "POST"))
            return fail(out, 405, "method", "method",
                        "use GET or POST on /v1/namespaces, GET, PUT or DELETE on "
                        "/v1/namespaces/<name>");
        ch.op = OP_NS_CREATE;
    } else if (strchr(name, '/')) {
        return fail(out, 404, "path", "path", "no such resource: /v1/namespaces/<name>");
    } else if (!strcmp(method, "GET")) {
        return ns_reply(c, name, 200, 1, out);
    } else if (!strcmp(method, "PUT")) {
        ch.op = OP_NS_UPDATE;
    } else if (!strcmp(method, "DELETE")) {
        ch.op = OP_NS_DELETE;
    } else {
        return fail(out, 405, "method", "method", "methods here: GET, PUT, DELETE");
    }
    ch.name = *name ? name : NULL;
    ch.team = who && !who->admin ? who->team : NULL;
    if (ch.op != OP_NS_DELETE && (ch.body = parse_body(body, len, out, &st)) == NULL) return st;
    st = apply(c, &ch, out);
    json_decref(ch.body);
    if (st) return st;
    if (ch.op == OP_NS_DELETE) {
        pthread_mutex_lock(&c->lock);
        json_t *o = json_pack("{s:I,s:b}", "version", (json_int_t)c->version, "deleted", 1);
        pthread_mutex_unlock(&c->lock);
        append_json(out, o);
        return 200;
    }
    return ns_reply(c, ch.op == OP_NS_CREATE ? ch.created : name,
                    ch.op == OP_NS_CREATE ? 201 : 200, 0, out);
}

/* ---- pools --------------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static json_t *pool_object(const json_t *m, const char *name)
{
    const json_t *p = json_object_get(json_object_get(m, "pools"), name);
    if (p == NULL) return NULL;
    json_t *nodes = json_deep_copy(json_object_get(p, "nodes"));
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        const char *addr = json_string_value(json_object_get(n, "node"));
        json_int_t count = 0;
        size_t k;
        json_t *r;
        json_array_foreach(json_object_get(p, "slots"), k, r)
            if (!strcmp(json_string_value(json_object_get(r, "node")), addr))
                count += json_integer_value(json_object_get(r, "to")) -
                         json_integer_value(json_object_get(r, "from")) + 1;
        json_object_set_new(n, "slots", json_integer(count));
        json_int_t rcount = 0;
        json_array_foreach(json_object_get(p, "slots"), k, r)
            if (!strcmp(json_string_value(json_object_get(r, "replica")) ?: "", addr))
                rcount += json_integer_value(json_object_get(r, "to")) -
                          json_integer_value(json_object_get(r, "from")) + 1;
        json_object_set_new(n, "replica_slots", json_integer(rcount));
    }
    const char *g = json_string_value(json_object_get(m, "gutter_pool"));
    /* its namespaces' names, sorted, so the answer does not depend on insertion order */
    const json_t *all = json_object_get(m, "namespaces");
    const char **names = malloc((json_object_size(all) + 1) * sizeof *names);
    size_t nn = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)all, k, v)
        if (names && !strcmp(json_string_value(json_object_get(v, "pool")), name)) names[nn++] = k;
    if (names) qsort(names, nn, sizeof *names, cmp_str);
    json_t *nss = json_array();
    for (size_t j = 0; j < nn; j++) json_array_append_new(nss, json_string(names[j]));
    free(names);
    return json_pack("{s:s,s:o,s:O,s:b,s:o}", "name", name, "nodes", nodes, "slots",
                     json_object_get(p, "slots"), "gutter", g && !strcmp(g, name), "namespaces",
                     nss);
}

static int pool_reply(struct control *c, const char *name, int status, long moved,
                      struct buf *out)
{
    pthread_mutex_lock(&c->lock);
    json_t *p = pool_object(c->model, name);
    json_t *o = json_pack("{s:I,s:o*}", "version", (json_int_t)c->version, "pool", p);
    pthread_mutex_unlock(&c->lock);
    if (p == NULL) {
        json_decref(o);
        char msg[120];
        snprintf(msg, sizeof msg, "no pool %.64s", name);
        return fail(out, 404, "pool", "exists", msg);
    }
    if (o && moved >= 0) json_object_set_new(o, "moved", json_integer(moved));
    append_json(out, o);
    return status;
}

static int pool_route_in(struct control *c, const char *method, const char *rest,
                         const char *body, size_t len, const struct auth_caller *who,
                         struct buf *out)
{
    (void)who; /* pools take admin tokens only: admin.c refused the others */
    CTL_INC(c, requests_pools);
    const char *name = rest[0] == '/' ? rest + 1 : rest;
    char pool[MODEL_NAME_MAX + 2] = "";
    const char *slash = strchr(name, '/'), *sub = slash ? slash : "";
    if ((size_t)(slash ? slash - name : (ptrdiff_t)strlen(name)) > MODEL_NAME_MAX)
        return fail(out, 404, "pool", "exists", "no such pool");
    snprintf(pool, sizeof pool, "%.*s", (int)(slash ? slash - name : (ptrdiff_t)strlen(name)), name);
    struct change ch = {0};
    int st = 0;
    if (*pool == 0) {
        if (!strcmp(method, "GET")) {
            pthread_mutex_lock(&c->lock);
            json_t *all = json_object();
            const char *k;
            json_t *v;
            json_object_foreach(json_object_get(c->model, "pools"), k, v)
                json_object_set_new(all, k, pool_object(c->model, k));
            json_t *o = json_pack("{s:I,s:o}", "version", (json_int_t)c->version, "pools", all);
            pthread_mutex_unlock(&c->lock);
            append_json(out, o);
            return 200;
        }
        if (strcmp(method, "POST"))
            return fail(out, 405, "method", "method", "use GET or POST on /v1/pools");
        ch.op = OP_POOL_CREATE;
    } else if (*sub == 0) {
        if (strcmp(method, "GET"))
            return fail(out, 405, "method", "method",
                        "GET here; add nodes with POST /v1/pools/<name>/nodes");
        return pool_reply(c, pool, 200, -1, out);
    } else if (!strcmp(sub, "/nodes")) {
        if (strcmp(method, "POST"))
            return fail(out, 405, "method", "method", "POST here adds a node");
        ch.op = OP_NODE_ADD;
    } else if (!strncmp(sub, "/nodes/", 7) && sub[7] && strlen(sub) > 13 &&
               !strcmp(sub + strlen(sub) - 6, "/drain")) {
        if (strcmp(method, "POST"))
            return fail(out, 405, "method", "method", "POST here drains the node");
        if (c->fo == NULL) return fail(out, 503, "drain", "failover", "no failover module");
        char node[MODEL_ADDR_MAX + 1];
        snprintf(node, sizeof node, "%.*s", (int)(strlen(sub) - 13), sub + 7);
        json_t *b = parse_body(body, len, out, &st);
        if (b == NULL) return st;
        st = failover_drain(c->fo, pool, node, b, out);
        json_decref(b);
        return st;
    } else if (!strncmp(sub, "/nodes/", 7) && sub[7]) {
        if (strcmp(method, "DELETE"))
            return fail(out, 405, "method", "method", "DELETE here removes the node");
        ch.op = OP_NODE_REMOVE;
        ch.node = sub + 7;
    } else {
        return fail(out, 404, "path", "path",
                    "no such resource: /v1/pools/<name> or /v1/pools/<name>/nodes[/<host:port>"
                    "[/drain]]");
    }
    ch.name = *pool ? pool : NULL;
    if (ch.op != OP_NODE_REMOVE && (ch.body = parse_body(body, len, out, &st)) == NULL) return st;
    st = apply(c, &ch, out);
    json_decref(ch.body);
    if (st) return st;
    return pool_reply(c, ch.op == OP_POOL_CREATE ? ch.created : pool,
                      ch.op == OP_POOL_CREATE ? 201 : 200,
                      ch.op == OP_POOL_CREATE ? -1 : (long)ch.moved, out);
}

/* ---- topology ----------------------------------------------------------------------------- */

/* Answer with the current document, shared (topodoc.h): held and answered at once. */
static int doc_now(struct control *c, struct buf *out)
{
    CTL_INC(c, requests_topology);
    bool gzip = topo_doc_gzip_accepted(admin_header("Accept-Encoding"));
    struct admin_held *h = admin_hold();
    pthread_mutex_lock(&c->lock);
    struct topo_doc *d = topo_doc_ref(c->doc);
    pthread_mutex_unlock(&c->lock);
    if (h == NULL) { /* no memory to hold it: a copy */
        size_t len;
        const char *text = topo_doc_text(d, &len);
        buf_append(out, text, len);
        topo_doc_unref(d);
        return 200;
    }
    topo_doc_answer(d, h, gzip);
    topo_doc_unref(d);
    return ADMIN_HELD;
}

static int topology_route(void *ctx, const char *method, const char *rest, const char *body,
                          size_t len, struct buf *out)
{
    struct control *c = ctx;
    if (strcmp(method, "GET")) return fail(out, 405, "method", "method", "GET here");
    if (*rest == 0) return doc_now(c, out);
    if (strncmp(rest, "?after=", 7) != 0)
        return fail(out, rest[0] == '?' ? 400 : 404, rest[0] == '?' ? "query" : "path",
                    rest[0] == '?' ? "unknown_field" : "path",
                    "GET /v1/topology, or /v1/topology?after=<version> to wait for a newer one");
    char *end;
    errno = 0;
    unsigned long long after = strtoull(rest + 7, &end, 10);
    if (rest[7] < '0' || rest[7] > '9' || *end || errno)
        return fail(out, 400, "after", "integer",
                    "after must be a version number: the one the caller holds (0: none)");
    pthread_mutex_lock(&c->lock);
    uint64_t version = c->version;
    pthread_mutex_unlock(&c->lock);
    if (version > after) return doc_now(c, out);
    CTL_INC(c, requests_topology_polls);
    struct admin_held *h = admin_hold();
    if (h == NULL) return fail(out, 503, "after", "memory", "out of memory; poll again");
    if (poll_add(c->poll, h, after,
                 topo_doc_gzip_accepted(admin_header("Accept-Encoding"))) < 0) {
        CTL_INC(c, polls_refused);
        struct buf e;
        buf_init(&e);
        fail(&e, 503, "after", "poll_max",
             "too many long polls held (--poll-max); poll again after a pause");
        admin_answer(h, 503, buf_start(&e), buf_used(&e));
        buf_release(&e);
    }
    return ADMIN_HELD;
}

/* ---- failures ------------------------------------------------------------------------------ */

static int reports_route(void *ctx, const char *method, const char *rest, const char *body,
                         size_t len, struct buf *out)
{
    struct control *c = ctx;
    if (strcmp(method, "POST") || *rest)
        return fail(out, strcmp(method, "POST") ? 405 : 404, "method", "method",
                    "POST /v1/reports {\"router\": ID, \"nodes\": {\"host:port\": \"up\"|\"down\"}}");
    int st = 0;
    if (!write_enter(c, method, out, &st)) return st;
    /* the leader decides: a standby sends the report on (forward.h) */
    st = to_leader(c, method, "/v1/reports", rest, body, len, out);
    if (st < 0) {
        json_t *b = parse_body(body, len, out, &st);
        if (b) {
            struct model_err e;
            st = c->fo ? failover_report(c->fo, b, &e)
                       : model_fail(&e, 503, "reports", "failover", "no failover module");
            if (st) reply_err(out, &e);
            else st = 200, buf_append_str(out, "{}\n");
            json_decref(b);
        }
    }
    write_leave(c, method);
    return st;
}

static int failures_route(void *ctx, const char *method, const char *rest, const char *body,
                          size_t len, struct buf *out)
{
    struct control *c = ctx;
    if (strcmp(method, "GET")) return fail(out, 405, "method", "method", "GET here");
    if (*rest) return fail(out, 404, "path", "path", "GET /v1/failures");
    if (c->fo == NULL) return fail(out, 503, "failures", "failover", "no failover module");
    append_json(out, failover_status(c->fo));
    return 200;
}

static void control_metrics(void *ctx, struct buf *out)
{
    struct control *c = ctx;
    struct control_metrics m;
    uint64_t *d = (uint64_t *)&m;
    const uint64_t *s = (const uint64_t *)&c->m;
    for (size_t i = 0; i < sizeof m / sizeof *d; i++) d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
    metrics_write_prom(out, "shoal_control", control_metric_descs,
                       sizeof control_metric_descs / sizeof control_metric_descs[0], &m, NULL);
    if (c->leases) lease_metrics(c->leases, out, clock_mono_ms());
    char line[300];
    snprintf(line, sizeof line,
             "# HELP shoal_control_promotion_seconds the last promotion's time from first "
             "suspicion to publication\n# TYPE shoal_control_promotion_seconds gauge\n"
             "shoal_control_promotion_seconds %.3f\n", (double)m.promotion_ms / 1000.0);
    buf_append_str(out, line);
}

struct admin *api_create(struct control *c, char *err, size_t errlen)
{
    struct admin_route routes[] = {
        /* held only on a follower, while the change goes to the leader */
        {"/v1/namespaces", ns_route, c, ADMIN_ROUTE_HOLD | ADMIN_ROUTE_TEAM},
        {"/v1/pools", pool_route, c, ADMIN_ROUTE_HOLD},
        {"/v1/topology", topology_route, c, ADMIN_ROUTE_QUERY | ADMIN_ROUTE_HOLD},
        /* renewals need an admin token under --auth-file (a team's could hold off failover) */
        {"/v1/leases", lease_route, c, 0},
        {"/v1/stats", dash_stats_route, c, ADMIN_ROUTE_QUERY},
        {"/v1/reports", reports_route, c, ADMIN_ROUTE_HOLD},
        {"/v1/failures", failures_route, c, 0},
        {"/static", dash_static_route, c, 0},
        {"/", dash_page_route, c, 0},
    };
    if ((c->chg = changer_create(c)) == NULL) {
        snprintf(err, errlen, "cannot start the change thread");
        return NULL;
    }
    struct admin_limits lim = ADMIN_LIMITS_OF(c->cfg);
    struct admin *a = admin_create_pool(API_THREADS, c->cfg.listen, (unsigned)c->cfg.port, &lim, control_metrics,
                                   c, routes, sizeof routes / sizeof routes[0], err, errlen);
    if (a == NULL) api_stop(c);
    return a;
}
