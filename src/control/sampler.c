/* sampler.c — the dashboard's sampler (see sampler.h).
 *
 * One thread paces the samples: it takes the nodes from the model, hands them to the workers,
 * waits until every one is read (each read ends within --stats-timeout-ms), then writes one
 * column of every namespace's ring. Rates come from each node's own counters: the difference
 * from that node's previous good read over the time between the two, so a node that was down
 * or slow for a while, or that restarted (counters going back), skews nothing. */
#include "control/sampler.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/httpc.h"
#include "common/log.h"
#include "common/nodefigs.h"
#include "control/control.h"
#include "control/model.h"

#define METRICS_BODY_MAX (4u << 20) /* a node's /metrics: 256 namespaces fit many times */

/* A namespace's counters on one node at its last good read. */
struct prev_ns {
    char name[NODEFIGS_NAME_MAX];
    double hits, misses, ops;
};

struct snode {
    char node[MODEL_ADDR_MAX + 1], admin[MODEL_ADDR_MAX + 1];
    int health; /* 1 answered, -1 did not, 0 not read yet */
    char error[200]; /* as long as a worker's message */
    double items, bytes, limit, version;
    uint64_t checked_ms; /* wall clock of the last read */
    struct prev_ns *prev;
    int nprev;
    double prev_t; /* monotonic seconds of the last good read */
};

struct series {
    char name[NODEFIGS_NAME_MAX];
    float *ops, *ratio, *mem; /* ring columns; NaN: no figure in that sample */
    uint64_t last_seq;        /* the last sample with a figure */
    double quota, items;      /* from the last sample with a figure */
    /* sums over the nodes read in the sample under way */
    double t_ops, t_hits, t_gets, t_mem, t_quota, t_items;
    int t_seen, t_rated;
};

