/* router_admin.c — shoal-router's admin HTTP content.
 *
 *   GET  /healthz         "ok" (src/common/admin.c)
 *   GET  /metrics         Prometheus text: request counters summed over workers, the topology
 *                         version in use, reloads, and per node: requests, errors, timeouts,
 *                         marked down, latency quantiles; per pool and per namespace
 *                         (scopestats.h): requests, errors, timeouts, nodes up/down, refusals,
 *                         latency quantiles
 *   GET  /v1/topology     the topology document in use (every field as loaded)
 *   PUT  /v1/topology     body: a whole topology document; applied when valid and newer
 *
 * Runs on the admin thread; publishing a table waits for workers' quiescence there, never on
 * a data-path thread. */
#include "router/router_admin.h"

#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "router/follow.h"
#include "router/reload.h"
#include "router/worker.h"

static void router_metrics(void *ctx, struct buf *out)
{
    struct router *r = ctx;
    struct router_metrics m;
    router_metrics_sum(r, &m);
    metrics_write_prom(out, "shoal_router", router_metric_descs, ROUTER_NMETRICS, &m, NULL);
    pthread_mutex_lock(&r->topo.lock);
    uint64_t version = topo_current(&r->topo)->version;
    pthread_mutex_unlock(&r->topo.lock);
    buf_printf(out,
               "# HELP shoal_router_topology_version version of the topology document in use\n"
               "# TYPE shoal_router_topology_version gauge\nshoal_router_topology_version %llu\n",
               (unsigned long long)version);
    buf_printf(out,
               "# HELP shoal_router_topology_reloads topology documents applied after start\n"
               "# TYPE shoal_router_topology_reloads counter\nshoal_router_topology_reloads %llu\n",
               (unsigned long long)__atomic_load_n(&r->reloads, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP shoal_router_topology_reload_failures topology documents refused\n"
               "# TYPE shoal_router_topology_reload_failures counter\n"
               "shoal_router_topology_reload_failures %llu\n",
               (unsigned long long)__atomic_load_n(&r->reload_failures, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP shoal_router_curr_connections client connections open now\n"
               "# TYPE shoal_router_curr_connections gauge\nshoal_router_curr_connections %llu\n",
               (unsigned long long)__atomic_load_n(&r->curr_conns, __ATOMIC_RELAXED));
    if (r->follow) follow_metrics(r->follow, out);
    nodestats_render(&r->nodes, out);
    /* the lock keeps the table from being replaced (and freed) while its names are read */
    pthread_mutex_lock(&r->topo.lock);
    scopestats_render(&r->scopes, topo_current(&r->topo), &r->nodes, out);
    pthread_mutex_unlock(&r->topo.lock);
}

static void json_str(struct buf *out, const char *s)
{
    buf_append(out, "\"", 1);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') buf_append(out, "\\", 1);
        if ((unsigned char)*s < 0x20) continue;
        buf_append(out, s, 1);
    }
    buf_append(out, "\"", 1);
}

/* The document in use, as it was loaded (re-serialised: same fields and values), so that what
 * GET returns can be edited and PUT back with a higher version. */
static void render_topology(const struct topo *t, struct buf *out)
{
    buf_append_str(out, t->doc ? t->doc : "{}");
    buf_append_str(out, "\n");
}

static int topology_route(void *ctx, const char *method, const char *rest, const char *body,
                          size_t len, struct buf *out)
{
    struct router *r = ctx;
    if (*rest) {
        buf_append_str(out, "{\"error\": \"no such resource; use /v1/topology\"}\n");
        return 404;
    }
    if (!strcmp(method, "GET")) {
        pthread_mutex_lock(&r->topo.lock);
        render_topology(topo_current(&r->topo), out);
        pthread_mutex_unlock(&r->topo.lock);
        return 200;
    }
    if (strcmp(method, "PUT") && strcmp(method, "POST")) {
        buf_append_str(out, "{\"error\": \"methods here: GET, PUT\"}\n");
        return 405;
    }
    char err[512];
    struct topo *t;
    int rc = topo_parse(body, len, 0, &t, err, sizeof err);
    if (rc < 0) router_topology_refused(r, "the admin API", err);
    if (rc < 0 || router_apply_topology(r, t, "the admin API", err, sizeof err) < 0) {
        buf_append_str(out, "{\"error\": ");
        json_str(out, err);
        buf_append_str(out, "}\n");
        return strstr(err, "not newer") ? 409 : 400;
    }
    pthread_mutex_lock(&r->topo.lock);
    render_topology(topo_current(&r->topo), out);
    pthread_mutex_unlock(&r->topo.lock);
    return 200;
}

struct admin *router_admin_create(struct router *r, char *err, size_t errlen)
{
    struct admin_route routes[] = {{"/v1/topology", topology_route, r, 0}};
    struct admin_limits lim = ADMIN_LIMITS_OF(r->cfg);
    return admin_create(r->cfg.admin_listen, (unsigned)r->cfg.admin_port, &lim, router_metrics, r,
                        routes, 1, err, errlen);
}
