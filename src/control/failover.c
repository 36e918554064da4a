/* failover.c — failure reports, probes, the suspect/dead rule, promotion and returns (see
 * failover.h); the failover object and both threads' lives (drains run on their own thread:
 * drain.c). Lock order: c->lock before f->mu (api.c reads node states under c->lock);
 * the failover thread never takes c->lock while it holds f->mu, and calls the lease hook with
 * neither held (but for the promotion's own check, under c->lock: the lease table's lock is
 * always the innermost). */
#include "control/failover_int.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/httpc.h"
#include "common/log.h"
#include "common/slot.h"
#include "control/control.h"
#include "control/leader.h"
#include "control/model.h"

#define FO_ROUTERS_MAX 1024
#define FO_ROUTER_ID_MAX 200
#define FO_PROBE_TIMEOUT_MS 200
#define FO_ADMIN_TIMEOUT_MS 500

struct fo_node {
    char addr[MODEL_ADDR_MAX + 1], admin[MODEL_ADDR_MAX + 1], pool[MODEL_NAME_MAX + 1];
    bool watched;  /* in a pool with a copies-2 namespace at the last round */
    bool probed, probe_ok;
    bool suspect, dead, promoted;
    uint64_t suspect_since, dead_since;
    unsigned down, listed; /* fresh reports: saying down / listing it */
};

struct fo_router {
    char id[FO_ROUTER_ID_MAX + 1];
    uint64_t at;   /* monotonic ms of the last report */
    json_t *nodes; /* {"host:port": "up"|"down"} */
};

/* ---- node table (under mu) ----------------------------------------------------------------- */

static struct fo_node *node_find(struct failover *f, const char *pool, const char *addr)
{
    for (size_t i = 0; i < f->nn; i++)
        if (!strcmp(f->nodes[i].addr, addr) && (pool == NULL || !strcmp(f->nodes[i].pool, pool)))
            return &f->nodes[i];
    return NULL;
}

static struct fo_node *node_add(struct failover *f, const char *pool, const char *addr)
{
    if (f->nn == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 64;
        struct fo_node *n = realloc(f->nodes, cap * sizeof *n);
        if (n == NULL) return NULL;
        f->nodes = n;
        f->cap = cap;
    }
    struct fo_node *n = &f->nodes[f->nn++];
    memset(n, 0, sizeof *n);
    snprintf(n->addr, sizeof n->addr, "%s", addr);
    snprintf(n->pool, sizeof n->pool, "%s", pool);
    n->probe_ok = true; /* not suspect before a probe says otherwise */
    return n;
}

static const char *node_state(const struct fo_node *n)
{
    return n->dead ? "dead" : n->suspect ? "suspect" : "up";
}

/* ---- reports ------------------------------------------------------------------------------- */