struct sampler {
    struct control *c;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work handed out, work done, stop */
    pthread_t pacer;
    pthread_t *workers;
    struct httpc **clients;
    unsigned nworkers, started;
    int stop;
    struct snode *nodes; /* reallocated only between samples, when no worker holds one */
    size_t nnodes, next, done;
    struct series **ser;
    size_t nser, maxser;
    json_t *index; /* namespace name -> position in ser */
    uint64_t *times; /* wall-clock ms of sample k at [k % cap] */
    size_t cap;
    uint64_t seq; /* the latest sample; 0: none yet */
    unsigned timeout_ms;
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void series_free(struct series *se)
{
    if (se == NULL) return;
    free(se->ops);
    free(se->ratio);
    free(se->mem);
    free(se);
}

/* The series of `name`, made when new; NULL when --stats-namespaces are tracked (counted) or
 * memory ran out. Caller holds s->mu. */
static struct series *series_get(struct sampler *s, const char *name)
{
    json_t *i = json_object_get(s->index, name);
    if (i) return s->ser[json_integer_value(i)];
    if (s->nser == s->maxser) {
        CTL_INC(s->c, stats_namespaces_dropped);
        return NULL;
    }
    struct series *se = calloc(1, sizeof *se);
    if (se == NULL || (se->ops = malloc(s->cap * sizeof(float))) == NULL ||
        (se->ratio = malloc(s->cap * sizeof(float))) == NULL ||
        (se->mem = malloc(s->cap * sizeof(float))) == NULL ||
        json_object_set_new(s->index, name, json_integer((json_int_t)s->nser)) < 0) {
        series_free(se);
        return NULL;
    }
    snprintf(se->name, sizeof se->name, "%s", name);
    for (size_t k = 0; k < s->cap; k++) se->ops[k] = se->ratio[k] = se->mem[k] = NAN;
    se->last_seq = s->seq;
    s->ser[s->nser++] = se;
    return se;
}

/* Forget series i (the last takes its place). Caller holds s->mu. */
static void series_drop(struct sampler *s, size_t i)
{
    json_object_del(s->index, s->ser[i]->name);
    series_free(s->ser[i]);
    if (i != --s->nser) {
        s->ser[i] = s->ser[s->nser];
        json_object_set_new(s->index, s->ser[i]->name, json_integer((json_int_t)i));
    }
}

/* Fold one node's read into the sample under way. Caller holds s->mu. */
static void absorb(struct sampler *s, struct snode *n, const struct nodefigs *st, double t,
                   const char *err)
{
    n->checked_ms = wall_ms();
    if (st == NULL) {
        n->health = -1;
        snprintf(n->error, sizeof n->error, "%s", err);
        CTL_INC(s->c, stats_node_failures);
        return; /* its previous counters stay: the next good read rates the whole gap */
    }
    n->health = 1;
    n->error[0] = 0;
    n->items = st->items;
    n->bytes = st->bytes;
    n->limit = st->limit;
    n->version = st->version;
    struct prev_ns *np = malloc((size_t)(st->nns ? st->nns : 1) * sizeof *np);
    double dt = n->prev ? t - n->prev_t : 0;
    for (int k = 0; k < st->nns; k++) {
        const struct nodefigs_ns *x = &st->ns[k];
        double ops = x->hits + x->misses + x->sets + x->deletes;
        const struct prev_ns *p = NULL;
        /* a node lists its namespaces in the same order each time: try the same place first */
        if (k < n->nprev && !strcmp(n->prev[k].name, x->name)) p = &n->prev[k];
        for (int j = 0; p == NULL && j < n->nprev; j++)
            if (!strcmp(n->prev[j].name, x->name)) p = &n->prev[j];
        struct series *se = series_get(s, x->name);
        if (se) {
            se->t_seen = 1;
            se->t_mem += x->memory;
            se->t_quota += x->quota;
            se->t_items += x->items;
            double dops = p ? ops - p->ops : -1, dh = p ? x->hits - p->hits : -1,
                   dg = p ? x->hits + x->misses - p->hits - p->misses : -1;
            if (p && dt > 0 && dops >= 0 && dh >= 0 && dg >= 0) { /* else new, or restarted */
                se->t_ops += dops / dt;
                se->t_hits += dh;
                se->t_gets += dg;
                se->t_rated = 1;
            }
        }
        if (np) {
            memcpy(np[k].name, x->name, sizeof np[k].name);
            np[k].hits = x->hits;
            np[k].misses = x->misses;
            np[k].ops = ops;
        }
    }
    free(n->prev);
    n->prev = np;
    n->nprev = np ? st->nns : 0;
    n->prev_t = t;
}

struct worker_arg {
    struct sampler *s;
    unsigned id;
};

static void *worker_main(void *arg)
{
    struct worker_arg *wa = arg;
    struct sampler *s = wa->s;
    struct httpc *h = s->clients[wa->id];
    free(wa);
    struct nodefigs *st = malloc(sizeof *st);
    struct httpc_reply r;
    httpc_reply_init(&r);
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (s->next >= s->nnodes) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        struct snode *n = &s->nodes[s->next++];
        char url[MODEL_ADDR_MAX + 32], err[200] = "out of memory";
        snprintf(url, sizeof url, "http://%s/metrics", n->admin);
        pthread_mutex_unlock(&s->mu);
        int ok = 0;
        if (st && httpc_get(h, url, s->timeout_ms, &r, err, sizeof err) == 0) {
            if (r.status != 200)
                snprintf(err, sizeof err, "/metrics answered %ld", r.status);
            else if (buf_append(&r.body, "", 1) == 0)
                ok = 1;
        }
        if (ok) nodefigs_parse(buf_start(&r.body), st);
        double t = mono_s();
        pthread_mutex_lock(&s->mu);
        absorb(s, n, ok ? st : NULL, t, err);
        if (++s->done == s->nnodes) pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    httpc_reply_release(&r);
    free(st);
    return NULL;
}

/* Make s->nodes the model's nodes that have an admin address, keeping what is known of those
 * already there. Called between samples, without s->mu. */
static void refresh_nodes(struct sampler *s)
{
    struct control *c = s->c;
    size_t cap = 0, n = 0;
    struct snode *nv = NULL;
    pthread_mutex_lock(&c->lock);
    const char *pname;
    json_t *pool;
    json_object_foreach(json_object_get(c->model, "pools"), pname, pool) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(pool, "nodes"), i, e) {
            const char *node = json_string_value(json_object_get(e, "node"));
            const char *admin = json_string_value(json_object_get(e, "admin"));
            if (node == NULL || admin == NULL || *admin == 0) continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 16;
                struct snode *t = realloc(nv, nc * sizeof *t);
                if (t == NULL) break;
                nv = t;
                cap = nc;
            }
            memset(&nv[n], 0, sizeof nv[n]);
            snprintf(nv[n].node, sizeof nv[n].node, "%s", node);
            snprintf(nv[n].admin, sizeof nv[n].admin, "%s", admin);
            n++;
        }
    }
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < s->nnodes; j++)
            if (s->nodes[j].node[0] && !strcmp(s->nodes[j].node, nv[i].node) &&
                !strcmp(s->nodes[j].admin, nv[i].admin)) {
                nv[i] = s->nodes[j];
                s->nodes[j].node[0] = 0; /* taken */
                s->nodes[j].prev = NULL;
                break;
            }
    for (size_t j = 0; j < s->nnodes; j++) free(s->nodes[j].prev);
    free(s->nodes);
    s->nodes = nv;
    s->nnodes = n;
    s->next = s->done = n; /* nothing handed out yet */
    pthread_mutex_unlock(&s->mu);
}

