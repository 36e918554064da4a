/* main.c — shoal, the command-line tool: finds the command (`shoal up`, `shoal ns create`...),
 * parses its flags, and resolves the settings every command shares: the local cluster's
 * directory, the control plane's URL, text or JSON output. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/proc.h"

static const struct cli_cmd commands[] = {
    {"up", "[flags] [-- ROUTER_FLAGS...]",
     "Start a local cluster: shoal-control, three shoal-nodes (pool main), a gutter node and a "
     "shoal-router, wait until all are healthy, print what runs where, and return (or stay, "
     "with --foreground).",
     cli_up_flags, 0, 0, cli_up},
    {"down", "[flags]", "Stop the local cluster that `shoal up` started from DIR.", cli_down_flags,
     0, 0, cli_down},
    {"ns create", "NAME [flags]", "Create a namespace.", cli_ns_flags, 1, 1, cli_ns_create},
    {"ns list", "[flags]", "List the namespaces.", NULL, 0, 0, cli_ns_list},
    {"ns show", "NAME [flags]", "Show a namespace, with its quota's push state on each node.",
     NULL, 1, 1, cli_ns_show},
    {"ns update", "NAME [flags]", "Change a namespace's settings (those given; others keep their "
     "value).", cli_ns_flags, 1, 1, cli_ns_update},
    {"ns delete", "NAME [flags]", "Delete a namespace.", NULL, 1, 1, cli_ns_delete},
    {"pool show", "[POOL] [flags]", "Show every pool, or one: its nodes, their slots, its "
     "namespaces.", NULL, 0, 1, cli_pool_show},
    {"node add", "POOL HOST:PORT [--admin HOST:PORT] [flags]", "Add a node to a pool: it takes "
     "its share of the slots from the others.", cli_node_flags, 2, 2, cli_node_add},
    {"node remove", "POOL HOST:PORT [flags]", "Remove a node from a pool: its slots go to the "
     "others.", NULL, 2, 2, cli_node_remove},
    {"node drain", "POOL HOST:PORT [--force] [flags]", "Hand a node's slots to their replicas "
     "(copies 2) with nothing lost, then make it their replica: before taking it down.",
     cli_drain_flags, 2, 2, cli_node_drain},
    {"status", "[flags]", "The cluster at a glance: each node's health, slots, memory, items and "
     "hit ratio, and the topology version.", NULL, 0, 0, cli_status},
    {"top", "[flags]", "Live per-namespace ops/s, hit ratio and memory, refreshed every second "
     "until q or Ctrl-C.", cli_top_flags, 0, 0, cli_top},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "Usage: shoal COMMAND [ARGS] [flags]\n"
               "The shoal command-line tool: run a local cluster, manage namespaces, pools and "
               "nodes through shoal-control, watch the cluster.\n\nCommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s", commands[i].name);
        fprintf(f, "  %-13s %s\n", left, commands[i].summary);
    }
    fprintf(f, "\nEvery command takes --control URL, --dir DIR, --json and --help; "
               "`shoal COMMAND --help` lists its flags.\nSHOAL_TOKEN, when set, is sent as "
               "`Authorization: Bearer`.\n");
}

static char dir_buf[PATH_MAX];

const char *cli_dir(const struct cli_cmd *cmd, const struct cli_args *a)
{
    const char *d = cli_flag(cmd, a, "dir");
    if (d == NULL) d = getenv("SHOAL_DIR");
    if (d && *d) return d;
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(dir_buf, sizeof dir_buf, "%s/shoal", xdg);
    else snprintf(dir_buf, sizeof dir_buf, "%s/.local/state/shoal", home && *home ? home : "/tmp");
    return dir_buf;
}

static char control_buf[512];

const char *cli_control_url(const struct cli_cmd *cmd, const struct cli_args *a)
{
    const char *c = cli_flag(cmd, a, "control");
    if (c) return c;
    json_t *rec = proc_record_load(cli_dir(cmd, a));
    const char *u = rec ? json_string_value(json_object_get(rec, "control")) : NULL;
    snprintf(control_buf, sizeof control_buf, "%s", u ? u : CLI_DEFAULT_CONTROL);
    json_decref(rec);
    return control_buf;
}

bool cli_json(const struct cli_cmd *cmd, const struct cli_args *a)
{
    return cli_switch(cmd, a, "json");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++) {
        const struct cli_cmd *c = &commands[i];
        const char *sp = strchr(c->name, ' ');
        int words = 1;
        if (sp) {
            if (argc < 3 || strncmp(argv[1], c->name, (size_t)(sp - c->name)) ||
                argv[1][sp - c->name] || strcmp(argv[2], sp + 1))
                continue;
            words = 2;
        } else if (strcmp(argv[1], c->name)) {
            continue;
        }
        struct cli_args a;
        if (cli_parse(c, argc - 1 - words, argv + 1 + words, &a) < 0) return 2;
        if (cli_switch(c, &a, "help")) {
            cli_usage(c);
            return 0;
        }
        return c->run(c, &a);
    }
    /* a group with no (or an unknown) subcommand: list that group's commands */
    bool group = false;
    for (size_t i = 0; i < NCOMMANDS; i++) {
        const char *sp = strchr(commands[i].name, ' ');
        if (sp && !strncmp(argv[1], commands[i].name, (size_t)(sp - commands[i].name)) &&
            argv[1][sp - commands[i].name] == 0) {
            if (!group) fprintf(stderr, "shoal %s: which one?\n", argv[1]);
            group = true;
            fprintf(stderr, "  shoal %s %s\n", commands[i].name, commands[i].usage);
        }
    }
    if (group) return (argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) ? 0 : 2;
    fprintf(stderr, "shoal: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
