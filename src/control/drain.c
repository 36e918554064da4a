/* drain.c — planned handoffs (`shoal node drain`, POST /v1/pools/P/nodes/N/drain): the
 * request's checks on the admin thread, then, on the drain thread, one handoff per replica on
 * the node's admin port and one version swapping the handed-off ranges with their replicas
 * (see failover.h). Failure detection and promotion are failover.c's. */
#include "control/failover_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/httpc.h"
#include "common/log.h"
#include "common/slot.h"
#include "control/control.h"

struct drain_range {
    uint16_t from, to;
    char replica[MODEL_ADDR_MAX + 1];
    bool replica_live;
};

/* The node's ranges as primary and its admin address, from the model (under c->lock). -1: no
 * such pool or node (e filled). */
static int drain_ranges(struct failover *f, const char *pool, const char *node,
                        struct drain_range **out, size_t *n, char *admin, struct model_err *e)
{
    struct control *c = f->c;
    *out = NULL;
    *n = 0;
    json_t *p = json_object_get(json_object_get(c->model, "pools"), pool);
    if (p == NULL) return model_fail(e, 404, "pool", "exists", "no pool %.64s", pool);
    json_t *nodes = json_object_get(p, "nodes");
    int ni = model_node_index(nodes, node);
    if (ni < 0) return model_fail(e, 404, "node", "exists", "node %.200s is not in pool %s", node, pool);
    snprintf(admin, MODEL_ADDR_MAX + 1, "%s",
             json_string_value(json_object_get(json_array_get(nodes, (size_t)ni), "admin")) ?: "");
    size_t i;
    json_t *v;
    struct drain_range *d = calloc(json_array_size(json_object_get(p, "slots")) + 1, sizeof *d);
    if (d == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    json_array_foreach(json_object_get(p, "slots"), i, v) {
        if (strcmp(json_string_value(json_object_get(v, "node")) ?: "", node)) continue;
        struct drain_range *x = &d[(*n)++];
        x->from = (uint16_t)json_integer_value(json_object_get(v, "from"));
        x->to = (uint16_t)json_integer_value(json_object_get(v, "to"));
        const char *rep = json_string_value(json_object_get(v, "replica"));
        snprintf(x->replica, sizeof x->replica, "%s", rep ?: "");
        x->replica_live = rep && failover_live(f, rep);
    }
    *out = d;
    return 0;
}

static json_t *range_pair(const struct drain_range *r)
{
    return json_pack("[i,i]", (int)r->from, (int)r->to);
}

static void answer_json(struct admin_held *h, int status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_SORT_KEYS) : NULL;
    json_decref(o);
    struct buf b;
    buf_init(&b);
    buf_append_str(&b, s ? s : "{\"error\": \"out of memory\"}");
    buf_append_str(&b, "\n");
    admin_answer(h, status, buf_start(&b), buf_used(&b));
    buf_release(&b);
    free(s);
}

static json_t *err_json(const struct model_err *e)
{
    return json_pack("{s:s,s:s,s:s}", "error", e->msg, "field", e->field, "rule", e->rule);
}

