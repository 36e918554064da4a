/* lease.c — slot leases, control side (see lease.h): the table of last grants, the view of the
 * model renewals are judged by, the promotions in progress, and the /v1/leases route. Nothing
 * here takes c->lock: a renewal never waits for a change or a state save. */
#include "control/lease.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "control/control.h"
#include "control/leader.h"
#include "control/model.h"

#define LEASE_NODE_MAX 300 /* longest "host:port" taken */

struct lease_table {
    pthread_mutex_t mu;   /* every field below; never held while taking another lock */
    uint64_t lease_ms;
    uint64_t takeover_ms; /* 0: none */
    json_t *granted;      /* node -> last grant, monotonic ms (integer) */
    /* The view of the model installed last (lease_publish): its nodes and version. Replaced
     * whole, never changed in place; read only under mu. */
    json_t *listed;      /* node -> true, for every node of every pool */
    uint64_t version;
    json_t *promoting;   /* node -> count of promotions over it begun and not ended */
};

struct lease_table *lease_table_new(uint64_t lease_ms)
{
    struct lease_table *t = calloc(1, sizeof *t);
    if (t == NULL || (t->granted = json_object()) == NULL || (t->listed = json_object()) == NULL ||
        (t->promoting = json_object()) == NULL) {
        if (t) json_decref(t->granted), json_decref(t->listed);
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->lease_ms = lease_ms;
    return t;
}

void lease_table_free(struct lease_table **tp)
{
    struct lease_table *t = *tp;
    if (t == NULL) return;
    json_decref(t->granted);
    json_decref(t->listed);
    json_decref(t->promoting);
    pthread_mutex_destroy(&t->mu);
    free(t);
    *tp = NULL;
}

uint64_t lease_length_ms(const struct lease_table *t) { return t->lease_ms; }

uint64_t lease_margin_ms(uint64_t lease_ms) { return lease_ms / 20 + 100; }

int lease_grant(struct lease_table *t, const char *node, uint64_t now_ms)
{
    pthread_mutex_lock(&t->mu);
    int rc = json_object_set_new(t->granted, node, json_integer((json_int_t)now_ms));
    pthread_mutex_unlock(&t->mu);
    return rc < 0 ? -1 : 0;
}

void lease_takeover(struct lease_table *t, uint64_t now_ms)
{
    pthread_mutex_lock(&t->mu);
    t->takeover_ms = now_ms;
    pthread_mutex_unlock(&t->mu);
}

/* The time the node counts as last granted: its grant or the takeover, the later; 0: never.
 * Under t->mu. */
static uint64_t since_locked(struct lease_table *t, const char *node)
{
    json_t *g = json_object_get(t->granted, node);
    uint64_t at = g ? (uint64_t)json_integer_value(g) : 0;
    return at > t->takeover_ms ? at : t->takeover_ms;
}

static bool lapsed_locked(struct lease_table *t, const char *node, uint64_t now_ms)
{
    uint64_t at = since_locked(t, node);
    return at == 0 || now_ms >= at + t->lease_ms + lease_margin_ms(t->lease_ms);
}

bool lease_lapsed(struct lease_table *t, const char *node, uint64_t now_ms)
{
    pthread_mutex_lock(&t->mu);
    bool lapsed = lapsed_locked(t, node, now_ms);
    pthread_mutex_unlock(&t->mu);
    return lapsed;
}

int lease_publish(struct lease_table *t, const json_t *model)
{
    json_t *set = model_listed_only(model, NULL);
    if (set == NULL) return -1;
    pthread_mutex_lock(&t->mu);
    json_t *old = t->listed;
    t->listed = set;
    t->version = model_version(model);
    pthread_mutex_unlock(&t->mu);
    json_decref(old);
    return 0;
}

int lease_renew(struct lease_table *t, const char *node, uint64_t now_ms, uint64_t *version)
{
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (json_object_get(t->promoting, node))
        rc = LEASE_PROMOTING;
    else if (json_object_get(t->listed, node) == NULL)
        rc = LEASE_UNLISTED;
    else if (json_object_set_new(t->granted, node, json_integer((json_int_t)now_ms)) < 0)
        rc = -1;
    *version = t->version;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

bool lease_promote_begin(struct lease_table *t, const char *node, uint64_t now_ms)
{
    pthread_mutex_lock(&t->mu);
    bool ok = lapsed_locked(t, node, now_ms);
    if (ok) {
        json_int_t n = json_integer_value(json_object_get(t->promoting, node));
        ok = json_object_set_new(t->promoting, node, json_integer(n + 1)) == 0;
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void lease_promote_end(struct lease_table *t, const char *node)
{
    pthread_mutex_lock(&t->mu);
    json_int_t n = json_integer_value(json_object_get(t->promoting, node));
    if (n > 1) json_object_set_new(t->promoting, node, json_integer(n - 1));
    else json_object_del(t->promoting, node);
    pthread_mutex_unlock(&t->mu);
}

uint64_t lease_version(struct lease_table *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t v = t->version;
    pthread_mutex_unlock(&t->mu);
    return v;
}

json_t *lease_listed(struct lease_table *t)
{
    json_t *all = json_array();
    pthread_mutex_lock(&t->mu);
    const char *k;
    json_t *v;
    json_object_foreach(t->listed, k, v)
        if (all && json_array_append_new(all, json_string(k)) < 0) {
            json_decref(all);
            all = NULL;
        }
    pthread_mutex_unlock(&t->mu);
    return all;
}

int64_t lease_age_ms(struct lease_table *t, const char *node, uint64_t now_ms)
{
    pthread_mutex_lock(&t->mu);
    uint64_t at = since_locked(t, node);
    pthread_mutex_unlock(&t->mu);
    if (at == 0) return -1;
    return now_ms > at ? (int64_t)(now_ms - at) : 0;
}

static json_t *one_entry(struct lease_table *t, const char *node, uint64_t now_ms)
{
    int64_t age = lease_age_ms(t, node, now_ms);
    return json_pack("{s:o,s:b}", "age_ms", age < 0 ? json_null() : json_integer(age), "lapsed",
                     lease_lapsed(t, node, now_ms));
}

json_t *lease_list(struct lease_table *t, const json_t *nodes, uint64_t now_ms)
{
    json_t *out = json_object();
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        const char *name = json_string_value(n);
        if (out && name) json_object_set_new(out, name, one_entry(t, name, now_ms));
    }
    /* and nodes granted that no pool lists now (removed since) */
    pthread_mutex_lock(&t->mu);
    json_t *names = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(t->granted, k, v) json_array_append_new(names, json_string(k));
    pthread_mutex_unlock(&t->mu);
    json_array_foreach(names, i, n) {
        const char *name = json_string_value(n);
        if (out && name && json_object_get(out, name) == NULL)
            json_object_set_new(out, name, one_entry(t, name, now_ms));
    }
    json_decref(names);
    return out;
}

void lease_metrics(struct lease_table *t, struct buf *out, uint64_t now_ms)
{
    buf_printf(out, "# HELP shoal_control_lease_age_seconds per node: seconds since its last "
                    "lease renewal (counted from this process's takeover if later)\n"
                    "# TYPE shoal_control_lease_age_seconds gauge\n");
    pthread_mutex_lock(&t->mu);
    const char *k;
    json_t *v;
    json_object_foreach(t->granted, k, v) {
        uint64_t at = since_locked(t, k);
        buf_printf(out, "shoal_control_lease_age_seconds{node=\"%s\"} %.3f\n", k,
                   now_ms > at ? (double)(now_ms - at) / 1000.0 : 0.0);
    }
    pthread_mutex_unlock(&t->mu);
}

/* ---- the /v1/leases route ----------------------------------------------------------------- */

static int fail(struct buf *out, int status, const char *field, const char *rule,
                const char *msg, const char *leader)
{
    json_t *o = json_pack("{s:s,s:s,s:s}", "error", msg, "field", field, "rule", rule);
    if (o && leader) json_object_set_new(o, "leader", json_string(leader));
    char *s = o ? json_dumps(o, JSON_SORT_KEYS) : NULL;
    buf_append_str(out, s ? s : "{\"error\": \"out of memory\"}");
    buf_append_str(out, "\n");
    free(s);
    json_decref(o);
    return status;
}

/* The renewal's node, or NULL with the 400 written. */
static const char *parse_renewal(json_t *o, struct buf *out, int *st)
{
    if (!json_is_object(o)) {
        *st = fail(out, 400, "body", "object", "the body must be {\"node\": \"host:port\"}", NULL);
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (strcmp(k, "node")) {
            char msg[200];
            snprintf(msg, sizeof msg, "unknown field %.64s: a renewal is {\"node\": \"host:port\"}",
                     k);
            *st = fail(out, 400, k, "unknown_field", msg, NULL);
            return NULL;
        }
    }
    const char *node = json_string_value(json_object_get(o, "node"));
    if (node == NULL || !*node || strlen(node) > LEASE_NODE_MAX || !strchr(node, ':') ||
        strpbrk(node, " \t\r\n\"\\")) {
        *st = fail(out, 400, "node", "host_port",
                   "node must be the host:port the node is listed by in its pool", NULL);
        return NULL;
    }
    return node;
}

/* POST: grant, on the leader only. */
static int renew(struct control *c, const char *body, size_t len, struct buf *out)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (o == NULL) {
        char msg[300];
        snprintf(msg, sizeof msg, "the body is not valid JSON: %s", je.text);
        return fail(out, 400, "body", "json", msg, NULL);
    }
    int st = 0;
    const char *node = parse_renewal(o, out, &st);
    if (node == NULL) {
        json_decref(o);
        return st;
    }
    /* as a change does (api.c write_enter): counted in `writers`, so ha outlives this call;
     * under c->gate, which nothing holds for longer than a count */
    pthread_mutex_lock(&c->gate);
    bool closing = c->closing;
    if (!closing) c->writers++;
    pthread_mutex_unlock(&c->gate);
    if (closing) {
        json_decref(o);
        return fail(out, 503, "state", "open", "shutting down: renew with another shoal-control",
                    NULL);
    }
    if (c->ha && !ha_is_leader(c->ha)) {
        char url[512] = "";
        bool known = ha_leader(c->ha, url, sizeof url, 0) >= 0;
        st = fail(out, 503, "leader", "leader",
                  "only the leader grants leases: renew with it (the node's next --control URL)",
                  known ? url : NULL);
    } else {
        /* The grant and the version it names are taken in one hold of the lease table's lock,
         * from the view the last installed model published (lease_publish), never c->lock:
         * a change or a state save in progress does not hold this answer up. Why a promotion
         * stays safe: see lease_promote_begin in lease.h. */
        uint64_t version = 0;
        int rc = lease_renew(c->leases, node, clock_mono_ms(), &version);
        if (rc == LEASE_UNLISTED) {
            char msg[400];
            snprintf(msg, sizeof msg, "no pool lists node %s", node);
            st = fail(out, 404, "node", "exists", msg, NULL);
        } else if (rc == LEASE_PROMOTING) {
            CTL_INC(c, lease_refusals);
            char msg[400];
            snprintf(msg, sizeof msg, "node %s's lease lapsed and its slots are being promoted to "
                     "their replicas: not renewed until that version is published", node);
            st = fail(out, 409, "node", "promoting", msg, NULL);
        } else if (rc < 0) {
            st = fail(out, 507, "body", "memory", "out of memory", NULL);
        } else {
            CTL_INC(c, lease_grants);
            json_t *r = json_pack("{s:s,s:I,s:I}", "node", node, "lease_ms",
                                  (json_int_t)lease_length_ms(c->leases), "version",
                                  (json_int_t)version);
            char *s = r ? json_dumps(r, JSON_SORT_KEYS) : NULL;
            json_decref(r);
            if (s) {
                buf_append_str(out, s);
                buf_append_str(out, "\n");
                free(s);
                st = 200;
            } else {
                st = fail(out, 507, "body", "memory", "out of memory", NULL);
            }
        }
    }
    pthread_mutex_lock(&c->gate);
    if (--c->writers == 0 && c->closing) pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->gate);
    json_decref(o);
    return st;
}

int lease_route(void *ctx, const char *method, const char *rest, const char *body, size_t len,
                struct buf *out)
{
    struct control *c = ctx;
    if (*rest && strcmp(rest, "/"))
        return fail(out, 404, "path", "path", "no such resource: /v1/leases", NULL);
    if (!strcmp(method, "POST")) return renew(c, body, len, out);
    if (strcmp(method, "GET"))
        return fail(out, 405, "method", "method",
                    "POST /v1/leases renews a node's lease, GET lists them", NULL);
    uint64_t now = clock_mono_ms();
    json_t *nodes = lease_listed(c->leases);
    if (nodes == NULL) return fail(out, 507, "body", "memory", "out of memory", NULL);
    uint64_t L = lease_length_ms(c->leases);
    json_t *o = json_pack("{s:I,s:I,s:b,s:o}", "lease_ms", (json_int_t)L, "margin_ms",
                          (json_int_t)lease_margin_ms(L), "leader",
                          __atomic_load_n(&c->m.leader, __ATOMIC_RELAXED) != 0, "nodes",
                          lease_list(c->leases, nodes, now));
    json_decref(nodes);
    char *s = o ? json_dumps(o, JSON_SORT_KEYS) : NULL;
    json_decref(o);
    if (s == NULL) return fail(out, 507, "body", "memory", "out of memory", NULL);
    buf_append_str(out, s);
    buf_append_str(out, "\n");
    free(s);
    return 200;
}
