/* args.c — the CLI's command lines: each command declares its flags once in a table (name,
 * value name, help); from it come parsing (--name VALUE, --name=VALUE, switches, positional
 * arguments anywhere, "--" ending flags) and the command's --help. Four common flags are
 * accepted by every command. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const struct cli_flag common_flags[] = {
    {"control", "URL", "shoal-control's URL [the local cluster's (see --dir), else " CLI_DEFAULT_CONTROL "]"},
    {"dir", "DIR", "the local cluster's directory [$SHOAL_DIR, else ~/.local/state/shoal]"},
    {"json", NULL, "print JSON instead of text"},
    {"help", NULL, "print this help"},
    {NULL, NULL, NULL},
};

static int nflags(const struct cli_flag *f)
{
    int n = 0;
    while (f && f[n].name) n++;
    return n;
}

/* Index of `name` (len bytes) over the command's flags then the common ones, or -1. */
static int find_flag(const struct cli_cmd *cmd, const char *name, size_t len)
{
    int n = nflags(cmd->flags);
    for (int i = 0; i < n; i++)
        if (strlen(cmd->flags[i].name) == len && !strncmp(cmd->flags[i].name, name, len)) return i;
    for (int i = 0; common_flags[i].name; i++)
        if (strlen(common_flags[i].name) == len && !strncmp(common_flags[i].name, name, len))
            return n + i;
    return -1;
}

static const struct cli_flag *flag_at(const struct cli_cmd *cmd, int i)
{
    int n = nflags(cmd->flags);
    return i < n ? &cmd->flags[i] : &common_flags[i - n];
}

int cli_parse(const struct cli_cmd *cmd, int argc, char **argv, struct cli_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--")) {
            a->rest = argv + i + 1;
            a->nrest = argc - i - 1;
            break;
        }
        if (!strcmp(s, "-h")) s = "--help";
        if (s[0] == '-' && s[1] == '-') {
            const char *name = s + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            int k = find_flag(cmd, name, len);
            if (k < 0) {
                fprintf(stderr, "shoal %s: unknown flag --%.*s; `shoal %s --help` lists them\n",
                        cmd->name, (int)len, name, cmd->name);
                return -1;
            }
            const struct cli_flag *f = flag_at(cmd, k);
            if (f->arg == NULL) {
                if (eq) {
                    fprintf(stderr, "shoal %s: --%s takes no value\n", cmd->name, f->name);
                    return -1;
                }
                a->val[k] = "1";
            } else if (eq) {
                a->val[k] = eq + 1;
            } else if (i + 1 < argc) {
                a->val[k] = argv[++i];
            } else {
                fprintf(stderr, "shoal %s: --%s needs a value (%s)\n", cmd->name, f->name, f->arg);
                return -1;
            }
            continue;
        }
        if (s[0] == '-' && s[1] != 0) {
            fprintf(stderr, "shoal %s: unknown flag %s; `shoal %s --help` lists them\n", cmd->name,
                    s, cmd->name);
            return -1;
        }
        if (a->npos == CLI_POS_MAX) {
            fprintf(stderr, "shoal %s: too many arguments\n", cmd->name);
            return -1;
        }
        a->pos[a->npos++] = s;
    }
    if (cli_switch(cmd, a, "help")) return 0;
    if (a->npos < cmd->min_pos || a->npos > cmd->max_pos) {
        fprintf(stderr, "shoal %s: %s; usage: shoal %s %s\n", cmd->name,
                a->npos < cmd->min_pos ? "missing arguments" : "too many arguments", cmd->name,
                cmd->usage);
        return -1;
    }
    return 0;
}

const char *cli_flag(const struct cli_cmd *cmd, const struct cli_args *a, const char *name)
{
    int k = find_flag(cmd, name, strlen(name));
    return k < 0 ? NULL : a->val[k];
}

bool cli_switch(const struct cli_cmd *cmd, const struct cli_args *a, const char *name)
{
    return cli_flag(cmd, a, name) != NULL;
}

int cli_parse_uint(const char *s, uint64_t *out)
{
    if (s == NULL || !isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    if (s == NULL || !isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return -1;
    unsigned shift = 0;
    switch (tolower((unsigned char)*end)) {
    case 'k': shift = 10; end++; break;
    case 'm': shift = 20; end++; break;
    case 'g': shift = 30; end++; break;
    case 't': shift = 40; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return -1;
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static void print_flags(const struct cli_flag *f)
{
    for (; f && f->name; f++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", f->name, f->arg ? " " : "", f->arg ? f->arg : "");
        printf("  %-24s %s\n", left, f->help);
    }
}

void cli_usage(const struct cli_cmd *cmd)
{
    printf("Usage: shoal %s %s\n%s\n\nFlags:\n", cmd->name, cmd->usage, cmd->summary);
    print_flags(cmd->flags);
    print_flags(common_flags);
}
