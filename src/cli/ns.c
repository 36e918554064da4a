/* ns.c — `shoal ns create|list|show|update|delete`: namespaces through shoal-control's API.
 * A flag's JSON field is its name with '_' for '-'; its value type follows its ARG name
 * (SIZE: 64m, 1g or bytes; S and N: whole numbers; others text), so each setting is declared
 * once, in cli_ns_flags. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

const struct cli_flag cli_ns_flags[] = {
    {"pool", "POOL", "the pool holding its keys [main]"},
    {"memory", "SIZE", "memory quota over the whole pool, split evenly over its nodes: 64m, 1g, "
                       "bytes [0: none]"},
    {"default-ttl", "S", "TTL in seconds given to items stored with none [0]"},
    {"max-ttl", "S", "longest TTL in seconds; longer ones are clamped [0: no limit]"},
    {"copies", "N", "copies of each key, 1 or 2 [1]"},
    {"eviction", "POLICY", "lru, lfu or s3fifo [s3fifo]"},
    {"team", "TEAM", "the owning team [none]"},
    {"lease-ttl", "S", "longest life of an unfilled lease [0]"},
    {"lease-period", "S", "at most one lease win per key per this many seconds [0: off]"},
    {"stale-ttl", "S", "seconds an invalidated item is served stale [0]"},
    {"max-value-bytes", "SIZE", "largest value accepted [0: no limit]"},
    {"ops-per-sec", "N", "requests per second per router [0: no limit]"},
    {"bytes-per-sec", "SIZE", "bytes per second per router [0: no limit]"},
    {NULL, NULL, NULL},
};

/* The settings given on the command line as a JSON object; NULL after printing a bad value. */
static json_t *settings(const struct cli_cmd *cmd, const struct cli_args *a, int *given)
{
    json_t *o = json_object();
    *given = 0;
    for (const struct cli_flag *f = cli_ns_flags; f->name; f++) {
        const char *v = cli_flag(cmd, a, f->name);
        if (v == NULL) continue;
        char field[64];
        size_t i = 0;
        for (; f->name[i] && i < sizeof field - 1; i++) field[i] = f->name[i] == '-' ? '_' : f->name[i];
        field[i] = 0;
        uint64_t x;
        if (!strcmp(f->arg, "SIZE")) {
            if (cli_parse_size(v, &x) < 0) {
                cli_err("shoal %s: --%s %s is not a size: give bytes, or a number with k, m, g or "
                        "t (e.g. 64m, 1g)", cmd->name, f->name, v);
                json_decref(o);
                return NULL;
            }
            json_object_set_new(o, field, json_integer((json_int_t)x));
        } else if (!strcmp(f->arg, "S") || !strcmp(f->arg, "N")) {
            if (cli_parse_uint(v, &x) < 0 || x > (uint64_t)INT64_MAX) {
                cli_err("shoal %s: --%s %s is not a whole number%s", cmd->name, f->name, v,
                        f->arg[0] == 'S' ? " of seconds" : "");
                json_decref(o);
                return NULL;
            }
            json_object_set_new(o, field, json_integer((json_int_t)x));
        } else {
            json_object_set_new(o, field, json_string(v));
        }
        (*given)++;
    }
    return o;
}

static const char *num(json_t *o, const char *k, char *out, size_t len)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v)) return json_string_value(v) ? json_string_value(v) : "-";
    snprintf(out, len, "%lld", (long long)json_integer_value(v));
    return out;
}

static const char *bytes(json_t *o, const char *k, char *out, size_t len)
{
    json_int_t v = json_integer_value(json_object_get(o, k));
    if (v == 0) return "none";
    return cli_human((uint64_t)v, out, len);
}

static const char *secs(json_t *o, const char *k, char *out, size_t len)
{
    json_int_t v = json_integer_value(json_object_get(o, k));
    if (v == 0) return "-";
    snprintf(out, len, "%llds", (long long)v);
    return out;
}

/* The settings of one namespace, one per line. */
static void print_settings(json_t *ns, json_t *reply)
{
    char b[64];
    json_t *share = json_object_get(reply, "share");
    printf("  %-16s %s\n", "pool", json_string_value(json_object_get(ns, "pool")) ?: "-");
    printf("  %-16s %s\n", "team", *(json_string_value(json_object_get(ns, "team")) ?: "") ?
                                        json_string_value(json_object_get(ns, "team")) : "-");
    printf("  %-16s %s", "memory", bytes(ns, "memory", b, sizeof b));
    if (json_integer_value(share)) printf(" (%s on each node)", cli_human((uint64_t)json_integer_value(share), b, sizeof b));
    printf("\n");
    static const char *const rest[] = {"copies", "eviction", "default_ttl", "max_ttl",
                                       "lease_ttl", "lease_period", "stale_ttl",
                                       "max_value_bytes", "ops_per_sec", "bytes_per_sec"};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        printf("  %-16s %s\n", rest[i], num(ns, rest[i], b, sizeof b));
}

