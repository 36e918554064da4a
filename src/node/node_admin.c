/* node_admin.c — shoal-node's admin HTTP content: the /v1/namespaces API and /metrics.
 *
 *   GET    /v1/namespaces          every namespace's settings and the table version
 *   GET    /v1/namespaces/<name>   one namespace's settings and figures
 *   PUT    /v1/namespaces/<name>   create or change (JSON body of settings)
 *   DELETE /v1/namespaces/<name>   remove (its keys fall back to default)
 *
 * Runs on the admin thread, which is also the only writer of the namespace table after start,
 * so reading the current table here needs only the registry lock. */
#include "node/node_admin.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "node/control.h"
#include "node/fence.h"
#include "node/node.h"
#include "node/repl.h"

static const struct metric_desc ns_metric_descs[] = {
#define X(name, kind, help) METRIC_DESC(struct ns_metrics, name, kind, help),
    NS_METRICS(X)
#undef X
};
#define NS_NMETRICS (sizeof ns_metric_descs / sizeof ns_metric_descs[0])

void node_ns_figures(struct node *n, const struct ns *ns, struct ns_metrics *out)
{
    node_ns_metrics_sum(n, ns->id, out);
    uint64_t *o = (uint64_t *)out;
    const uint64_t *b = (const uint64_t *)&ns->base;
    for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++) o[i] -= b[i];
}

static int ns_route(void *ctx, const char *method, const char *rest, const char *body, size_t len,
                    struct buf *out)
{
    struct node *n = ctx;
    const char *name = rest[0] == '/' ? rest + 1 : rest;
    bool get = !strcmp(method, "GET");
    if (*name == 0) {
        if (!get) {
            buf_append_str(out, "{\"error\": \"use GET on /v1/namespaces, or PUT/DELETE on "
                                "/v1/namespaces/<name>\"}\n");
            return 405;
        }
        pthread_mutex_lock(&n->ns.lock);
        ns_render_json(ns_current(&n->ns), NULL, out);
        pthread_mutex_unlock(&n->ns.lock);
        return 200;
    }
    if (!strcmp(method, "PUT")) return ns_put_json(&n->ns, name, body, len, out);
    if (!strcmp(method, "DELETE")) return ns_delete(&n->ns, name, out);
    if (!get) {
        buf_append_str(out, "{\"error\": \"methods here: GET, PUT, DELETE\"}\n");
        return 405;
    }
    pthread_mutex_lock(&n->ns.lock);
    const struct ns *ns = ns_find(ns_current(&n->ns), name, strlen(name));
    int st = 200;
    if (ns == NULL) {
        buf_printf(out, "{\"error\": \"no namespace '%.64s'\"}\n", name);
        st = 404;
    } else {
        struct buf one;
        buf_init(&one);
        ns_render_json(ns_current(&n->ns), ns, &one);
        struct ns_metrics m;
        node_ns_figures(n, ns, &m);
        /* splice the figures into the settings object: {...settings..., "stats": {...}} */
        size_t used = buf_used(&one);
        while (used && (buf_start(&one)[used - 1] == '\n' || buf_start(&one)[used - 1] == '}'))
            used--;
        buf_append(out, buf_start(&one), used);
        buf_append_str(out, ", \"stats\": {");
        for (size_t i = 0; i < NS_NMETRICS; i++)
            buf_printf(out, "%s\"%s\": %llu", i ? ", " : "", ns_metric_descs[i].name,
                       (unsigned long long)*(uint64_t *)((char *)&m + ns_metric_descs[i].offset));
        struct store_ns_stats es;
        store_ns_stats(n->store, ns->id, &es);
        buf_printf(out, ", \"items\": %llu, \"bytes\": %llu, \"evictions\": %llu, \"expired\": %llu",
                   (unsigned long long)es.items, (unsigned long long)es.bytes,
                   (unsigned long long)es.evictions, (unsigned long long)es.expired);
        buf_append_str(out, "}}\n");
        buf_release(&one);
    }
    pthread_mutex_unlock(&n->ns.lock);
    return st;
}