int failover_report(struct failover *f, json_t *body, struct model_err *e)
{
    if (!json_is_object(body))
        return model_fail(e, 400, "body", "object",
                          "the body must be {\"router\": ID, \"nodes\": {\"host:port\": \"up\"|\"down\"}}");
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
        if (strcmp(k, "router") && strcmp(k, "nodes"))
            return model_fail(e, 400, k, "unknown_field",
                              "unknown field '%s'; a report is {\"router\", \"nodes\"}", k);
    const char *id = json_string_value(json_object_get(body, "router"));
    if (id == NULL || *id == 0 || strlen(id) > FO_ROUTER_ID_MAX)
        return model_fail(e, 400, "router", "required",
                          "router is required: the router's follower id, 1 to %d bytes",
                          FO_ROUTER_ID_MAX);
    json_t *nodes = json_object_get(body, "nodes");
    if (!json_is_object(nodes))
        return model_fail(e, 400, "nodes", "object",
                          "nodes must be an object {\"host:port\": \"up\"|\"down\"}");
    json_object_foreach(nodes, k, v) {
        const char *s = json_string_value(v);
        if (strlen(k) > MODEL_ADDR_MAX || s == NULL || (strcmp(s, "up") && strcmp(s, "down")))
            return model_fail(e, 400, "nodes", "up_or_down",
                              "nodes.%.200s must be \"up\" or \"down\"", k);
    }
    /* only entries of listed nodes (all that is counted): made-up names held gigabytes */
    pthread_mutex_lock(&f->c->lock);
    json_t *kept = model_listed_only(f->c->model, nodes);
    pthread_mutex_unlock(&f->c->lock);
    if (kept == NULL) return model_fail(e, 507, "body", "memory", "out of memory");
    uint64_t now = clock_mono_ms();
    pthread_mutex_lock(&f->mu);
    struct fo_router *r = NULL;
    for (size_t i = 0; i < f->nr && r == NULL; i++)
        if (!strcmp(f->routers[i].id, id)) r = &f->routers[i];
    if (r == NULL) { /* a new router, in the slot of a long-stale one when full */
        for (size_t i = 0; i < f->nr && r == NULL; i++)
            if (now - f->routers[i].at > 10 * f->c->cfg.report_stale_ms) r = &f->routers[i];
        if (r == NULL && f->nr < FO_ROUTERS_MAX) r = &f->routers[f->nr++];
        if (r == NULL) {
            pthread_mutex_unlock(&f->mu);
            json_decref(kept);
            return model_fail(e, 503, "router", "limit", "%d routers report already",
                              FO_ROUTERS_MAX);
        }
        json_decref(r->nodes);
        memset(r, 0, sizeof *r);
        snprintf(r->id, sizeof r->id, "%s", id);
    }
    json_decref(r->nodes);
    r->nodes = kept;
    r->at = now;
    pthread_mutex_unlock(&f->mu);
    CTL_INC(f->c, reports);
    return 0;
}

/* Count every node's fresh reports (under mu). */
static void count_reports(struct failover *f, uint64_t now)
{
    for (size_t i = 0; i < f->nn; i++) f->nodes[i].down = f->nodes[i].listed = 0;
    for (size_t j = 0; j < f->nr; j++) {
        struct fo_router *r = &f->routers[j];
        if (r->nodes == NULL || now - r->at >= f->c->cfg.report_stale_ms) continue;
        for (size_t i = 0; i < f->nn; i++) {
            const char *s = json_string_value(json_object_get(r->nodes, f->nodes[i].addr));
            if (s == NULL) continue;
            f->nodes[i].listed++;
            if (!strcmp(s, "down")) f->nodes[i].down++;
        }
    }
}

/* ---- reads for the API (under c->lock) ------------------------------------------------------ */

bool failover_live(void *fv, const char *node)
{
    struct failover *f = fv;
    pthread_mutex_lock(&f->mu);
    bool live = true;
    for (size_t i = 0; i < f->nn && live; i++)
        if (f->nodes[i].dead && !strcmp(f->nodes[i].addr, node)) live = false;
    pthread_mutex_unlock(&f->mu);
    return live;
}

json_t *failover_status(struct failover *f)
{
    json_t *nodes = json_object(), *routers = json_object();
    uint64_t now = clock_mono_ms();
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nn; i++) {
        struct fo_node *n = &f->nodes[i];
        char dr[32];
        snprintf(dr, sizeof dr, "%u/%u", n->down, n->listed);
        json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:b}", "pool", n->pool, "state", node_state(n),
                              "down_reports", dr, "probe",
                              !n->watched || !n->probed ? "off" : n->probe_ok ? "ok" : "failing",
                              "promoted", n->dead && n->promoted);
        if (o && n->suspect) json_object_set_new(o, "suspect_ms", json_integer((json_int_t)(now - n->suspect_since)));
        if (o && n->dead) json_object_set_new(o, "dead_ms", json_integer((json_int_t)(now - n->dead_since)));
        char key[MODEL_ADDR_MAX + MODEL_NAME_MAX + 2];
        /* a node in two pools shows once per pool */
        snprintf(key, sizeof key, "%s%s%s", n->addr, node_find(f, NULL, n->addr) == n ? "" : "@",
                 node_find(f, NULL, n->addr) == n ? "" : n->pool);
        json_object_set_new(nodes, key, o);
    }
    for (size_t j = 0; j < f->nr; j++)
        json_object_set_new(routers, f->routers[j].id,
                            json_pack("{s:I,s:b}", "age_ms", (json_int_t)(now - f->routers[j].at),
                                      "fresh", now - f->routers[j].at < f->c->cfg.report_stale_ms));
    pthread_mutex_unlock(&f->mu);
    return json_pack("{s:o,s:o,s:I,s:I,s:I}", "nodes", nodes, "routers", routers,
                     "failure_timeout_ms", (json_int_t)f->c->cfg.failure_timeout_ms,
                     "report_stale_ms", (json_int_t)f->c->cfg.report_stale_ms, "probe_ms",
                     (json_int_t)f->c->cfg.probe_ms);
}

