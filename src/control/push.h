/* push.h — brings every node's namespace settings in line with the model: each namespace's
 * node-side settings (memory share, TTLs, eviction, lease and stale settings) are PUT to
 * /v1/namespaces/<name> on the admin port of every node of its pool that has an admin address,
 * and removed (DELETE) from nodes that no longer hold it. The memory share is the namespace's
 * quota divided evenly over its pool's nodes (model_ns_share).
 *
 * One background thread does the HTTP (common/httpc), so a slow or dead node
 * never blocks the API. A failed push is logged (a few lines per 10 s), counted in /metrics and
 * tried again after a wait that doubles from 100 ms up to --push-retry-ms. What each node was
 * last sent successfully is remembered in memory only: after a restart everything is pushed
 * again (PUT is idempotent), but removals that were pending at the crash are not retried. */
#ifndef SHOAL_CONTROL_PUSH_H
#define SHOAL_CONTROL_PUSH_H

#include <jansson.h>
#include <stddef.h>

struct control;
struct pusher;

struct pusher *push_create(struct control *c, char *err, size_t errlen);
/* The model changed: recompute what every node should hold (takes c->lock) and wake the
 * thread. Call without c->lock held. */
void push_notify(struct pusher *p);
/* --etcd: only the leader pushes. push_pause stops sending (this process is no longer the
 * leader: a former leader's retries must not undo the new one's pushes); push_resume forgets
 * what was sent before (another leader may have pushed since), recomputes and sends it all. */
void push_pause(struct pusher *p);
void push_resume(struct pusher *p);
/* JSON object of one namespace's push state per node, {"host:port": {"share": B, "in_place":
 * bool, "failures": N, "error": "..."}}: a new reference, or NULL. */
json_t *push_status(struct pusher *p, const char *ns);
void push_destroy(struct pusher **p);

#endif
