/* reload.h — the one path every new topology takes once the router runs: SIGHUP's re-read of
 * the --config file, PUT /v1/topology on the admin port, and the control-plane follower
 * (follow.h). Each parses a whole table first and hands it here to be published atomically,
 * counted and logged the same way, so an invalid document changes nothing wherever it came
 * from. */
#ifndef SHOAL_ROUTER_RELOAD_H
#define SHOAL_ROUTER_RELOAD_H

#include <stddef.h>
#include <stdint.h>

#include "router/router.h"

/* Publish `t` (owned from now on; freed when refused) if its version is newer than the one in
 * use. Counts a reload and logs "topology version N in use (...)", or counts a failure and
 * logs it as router_topology_refused does. `origin` says where the document came from in the
 * log ("the admin API", "the control plane"; NULL for the --config file). 0 when published, -1
 * with the reason in err. Runs on the main, admin or follower thread, never on a worker (it
 * waits for the workers' quiescence). */
int router_apply_topology(struct router *r, struct topo *t, const char *origin, char *err,
                          size_t errlen);

/* A document that did not parse: counted in shoal_router_topology_reload_failures and logged
 * as "topology reload failed, keeping version N: <err>" (the --config file, origin NULL) or
 * "topology from <origin> refused, keeping version N: <err>". */
void router_topology_refused(struct router *r, const char *origin, const char *err);

/* The version of the table in use (read under the registry's lock: callers are not workers,
 * so they may not hold the table without it). */
uint64_t router_topology_version(struct router *r);

#endif
