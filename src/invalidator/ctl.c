/* ctl.c — shoal-invalidator --control: key templates from shoal-control's namespace records
 * (the `invalidation` field, common/nsfields.h), merged with the configuration file's tables
 * (see ctl.h; docs/invalidator.md, "Templates from the control plane").
 *
 * Two threads. The follower (common/follow.h, shared with shoal-node and shoal-router) takes
 * each topology document, checks its namespaces' templates and hands the list of (namespace,
 * table, templates) entries to the applier. The applier, on an ordinary PostgreSQL connection,
 * prepares each table as setup_prepare does at start (the table and every templated column
 * exist; the replica identity covers them, else REPLICA IDENTITY FULL), builds the map (the
 * config's tables plus every entry that passed, templates and truncate namespaces merged per
 * table), hands it to the reader (inv->next_map: the reader takes it at its next transaction),
 * and only then adds new tables to the publication, so no change of a table PostgreSQL starts
 * sending can be decoded with the map before. An entry that fails (no such table or column, an
 * identity it may not change) is left out and logged, and the whole build is tried again every
 * CTL_RETRY_MS until it passes.
 *
 * Promotions (FAILOVER.md C1, C6): the follower keeps the last document it took; when a newer
 * one makes a slot's replica its primary (promote_diff), the recent deletes of those slots are
 * sent again to every cluster (deliver_replay over the replay window), since asynchronous
 * replication may have lost some of them on the way to the new primary. */
#include "invalidator/ctl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/follow.h"
#include "common/log.h"
#include "common/nsfields.h"
#include "common/promote.h"
#include "common/slot.h"
#include "common/template.h"
#include "invalidator/deliver.h"
#include "invalidator/invalidator.h"
#include "invalidator/setup.h"

#define CTL_RETRY_MS 5000

struct inv_ctl {
    struct inv *inv;
    struct follower *f;
    pthread_t th;
    bool running;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;             /* under lock */
    json_t *want;          /* under lock: the newest document's entries, not yet built */
    uint64_t want_version; /* under lock */
    _Atomic uint64_t taken; /* newest topology version taken from the control plane */
    char id[200];
    char last_refused[2048]; /* the applier's: refusals last logged */
    json_t *last_doc;      /* the follower's: the last document taken (promotions) */
};

static uint64_t ctl_version(void *ctx)
{
    struct inv_ctl *c = ctx;
    return atomic_load(&c->taken);
}

static char *ctl_register_body(void *ctx, const char **id)
{
    struct inv_ctl *c = ctx;
    *id = c->id;
    json_t *doc = json_pack("{s:s}", "id", c->id);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return body;
}

static void ctl_refused(void *ctx, const char *err)
{
    struct inv_ctl *c = ctx;
    log_error("topology from the control plane refused, keeping the key templates of version "
              "%llu: %s",
              (unsigned long long)atomic_load(&c->taken), err);
}

/* The follower took `root` after the previous document: replay the recent deletes of the
 * slots it promoted, to every cluster, and keep it for the next comparison. */
static void ctl_promotions(struct inv_ctl *c, json_t *root, uint64_t version)
{
    if (c->last_doc && c->inv->d) {
        uint16_t *slots = malloc(SLOT_COUNT * sizeof *slots);
        size_t n = slots ? promote_diff(c->last_doc, root, NULL, slots) : 0;
        if (n > 0) {
            char err[256];
            long q = deliver_replay(c->inv->d, NULL, slots, n, c->inv->opt.replay_window, err,
                                    sizeof err);
            if (q < 0)
                log_error("topology version %llu promoted %zu slots; replay failed: %s",
                          (unsigned long long)version, n, err);
            else
                log_notice("topology version %llu promoted %zu slots: %ld recent deletes "
                           "(last %llu s) sent again to every cluster",
                           (unsigned long long)version, n, q,
                           (unsigned long long)c->inv->opt.replay_window);
        }
        free(slots);
    }
    json_decref(c->last_doc);
    c->last_doc = json_incref(root);
}

/* A document: its namespaces' templates as [{"ns", "table", "keys"}], to the applier. */
static enum follow_take ctl_take(void *ctx, const char *text, size_t len, uint64_t in_use,
                                 char *err, size_t errlen)
{
    struct inv_ctl *c = ctx;
    enum follow_take rc;
    uint64_t version;
    json_t *root = follow_doc_parse(text, len, in_use, &version, &rc, err, errlen);
    if (root == NULL) return rc;
    rc = FOLLOW_INVALID;
    json_t *entries = NULL;
    json_t *nss = json_object_get(root, "namespaces");
    if (!json_is_object(nss)) {
        snprintf(err, errlen, "namespaces: must be an object");
        goto out;
    }
    if ((entries = json_array()) == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = FOLLOW_FAILED;
        goto out;
    }
    const char *name, *table;
    json_t *ns, *keys;
    json_object_foreach(nss, name, ns) {
        json_t *iv = json_object_get(ns, NSF_INVALIDATION);
        if (iv == NULL) continue;
        struct nsf_err e;
        if (nsf_invalidation_check(name, iv, &e) < 0) {
            snprintf(err, errlen, "namespaces.%.64s.%s", name, e.msg);
            goto out;
        }
        json_object_foreach(json_object_get(iv, "tables"), table, keys) {
            if (json_array_append_new(entries, json_pack("{s:s,s:s,s:O}", "ns", name, "table",
                                                         table, "keys", keys)) < 0) {
                snprintf(err, errlen, "out of memory");
                rc = FOLLOW_FAILED;
                goto out;
            }
        }
    }
    pthread_mutex_lock(&c->lock);
    json_decref(c->want);
    c->want = entries;
    c->want_version = version;
    entries = NULL;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    atomic_store(&c->taken, version);
    ctl_promotions(c, root, version);
    rc = FOLLOW_APPLIED;
out:
    json_decref(entries);
    json_decref(root);
    return rc;
}

