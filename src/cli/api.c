/* api.c — the CLI's calls over HTTP (src/common/httpc): to shoal-control's API, and plain GETs
 * of a node's /healthz and /metrics. A refusal is printed readably: the API's
 * {"error", "field", "rule"} body becomes the message with the field and rule after it, and an
 * unreachable control plane is named with what to do. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/httpc.h"

#define CLI_API_TIMEOUT_MS 10000

/* One client for the whole run, so its connections are kept alive: `shoal up` polls /healthz
 * every few milliseconds, and a new connection per poll would leave a TIME_WAIT socket on an
 * ephemeral port each time, ports a node about to start may have been given. */
static struct httpc *shared;
static const char *token_from; /* where the token sent came from; NULL: none sent */

static struct httpc *client(void)
{
    if (shared) return shared;
    struct httpc *h = httpc_create(0);
    if (h == NULL) return NULL;
    const char *tok = cli_token(&token_from);
    if (tok == NULL) token_from = NULL;
    if (tok) {
        char line[1024];
        snprintf(line, sizeof line, "Authorization: Bearer %s", tok);
        if (httpc_add_header(h, line) < 0) httpc_destroy(&h);
    }
    return shared = h;
}

/* What to do after a 401 or 403, naming where the token came from. */
static const char *auth_hint(long status, json_t *j)
{
    static char h[PATH_MAX + 400];
    const char *file = cli_token_path();
    if (status == 403) {
        const char *team = json_string_value(json_object_get(j, "team"));
        snprintf(h, sizeof h, "the token sent (from %s) %s%s%s may change only that team's "
                 "namespaces; use an admin token for this (SHOAL_TOKEN, or %s)", token_from,
                 team ? "is team " : "is a team's token and", team ? team : "", team ? "'s and" : "",
                 file);
    } else if (token_from == NULL) {
        snprintf(h, sizeof h, "this control plane requires a token: export SHOAL_TOKEN=<token>, "
                 "or put it in %s (`shoal up` writes the local cluster's there)", file);
    } else {
        if (token_from[0] == '/')
            snprintf(h, sizeof h, "the token in %s is not one this control plane knows: set "
                     "SHOAL_TOKEN to one it does (a local cluster's own is in DIR/token)",
                     token_from);
        else
            snprintf(h, sizeof h, "the token in SHOAL_TOKEN is not one this control plane knows: "
                     "fix it, or unset it to send the one in %s (`shoal up` writes the local "
                     "cluster's there)", file);
    }
    return h;
}

/* httpc's message without its "METHOD URL: " prefix, in plain words for the usual cases. */
static const char *detail(const char *err, const char *url)
{
    const char *p = strstr(err, url);
    if (p) {
        p += strlen(url);
        if (p[0] == ':' && p[1] == ' ') p += 2;
    } else {
        p = err;
    }
    if (strstr(p, "Couldn't connect") || strstr(p, "onnection refused")) return "connection refused";
    if (strstr(p, "imed out") || strstr(p, "Timeout")) return "no answer in time";
    if (strstr(p, "resolve")) return "the host name does not resolve";
    return p;
}

char *cli_path_escape(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(3 * n + 1), *o = out;
    if (out == NULL) return NULL;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            strchr("-_.~:", c))
            *o++ = (char)c;
        else
            o += sprintf(o, "%%%02X", c);
    }
    *o = 0;
    return out;
}

json_t *cli_call(const char *control, const char *method, const char *path, json_t *body)
{
    return cli_call_t(control, method, path, body, CLI_API_TIMEOUT_MS);
}

json_t *cli_call_t(const char *control, const char *method, const char *path, json_t *body,
                   unsigned timeout_ms)
{
    char url[2048], err[1024];
    size_t clen = strlen(control);
    while (clen > 0 && control[clen - 1] == '/') clen--;
    snprintf(url, sizeof url, "%.*s%s", (int)clen, control, path);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct httpc *h = client();
    if (h == NULL || (body && text == NULL)) {
        free(text);
        cli_err("shoal: out of memory");
        return NULL;
    }
    struct httpc_reply r;
    httpc_reply_init(&r);
    int rc = httpc_request(h, method, url, text, text ? strlen(text) : 0, timeout_ms, &r,
                           err, sizeof err);
    free(text);
    if (rc < 0) {
        cli_err("shoal: cannot reach the control plane at %.*s: %s — is the cluster up? run "
                "`shoal up`, or point --control at it",
                (int)clen, control, detail(err, url));
        httpc_reply_release(&r);
        return NULL;
    }
    json_error_t je;
    json_t *j = buf_used(&r.body) ? json_loadb(buf_start(&r.body), buf_used(&r.body), 0, &je) : NULL;
    if (r.status >= 200 && r.status < 300 && j != NULL) {
        httpc_reply_release(&r);
        return j;
    }
    const char *msg = j ? json_string_value(json_object_get(j, "error")) : NULL;
    if (msg) {
        const char *field = json_string_value(json_object_get(j, "field"));
        const char *rule = json_string_value(json_object_get(j, "rule"));
        fprintf(stderr, "shoal: refused (HTTP %ld): %s\n", r.status, msg);
        if (field || rule)
            fprintf(stderr, "  field: %s, rule: %s\n", field ? field : "-", rule ? rule : "-");
        const char *hint = NULL;
        bool ns = !strncmp(path, "/v1/namespaces", 14);
        if (r.status == 401 || r.status == 403) hint = auth_hint(r.status, j);
        else if (rule && !strcmp(rule, "default_kept")) hint = "`shoal ns update default ...` changes it";
        else if (ns && r.status == 409 && rule && !strcmp(rule, "unique"))
            hint = "`shoal ns update NAME ...` changes an existing namespace";
        else if (ns && r.status == 404) hint = "`shoal ns list` shows the namespaces";
        else if (r.status == 404) hint = "`shoal pool show` lists the pools and their nodes";
        if (hint) fprintf(stderr, "  %s\n", hint);
    } else if (r.status >= 200 && r.status < 300) {
        fprintf(stderr, "shoal: the control plane at %.*s answered %s %s with no JSON; is it "
                "shoal-control?\n", (int)clen, control, method, path);
    } else {
        int n = (int)(buf_used(&r.body) > 300 ? 300 : buf_used(&r.body));
        fprintf(stderr, "shoal: %s %s answered HTTP %ld: %.*s\n", method, url, r.status, n,
                n ? buf_start(&r.body) : "");
    }
    json_decref(j);
    httpc_reply_release(&r);
    return NULL;
}

int cli_http_get(const char *url, unsigned timeout_ms, long *status, char **body, char *err,
                 size_t errlen)
{
    struct httpc *h = client();
    if (h == NULL) return snprintf(err, errlen, "out of memory"), -1;
    struct httpc_reply r;
    httpc_reply_init(&r);
    char e[1024];
    int rc = httpc_get(h, url, timeout_ms, &r, e, sizeof e);
    if (rc < 0) {
        snprintf(err, errlen, "%s", detail(e, url));
        httpc_reply_release(&r);
        return -1;
    }
    *status = r.status;
    *body = strndup(buf_used(&r.body) ? buf_start(&r.body) : "", buf_used(&r.body));
    httpc_reply_release(&r);
    if (*body == NULL) return snprintf(err, errlen, "out of memory"), -1;
    return 0;
}