int cli_ns_create(const struct cli_cmd *cmd, struct cli_args *a)
{
    int given;
    json_t *body = settings(cmd, a, &given);
    if (body == NULL) return 2;
    json_object_set_new(body, "name", json_string(a->pos[0]));
    if (!json_object_get(body, "pool")) json_object_set_new(body, "pool", json_string("main"));
    json_t *r = cli_call(cli_control_url(cmd, a), "POST", "/v1/namespaces", body);
    json_decref(body);
    if (r == NULL) return 1;
    if (cli_json(cmd, a)) {
        cli_print_json(r);
    } else {
        printf("created namespace %s (topology version %lld)\n", a->pos[0],
               (long long)json_integer_value(json_object_get(r, "version")));
        print_settings(json_object_get(r, "namespace"), r);
    }
    json_decref(r);
    return 0;
}

int cli_ns_update(const struct cli_cmd *cmd, struct cli_args *a)
{
    int given;
    json_t *body = settings(cmd, a, &given);
    if (body == NULL) return 2;
    if (given == 0) {
        json_decref(body);
        return cli_err("shoal ns update: nothing to change: give at least one setting, e.g. "
                       "--memory 128m (`shoal ns update --help` lists them)"), 2;
    }
    char *name = cli_path_escape(a->pos[0]), path[512];
    snprintf(path, sizeof path, "/v1/namespaces/%s", name ? name : "");
    free(name);
    json_t *r = cli_call(cli_control_url(cmd, a), "PUT", path, body);
    json_decref(body);
    if (r == NULL) return 1;
    if (cli_json(cmd, a)) {
        cli_print_json(r);
    } else {
        printf("updated namespace %s (topology version %lld)\n", a->pos[0],
               (long long)json_integer_value(json_object_get(r, "version")));
        print_settings(json_object_get(r, "namespace"), r);
    }
    json_decref(r);
    return 0;
}

int cli_ns_delete(const struct cli_cmd *cmd, struct cli_args *a)
{
    char *name = cli_path_escape(a->pos[0]), path[512];
    snprintf(path, sizeof path, "/v1/namespaces/%s", name ? name : "");
    free(name);
    json_t *r = cli_call(cli_control_url(cmd, a), "DELETE", path, NULL);
    if (r == NULL) return 1;
    if (cli_json(cmd, a)) cli_print_json(r);
    else printf("deleted namespace %s (topology version %lld)\n", a->pos[0],
                (long long)json_integer_value(json_object_get(r, "version")));
    json_decref(r);
    return 0;
}

int cli_ns_list(const struct cli_cmd *cmd, struct cli_args *a)
{
    json_t *r = cli_call(cli_control_url(cmd, a), "GET", "/v1/namespaces", NULL);
    if (r == NULL) return 1;
    if (cli_json(cmd, a)) {
        cli_print_json(r);
        json_decref(r);
        return 0;
    }
    struct cli_table *t = cli_table_new(8, "namespace", "team", "pool", "memory", "copies",
                                        "eviction", "default_ttl", "max_ttl");
    const char *name;
    json_t *ns;
    json_object_foreach(json_object_get(r, "namespaces"), name, ns) {
        char m[32], c[32], d[32], x[32];
        const char *team = json_string_value(json_object_get(ns, "team"));
        cli_table_row(t, name, team && *team ? team : "-",
                      json_string_value(json_object_get(ns, "pool")), bytes(ns, "memory", m, sizeof m),
                      num(ns, "copies", c, sizeof c), json_string_value(json_object_get(ns, "eviction")),
                      secs(ns, "default_ttl", d, sizeof d), secs(ns, "max_ttl", x, sizeof x));
    }
    cli_table_print(t, 0);
    cli_table_free(&t);
    printf("(topology version %lld)\n", (long long)json_integer_value(json_object_get(r, "version")));
    json_decref(r);
    return 0;
}

int cli_ns_show(const struct cli_cmd *cmd, struct cli_args *a)
{
    char *name = cli_path_escape(a->pos[0]), path[512];
    snprintf(path, sizeof path, "/v1/namespaces/%s", name ? name : "");
    free(name);
    json_t *r = cli_call(cli_control_url(cmd, a), "GET", path, NULL);
    if (r == NULL) return 1;
    if (cli_json(cmd, a)) {
        cli_print_json(r);
        json_decref(r);
        return 0;
    }
    printf("namespace %s (topology version %lld)\n", a->pos[0],
           (long long)json_integer_value(json_object_get(r, "version")));
    print_settings(json_object_get(r, "namespace"), r);
    json_t *nodes = json_object_get(r, "nodes");
    if (json_object_size(nodes)) {
        printf("\n");
        struct cli_table *t = cli_table_new(5, "node", "share", "in_place", "failures", "error");
        const char *node;
        json_t *st;
        json_object_foreach(nodes, node, st) {
            char s[32], f[32];
            cli_table_row(t, node, bytes(st, "share", s, sizeof s),
                          json_is_true(json_object_get(st, "in_place")) ? "yes" : "no",
                          num(st, "failures", f, sizeof f),
                          json_string_value(json_object_get(st, "error")));
        }
        cli_table_print(t, 2);
        cli_table_free(&t);
    }
    json_decref(r);
    return 0;
}