/* ---- probes -------------------------------------------------------------------------------- */

struct target {
    char pool[MODEL_NAME_MAX + 1], addr[MODEL_ADDR_MAX + 1], admin[MODEL_ADDR_MAX + 1];
    int fd;
    int phase; /* 0 connecting, 1 reading, 2 done */
    bool ok;
    char buf[64];
    size_t got;
};

/* Start a non-blocking connect to "host:port"; -1 when it cannot even start. */
static int probe_connect(const char *addr)
{
    char host[MODEL_ADDR_MAX + 1];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL) return -1;
    size_t hl = (size_t)(colon - addr);
    if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') {
        memcpy(host, addr + 1, hl - 2);
        host[hl - 2] = 0;
    } else {
        memcpy(host, addr, hl);
        host[hl] = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0) return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) < 0 && errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Probe every target at once: connect, "version\r\n", a "VERSION " line, within timeout_ms. */
static void probe_all(struct target *t, size_t n, unsigned timeout_ms)
{
    struct pollfd *pf = calloc(n ? n : 1, sizeof *pf);
    if (pf == NULL) return; /* nothing known this round: states stay */
    for (size_t i = 0; i < n; i++) {
        t[i].fd = probe_connect(t[i].addr);
        t[i].phase = t[i].fd < 0 ? 2 : 0;
        t[i].ok = false;
        t[i].got = 0;
    }
    uint64_t end = clock_mono_ms() + timeout_ms;
    for (;;) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            pf[i].fd = t[i].phase == 2 ? -1 : t[i].fd;
            pf[i].events = t[i].phase == 0 ? POLLOUT : POLLIN;
            pf[i].revents = 0;
            k += t[i].phase != 2;
        }
        uint64_t now = clock_mono_ms();
        if (k == 0 || now >= end) break;
        if (poll(pf, n, (int)(end - now)) < 0 && errno != EINTR) break;
        for (size_t i = 0; i < n; i++) {
            if (t[i].phase == 2 || pf[i].revents == 0) continue;
            if (t[i].phase == 0) {
                int err = 0;
                socklen_t el = sizeof err;
                if (getsockopt(t[i].fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err != 0 ||
                    send(t[i].fd, "version\r\n", 9, MSG_NOSIGNAL) != 9) {
                    t[i].phase = 2;
                    continue;
                }
                t[i].phase = 1;
                continue;
            }
            ssize_t r = recv(t[i].fd, t[i].buf + t[i].got, sizeof t[i].buf - 1 - t[i].got, 0);
            if (r <= 0) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                t[i].phase = 2;
                continue;
            }
            t[i].got += (size_t)r;
            t[i].buf[t[i].got] = 0;
            if (strstr(t[i].buf, "\r\n") || t[i].got == sizeof t[i].buf - 1) {
                t[i].ok = !strncmp(t[i].buf, "VERSION ", 8);
                t[i].phase = 2;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (t[i].fd >= 0) close(t[i].fd);
    free(pf);
}

/* The nodes of every pool with a copies-2 namespace, from the model (takes c->lock). */
static struct target *targets(struct control *c, size_t *n)
{
    *n = 0;
    size_t cap = 0;
    struct target *t = NULL;
    pthread_mutex_lock(&c->lock);
    const char *k;
    json_t *p;
    json_object_foreach(json_object_get(c->model, "pools"), k, p) {
        if (!model_pool_replicated(c->model, k)) continue;
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(p, "nodes"), i, v) {
            if (*n == cap) {
                cap = cap ? cap * 2 : 16;
                struct target *nt = realloc(t, cap * sizeof *t);
                if (nt == NULL) goto out;
                t = nt;
            }
            struct target *x = &t[(*n)++];
            memset(x, 0, sizeof *x);
            snprintf(x->pool, sizeof x->pool, "%s", k);
            snprintf(x->addr, sizeof x->addr, "%s", json_string_value(json_object_get(v, "node")));
            snprintf(x->admin, sizeof x->admin, "%s",
                     json_string_value(json_object_get(v, "admin")) ?: "");
        }
    }
out:
    pthread_mutex_unlock(&c->lock);
    return t;
}