/* Write the finished sample as column `seq`. Caller holds s->mu. */
static void record(struct sampler *s)
{
    uint64_t seq = ++s->seq;
    size_t col = (size_t)(seq % s->cap);
    s->times[col] = wall_ms();
    for (size_t i = 0; i < s->nser;) {
        struct series *se = s->ser[i];
        se->ops[col] = se->t_rated ? (float)se->t_ops : NAN;
        se->ratio[col] = se->t_rated && se->t_gets > 0 ? (float)(se->t_hits / se->t_gets) : NAN;
        se->mem[col] = se->t_seen ? (float)se->t_mem : NAN;
        if (se->t_seen) {
            se->last_seq = seq;
            se->quota = se->t_quota;
            se->items = se->t_items;
        }
        se->t_ops = se->t_hits = se->t_gets = se->t_mem = se->t_quota = se->t_items = 0;
        se->t_seen = se->t_rated = 0;
        if (seq - se->last_seq >= s->cap) { /* no figure left in the window: gone */
            series_drop(s, i);
            continue;
        }
        i++;
    }
    CTL_INC(s->c, stats_samples);
}

static void *pacer_main(void *arg)
{
    struct sampler *s = arg;
    uint64_t interval = s->c->cfg.stats_interval_ms;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (;;) {
        refresh_nodes(s);
        pthread_mutex_lock(&s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        s->next = s->done = 0;
        pthread_cond_broadcast(&s->cv);
        while (!s->stop && s->done < s->nnodes) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->stop) record(s);
        /* the next sample starts one interval after this one did; a late one starts at once */
        next.tv_nsec += (long)(interval % 1000) * 1000000;
        next.tv_sec += (time_t)(interval / 1000) + next.tv_nsec / 1000000000;
        next.tv_nsec %= 1000000000;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec > next.tv_nsec))
            next = now;
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &next) == 0) {
        }
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
    }
    return NULL;
}