int failover_drain(struct failover *f, const char *pool, const char *node, json_t *body,
                   struct buf *out)
{
    struct model_err e;
    json_t *o = NULL;
    int st = 0;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
        if (strcmp(k, "force") && strcmp(k, "timeout_ms")) {
            st = model_fail(&e, 400, k, "unknown_field",
                            "unknown field '%s'; a drain takes {\"force\": bool, \"timeout_ms\": N}", k);
            goto fail;
        }
    json_t *force = json_object_get(body, "force"), *tmo = json_object_get(body, "timeout_ms");
    if ((force && !json_is_boolean(force)) ||
        (tmo && (!json_is_integer(tmo) || json_integer_value(tmo) < 10 ||
                 json_integer_value(tmo) > 60000))) { /* a node's limit for a handoff */
        st = model_fail(&e, 400, force && !json_is_boolean(force) ? "force" : "timeout_ms",
                        "range", "force must be true or false, timeout_ms 10 to 60000");
        goto fail;
    }
    struct drain_range *d = NULL;
    size_t n = 0;
    char admin[MODEL_ADDR_MAX + 1] = "";
    pthread_mutex_lock(&f->c->lock);
    st = drain_ranges(f, pool, node, &d, &n, admin, &e);
    pthread_mutex_unlock(&f->c->lock);
    if (st) goto fail;
    json_t *stuck = json_array();
    bool movable = false;
    for (size_t i = 0; i < n; i++) {
        if (!d[i].replica_live) json_array_append_new(stuck, range_pair(&d[i]));
        else movable = true;
    }
    free(d);
    if (json_array_size(stuck) > 0 && !json_is_true(force)) {
        model_fail(&e, 409, "node", "replica",
                   "%zu range%s of %s %s no live replica to hand off to (its keys would go to "
                   "the gutter): add nodes or a copies-2 namespace, or drain with "
                   "{\"force\": true} to move the others and keep those", json_array_size(stuck),
                   json_array_size(stuck) == 1 ? "" : "s", node,
                   json_array_size(stuck) == 1 ? "has" : "have");
        o = err_json(&e);
        json_object_set_new(o, "ranges", stuck);
        goto answer;
    }
    json_decref(stuck);
    if (movable && *admin == 0) {
        st = model_fail(&e, 409, "node", "admin",
                        "node %s has no admin address, so it cannot hand its slots off: add "
                        "one, or remove the node instead", node);
        goto fail;
    }
    struct drain_job *j = calloc(1, sizeof *j);
    struct admin_held *h = j ? admin_hold() : NULL;
    if (h == NULL) {
        free(j);
        st = model_fail(&e, 503, "drain", "memory", "out of memory; try again");
        goto fail;
    }
    j->h = h;
    snprintf(j->pool, sizeof j->pool, "%s", pool);
    snprintf(j->node, sizeof j->node, "%s", node);
    j->force = json_is_true(force);
    j->timeout_ms = tmo ? (unsigned)json_integer_value(tmo) : 2000;
    pthread_mutex_lock(&f->mu);
    *f->drains_tail = j;
    f->drains_tail = &j->next;
    pthread_cond_signal(&f->dcv);
    pthread_mutex_unlock(&f->mu);
    return ADMIN_HELD;
fail:
    o = err_json(&e);
answer:;
    char *s = o ? json_dumps(o, JSON_SORT_KEYS) : NULL;
    json_decref(o);
    buf_append_str(out, s ? s : "{\"error\": \"out of memory\"}");
    buf_append_str(out, "\n");
    free(s);
    return e.status;
}

struct swap_arg {
    const char *pool, *node;
    uint8_t *slots;
    uint32_t swapped;
};

static int swap_fn(json_t *m, void *arg, struct model_err *e)
{
    struct swap_arg *a = arg;
    return model_swap(m, a->pool, a->node, a->slots, &a->swapped, e);
}

/* Hand the node's ranges off to each live replica (C2's handoff on the node's admin port),
 * then publish the swap of those that were handed off, in one version; answer the request. */