/* ---- the rule ------------------------------------------------------------------------------ */

struct action {
    char pool[MODEL_NAME_MAX + 1], addr[MODEL_ADDR_MAX + 1];
    uint64_t suspect_since;
    bool back; /* a dead node came back (else: a dead node to promote) */
};

/* Update every node's state from this round's probes and the reports (under mu); the actions
 * it calls for into `act` (room for f->nn). */
static size_t evaluate(struct failover *f, const struct target *t, size_t nt, uint64_t now,
                       struct action *act)
{
    struct control *c = f->c;
    for (size_t i = 0; i < f->nn; i++) f->nodes[i].watched = false;
    for (size_t i = 0; i < nt; i++) {
        struct fo_node *n = node_find(f, t[i].pool, t[i].addr);
        if (n == NULL && (n = node_add(f, t[i].pool, t[i].addr)) == NULL) continue;
        n->watched = true;
        n->probed = true;
        if (!t[i].ok && n->probe_ok) log_notice("probe of %s (pool %s) fails", n->addr, n->pool);
        if (t[i].ok && !n->probe_ok) log_notice("probe of %s (pool %s) passes again", n->addr, n->pool);
        n->probe_ok = t[i].ok;
        if (!t[i].ok) CTL_INC(c, probe_failures);
        snprintf(n->admin, sizeof n->admin, "%s", t[i].admin);
    }
    /* nodes no longer watched (pool lost its copies-2 namespaces, node removed) are forgotten */
    for (size_t i = 0; i < f->nn;) {
        if (f->nodes[i].watched) {
            i++;
            continue;
        }
        f->nodes[i] = f->nodes[--f->nn];
    }
    count_reports(f, now);
    size_t na = 0;
    uint64_t suspects = 0, deads = 0;
    for (size_t i = 0; i < f->nn; i++) {
        struct fo_node *n = &f->nodes[i];
        bool quorum = failover_quorum_down(n->down, n->listed);
        if (n->dead) {
            if (n->probe_ok && !quorum) { /* back: probes pass and no majority says down */
                log_notice("node %s (pool %s) is back: probes pass, %u/%u routers say down",
                           n->addr, n->pool, n->down, n->listed);
                n->dead = n->suspect = false;
                struct action *a = &act[na++];
                snprintf(a->pool, sizeof a->pool, "%s", n->pool);
                snprintf(a->addr, sizeof a->addr, "%s", n->addr);
                a->back = true;
            } else if (!n->promoted) {
                struct action *a = &act[na++];
                snprintf(a->pool, sizeof a->pool, "%s", n->pool);
                snprintf(a->addr, sizeof a->addr, "%s", n->addr);
                a->suspect_since = n->suspect_since;
                a->back = false;
            }
        } else if (quorum && !n->probe_ok) {
            if (!n->suspect) {
                n->suspect = true;
                n->suspect_since = now;
                log_notice("node %s (pool %s) is suspect: %u/%u routers say down, probes fail",
                           n->addr, n->pool, n->down, n->listed);
            }
            if (now - n->suspect_since >= c->cfg.failure_timeout_ms) {
                n->dead = true;
                n->promoted = false;
                n->dead_since = now;
                log_notice("node %s (pool %s) is dead: suspect for %llu ms", n->addr, n->pool,
                           (unsigned long long)(now - n->suspect_since));
                struct action *a = &act[na++];
                snprintf(a->pool, sizeof a->pool, "%s", n->pool);
                snprintf(a->addr, sizeof a->addr, "%s", n->addr);
                a->suspect_since = n->suspect_since;
                a->back = false;
            }
        } else if (n->suspect) {
            log_notice("node %s (pool %s) is no longer suspect after %llu ms (%u/%u routers say "
                       "down, probe %s)", n->addr, n->pool,
                       (unsigned long long)(now - n->suspect_since), n->down, n->listed,
                       n->probe_ok ? "passes" : "fails");
            n->suspect = false;
        }
        suspects += n->suspect && !n->dead;
        deads += n->dead;
    }
    CTL_SET(c, nodes_suspect, suspects);
    CTL_SET(c, nodes_dead, deads);
    return na;
}