struct sampler *sampler_create(struct control *c, char *err, size_t errlen)
{
    struct sampler *s = calloc(1, sizeof *s);
    if (s == NULL) goto oom;
    s->c = c;
    s->cap = (size_t)(c->cfg.stats_window * 1000 / c->cfg.stats_interval_ms) + 1;
    s->maxser = (size_t)c->cfg.stats_namespaces;
    s->timeout_ms = (unsigned)c->cfg.stats_timeout_ms;
    s->nworkers = (unsigned)c->cfg.stats_workers;
    s->times = calloc(s->cap, sizeof *s->times);
    s->ser = calloc(s->maxser, sizeof *s->ser);
    s->index = json_object();
    s->workers = calloc(s->nworkers, sizeof *s->workers);
    s->clients = calloc(s->nworkers, sizeof *s->clients);
    if (!s->times || !s->ser || !s->index || !s->workers || !s->clients) goto oom;
    for (unsigned i = 0; i < s->nworkers; i++)
        if ((s->clients[i] = httpc_create(METRICS_BODY_MAX)) == NULL) goto oom;
    pthread_mutex_init(&s->mu, NULL);
    clock_cond_init_monotonic(&s->cv);
    for (; s->started < s->nworkers; s->started++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (wa == NULL) break;
        *wa = (struct worker_arg){s, s->started};
        if (pthread_create(&s->workers[s->started], NULL, worker_main, wa) != 0) {
            free(wa);
            break;
        }
    }
    if (s->started < s->nworkers || pthread_create(&s->pacer, NULL, pacer_main, s) != 0) {
        snprintf(err, errlen, "cannot start the stats sampler's threads");
        s->nworkers = s->started; /* joins what started */
        s->pacer = 0;
        sampler_destroy(&s);
        return NULL;
    }
    return s;
oom:
    snprintf(err, errlen, "out of memory for the stats sampler");
    if (s) {
        for (unsigned i = 0; s->clients && i < s->nworkers; i++) httpc_destroy(&s->clients[i]);
        free(s->clients);
        free(s->workers);
        json_decref(s->index);
        free(s->ser);
        free(s->times);
        free(s);
    }
    return NULL;
}

void sampler_destroy(struct sampler **sp)
{
    struct sampler *s = *sp;
    if (s == NULL) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (unsigned i = 0; i < s->nworkers; i++) httpc_cancel(s->clients[i]);
    if (s->pacer) pthread_join(s->pacer, NULL);
    for (unsigned i = 0; i < s->started; i++) pthread_join(s->workers[i], NULL);
    for (unsigned i = 0; i < s->nworkers; i++) httpc_destroy(&s->clients[i]);
    for (size_t j = 0; j < s->nnodes; j++) free(s->nodes[j].prev);
    free(s->nodes);
    for (size_t i = 0; i < s->nser; i++) series_free(s->ser[i]);
    free(s->ser);
    json_decref(s->index);
    free(s->times);
    free(s->workers);
    free(s->clients);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    *sp = NULL;
}

/* ---- GET /v1/stats ------------------------------------------------------------------------ */

/* A figure: null when unknown, an integer when whole (counts, bytes), else a real rounded to
 * `scale` (1e4: a ratio's 0.01 %), so a float ring's noise does not reach the page. */
static json_t *fig(double v, double scale)
{
    if (isnan(v) || v < 0) return json_null();
    if (v == floor(v) && v < 9e15) return json_integer((json_int_t)v);
    return json_real(round(v * scale) / scale);
}
static json_t *num_or_null(double v) { return fig(v, 100); }

/* The pools and their nodes from the model: slot counts and ranges. Caller holds c->lock. */
static json_t *pools_json(const json_t *m)
{
    json_t *out = json_object();
    const char *g = json_string_value(json_object_get(m, "gutter_pool"));
    const char *pname;
    json_t *pool;
    json_object_foreach(json_object_get((json_t *)m, "pools"), pname, pool) {
        json_t *nodes = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(pool, "nodes"), i, e) {
            const char *node = json_string_value(json_object_get(e, "node"));
            const char *admin = json_string_value(json_object_get(e, "admin"));
            json_t *ranges = json_array();
            json_int_t count = 0;
            size_t k;
            json_t *r;
            json_array_foreach(json_object_get(pool, "slots"), k, r) {
                if (strcmp(json_string_value(json_object_get(r, "node")), node)) continue;
                json_int_t from = json_integer_value(json_object_get(r, "from")),
                           to = json_integer_value(json_object_get(r, "to"));
                count += to - from + 1;
                json_array_append_new(ranges, json_pack("[I,I]", from, to));
            }
            json_array_append_new(nodes, json_pack("{s:s,s:s?,s:I,s:o}", "node", node, "admin",
                                                   admin && *admin ? admin : NULL, "slots", count,
                                                   "ranges", ranges));
        }
        json_object_set_new(out, pname, json_pack("{s:o,s:b}", "nodes", nodes, "gutter",
                                                  g && !strcmp(g, pname)));
    }
    return out;
}