static void render_metrics(void *ctx, struct buf *out)
{
    struct node *n = ctx;
    struct node_metrics m;
    struct store_stats ss;
    node_metrics_sum(n, &m);
    store_stats(n->store, &ss);
    size_t nn, ns;
    const struct metric_desc *nd = node_metric_table(&nn), *sd = store_metric_table(&ns);
    metrics_write_prom(out, "shoal_node", nd, nn, &m, NULL);
    metrics_write_prom(out, "shoal_node", sd, ns, &ss, NULL);
    buf_printf(out,
               "# HELP shoal_node_curr_connections client connections open now\n"
               "# TYPE shoal_node_curr_connections gauge\nshoal_node_curr_connections %llu\n"
               "# HELP shoal_node_limit_maxbytes item memory limit in bytes\n"
               "# TYPE shoal_node_limit_maxbytes gauge\nshoal_node_limit_maxbytes %llu\n",
               (unsigned long long)__atomic_load_n(&n->curr_conns, __ATOMIC_RELAXED),
               (unsigned long long)ss.limit_maxbytes);
    buf_printf(out,
               "# HELP shoal_node_topology_version topology version from the control plane in "
               "use (0: none, or no --control)\n# TYPE shoal_node_topology_version gauge\n"
               "shoal_node_topology_version %llu\n",
               (unsigned long long)node_control_version(n->control));
    if (n->control) node_control_metrics(n->control, out);
    if (n->fence) fence_metrics(n->fence, out);
    if (n->repl) repl_metrics_prom(n->repl, out);
    /* per namespace: one series per namespace under one HELP/TYPE */
    pthread_mutex_lock(&n->ns.lock);
    const struct ns_table *t = ns_current(&n->ns);
    struct ns_metrics per[NS_MAX];
    for (int id = 0; id < NS_MAX; id++)
        if (t->byid[id]) node_ns_figures(n, t->byid[id], &per[id]);
    for (size_t i = 0; i < NS_NMETRICS; i++) {
        const struct metric_desc *d = &ns_metric_descs[i];
        buf_printf(out, "# HELP shoal_node_ns_%s_total per namespace: %s\n", d->name, d->help);
        buf_printf(out, "# TYPE shoal_node_ns_%s_total counter\n", d->name);
        for (int id = 0; id < NS_MAX; id++)
            if (t->byid[id])
                buf_printf(out, "shoal_node_ns_%s_total{namespace=\"%s\"} %llu\n", d->name,
                           t->byid[id]->name,
                           (unsigned long long)*(uint64_t *)((char *)&per[id] + d->offset));
    }
    buf_printf(out, "# HELP shoal_node_ns_quota_bytes per namespace: memory quota (0: none)\n"
                    "# TYPE shoal_node_ns_quota_bytes gauge\n");
    for (int id = 0; id < NS_MAX; id++)
        if (t->byid[id])
            buf_printf(out, "shoal_node_ns_quota_bytes{namespace=\"%s\"} %llu\n",
                       t->byid[id]->name, (unsigned long long)t->byid[id]->cfg.memory);
    buf_printf(out, "# HELP shoal_node_ns_hit_ratio per namespace: get hits / (hits + misses)\n"
                    "# TYPE shoal_node_ns_hit_ratio gauge\n");
    for (int id = 0; id < NS_MAX; id++) {
        if (t->byid[id] == NULL) continue;
        uint64_t reads = per[id].get_hits + per[id].get_misses;
        buf_printf(out, "shoal_node_ns_hit_ratio{namespace=\"%s\"} %.4f\n", t->byid[id]->name,
                   reads ? (double)per[id].get_hits / (double)reads : 0.0);
    }
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } eng[] = {
        {"items", "gauge", "items stored now", offsetof(struct store_ns_stats, items)},
        {"bytes", "gauge", "bytes of stored items", offsetof(struct store_ns_stats, bytes)},
        {"memory_bytes", "gauge", "bytes of log segments owned (at most the quota)",
         offsetof(struct store_ns_stats, memory)},
        {"evictions_total", "counter", "live items evicted",
         offsetof(struct store_ns_stats, evictions)},
        {"expired_total", "counter", "expired items reclaimed",
         offsetof(struct store_ns_stats, expired)},
    };
    for (size_t i = 0; i < sizeof eng / sizeof eng[0]; i++) {
        buf_printf(out, "# HELP shoal_node_ns_%s per namespace: %s\n# TYPE shoal_node_ns_%s %s\n",
                   eng[i].name, eng[i].help, eng[i].name, eng[i].type);
        for (int id = 0; id < NS_MAX; id++) {
            if (t->byid[id] == NULL) continue;
            struct store_ns_stats es;
            store_ns_stats(n->store, (uint16_t)id, &es);
            buf_printf(out, "shoal_node_ns_%s{namespace=\"%s\"} %llu\n", eng[i].name,
                       t->byid[id]->name,
                       (unsigned long long)*(uint64_t *)((char *)&es + eng[i].off));
        }
    }
    pthread_mutex_unlock(&n->ns.lock);
}

struct admin *node_admin_create(struct node *n, char *err, size_t errlen)
{
    struct admin_route routes[] = {{"/v1/namespaces", ns_route, n, 0},
                                   {"/v1/replication", repl_admin_route, n, ADMIN_ROUTE_HOLD}};
    struct admin_limits lim = ADMIN_LIMITS_OF(n->cfg);
    return admin_create(n->cfg.admin_listen, (unsigned)n->cfg.admin_port, &lim, render_metrics, n,
                        routes, sizeof routes / sizeof routes[0], err, errlen);
}
