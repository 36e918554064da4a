/* cli.h — the shoal command-line tool (`build/bin/shoal`): what its commands share.
 *
 * One file per concept: main.c (dispatch, help), args.c (flag tables and values), api.c (calls
 * to shoal-control over src/common/httpc, readable errors), out.c (tables, sizes, JSON),
 * layout.c (the local cluster's record under DIR), cluster.c (shoal up/down), ns.c (namespace
 * commands), pool.c (pool show, node add/remove/drain), probe.c (a node's health and figures),
 * status.c (shoal status), top.c (shoal top) and token.c (the bearer token).
 *
 * Exit status: 0 done, 1 refused or failed (the message says why and what to do), 2 usage. */
#ifndef SHOAL_CLI_CLI_H
#define SHOAL_CLI_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define CLI_FLAGS_MAX 32
#define CLI_POS_MAX 8
#define CLI_DEFAULT_CONTROL "http://127.0.0.1:11500"

/* One flag of a command: --name ARG (arg names the value in help; NULL for a switch). */
struct cli_flag {
    const char *name;
    const char *arg;
    const char *help;
};

/* What the command line held: val[i] is the value of flags[i] (NULL when not given; "1" for a
 * switch); pos the positional arguments; rest what followed "--". */
struct cli_args {
    const char *val[CLI_FLAGS_MAX];
    const char *pos[CLI_POS_MAX];
    int npos;
    char **rest;
    int nrest;
};

struct cli_cmd;
typedef int (*cli_run_fn)(const struct cli_cmd *cmd, struct cli_args *a);

struct cli_cmd {
    const char *name;    /* "ns create" */
    const char *usage;   /* "NAME [flags]" */
    const char *summary; /* one line */
    const struct cli_flag *flags; /* terminated by a NULL name; the common flags are added */
    int min_pos, max_pos;
    cli_run_fn run;
};

/* args.c */
/* Parse argv against the command's flags plus the common ones (--control, --dir, --json,
 * --help). Prints a usage error and returns -1 on a bad command line. */
int cli_parse(const struct cli_cmd *cmd, int argc, char **argv, struct cli_args *a);
/* The value of flag `name` (the command's or a common one), or NULL when not given. */
const char *cli_flag(const struct cli_cmd *cmd, const struct cli_args *a, const char *name);
bool cli_switch(const struct cli_cmd *cmd, const struct cli_args *a, const char *name);
/* "64m", "1g", "512k", "1048576" (powers of 1024; an optional trailing b/B or iB) -> bytes. */
int cli_parse_size(const char *s, uint64_t *out);
int cli_parse_uint(const char *s, uint64_t *out);
void cli_usage(const struct cli_cmd *cmd);

/* main.c: the resolved common settings */
const char *cli_dir(const struct cli_cmd *cmd, const struct cli_args *a);
const char *cli_control_url(const struct cli_cmd *cmd, const struct cli_args *a);
bool cli_json(const struct cli_cmd *cmd, const struct cli_args *a);

/* api.c */
/* Send METHOD url-path to the control plane and return the parsed reply on 2xx (the caller
 * json_decref's it). On anything else print what went wrong and what to do, and return NULL.
 * body may be NULL. The token (cli_token()) goes as `Authorization: Bearer`. */
json_t *cli_call(const char *control, const char *method, const char *path, json_t *body);
/* cli_call with its own timeout (a drain waits for handoffs). */
json_t *cli_call_t(const char *control, const char *method, const char *path, json_t *body,
                   unsigned timeout_ms);
/* A plain GET of any URL within timeout_ms: 0 with *status and the body (NUL-terminated, caller
 * frees), or -1 with a message in err. */
int cli_http_get(const char *url, unsigned timeout_ms, long *status, char **body, char *err,
                 size_t errlen);
/* Percent-encode a path segment (node addresses keep their ':'). Caller frees. */
char *cli_path_escape(const char *s);

/* token.c */
/* The CLI's token file: $XDG_CONFIG_HOME/shoal/token, else ~/.config/shoal/token. */
const char *cli_token_path(void);
/* The token to send: SHOAL_TOKEN, else the token file's; NULL when neither. *from names the
 * source (for messages). */
const char *cli_token(const char **from);
/* `shoal up`: the local cluster's admin token into tok (SHOAL_TOKEN, else the token file's,
 * made when missing), and DIR/auth.json and DIR/token written for the daemons (0600). *where
 * says where the token is kept. 0, or -1 with err. */
int cli_token_for_up(const char *dir, char *tok, size_t len, const char **where, char *err,
                     size_t errlen);

/* out.c */
/* A text table: add rows of cells, then print with aligned columns. */
struct cli_table;
struct cli_table *cli_table_new(int ncols, ...);
void cli_table_row(struct cli_table *t, ...); /* ncols strings (NULL prints "-") */
void cli_table_print(struct cli_table *t, int indent);
void cli_table_free(struct cli_table **t);
/* 1536 -> "1.5K", 67108864 -> "64M". */
const char *cli_human(uint64_t bytes, char *out, size_t len);
void cli_print_json(json_t *j);
int cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* prints, returns 1 */

/* commands */
int cli_up(const struct cli_cmd *cmd, struct cli_args *a);
int cli_down(const struct cli_cmd *cmd, struct cli_args *a);
int cli_ns_create(const struct cli_cmd *cmd, struct cli_args *a);
int cli_ns_list(const struct cli_cmd *cmd, struct cli_args *a);
int cli_ns_show(const struct cli_cmd *cmd, struct cli_args *a);
int cli_ns_update(const struct cli_cmd *cmd, struct cli_args *a);
int cli_ns_delete(const struct cli_cmd *cmd, struct cli_args *a);
int cli_pool_show(const struct cli_cmd *cmd, struct cli_args *a);
int cli_node_add(const struct cli_cmd *cmd, struct cli_args *a);
int cli_node_remove(const struct cli_cmd *cmd, struct cli_args *a);
int cli_node_drain(const struct cli_cmd *cmd, struct cli_args *a);
int cli_status(const struct cli_cmd *cmd, struct cli_args *a);
int cli_top(const struct cli_cmd *cmd, struct cli_args *a);

extern const struct cli_flag cli_up_flags[], cli_down_flags[], cli_ns_flags[],
    cli_node_flags[], cli_top_flags[], cli_drain_flags[];

#endif