/* Health and figures of each node in `pools`. Caller holds s->mu. */
static void nodes_health(struct sampler *s, json_t *pools)
{
    const char *pname;
    json_t *pool;
    json_object_foreach(pools, pname, pool) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(pool, "nodes"), i, e) {
            const char *node = json_string_value(json_object_get(e, "node"));
            const struct snode *n = NULL;
            for (size_t j = 0; j < s->nnodes && n == NULL; j++)
                if (!strcmp(s->nodes[j].node, node)) n = &s->nodes[j];
            const char *health = n == NULL ? "unknown" : n->health > 0 ? "up"
                                                       : n->health < 0 ? "down" : "unknown";
            json_object_set_new(e, "health", json_string(health));
            if (n == NULL && json_object_get(e, "admin") == NULL)
                json_object_set_new(e, "error", json_string("no admin address: not read"));
            if (n == NULL) continue;
            if (n->health < 0) json_object_set_new(e, "error", json_string(n->error));
            int up = n->health > 0;
            json_object_set_new(e, "items", num_or_null(up ? n->items : NAN));
            json_object_set_new(e, "memory_bytes", num_or_null(up ? n->bytes : NAN));
            json_object_set_new(e, "memory_limit", num_or_null(up ? n->limit : NAN));
            json_object_set_new(e, "topology_version", num_or_null(up ? n->version : NAN));
            if (n->checked_ms)
                json_object_set_new(e, "checked_ms", json_integer((json_int_t)n->checked_ms));
        }
    }
}

static json_t *column(const float *v, const struct sampler *s, uint64_t from, double scale)
{
    json_t *a = json_array();
    for (uint64_t k = from; k <= s->seq; k++) json_array_append_new(a, fig(v[k % s->cap], scale));
    return a;
}

json_t *sampler_json(struct sampler *s, uint64_t since)
{
    struct control *c = s->c;
    pthread_mutex_lock(&c->lock);
    json_t *pools = pools_json(c->model);
    json_t *nsmodel = json_deep_copy(json_object_get(c->model, "namespaces"));
    uint64_t version = c->version;
    pthread_mutex_unlock(&c->lock);
    json_t *nss = json_object();
    pthread_mutex_lock(&s->mu);
    nodes_health(s, pools);
    uint64_t oldest = s->seq >= s->cap ? s->seq - s->cap + 1 : 1;
    uint64_t from = since + 1 > oldest ? since + 1 : oldest;
    json_t *times = json_array();
    for (uint64_t k = from; k <= s->seq; k++)
        json_array_append_new(times, json_integer((json_int_t)s->times[k % s->cap]));
    for (size_t i = 0; i < s->nser; i++) {
        const struct series *se = s->ser[i];
        size_t col = (size_t)(s->seq % s->cap);
        const char *pool = json_string_value(json_object_get(json_object_get(nsmodel, se->name),
                                                             "pool"));
        json_object_set_new(
            nss, se->name,
            json_pack("{s:s?,s:o,s:o,s:o,s:o,s:o,s:{s:o,s:o,s:o}}", "pool", pool, "quota_bytes",
                      num_or_null(se->quota), "items", num_or_null(se->items), "ops_per_sec",
                      column(se->ops, s, from, 100), "hit_ratio", column(se->ratio, s, from, 1e4),
                      "memory_bytes", column(se->mem, s, from, 1), "latest", "ops_per_sec",
                      fig(se->ops[col], 100), "hit_ratio", fig(se->ratio[col], 1e4),
                      "memory_bytes", fig(se->mem[col], 1)));
    }
    json_t *o = json_pack("{s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o}", "version", (json_int_t)version,
                          "interval_ms", (json_int_t)c->cfg.stats_interval_ms, "window_s",
                          (json_int_t)c->cfg.stats_window, "seq", (json_int_t)s->seq,
                          "first_seq", (json_int_t)from, "times", times, "pools", pools,
                          "namespaces", nss);
    pthread_mutex_unlock(&s->mu);
    json_decref(nsmodel);
    return o;
}
