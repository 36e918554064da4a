/* pool.c — `shoal pool show [POOL]`, `shoal node add POOL HOST:PORT`, `shoal node remove POOL
 * HOST:PORT`, `shoal node drain POOL HOST:PORT`: pools, their nodes and slot ranges through
 * shoal-control's API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

const struct cli_flag cli_node_flags[] = {
    {"admin", "HOST:PORT", "the node's admin address: namespace settings are pushed there [none]"},
    {NULL, NULL, NULL},
};

const struct cli_flag cli_drain_flags[] = {
    {"force", NULL, "move the ranges that have a live replica and keep the others (without it, "
     "ranges without one refuse the drain)"},
    {"timeout-ms", "MS", "how long each replica may take to catch up before its handoff fails "
     "[2000]"},
    {NULL, NULL, NULL},
};

/* "0-5460, 13654-16383": the slot ranges of `node` in a pool's map. */
static void ranges(json_t *slots, const char *node, char *out, size_t len)
{
    size_t i, used = 0;
    json_t *r;
    out[0] = 0;
    json_array_foreach(slots, i, r) {
        if (strcmp(json_string_value(json_object_get(r, "node")) ?: "", node)) continue;
        long long from = json_integer_value(json_object_get(r, "from"));
        long long to = json_integer_value(json_object_get(r, "to"));
        int n = snprintf(out + used, len - used, "%s%lld-%lld", used ? ", " : "", from, to);
        if (n < 0 || (size_t)n >= len - used) {
            if (len > 4) strcpy(out + len - 4, "...");
            return;
        }
        used += (size_t)n;
    }
}

static void print_pool(const char *name, json_t *pool)
{
    json_t *nss = json_object_get(pool, "namespaces");
    printf("pool %s%s: %zu node%s; namespaces: ", name,
           json_is_true(json_object_get(pool, "gutter")) ? " (gutter)" : "",
           json_array_size(json_object_get(pool, "nodes")),
           json_array_size(json_object_get(pool, "nodes")) == 1 ? "" : "s");
    size_t i;
    json_t *v;
    json_array_foreach(nss, i, v) printf("%s%s", i ? ", " : "", json_string_value(v));
    printf("%s\n", json_array_size(nss) ? "" : "none");
    struct cli_table *t = cli_table_new(4, "node", "admin", "slots", "ranges");
    json_array_foreach(json_object_get(pool, "nodes"), i, v) {
        const char *node = json_string_value(json_object_get(v, "node"));
        const char *admin = json_string_value(json_object_get(v, "admin"));
        char slots[32], rg[256];
        snprintf(slots, sizeof slots, "%lld", (long long)json_integer_value(json_object_get(v, "slots")));
        ranges(json_object_get(pool, "slots"), node ? node : "", rg, sizeof rg);
        cli_table_row(t, node, admin && *admin ? admin : NULL, slots, rg);
    }
    cli_table_print(t, 2);
    cli_table_free(&t);
}

int cli_pool_show(const struct cli_cmd *cmd, struct cli_args *a)
{
    char path[512];
    if (a->npos) {
        char *p = cli_path_escape(a->pos[0]);
        snprintf(path, sizeof path, "/v1/pools/%s", p ? p : "");
        free(p);
    } else {
        snprintf(path, sizeof path, "/v1/pools");
    }
    json_t *r = cli_call(cli_control_url(cmd, a), "GET", path, NULL);
    if (r == NULL) return 1;
    if (cli_json(cmd, a)) {
        cli_print_json(r);
        json_decref(r);
        return 0;
    }
    if (a->npos) {
        print_pool(a->pos[0], json_object_get(r, "pool"));
    } else {
        const char *name;
        json_t *pool;
        bool first = true;
        json_object_foreach(json_object_get(r, "pools"), name, pool) {
            if (!first) printf("\n");
            first = false;
            print_pool(name, pool);
        }
        if (first) printf("no pools yet: `shoal up` makes a local cluster's, or POST /v1/pools\n");
    }
    printf("(topology version %lld)\n", (long long)json_integer_value(json_object_get(r, "version")));
    json_decref(r);
    return 0;
}

