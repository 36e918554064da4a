/* reload.c — publishing a new topology table, whoever read it (see reload.h). */
#include "router/reload.h"

#include <jansson.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/promote.h"
#include "router/dellog.h"
#include "router/replaycut.h"

uint64_t router_topology_version(struct router *r)
{
    pthread_mutex_lock(&r->topo.lock);
    uint64_t v = topo_current(&r->topo)->version;
    pthread_mutex_unlock(&r->topo.lock);
    return v;
}

void router_topology_refused(struct router *r, const char *origin, const char *err)
{
    __atomic_fetch_add(&r->reload_failures, 1, __ATOMIC_RELAXED);
    unsigned long long v = router_topology_version(r);
    if (origin)
        log_error("topology from %s refused, keeping version %llu: %s", origin, v, err);
    else
        log_error("topology reload failed, keeping version %llu: %s", v, err);
}

/* The document in use, parsed, for promote_diff (under apply_lock): kept from the last apply
 * when it has replicas, else parsed from the table in use. */
static json_t *applied_doc(struct router *r)
{
    if (r->applied_doc == NULL) {
        pthread_mutex_lock(&r->topo.lock);
        const char *doc = topo_current(&r->topo)->doc;
        r->applied_doc = doc ? json_loads(doc, 0, NULL) : NULL;
        pthread_mutex_unlock(&r->topo.lock);
    }
    return r->applied_doc;
}

#define REPLAYCUT_TIMEOUT_MS 250  /* one new primary's answer */
#define REPLAYCUT_BUDGET_MS 1000   /* all of them: the rest replay their whole window */

/* Ask the new primaries of the `n` promoted slots up to when they applied their dead primary's
 * stream, and hand the promotion to the workers with the replay's start per slot (dellog.h).
 * Runs on the thread applying the topology (blocking sockets, bounded by the budget). */
static void replay_cutoffs(struct router *r, json_t *old, json_t *now, uint64_t version,
                           const uint16_t *slots, size_t n)
{
    uint8_t *group = malloc(n);
    const char *oldp[DELLOG_GROUPS - 1], *newp[DELLOG_GROUPS - 1];
    uint64_t since[DELLOG_GROUPS - 1];
    size_t np = group ? replaycut_pairs(old, now, slots, n, group, oldp, newp, DELLOG_GROUPS - 1) : 0;
    if (group == NULL) { /* no memory: one group, the whole window */
        log_error("topology version %llu: out of memory for the replay's cutoffs: replaying the "
                  "whole window", (unsigned long long)version);
        dellog_promoted(r, version, slots, n, NULL, NULL, 0);
        return;
    }
    uint64_t start = clock_mono_ms();
    for (size_t k = 0; k < np; k++) {
        uint64_t wall = 0;
        const char *why = "over the time budget";
        uint64_t spent = clock_mono_ms() - start;
        bool known = spent < REPLAYCUT_BUDGET_MS &&
                     replaycut_query(newp[k], oldp[k], REPLAYCUT_TIMEOUT_MS, &wall, &why) == 0;
        uint64_t now_wall = (uint64_t)(clock_wall_us() / 1000), now_mono = clock_mono_ms();
        since[k] = replaycut_since(known, wall, r->cfg.replay_margin_ms, now_wall, now_mono);
        if (known)
            log_notice("topology version %llu: %s applied %s's stream up to %llu ms ago: replaying "
                       "deletes since %llu ms ago (--replay-margin-ms %llu)",
                       (unsigned long long)version, newp[k], oldp[k],
                       (unsigned long long)(now_wall > wall ? now_wall - wall : 0),
                       (unsigned long long)(since[k] && now_mono > since[k] ? now_mono - since[k] : 0),
                       (unsigned long long)r->cfg.replay_margin_ms);
        else
            log_warn("topology version %llu: no replication stamp from %s for %s (%s): "
                     "replaying the whole window of its deletes", (unsigned long long)version,
                     newp[k], oldp[k], why);
    }
    dellog_promoted(r, version, slots, n, group, since, np);
    free(group);
}

int router_apply_topology(struct router *r, struct topo *t, const char *origin, char *err,
                          size_t errlen)
{
    /* the figures are taken before publishing: once published, `t` belongs to the registry
     * and a newer publish on another thread may free it */
    unsigned long long version = t->version;
    unsigned nnodes = t->nnodes, npools = t->npools, nns = t->nns;
    pthread_mutex_lock(&r->apply_lock);
    /* only a table with replicas can have its slots promoted: without, nothing is parsed or
     * kept (a document of 10,000 namespaces is megabytes of JSON tree) */
    pthread_mutex_lock(&r->topo.lock);
    bool old_replicas = topo_has_replicas(topo_current(&r->topo));
    pthread_mutex_unlock(&r->topo.lock);
    bool new_replicas = topo_has_replicas(t);
    json_t *old = old_replicas ? applied_doc(r) : NULL;
    json_t *now = old && t->doc ? json_loads(t->doc, 0, NULL) : NULL;
    uint16_t *promoted = malloc(SLOT_COUNT * sizeof *promoted);
    size_t npromoted = promoted && old && now ? promote_diff(old, now, NULL, promoted) : 0;
    if (topo_publish(&r->topo, t, err, errlen) < 0) {
        pthread_mutex_unlock(&r->apply_lock);
        json_decref(now);
        free(promoted);
        router_topology_refused(r, origin, err);
        return -1;
    }
    /* where each promoted slot's replay starts, asked of its new primary while the workers
     * already route to it (the deletes they log meanwhile are newer than any cutoff) */
    if (npromoted) replay_cutoffs(r, old, now, version, promoted, npromoted);
    json_decref(r->applied_doc);
    r->applied_doc = new_replicas ? now : NULL; /* else parsed again when needed */
    if (!new_replicas) json_decref(now);
    pthread_mutex_unlock(&r->apply_lock);
    free(promoted);
    if (npromoted)
        log_notice("topology version %llu promotes %zu slots to their replicas; the workers "
                   "replay their recent deletes there", version, npromoted);
    __atomic_fetch_add(&r->reloads, 1, __ATOMIC_RELAXED);
    log_notice("topology version %llu in use (%u nodes, %u pools, %u namespaces%s%s)", version,
               nnodes, npools, nns, origin ? "; from " : "", origin ? origin : "");
    return 0;
}
