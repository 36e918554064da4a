/* api.h — shoal-control's HTTP/JSON API on its admin listener (docs/admin-api.md):
 *
 *   POST   /v1/namespaces                        create a namespace
 *   GET    /v1/namespaces                        every namespace
 *   GET|PUT|DELETE /v1/namespaces/<name>         one: read (with its push state), change, remove
 *   POST   /v1/pools                             create a pool (with its first nodes)
 *   GET    /v1/pools, /v1/pools/<name>           pools with nodes, slot counts and slot maps
 *   POST   /v1/pools/<name>/nodes                add a node: it takes its share of the slots
 *   DELETE /v1/pools/<name>/nodes/<host:port>    remove a node: its slots go to the others
 *   GET    /v1/topology[?after=V]                the topology document; with after=, held
 *                                                until a newer version or --poll-timeout (304)
 *   GET    /v1/stats[?since=N], /, /static/...   the dashboard and its figures (dash.h)
 *   GET    /healthz, /metrics                    (common/admin.c)
 *
 * A change is applied to a copy of the model, checked whole, stored, and only then made
 * current and acknowledged; a refusal is a 4xx (503 when it could not be stored) with
 * {"error", "field", "rule"} and changes nothing. */
#ifndef SHOAL_CONTROL_API_H
#define SHOAL_CONTROL_API_H

#include <stddef.h>

struct control;

/* Threads of control's admin listener: a request that takes long (a big GET, a forwarded
 * change) holds up only the connections of its thread, and changes run on their own thread
 * (api.c), so lease renewals are answered while a change is stored. */
#define API_THREADS 4

/* Start the change thread and the listener on cfg.listen:port. NULL with a message on
 * failure. */
struct admin *api_create(struct control *c, char *err, size_t errlen);
/* Stop the change thread once control_close_writes has returned (nothing is queued then). */
void api_stop(struct control *c);

#endif