/* ---- promotion ----------------------------------------------------------------------------- */

struct promote_arg {
    struct failover *f;
    const char *pool, *dead;
    uint32_t promoted;
    bool begun; /* lease.begin said yes: lease.end is owed */
};

static int promote_fn(json_t *m, void *arg, struct model_err *e)
{
    struct promote_arg *a = arg;
    /* checked again here, at the commit, under the lease table's lock where leases are granted
     * too: a renewal that came in since the first check keeps the node primary; from here until
     * promote() ends it, the node's renewals are refused, so none can name a version older
     * than this promotion's (the argument: lease.h) */
    if (a->f->lease.begin && !a->begun) {
        if (!a->f->lease.begin(a->f->lease.ctx, a->dead, clock_mono_ms()))
            return model_fail(e, 409, "lease", "lease",
                              "the node renewed its slot lease since it was declared dead");
        a->begun = true;
    }
    return model_promote(m, a->pool, a->dead, failover_live, a->f, &a->promoted, e);
}

static int noop_fn(json_t *m, void *arg, struct model_err *e)
{
    (void)m, (void)arg, (void)e;
    return 0; /* the pool is recomputed by model_replicas_sync (it is the touched one) */
}

/* `applied` of `dead`'s stream on the replica whose admin address is `admin`: -1 when it did
 * not answer or lists no such primary. */
static long long replica_applied(struct failover *f, const char *admin, const char *dead)
{
    if (*admin == 0) return -1;
    char url[MODEL_ADDR_MAX + 40], err[256];
    snprintf(url, sizeof url, "http://%s/v1/replication", admin);
    struct httpc_reply r;
    httpc_reply_init(&r);
    long long applied = -1;
    if (httpc_get(f->http, url, FO_ADMIN_TIMEOUT_MS, &r, err, sizeof err) == 0 && r.status == 200) {
        json_t *o = json_loadb(buf_start(&r.body), buf_used(&r.body), 0, NULL);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(o, "primaries"), i, p)
            if (!strcmp(json_string_value(json_object_get(p, "node")) ?: "", dead) &&
                json_is_integer(json_object_get(p, "applied")))
                applied = json_integer_value(json_object_get(p, "applied"));
        json_decref(o);
    }
    httpc_reply_release(&r);
    return applied;
}