/* Append `s` to the array unless it holds it. */
static void add_unique(json_t *a, json_t *s)
{
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x)
        if (json_equal(x, s)) return;
    json_array_append(a, s);
}

/* Check entry `e` against table info `sc`: 0 when every templated column exists (*covered 0
 * when one is outside the replica identity), -1 with the reason. */
static int entry_check(json_t *e, const struct setup_cols *sc, int *covered, char *why,
                       size_t whylen)
{
    size_t i;
    json_t *k;
    *covered = 1;
    json_array_foreach(json_object_get(e, "keys"), i, k) {
        char perr[300];
        struct tmpl *t = tmpl_parse(json_string_value(k), perr, sizeof perr);
        if (t == NULL) return snprintf(why, whylen, "%s", perr), -1;
        for (size_t j = 0; j < tmpl_nrefs(t); j++) {
            int col = setup_col(sc, tmpl_ref(t, j));
            if (col == 0) {
                snprintf(why, whylen, "no column \"%.100s\" (template \"%.200s\")",
                         tmpl_ref(t, j), json_string_value(k));
                tmpl_free(&t);
                return -1;
            }
            if (col == 1) *covered = 0;
        }
        tmpl_free(&t);
    }
    return 0;
}

/* Build the map for `entries`, hand it to the reader and complete the publication. Returns the
 * entries refused (logged when the list changed), or -1 when PostgreSQL could not be asked. */
static long build(struct inv_ctl *c, json_t *entries)
{
    struct inv *inv = c->inv;
    char err[600];
    PGconn *pg = PQconnectdb(inv->opt.pg);
    if (PQstatus(pg) != CONNECTION_OK) {
        log_warn_limited("--control: cannot connect to PostgreSQL to prepare the tables of the "
                         "control plane's templates: %s", PQerrorMessage(pg));
        PQfinish(pg);
        return -1;
    }
    json_t *tables = inv_config_tables_json(&inv->conf);
    char refused[sizeof c->last_refused] = "";
    size_t nref = 0; /* bytes in refused */
    long nrefused = 0;
    if (tables == NULL) goto fail;
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e) {
        const char *full = json_string_value(json_object_get(e, "table"));
        const char *ns = json_string_value(json_object_get(e, "ns"));
        const char *dot = strchr(full, '.');
        char schema[NSF_INV_IDENT_MAX + 1], why[600] = "";
        snprintf(schema, sizeof schema, "%.*s", (int)(dot - full), full);
        const char *name = dot + 1;
        struct setup_cols sc = {0};
        int covered = 1;
        if (inv->conf.inv_name && !strcmp(schema, inv->conf.inv_schema) &&
            !strcmp(name, inv->conf.inv_name)) {
            snprintf(why, sizeof why, "it is the invalidation table");
        } else if (setup_table_cols(pg, schema, name, &sc, err, sizeof err) < 0) {
            setup_cols_clear(&sc);
            goto pgfail;
        } else if (!sc.exists) {
            snprintf(why, sizeof why, "no such table");
        } else if (entry_check(e, &sc, &covered, why, sizeof why) == 0 && !covered &&
                   setup_identity_full(inv, pg, schema, name, why, sizeof why) < 0) {
            /* why says what to run */
        }
        setup_cols_clear(&sc);
        if (why[0]) {
            int w = snprintf(refused + nref, sizeof refused - nref,
                             "namespace %s, table %s: %s\n", ns, full, why);
            if (w > 0) nref = nref + (size_t)w < sizeof refused ? nref + (size_t)w : sizeof refused - 1;
            nrefused++;
            continue;
        }
        json_t *t = json_object_get(tables, full);
        if (t == NULL) {
            t = json_pack("{s:[],s:[]}", "keys", "namespaces");
            if (t == NULL || json_object_set_new(tables, full, t) < 0) goto fail;
        }
        size_t j;
        json_t *k;
        json_array_foreach(json_object_get(e, "keys"), j, k) add_unique(json_object_get(t, "keys"), k);
        add_unique(json_object_get(t, "namespaces"), json_object_get(e, "ns"));
    }
    if (strcmp(refused, c->last_refused)) {
        char *line = refused;
        for (char *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
            *nl = 0;
            log_error("--control: templates left out until fixed (retried every %d s): %s",
                      CTL_RETRY_MS / 1000, line);
            *nl = '\n';
        }
        memcpy(c->last_refused, refused, sizeof refused);
    }
    size_t ntables = json_object_size(tables);
    struct inv_config *map = malloc(sizeof *map);
    if (map == NULL || inv_map_parse(json_incref(tables), map, err, sizeof err) < 0) {
        log_error("--control: the merged templates could not be built: %s",
                  map ? err : "out of memory");
        free(map);
        goto fail;
    }
    struct inv_config *old = atomic_exchange(&inv->next_map, map);
    if (old) {
        inv_config_free(old);
        free(old);
    }
    atomic_store(&inv->map_ready, true);
    atomic_store(&inv->figs.mapped_tables, ntables);
    atomic_store(&inv->figs.templates_refused, (uint64_t)nrefused);
    /* after the map: a change PostgreSQL sends for a table added now is decoded with it */
    const char *full;
    json_t *t;
    json_object_foreach(tables, full, t) {
        const char *dot = strchr(full, '.');
        char schema[NSF_INV_IDENT_MAX + 1];
        snprintf(schema, sizeof schema, "%.*s", (int)(dot - full), full);
        if (setup_publication_add(inv, pg, schema, dot + 1, err, sizeof err) < 0) {
            log_warn_limited("--control: %s (retrying)", err);
            nrefused++;
        }
    }
    json_decref(tables);
    PQfinish(pg);
    return nrefused;
