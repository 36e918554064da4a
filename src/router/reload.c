/* reload.c — publishing a new topology table, whoever read it (see reload.h). */
#include "router/reload.h"

#include "common/log.h"

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

int router_apply_topology(struct router *r, struct topo *t, const char *origin, char *err,
                          size_t errlen)
{
    /* the figures are taken before publishing: once published, `t` belongs to the registry
     * and a newer publish on another thread may free it */
    unsigned long long version = t->version;
    unsigned nnodes = t->nnodes, npools = t->npools, nns = t->nns;
    if (topo_publish(&r->topo, t, err, errlen) < 0) {
        router_topology_refused(r, origin, err);
        return -1;
    }
    __atomic_fetch_add(&r->reloads, 1, __ATOMIC_RELAXED);
    log_notice("topology version %llu in use (%u nodes, %u pools, %u namespaces%s%s)", version,
               nnodes, npools, nns, origin ? "; from " : "", origin ? origin : "");
    return 0;
}
