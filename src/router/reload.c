/* reload.c — publishing a new topology table, whoever read it (see reload.h). */
#include "router/reload.h"

#include <jansson.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/promote.h"
#include "router/dellog.h"

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
    json_decref(r->applied_doc);
    r->applied_doc = new_replicas ? now : NULL; /* else parsed again when needed */
    if (!new_replicas) json_decref(now);
    if (npromoted) dellog_promoted(r, version, promoted, npromoted);
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