pgfail:
    log_warn_limited("--control: preparing the control plane's tables: %s (retrying)", err);
fail:
    json_decref(tables);
    PQfinish(pg);
    return -1;
}

static void *ctl_main(void *arg)
{
    struct inv_ctl *c = arg;
    json_t *cur = NULL, *built = NULL; /* the newest entries; those of the last full build */
    uint64_t cur_version = 0;
    bool pending = false;
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        if (c->want == NULL) {
            if (pending) {
                struct timespec ts = clock_deadline(CTL_RETRY_MS);
                pthread_cond_timedwait(&c->cond, &c->lock, &ts);
            } else {
                pthread_cond_wait(&c->cond, &c->lock);
            }
            if (c->stop) break;
            if (c->want == NULL && !pending) continue;
        }
        if (c->want) {
            json_decref(cur);
            cur = c->want;
            cur_version = c->want_version;
            c->want = NULL;
        }
        pthread_mutex_unlock(&c->lock);
        if (!pending && built && json_equal(built, cur)) {
            atomic_store(&c->inv->figs.templates_version, cur_version); /* nothing to change */
        } else {
            long r = build(c, cur);
            pending = r != 0;
            if (r >= 0) atomic_store(&c->inv->figs.templates_version, cur_version);
            json_decref(built);
            built = json_incref(cur);
        }
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    json_decref(cur);
    json_decref(built);
    return NULL;
}

struct inv_ctl *inv_ctl_start(struct inv *inv, char *err, size_t errlen)
{
    struct inv_ctl *c = calloc(1, sizeof *c);
    if (c == NULL) return snprintf(err, errlen, "out of memory"), NULL;
    c->inv = inv;
    snprintf(c->id, sizeof c->id, "shoal-invalidator/%.100s", inv->opt.slot);
    pthread_mutex_init(&c->lock, NULL);
    clock_cond_init_monotonic(&c->cond);
    struct follow_spec spec = {
        .url = inv->opt.control,
        .metric_prefix = "shoal_invalidator",
        .register_path = "/v1/invalidators",
        .timeout_ms = (unsigned)inv->opt.control_timeout_ms,
        .backoff_max_ms = (unsigned)inv->opt.control_backoff_max_ms,
        .token_file = inv->opt.token_file,
        .ctx = c,
        .version = ctl_version,
        .register_body = ctl_register_body,
        .take = ctl_take,
        .refused = ctl_refused,
    };
    c->f = follower_create(&spec, err, errlen);
    if (c->f == NULL) goto fail;
    if (pthread_create(&c->th, NULL, ctl_main, c) != 0) {
        snprintf(err, errlen, "--control: cannot start the templates thread");
        goto fail;
    }
    c->running = true;
    if (follower_run(c->f, err, errlen) < 0) goto fail;
    return c;
fail:
    inv_ctl_stop(&c);
    return NULL;
}

void inv_ctl_stop(struct inv_ctl **pc)
{
    struct inv_ctl *c = *pc;
    if (c == NULL) return;
    follower_free(&c->f);
    if (c->running) {
        pthread_mutex_lock(&c->lock);
        c->stop = true;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->th, NULL);
    }
    json_decref(c->want);
    json_decref(c->last_doc);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
    *pc = NULL;
}

void inv_ctl_metrics(struct inv_ctl *c, struct buf *out)
{
    if (c && c->f) follower_metrics(c->f, out);
}