/* Promote dead node `a->addr`'s ranges in pool `a->pool`; true when done (or nothing to do). */
static bool promote(struct failover *f, const struct action *a)
{
    struct control *c = f->c;
    /* the replicas to promote to: with copies 2 each range lists one, so the choice by
     * `applied` is among one; asked anyway, logged, and a replica that does not answer is
     * promoted all the same (it is the only copy there is) */
    json_t *cands = json_object();
    pthread_mutex_lock(&c->lock);
    json_t *p = json_object_get(json_object_get(c->model, "pools"), a->pool);
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(p, "slots"), i, r) {
        const char *rep = json_string_value(json_object_get(r, "replica"));
        if (rep && !strcmp(json_string_value(json_object_get(r, "node")) ?: "", a->addr)) {
            json_t *nodes = json_object_get(p, "nodes");
            int ni = model_node_index(nodes, rep);
            const char *admin = ni < 0 ? NULL
                : json_string_value(json_object_get(json_array_get(nodes, (size_t)ni), "admin"));
            json_object_set_new(cands, rep, json_string(admin ? admin : ""));
        }
    }
    pthread_mutex_unlock(&c->lock);
    char to[1024] = "";
    const char *k;
    json_t *v;
    json_object_foreach(cands, k, v) {
        long long ap = replica_applied(f, json_string_value(v), a->addr);
        if (ap < 0)
            log_notice("promotion of %s: replica %s did not say what it applied (no admin "
                       "answer): promoted anyway, it is the slots' only copy", a->addr, k);
        else
            log_notice("promotion of %s: replica %s applied %lld bytes of its stream", a->addr,
                       k, ap);
        size_t l = strlen(to);
        snprintf(to + l, sizeof to - l, "%s%s", l ? "," : "", k);
    }
    json_decref(cands);
    struct promote_arg pa = {f, a->pool, a->addr, 0, false};
    struct model_err e;
    uint64_t version = 0;
    char what[MODEL_ADDR_MAX + 100];
    snprintf(what, sizeof what, "promotion of dead node %s in pool", a->addr);
    int st = control_change(c, a->pool, what, promote_fn, &pa, &e, &version);
    /* installed and published (renewals now name its version), or nothing changed */
    if (pa.begun) f->lease.end(f->lease.ctx, a->addr);
    if (st != 0 && st != 304) {
        log_error("promotion of %s in pool %s not published (retried): %s", a->addr, a->pool,
                  e.msg);
        return false;
    }
    uint64_t ms = clock_mono_ms() - a->suspect_since;
    if (pa.promoted > 0) {
        log_notice("promoted %u slots of %s to %s in %llu ms (version %llu)", pa.promoted,
                   a->addr, to, (unsigned long long)ms, (unsigned long long)version);
        CTL_INC(c, promotions);
        CTL_SET(c, promotion_ms, ms);
    } else {
        log_notice("dead node %s of pool %s owned no slot with a replica: nothing promoted "
                   "(its ranges without one are the gutter's)", a->addr, a->pool);
    }
    return true;
}

static void back(struct failover *f, const struct action *a)
{
    struct model_err e;
    uint64_t version = 0;
    char what[MODEL_ADDR_MAX + 100];
    snprintf(what, sizeof what, "node %s back, replicas recomputed in pool", a->addr);
    int st = control_change(f->c, a->pool, what, noop_fn, NULL, &e, &version);
    CTL_INC(f->c, returns);
    if (st != 0 && st != 304) log_error("node %s back, but replicas not recomputed: %s", a->addr, e.msg);
}

/* ---- the thread ---------------------------------------------------------------------------- */