static void drain_run(struct failover *f, struct drain_job *j)
{
    struct control *c = f->c;
    uint64_t t0 = clock_mono_ms();
    struct model_err e;
    struct drain_range *d = NULL;
    size_t n = 0;
    char admin[MODEL_ADDR_MAX + 1] = "";
    pthread_mutex_lock(&c->lock);
    int st = drain_ranges(f, j->pool, j->node, &d, &n, admin, &e);
    pthread_mutex_unlock(&c->lock);
    if (st) {
        answer_json(j->h, st, err_json(&e));
        return;
    }
    static uint8_t slots[SLOT_COUNT]; /* the failover thread's */
    memset(slots, 0, sizeof slots);
    json_t *moved = json_array(), *failed = json_array(), *kept = json_array();
    bool *done = calloc(n + 1, sizeof *done);
    for (size_t i = 0; done && i < n; i++) {
        if (!d[i].replica_live) {
            json_array_append_new(kept, range_pair(&d[i]));
            continue;
        }
        if (done[i]) continue;
        /* one handoff per replica, with every range going to it */
        json_t *list = json_array();
        for (size_t k = i; k < n; k++)
            if (d[k].replica_live && !done[k] && !strcmp(d[k].replica, d[i].replica)) {
                json_array_append_new(list, range_pair(&d[k]));
                done[k] = true;
            }
        json_t *req = json_pack("{s:s,s:O,s:i}", "to", d[i].replica, "slots", list,
                                "timeout_ms", (int)j->timeout_ms);
        char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
        json_decref(req);
        char url[MODEL_ADDR_MAX + 48], err[256] = "";
        snprintf(url, sizeof url, "http://%s/v1/replication/handoff", admin);
        struct httpc_reply r;
        httpc_reply_init(&r);
        int rc = body ? httpc_request(f->dhttp, "POST", url, body, strlen(body),
                                      j->timeout_ms + 1000, &r, err, sizeof err)
                      : -1;
        free(body);
        bool ok = rc == 0 && r.status == 200;
        size_t li;
        json_t *pr;
        json_array_foreach(list, li, pr) {
            json_int_t a = json_integer_value(json_array_get(pr, 0)),
                       b = json_integer_value(json_array_get(pr, 1));
            if (ok) {
                for (json_int_t s = a; s <= b; s++) slots[s] = 1;
                json_array_append_new(moved, json_pack("{s:I,s:I,s:s}", "from", a, "to", b,
                                                       "new_node", d[i].replica));
            } else {
                json_array_append_new(failed, json_pack("{s:I,s:I,s:s,s:I,s:s%}", "from", a, "to", b,
                                                        "replica", d[i].replica, "status",
                                                        (json_int_t)(rc == 0 ? r.status : 0),
                                                        "error", rc == 0 ? buf_start(&r.body) : err,
                                                        rc == 0 ? buf_used(&r.body) : strlen(err)));
            }
        }
        if (!ok) {
            CTL_INC(c, handoff_failures);
            log_error("drain of %s: handoff to %s failed: %s", j->node, d[i].replica,
                      rc == 0 ? "the node refused it" : err);
        }
        httpc_reply_release(&r);
        json_decref(list);
    }
    free(done);
    free(d);
    uint64_t version = 0;
    struct swap_arg sa = {j->pool, j->node, slots, 0};
    st = 0;
    if (json_array_size(moved) > 0) {
        char what[MODEL_ADDR_MAX + 100];
        snprintf(what, sizeof what, "drain of %s: slots swapped with their replicas in pool", j->node);
        /* replicas not re-planned (control.h): routers would take a re-planned one for a
         * promotion and replay deletes over newer writes */
        st = control_change_keeping_replicas(c, j->pool, what, swap_fn, &sa, &e, &version);
        if (st == 304) st = 0;
    }
    if (st) {
        json_decref(moved);
        json_decref(failed);
        json_decref(kept);
        answer_json(j->h, st, err_json(&e));
        return;
    }
    uint64_t ms = clock_mono_ms() - t0;
    if (json_array_size(moved) > 0) {
        CTL_INC(c, drains);
        log_notice("drained %u slots of %s in %llu ms (%zu range%s kept, %zu failed)",
                   sa.swapped, j->node, (unsigned long long)ms, json_array_size(kept),
                   json_array_size(kept) == 1 ? "" : "s", json_array_size(failed));
    }
    if (version == 0) {
        pthread_mutex_lock(&c->lock);
        version = c->version;
        pthread_mutex_unlock(&c->lock);
    }
    json_t *o = json_pack("{s:I,s:s,s:s,s:o,s:o,s:o,s:I,s:i}", "version", (json_int_t)version,
                          "pool", j->pool, "node", j->node, "moved", moved, "failed", failed,
                          "kept", kept, "ms", (json_int_t)ms, "slots", (int)sa.swapped);
    if (o && json_array_size(failed) > 0) {
        char msg[MODEL_ADDR_MAX + 300];
        snprintf(msg, sizeof msg, "%zu range%s of %s could not be handed off (the replica did not "
                 "catch up in time, or the node refused): %s; drain again", json_array_size(failed),
                 json_array_size(failed) == 1 ? "" : "s", j->node,
                 json_array_size(moved) ? "the others moved" : "nothing moved");
        json_object_set_new(o, "error", json_string(msg));
        json_object_set_new(o, "field", json_string("node"));
        json_object_set_new(o, "rule", json_string("handoff"));
    }
    answer_json(j->h, json_array_size(failed) > 0 ? 502 : 200, o);
}

/* Drains one at a time, on their own thread: handoffs take up to their timeout each. */
void *drain_main(void *arg)
{
    struct failover *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        while (!f->stop && f->drains == NULL) pthread_cond_wait(&f->dcv, &f->mu);
        if (f->stop) {
            pthread_mutex_unlock(&f->mu);
            return NULL;
        }
        struct drain_job *j = f->drains;
        f->drains = j->next;
        if (f->drains == NULL) f->drains_tail = &f->drains;
        pthread_mutex_unlock(&f->mu);
        drain_run(f, j);
        free(j);
    }
}

void drain_refuse_queued(struct failover *f)
{
    for (struct drain_job *j = f->drains, *nx; j; j = nx) {
        nx = j->next;
        answer_json(j->h, 503, json_pack("{s:s,s:s,s:s}", "error", "shutting down: drain not "
                                         "run; send it again", "field", "state", "rule", "open"));
        free(j);
    }
    f->drains = NULL;
    f->drains_tail = &f->drains;
}
