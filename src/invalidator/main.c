/* main.c — shoal-invalidator: PostgreSQL commits become cache deletes in every cluster (issue
 * 14; docs/invalidator.md).
 *
 * Start-up order: options (--options FILE for `name = value` lines), the JSON configuration
 * (--config FILE), PostgreSQL prepared (tables, replica identity, invalidation table,
 * publication, slot; a problem a retry cannot fix stops the process with exit status 2),
 * delivery, the admin listener, the cleaner, then the reader thread. SIGINT/SIGTERM stop in
 * reverse order. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/options.h"
#include "common/sigs.h"
#include "common/slot.h"
#include "invalidator/ctl.h"
#include "invalidator/deliver.h"
#include "invalidator/invalidator.h"
#include "invalidator/rows.h"
#include "invalidator/setup.h"

static struct inv inv;

/* A plain copy of the figures, for the metrics table. */
struct figs_snap {
    INV_METRICS(METRIC_FIELD)
};
static const struct metric_desc fig_desc[] = {
#define X(name, kind, help) METRIC_DESC(struct figs_snap, name, kind, help),
    INV_METRICS(X)
#undef X
};

static void metrics(void *ctx, struct buf *out)
{
    struct inv *v = ctx;
    struct figs_snap s;
#define X(name, kind, help) s.name = atomic_load(&v->figs.name);
    INV_METRICS(X)
#undef X
    metrics_write_prom(out, "shoal_invalidator", fig_desc, sizeof fig_desc / sizeof *fig_desc, &s,
                       NULL);
    deliver_metrics(v->d, out);
    inv_ctl_metrics(v->ctl, out);
}

/* GET /healthz: 200 while the replication stream is up and every cluster reachable, 503
 * otherwise; the body says which, with the confirmed LSN and the lag (replaces the admin
 * listener's plain "ok"). */
static int status_route(void *ctx, const char *method, const char *rest, const char *body,
                        size_t len, struct buf *out)
{
    struct inv *v = ctx;
    int up = (int)atomic_load(&v->figs.streaming), ok = up && deliver_healthy(v->d);
    buf_printf(out,
               "{\"healthy\": %s, \"streaming\": %s, \"confirmed_lsn\": %llu, \"lag_bytes\": "
               "%llu, \"lag_seconds\": %llu}\n",
               ok ? "true" : "false", up ? "true" : "false",
               (unsigned long long)atomic_load(&v->figs.confirmed_lsn),
               (unsigned long long)atomic_load(&v->figs.lag_bytes),
               (unsigned long long)atomic_load(&v->figs.lag_seconds));
    return ok ? 200 : 503;
}

/* POST /v1/replay {"slots": [n, "lo-hi", ...], "since_s": S, "cluster": "name"}: send again
 * the deletes of the last S seconds whose keys fall in those slots. */
static int replay_route(void *ctx, const char *method, const char *rest, const char *body,
                        size_t len, struct buf *out)
{
    struct inv *v = ctx;
    if (strcmp(method, "POST")) {
        buf_printf(out, "{\"error\": \"POST a JSON body {\\\"slots\\\": [...], "
                        "\\\"since_s\\\": N}\"}\n");
        return 405;
    }
    json_error_t je;
    json_t *doc = json_loadb(body, len, 0, &je);
    json_t *slots = json_object_get(doc, "slots"), *since = json_object_get(doc, "since_s");
    json_t *cl = json_object_get(doc, "cluster");
    const char *bad = NULL, *key;
    json_t *val;
    char unknown[120];
    json_object_foreach(doc, key, val) {
        if (strcmp(key, "slots") && strcmp(key, "since_s") && strcmp(key, "cluster")) {
            /* a typo ("sinse_s") must not quietly widen the replay to its default */
            char name[64];
            log_clean(name, sizeof name, key, strlen(key));
            snprintf(unknown, sizeof unknown, "unknown field \"%s\" (slots, since_s, cluster)",
                     name);
            bad = unknown;
            break;
        }
    }
    if (doc == NULL)
        bad = "the body is not JSON: POST {\"slots\": [...], \"since_s\": N}";
    else if (bad == NULL && !json_is_array(slots))
        bad = "\"slots\" must be a list of slot numbers or \"lo-hi\"";
    else if (bad == NULL && since && (!json_is_integer(since) || json_integer_value(since) < 0))
        bad = "\"since_s\" must be a number of seconds, 0 or more";
    else if (bad == NULL && cl && !json_is_string(cl))
        bad = "\"cluster\" must be a cluster's name";
    uint16_t *list = NULL;
    size_t n = 0;
    if (bad == NULL && (list = malloc(SLOT_COUNT * sizeof *list)) == NULL) bad = "out of memory";
    static unsigned char seen[SLOT_COUNT];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; bad == NULL && i < json_array_size(slots); i++) {
        json_t *e = json_array_get(slots, i);
        long lo, hi;
        int end = 0;
        if (json_is_integer(e)) {
            lo = hi = (long)json_integer_value(e);
        } else if (!json_is_string(e) || sscanf(json_string_value(e), "%ld-%ld%n", &lo, &hi,
                                                 &end) != 2 || json_string_value(e)[end]) {
            bad = "\"slots\" must be a list of slot numbers or \"lo-hi\"";
            break;
        }
        if (lo < 0 || hi >= SLOT_COUNT || lo > hi) {
            bad = "a slot is out of range (0-16383)";
            break;
        }
        for (long s = lo; s <= hi; s++)
            if (!seen[s]) {
                seen[s] = 1;
                list[n++] = (uint16_t)s;
            }
    }
    int status = 400;
    if (bad) {
        /* escaped: the messages quote field names */
        json_t *e = json_pack("{s:s}", "error", bad);
        char *t = e ? json_dumps(e, 0) : NULL;
        buf_printf(out, "%s\n", t ? t : "{}");
        free(t);
        json_decref(e);
    } else {
        char err[300];
        long q = deliver_replay(v->d, cl ? json_string_value(cl) : NULL, list, n,
                                since ? (uint64_t)json_integer_value(since)
                                      : v->opt.replay_window,
                                err, sizeof err);
        if (q < 0) {
            json_t *e = json_pack("{s:s}", "error", err);
            char *t = e ? json_dumps(e, 0) : NULL;
            buf_printf(out, "%s\n", t ? t : "{}");
            free(t);
            json_decref(e);
            status = 409;
        } else {
            buf_printf(out, "{\"queued\": %ld, \"slots\": %zu}\n", q, n);
            status = 200;
        }
    }
    free(list);
    json_decref(doc);
    return status;
}

