/* top.c — `shoal top`: per-namespace ops/s, hit ratio and memory, summed over every node of
 * every pool (their /metrics), refreshed in place each interval until q or Ctrl-C. Rates are
 * the difference of two samples over the time between them; the hit ratio is the interval's
 * (hits over gets), "-" when it had no gets. --json prints one JSON object per refresh. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/probe.h"

const struct cli_flag cli_top_flags[] = {
    {"interval", "S", "seconds between refreshes [1]"},
    {"iterations", "N", "stop after N refreshes [0: until q or Ctrl-C]"},
    {"once", NULL, "one refresh (after one interval), then stop"},
    {NULL, NULL, NULL},
};

struct ns_sum {
    char name[72];
    char pool[72];
    double ops, hits, misses, memory, quota, items;
};

struct sample {
    double t;
    int n;
    struct ns_sum ns[PROBE_NS_MAX];
};

static volatile sig_atomic_t quit;
static void on_int(int s) { (void)s; quit = 1; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct ns_sum *find(struct sample *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->ns[i].name, name)) return &s->ns[i];
    if (s->n == PROBE_NS_MAX) return NULL;
    struct ns_sum *x = &s->ns[s->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    return x;
}

/* One sample: namespaces from the control plane, figures from every node's /metrics. */
static int take(const char *control, struct sample *s, struct probe_node *pn)
{
    json_t *nss = cli_call(control, "GET", "/v1/namespaces", NULL);
    if (nss == NULL) return -1;
    json_t *pools = cli_call(control, "GET", "/v1/pools", NULL);
    if (pools == NULL) {
        json_decref(nss);
        return -1;
    }
    s->n = 0;
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(nss, "namespaces"), name, v) {
        struct ns_sum *x = find(s, name);
        if (x) snprintf(x->pool, sizeof x->pool, "%s", json_string_value(json_object_get(v, "pool")) ?: "");
    }
    json_t *pool;
    json_object_foreach(json_object_get(pools, "pools"), name, pool) {
        size_t i;
        json_t *n;
        json_array_foreach(json_object_get(pool, "nodes"), i, n) {
            const char *admin = json_string_value(json_object_get(n, "admin"));
            if (admin == NULL || !*admin) continue;
            probe_node(admin, pn);
            for (int k = 0; k < pn->nns; k++) {
                struct nodefigs_ns *p = &pn->ns[k];
                struct ns_sum *x = find(s, p->name);
                if (x == NULL) continue;
                x->ops += p->hits + p->misses + p->sets + p->deletes;
                x->hits += p->hits;
                x->misses += p->misses;
                x->memory += p->memory;
                x->quota += p->quota;
                x->items += p->items;
            }
        }
    }
    s->t = now_s();
    json_decref(nss);
    json_decref(pools);
    return 0;
}

