/* dash.c — the dashboard's routes (see dash.h). The page and its script are src/control/www/,
 * built into the binary with .incbin (the Makefile makes dash.o depend on them), so the page
 * works from the binary alone, with no network and no files to install beside it. */
#include "control/dash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "control/control.h"
#include "control/sampler.h"

#define ASSET(sym, file)                                                                         \
    __asm__(".section .rodata\n"                                                                 \
            ".balign 16\n"                                                                       \
            ".global " #sym "\n"                                                                 \
            ".hidden " #sym "\n" #sym ":\n"                                                      \
            ".incbin \"" file "\"\n"                                                             \
            ".global " #sym "_end\n"                                                             \
            ".hidden " #sym "_end\n" #sym "_end:\n"                                              \
            ".byte 0\n"                                                                          \
            ".previous\n");                                                                      \
    extern const char sym[], sym##_end[]
ASSET(shoal_dash_html, "src/control/www/index.html");
ASSET(shoal_dash_js, "src/control/www/dash.js");

#define CHART_JS_MAX (8u << 20)

static char *chart_js;
static size_t chart_js_len;

void dash_setup(const char *path)
{
    FILE *f = path && *path ? fopen(path, "rb") : NULL;
    struct buf b;
    buf_init(&b);
    if (f != NULL) {
        char tmp[65536];
        size_t n;
        while ((n = fread(tmp, 1, sizeof tmp, f)) > 0 && buf_used(&b) + n <= CHART_JS_MAX)
            if (buf_append(&b, tmp, n) < 0) break;
        int bad = ferror(f) || !feof(f);
        fclose(f);
        if (!bad && buf_used(&b) > 0 && (chart_js = malloc(buf_used(&b))) != NULL) {
            memcpy(chart_js, buf_start(&b), buf_used(&b));
            chart_js_len = buf_used(&b);
        }
        buf_release(&b);
    }
    if (chart_js == NULL)
        log_warn("dashboard: cannot read Chart.js from --chart-js %s (%s): the page shows "
                 "tables but no charts; install libjs-chart.js or point --chart-js at chart.min.js",
                 path ? path : "(none)", f == NULL ? strerror(errno) : "read error or too large");
}

void dash_teardown(void)
{
    free(chart_js);
    chart_js = NULL;
    chart_js_len = 0;
}

static int get_only(const char *method, struct buf *out)
{
    if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) return 0;
    buf_append_str(out, "{\"error\": \"use GET here\", \"field\": \"method\", \"rule\": \"method\"}\n");
    return 405;
}

static int asset(struct buf *out, const char *type, const char *start, const char *end)
{
    admin_set_type(type);
    buf_append(out, start, (size_t)(end - start));
    return 200;
}

int dash_page_route(void *ctx, const char *method, const char *rest, const char *body,
                    size_t len, struct buf *out)
{
    int st = get_only(method, out);
    if (st) return st;
    return asset(out, "text/html; charset=utf-8", shoal_dash_html, shoal_dash_html_end);
}

int dash_static_route(void *ctx, const char *method, const char *rest, const char *body,
                      size_t len, struct buf *out)
{
    int st = get_only(method, out);
    if (st) return st;
    if (!strcmp(rest, "/dash.js"))
        return asset(out, "text/javascript; charset=utf-8", shoal_dash_js, shoal_dash_js_end);
    if (!strcmp(rest, "/chart.js") && chart_js)
        return asset(out, "text/javascript; charset=utf-8", chart_js, chart_js + chart_js_len);
    admin_set_type("text/plain");
    buf_append_str(out, !strcmp(rest, "/chart.js")
                            ? "Chart.js is not installed: see shoal-control --chart-js\n"
                            : "not found: /static/dash.js or /static/chart.js\n");
    return 404;
}

int dash_stats_route(void *ctx, const char *method, const char *rest, const char *body,
                     size_t len, struct buf *out)
{
    struct control *c = ctx;
    int st = get_only(method, out);
    if (st) return st;
    unsigned long long since = 0;
    if (*rest) {
        char *end;
        errno = 0;
        if (strncmp(rest, "?since=", 7) || rest[7] < '0' || rest[7] > '9' ||
            (since = strtoull(rest + 7, &end, 10), *end) || errno) {
            buf_append_str(out, "{\"error\": \"GET /v1/stats, or /v1/stats?since=<seq> for the "
                                "samples after seq\", \"field\": \"since\", \"rule\": \"integer\"}\n");
            return 400;
        }
    }
    json_t *o = sampler_json(c->stats, since);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(o);
    if (s == NULL) {
        buf_append_str(out, "{\"error\": \"out of memory\", \"field\": \"body\", \"rule\": \"memory\"}\n");
        return 503;
    }
    buf_append_str(out, s);
    buf_append_str(out, "\n");
    free(s);
    return 200;
}