static int node_change(const struct cli_cmd *cmd, struct cli_args *a, bool add)
{
    const char *pool = a->pos[0], *node = a->pos[1];
    if (strchr(node, ':') == NULL)
        return cli_err("shoal %s: %s is not HOST:PORT", cmd->name, node), 2;
    const char *admin = cli_flag(cmd, a, "admin");
    char *p = cli_path_escape(pool), *n = cli_path_escape(node), path[1024];
    json_t *body = NULL;
    if (add) {
        snprintf(path, sizeof path, "/v1/pools/%s/nodes", p ? p : "");
        body = json_pack("{s:s}", "node", node);
        if (admin) json_object_set_new(body, "admin", json_string(admin));
    } else {
        snprintf(path, sizeof path, "/v1/pools/%s/nodes/%s", p ? p : "", n ? n : "");
    }
    free(p);
    free(n);
    bool json = cli_json(cmd, a);
    if (!json) {
        printf("%s %s %s pool %s...\n", add ? "adding" : "removing", node, add ? "to" : "from", pool);
        fflush(stdout);
    }
    json_t *r = cli_call(cli_control_url(cmd, a), add ? "POST" : "DELETE", path, body);
    json_decref(body);
    if (r == NULL) return 1;
    if (json) {
        cli_print_json(r);
    } else {
        long long moved = json_integer_value(json_object_get(r, "moved"));
        printf("%s: %lld slot%s moved %s it; topology version %lld (routers follow within a "
               "second)\n", add ? "added" : "removed", moved, moved == 1 ? "" : "s",
               add ? "to" : "away from", (long long)json_integer_value(json_object_get(r, "version")));
        print_pool(pool, json_object_get(r, "pool"));
    }
    json_decref(r);
    return 0;
}

int cli_node_add(const struct cli_cmd *cmd, struct cli_args *a) { return node_change(cmd, a, true); }
int cli_node_remove(const struct cli_cmd *cmd, struct cli_args *a) { return node_change(cmd, a, false); }

int cli_node_drain(const struct cli_cmd *cmd, struct cli_args *a)
{
    const char *pool = a->pos[0], *node = a->pos[1];
    if (strchr(node, ':') == NULL)
        return cli_err("shoal %s: %s is not HOST:PORT", cmd->name, node), 2;
    uint64_t tmo = 2000;
    const char *t = cli_flag(cmd, a, "timeout-ms");
    if (t && (cli_parse_uint(t, &tmo) < 0 || tmo < 10 || tmo > 60000))
        return cli_err("shoal %s: --timeout-ms must be 10 to 60000", cmd->name), 2;
    char *p = cli_path_escape(pool), *n = cli_path_escape(node), path[1024];
    snprintf(path, sizeof path, "/v1/pools/%s/nodes/%s/drain", p ? p : "", n ? n : "");
    free(p);
    free(n);
    json_t *body = json_pack("{s:b,s:I}", "force", cli_switch(cmd, a, "force"), "timeout_ms",
                             (json_int_t)tmo);
    bool json = cli_json(cmd, a);
    if (!json) {
        printf("draining %s of pool %s: handing its ranges off to their replicas...\n", node, pool);
        fflush(stdout);
    }
    /* one handoff per replica, each up to timeout-ms */
    json_t *r = cli_call_t(cli_control_url(cmd, a), "POST", path, body,
                           (unsigned)(tmo * 8 + 10000));
    json_decref(body);
    if (r == NULL) return 1;
    if (json) {
        cli_print_json(r);
        json_decref(r);
        return 0;
    }
    struct cli_table *tb = cli_table_new(3, "slots", "now on", "");
    size_t i;
    json_t *v;
    char rg[64];
    json_array_foreach(json_object_get(r, "moved"), i, v) {
        snprintf(rg, sizeof rg, "%lld-%lld", (long long)json_integer_value(json_object_get(v, "from")),
                 (long long)json_integer_value(json_object_get(v, "to")));
        cli_table_row(tb, rg, json_string_value(json_object_get(v, "new_node")),
                      "moved (handed off, no lag)");
    }
    json_array_foreach(json_object_get(r, "kept"), i, v) {
        snprintf(rg, sizeof rg, "%lld-%lld", (long long)json_integer_value(json_array_get(v, 0)),
                 (long long)json_integer_value(json_array_get(v, 1)));
        cli_table_row(tb, rg, node, "kept (no live replica)");
    }
    cli_table_print(tb, 2);
    cli_table_free(&tb);
    printf("drained: %lld slots in %zu range%s moved in %lld ms, %zu range%s kept; topology "
           "version %lld\n", (long long)json_integer_value(json_object_get(r, "slots")),
           json_array_size(json_object_get(r, "moved")),
           json_array_size(json_object_get(r, "moved")) == 1 ? "" : "s",
           (long long)json_integer_value(json_object_get(r, "ms")),
           json_array_size(json_object_get(r, "kept")),
           json_array_size(json_object_get(r, "kept")) == 1 ? "" : "s",
           (long long)json_integer_value(json_object_get(r, "version")));
    json_decref(r);
    return 0;
}