static void show(const struct sample *prev, const struct sample *cur, bool json, bool tty,
                 const char *control)
{
    double dt = cur->t - prev->t;
    if (dt <= 0) dt = 1e-9;
    json_t *out = json ? json_pack("{s:f, s:{}}", "interval", dt, "namespaces") : NULL;
    struct cli_table *t = json ? NULL : cli_table_new(6, "namespace", "pool", "ops/s", "hit ratio",
                                                      "memory", "items");
    for (int i = 0; i < cur->n; i++) {
        const struct ns_sum *c = &cur->ns[i], *p = NULL;
        for (int j = 0; j < prev->n; j++)
            if (!strcmp(prev->ns[j].name, c->name)) p = &prev->ns[j];
        double ops = p ? (c->ops - p->ops) / dt : 0;
        double gets = p ? (c->hits + c->misses) - (p->hits + p->misses) : 0;
        double ratio = gets > 0 ? (c->hits - p->hits) / gets : -1;
        if (ops < 0) ops = 0; /* a node restarted between the samples */
        if (json) {
            json_object_set_new(json_object_get(out, "namespaces"), c->name, json_pack(
                "{s:s, s:f, s:o, s:f, s:f, s:f}", "pool", c->pool, "ops_per_sec", ops,
                "hit_ratio", ratio >= 0 ? json_real(ratio) : json_null(), "memory_bytes", c->memory,
                "quota_bytes", c->quota, "items", c->items));
            continue;
        }
        char o[32], r[32], m[64], q[32], b[32], it[32];
        snprintf(o, sizeof o, "%.0f", ops);
        if (ratio >= 0) snprintf(r, sizeof r, "%.1f%%", 100 * ratio);
        else snprintf(r, sizeof r, "-");
        if (c->quota > 0) snprintf(m, sizeof m, "%s / %s", cli_human((uint64_t)c->memory, b, sizeof b),
                                   cli_human((uint64_t)c->quota, q, sizeof q));
        else snprintf(m, sizeof m, "%s", cli_human((uint64_t)c->memory, b, sizeof b));
        snprintf(it, sizeof it, "%.0f", c->items);
        cli_table_row(t, c->name, *c->pool ? c->pool : NULL, o, r, m, it);
    }
    if (json) {
        char *s = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS);
        if (s) printf("%s\n", s);
        free(s);
        json_decref(out);
    } else {
        if (tty) printf("\033[H\033[J");
        time_t now = time(NULL);
        char ts[32];
        strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
        printf("shoal top — %s — control plane %s — every %.1f s%s\n\n", ts, control, dt,
               tty ? " (q quits)" : "");
        cli_table_print(t, 0);
        if (!tty) printf("\n");
        cli_table_free(&t);
    }
    fflush(stdout);
}

/* Wait `secs`, ending early on q (or Ctrl-C) from a terminal; true when asked to quit. */
static bool wait_or_quit(double secs, bool keys)
{
    double end = now_s() + secs;
    while (!quit) {
        double left = end - now_s();
        if (left <= 0) return false;
        struct pollfd pf = {.fd = 0, .events = POLLIN};
        int r = poll(keys ? &pf : NULL, keys ? 1 : 0, (int)(left * 1000) + 1);
        if (r == 1) {
            char c;
            if (read(0, &c, 1) == 1 && (c == 'q' || c == 'Q' || c == 3)) return true;
        }
    }
    return true;
}

int cli_top(const struct cli_cmd *cmd, struct cli_args *a)
{
    const char *control = cli_control_url(cmd, a);
    bool json = cli_json(cmd, a);
    uint64_t iters = 0, interval_s = 1;
    const char *v;
    if ((v = cli_flag(cmd, a, "iterations")) && cli_parse_uint(v, &iters) < 0)
        return cli_err("shoal top: --iterations takes a whole number"), 2;
    if ((v = cli_flag(cmd, a, "interval")) &&
        (cli_parse_uint(v, &interval_s) < 0 || interval_s == 0 || interval_s > 3600))
        return cli_err("shoal top: --interval takes seconds, 1..3600"), 2;
    if (cli_switch(cmd, a, "once")) iters = 1;
    bool tty = !json && isatty(1);
    bool keys = tty && isatty(0);
    struct termios saved;
    if (keys && tcgetattr(0, &saved) == 0) {
        struct termios raw = saved;
        raw.c_lflag &= (tcflag_t)~(ICANON | ECHO);
        tcsetattr(0, TCSANOW, &raw);
    } else {
        keys = false;
    }
    struct sigaction sa = {.sa_handler = on_int};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    struct sample *s[2] = {malloc(sizeof(struct sample)), malloc(sizeof(struct sample))};
    struct probe_node *pn = malloc(sizeof *pn);
    int rc = 0;
    if (s[0] == NULL || s[1] == NULL || pn == NULL) {
        rc = cli_err("shoal top: out of memory");
        goto out;
    }
    if (take(control, s[0], pn) < 0) {
        rc = 1;
        goto out;
    }
    for (uint64_t i = 0; iters == 0 || i < iters; i++) {
        if (wait_or_quit((double)interval_s, keys)) break;
        struct sample *prev = s[i & 1], *cur = s[(i + 1) & 1];
        if (take(control, cur, pn) < 0) {
            rc = 1;
            break;
        }
        show(prev, cur, json, tty, control);
    }
out:
    if (keys) tcsetattr(0, TCSANOW, &saved);
    free(s[0]);
    free(s[1]);
    free(pn);
    return rc;
}
