/* status.c — `shoal status`: every pool's nodes with their health (/healthz), slots, memory,
 * items and hit ratio (/metrics), the control plane's topology version, and the local
 * cluster's router with the version it runs. Exit status 1 when a node is not healthy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/probe.h"
#include "cli/proc.h"

static json_t *num_or_null(double v) { return v < 0 ? json_null() : json_real(v); }

int cli_status(const struct cli_cmd *cmd, struct cli_args *a)
{
    const char *control = cli_control_url(cmd, a);
    json_t *r = cli_call(control, "GET", "/v1/pools", NULL);
    if (r == NULL) return 1;
    bool json = cli_json(cmd, a);
    long long version = json_integer_value(json_object_get(r, "version"));
    json_t *out = json_pack("{s:s, s:I, s:[], s:[]}", "control", control, "version",
                            (json_int_t)version, "nodes", "routers");
    struct cli_table *t = cli_table_new(9, "pool", "node", "health", "slots", "memory", "items",
                                        "hit ratio", "version", "admin");
    struct probe_node *pn = malloc(sizeof *pn);
    int unhealthy = 0, total = 0;
    const char *pname;
    json_t *pool;
    json_object_foreach(json_object_get(r, "pools"), pname, pool) {
        size_t i;
        json_t *n;
        json_array_foreach(json_object_get(pool, "nodes"), i, n) {
            const char *node = json_string_value(json_object_get(n, "node")) ?: "?";
            const char *admin = json_string_value(json_object_get(n, "admin"));
            long long slots = json_integer_value(json_object_get(n, "slots"));
            bool gutter = json_is_true(json_object_get(pool, "gutter"));
            char health[200], sl[32], mem[64], items[32], ratio[32], ver[32], b1[32], b2[32];
            total++;
            if (admin && *admin && pn) {
                probe_node(admin, pn);
            } else if (pn) {
                memset(pn, 0, sizeof *pn);
                pn->items = pn->bytes = pn->limit = pn->hits = pn->misses = pn->version = -1;
                pn->reachable = pn->healthy = probe_accepts(node, 1000);
                if (!pn->healthy) snprintf(pn->error, sizeof pn->error, "connection refused");
            }
            if (pn == NULL) continue;
            if (pn->healthy) snprintf(health, sizeof health, "%s", admin && *admin ? "ok" : "ok (port open; no admin)");
            else snprintf(health, sizeof health, "DOWN: %s", pn->error);
            unhealthy += !pn->healthy;
            snprintf(sl, sizeof sl, "%lld", gutter ? 0 : slots);
            if (gutter) snprintf(sl, sizeof sl, "gutter");
            if (pn->bytes >= 0 && pn->limit > 0)
                snprintf(mem, sizeof mem, "%s / %s", cli_human((uint64_t)pn->bytes, b1, sizeof b1),
                         cli_human((uint64_t)pn->limit, b2, sizeof b2));
            else snprintf(mem, sizeof mem, "-");
            if (pn->items >= 0) snprintf(items, sizeof items, "%.0f", pn->items);
            else snprintf(items, sizeof items, "-");
            double gets = pn->hits + pn->misses;
            if (pn->hits >= 0 && gets > 0) snprintf(ratio, sizeof ratio, "%.1f%%", 100.0 * pn->hits / gets);
            else snprintf(ratio, sizeof ratio, "-");
            if (pn->version >= 0) snprintf(ver, sizeof ver, "%.0f", pn->version);
            else snprintf(ver, sizeof ver, "-");
            cli_table_row(t, pname, node, health, sl, mem, items, ratio, ver, admin);
            json_array_append_new(json_object_get(out, "nodes"), json_pack(
                "{s:s, s:s, s:s?, s:b, s:b, s:s?, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
                "pool", pname, "node", node, "admin", admin, "gutter", gutter, "healthy",
                pn->healthy, "error", pn->healthy ? NULL : pn->error, "slots", (json_int_t)slots,
                "memory_bytes", num_or_null(pn->bytes), "memory_limit", num_or_null(pn->limit),
                "items", num_or_null(pn->items), "get_hits", num_or_null(pn->hits),
                "get_misses", num_or_null(pn->misses),
                "hit_ratio", pn->hits >= 0 && gets > 0 ? json_real(pn->hits / gets) : json_null(),
                "topology_version", num_or_null(pn->version)));
        }
    }
    free(pn);

    /* the local cluster's router, when it follows this control plane */
    json_t *rec = proc_record_load(cli_dir(cmd, a));
    struct cli_table *rt = NULL;
    if (rec && !strcmp(json_string_value(json_object_get(rec, "control")) ?: "", control)) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(rec, "processes"), i, p) {
            if (strcmp(json_string_value(json_object_get(p, "name")) ?: "", "router")) continue;
            const char *addr = json_string_value(json_object_get(p, "address")) ?: "?";
            const char *admin = json_string_value(json_object_get(p, "admin")) ?: "?";
            char url[300], err[200], *body = NULL, ver[32] = "-";
            long st = 0;
            snprintf(url, sizeof url, "http://%s/metrics", admin);
            bool ok = probe_healthz(admin, 1000);
            double v = -1;
            if (ok && cli_http_get(url, 2000, &st, &body, err, sizeof err) == 0 && st == 200)
                v = probe_metric(body, "shoal_router_topology_version");
            free(body);
            if (v >= 0) snprintf(ver, sizeof ver, "%.0f", v);
            if (rt == NULL) rt = cli_table_new(4, "router", "health", "version", "admin");
            cli_table_row(rt, addr, ok ? "ok" : "DOWN", ver, admin);
            json_array_append_new(json_object_get(out, "routers"),
                                  json_pack("{s:s, s:s, s:b, s:o}", "address", addr, "admin", admin,
                                            "healthy", ok, "topology_version", num_or_null(v)));
        }
    }
    json_decref(rec);
    json_object_set_new(out, "healthy", json_boolean(unhealthy == 0));
    if (json) {
        cli_print_json(out);
    } else {
        printf("control plane %s: topology version %lld\n\n", control, version);
        if (total) cli_table_print(t, 0);
        else printf("no nodes: `shoal node add POOL HOST:PORT` or `shoal up`\n");
        if (rt) {
            printf("\n");
            cli_table_print(rt, 0);
        }
        if (unhealthy)
            printf("\n%d of %d nodes not healthy: see the error column, and the node's log\n",
                   unhealthy, total);
    }
    cli_table_free(&t);
    cli_table_free(&rt);
    json_decref(out);
    json_decref(r);
    return unhealthy ? 1 : 0;
}