static void *reader_main(void *arg)
{
    char err[600];
    if (reader_run(&inv, err, sizeof err) < 0) {
        log_error("reader: %s", err);
        kill(getpid(), SIGTERM);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    static const struct opt_program prog = {
        "shoal-invalidator",
        "Reads PostgreSQL's commits (logical replication, pgoutput) and deletes the keys they "
        "change from every cluster.",
        "shoal-invalidator " INVALIDATOR_VERSION, "the JSON configuration",
        "the JSON configuration: clusters, tables and their key templates, the invalidation "
        "table (required; with --control the clusters alone will do; docs/invalidator.md)"};
    struct opt_def defs[OPTIONS_COUNT(INV_OPTIONS)];
    size_t ndefs = OPTIONS_DEFS(INV_OPTIONS, defs, &inv.opt);
    char err[800];
    const char *config = NULL;
    int exit_now = options_start(&prog, defs, ndefs, argc, argv, &config);
    if (exit_now >= 0) return exit_now;
    log_set_level((int)(inv.opt.verbose > 2 ? 2 : inv.opt.verbose));
    if (inv.opt.pg == NULL || config == NULL) {
        fprintf(stderr, "shoal-invalidator: --pg CONNINFO and --config FILE are required (see "
                        "--help)\n");
        return 2;
    }
    if (inv.opt.control && !follow_url_ok(inv.opt.control)) {
        fprintf(stderr, "shoal-invalidator: --control must be up to %d http:// or https:// URLs "
                        "separated by ','\n", FOLLOW_URLS_MAX);
        return 2;
    }
    if (inv_config_load(config, &inv.conf, inv.opt.control != NULL, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-invalidator: %s\n", err);
        return 2;
    }
    if (setup_prepare(&inv, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-invalidator: %s\n", err);
        return 2;
    }
    sigset_t sigs;
    sigs_block(&sigs, 0);
    struct deliver_cfg dcfg = {inv.conf.clusters, inv.conf.nclusters, inv.opt.spill_dir,
                               inv.opt.mem_max,   inv.opt.spill_max,  inv.opt.batch_max,
                               inv.opt.replay_window, inv.opt.timeout_ms};
    inv.d = deliver_create(&dcfg, err, sizeof err);
    if (inv.d == NULL) {
        fprintf(stderr, "shoal-invalidator: %s\n", err);
        return 2;
    }
    struct admin *admin = NULL;
    if (inv.opt.admin_port) {
        struct admin_route routes[] = {{"/v1/replay", replay_route, &inv, 0},
                                       {"/healthz", status_route, &inv, 0}};
        struct admin_limits lim = ADMIN_LIMITS_OF(inv.opt);
        admin = admin_create(inv.opt.admin_listen, (unsigned)inv.opt.admin_port, &lim, metrics,
                             &inv, routes, 2, err, sizeof err);
        if (admin == NULL) {
            fprintf(stderr, "shoal-invalidator: %s\n", err);
            return 2;
        }
    }
    inv.rows = rows_create(&inv.conf, &inv.figs);
    if (inv.rows == NULL) {
        fprintf(stderr, "shoal-invalidator: out of memory\n");
        return 2;
    }
    struct cleaner *cl = cleaner_start(&inv, err, sizeof err);
    if (cl == NULL && err[0]) {
        fprintf(stderr, "shoal-invalidator: %s\n", err);
        return 2;
    }
    if (inv.opt.control && (inv.ctl = inv_ctl_start(&inv, err, sizeof err)) == NULL) {
        fprintf(stderr, "shoal-invalidator: %s\n", err);
        return 2;
    }
    pthread_t reader;
    if (pthread_create(&reader, NULL, reader_main, NULL) != 0) {
        fprintf(stderr, "shoal-invalidator: cannot start the reader thread\n");
        return 2;
    }
    log_notice("reading slot %s for %zu tables%s into %zu clusters; admin port %u",
               inv.opt.slot, inv.conf.ntables, inv.conf.inv_name ? " and the invalidation table"
                                                                 : "",
               inv.conf.nclusters, admin ? admin_port(admin) : 0);
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    log_notice("signal %d: shutting down", sig);
    atomic_store(&inv.stop, true);
    pthread_join(reader, NULL);
    inv_ctl_stop(&inv.ctl);
    struct inv_config *left = atomic_exchange(&inv.next_map, NULL); /* never taken */
    if (left) {
        inv_config_free(left);
        free(left);
    }
    cleaner_stop(&cl);
    admin_destroy(&admin);
    deliver_destroy(inv.d);
    rows_destroy(&inv.rows); /* after delivery: it may hold namespaces interned there */
    inv_config_free(&inv.conf);
    options_release();
    return 0;
}