static void *fo_main(void *arg)
{
    struct failover *f = arg;
    struct control *c = f->c;
    uint64_t next = clock_mono_ms();
    for (;;) {
        pthread_mutex_lock(&f->mu);
        while (!f->stop && clock_mono_ms() < next) {
            struct timespec ts = clock_deadline(next - clock_mono_ms());
            pthread_cond_timedwait(&f->cv, &f->mu, &ts);
        }
        if (f->stop) {
            pthread_mutex_unlock(&f->mu);
            break;
        }
        pthread_mutex_unlock(&f->mu);
        next = clock_mono_ms() + c->cfg.probe_ms;
        if (c->ha && !ha_is_leader(c->ha)) { /* the leader decides; this one forgets what it
                                              * saw, so a later term starts from fresh reports */
            pthread_mutex_lock(&f->mu);
            f->nn = 0;
            for (size_t i = 0; i < f->nr; i++) json_decref(f->routers[i].nodes);
            memset(f->routers, 0, f->nr * sizeof *f->routers);
            f->nr = 0;
            pthread_mutex_unlock(&f->mu);
            CTL_SET(c, nodes_suspect, 0);
            CTL_SET(c, nodes_dead, 0);
            continue;
        }
        size_t nt = 0;
        struct target *t = targets(c, &nt);
        unsigned tmo = c->cfg.probe_ms < FO_PROBE_TIMEOUT_MS ? (unsigned)c->cfg.probe_ms
                                                             : FO_PROBE_TIMEOUT_MS;
        probe_all(t, nt, tmo);
        uint64_t now = clock_mono_ms();
        pthread_mutex_lock(&f->mu);
        struct action *act = calloc(f->nn + nt + 1, sizeof *act);
        size_t na = act ? evaluate(f, t, nt, now, act) : 0;
        pthread_mutex_unlock(&f->mu);
        free(t);
        for (size_t i = 0; i < na; i++) {
            if (act[i].back) {
                back(f, &act[i]);
                continue;
            }
            /* the lease hook with no lock held (the lease table has its own) */
            if (f->lease.lapsed && !f->lease.lapsed(f->lease.ctx, act[i].addr, clock_mono_ms()))
                continue;
            if (!promote(f, &act[i])) continue;
            pthread_mutex_lock(&f->mu);
            struct fo_node *n = node_find(f, act[i].pool, act[i].addr);
            if (n && n->dead) n->promoted = true;
            pthread_mutex_unlock(&f->mu);
        }
        free(act);
    }
    return NULL;
}

struct failover *failover_create(struct control *c, char *err, size_t errlen)
{
    struct failover *f = calloc(1, sizeof *f);
    if (f == NULL || (f->routers = calloc(FO_ROUTERS_MAX, sizeof *f->routers)) == NULL ||
        (f->http = httpc_create(1 << 20)) == NULL || (f->dhttp = httpc_create(1 << 20)) == NULL ||
        (c->auth_header && (httpc_add_header(f->http, c->auth_header) < 0 ||
                            httpc_add_header(f->dhttp, c->auth_header) < 0))) {
        if (f) httpc_destroy(&f->http);
        if (f) httpc_destroy(&f->dhttp);
        if (f) free(f->routers);
        free(f);
        snprintf(err, errlen, "failover: out of memory (or libcurl missing)");
        return NULL;
    }
    httpc_set_connect_timeout(f->http, FO_ADMIN_TIMEOUT_MS);
    httpc_set_connect_timeout(f->dhttp, FO_ADMIN_TIMEOUT_MS);
    f->c = c;
    pthread_mutex_init(&f->mu, NULL);
    clock_cond_init_monotonic(&f->cv);
    pthread_cond_init(&f->dcv, NULL);
    f->drains_tail = &f->drains;
    return f;
}

void failover_set_lease(struct failover *f, const struct failover_lease_hooks *hooks)
{
    f->lease = *hooks;
}

int failover_start(struct failover *f, char *err, size_t errlen)
{
    if (pthread_create(&f->th, NULL, fo_main, f) != 0) {
        snprintf(err, errlen, "failover: cannot start its thread");
        return -1;
    }
    if (pthread_create(&f->dth, NULL, drain_main, f) != 0) {
        pthread_mutex_lock(&f->mu);
        f->stop = true;
        pthread_cond_signal(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->th, NULL);
        snprintf(err, errlen, "failover: cannot start its drain thread");
        return -1;
    }
    f->started = true;
    return 0;
}

void failover_destroy(struct failover **fp)
{
    struct failover *f = *fp;
    if (f == NULL) return;
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_signal(&f->cv);
    pthread_cond_signal(&f->dcv);
    pthread_mutex_unlock(&f->mu);
    if (f->started) {
        pthread_join(f->th, NULL);
        pthread_join(f->dth, NULL);
    }
    drain_refuse_queued(f);
    for (size_t i = 0; i < f->nr; i++) json_decref(f->routers[i].nodes);
    free(f->routers);
    free(f->nodes);
    httpc_destroy(&f->http);
    httpc_destroy(&f->dhttp);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    pthread_cond_destroy(&f->dcv);
    free(f);
    *fp = NULL;
}
