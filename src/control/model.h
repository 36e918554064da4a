/* model.h — the control plane's state as one JSON value, the changes the API makes to it, the
 * rules every state must satisfy, and the topology document rendered from it.
 *
 * The model is the state file's content:
 *   {"format": 1, "version": N, "gutter_pool": P (optional), "gutter_ttl": S,
 *    "pools": {P: {"nodes": [{"node": "host:port", "admin": "host:port", "zone": Z}...],
 *                  "slots": [{"from": A, "to": B, "node": "host:port",
 *                             "replica": "host:port" (copies 2)}...],
 *                  "uneven": true (after a promotion or drain: the even rule no longer
 *                                  applies to its map)}},
 *    "namespaces": {N: {"team", "pool", "memory", "copies", "eviction", "default_ttl",
 *                       "max_ttl", "lease_ttl", "stale_ttl", "lease_period",
 *                       "max_value_bytes", "ops_per_sec", "bytes_per_sec",
 *                       "invalidation" (optional)}}}
 * Every namespace stores every field but `invalidation` (common/nsfields.h), which only those
 * with key templates for shoal-invalidator have. A change is made on a fork of the current model
 * (model_fork: its own top level, pools and namespaces objects, sharing every pool and
 * namespace value the change does not touch) and checked whole (model_check_since) before it
 * replaces it, so a refused change changes nothing. A value installed in a model is never
 * changed in place again: later versions share it, and the renderer (render.h) and the check
 * know an unchanged value by its address.
 *
 * Errors fill a model_err: the HTTP status, the field (as sent, or a path such as
 * "namespaces.x.copies" for a rule another object breaks), the rule's short name and a message
 * that says what to do. */
#ifndef SHOAL_CONTROL_MODEL_H
#define SHOAL_CONTROL_MODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define MODEL_FORMAT 1
#define MODEL_NAME_MAX 64
#define MODEL_ADDR_MAX 262        /* "[v6]:port" or "host:port" */
#define MODEL_POOLS_MAX 1024
#define MODEL_NS_MAX 16384
#define MODEL_NS_PER_POOL_MAX 255 /* a node holds 256 namespaces, its own default included */

struct model_err {
    int status;
    char field[160];
    char rule[48];
    char msg[384];
};

/* A new, empty model (version 0, no pools). NULL when out of memory. */
json_t *model_new(void);
/* 0 when `m` satisfies every rule (used on every change and on load), else the HTTP status of
 * the first broken rule with `e` filled. */
int model_check(const json_t *m, struct model_err *e);
/* The same rules for `m` made from `prev` (a model that passed them) by one change on a fork:
 * pool and namespace values `m` shares with `prev` are not checked again (nothing their rules
 * read changed when the pool they name is the same value too). prev NULL: model_check. */
int model_check_since(const json_t *m, const json_t *prev, struct model_err *e);
/* A model to change: `m`'s top level, "pools" and "namespaces" objects copied, their values
 * shared, except namespace `ns` and pool `pool` (either may be NULL or absent), which are deep
 * copies the change may edit in place. A new reference; NULL when out of memory. */
json_t *model_fork(const json_t *m, const char *ns, const char *pool);
uint64_t model_version(const json_t *m);

/* The changes. Each returns 0, or an HTTP status with `e` filled; `m` may be partly changed on
 * failure (the caller works on a copy). */
int model_ns_create(json_t *m, json_t *body, const char **name, struct model_err *e);
int model_ns_update(json_t *m, const char *name, json_t *body, struct model_err *e);
int model_ns_delete(json_t *m, const char *name, struct model_err *e);
/* body: {"name": P, "nodes": ["host:port" | {"node": ..., "admin": ...}...], "gutter": bool,
 * "gutter_ttl": S}. The first pool also gets the `default` namespace. */
int model_pool_create(json_t *m, json_t *body, const char **name, struct model_err *e);
/* body: {"node": "host:port", "admin": "host:port"}. *moved: slots that changed owner. */
int model_node_add(json_t *m, const char *pool, json_t *body, uint32_t *moved,
                   struct model_err *e);
int model_node_remove(json_t *m, const char *pool, const char *node, uint32_t *moved,
                      struct model_err *e);

/* The router's topology document (docs/router.md) for `m`: a new reference, NULL on memory. */
json_t *model_topology(const json_t *m);
/* The same without "namespaces" (render.h adds their text). */
json_t *model_topology_frame(const json_t *m);
/* A namespace's memory share on each node of its pool: memory * copies / nodes, rounded down
 * (with copies 2 each node holds its primary share and a replica's). */
uint64_t model_ns_share(const json_t *m, const char *ns);

/* ---- replicas and failover (issue 15, docs/operations.md "Failure handling") -------------
 * A pool holding a namespace with copies 2 has a "replica" on every range that can have one
 * (slotmap_replicas: another live node, another zone when zones are labelled); others have
 * none. */
/* The index of node `addr` in a pool's "nodes" array (objects with "node"), or -1. */
int model_node_index(const json_t *nodes, const char *addr);
/* A new object of the members of `obj` whose key is a node some pool lists (values shared), or
 * NULL when memory ran out. With `obj` NULL: every listed node, each as true (a set). */
json_t *model_listed_only(const json_t *m, const json_t *obj);

typedef bool (*model_live_fn)(void *ctx, const char *node);
/* Pool `pool` holds a namespace with copies 2. */
bool model_pool_replicated(const json_t *m, const char *pool);
/* Bring every pool's replicas in line with its namespaces: added where a copies-2 namespace
 * arrived, removed where the last left, and recomputed for pool `touched` (NULL: none); nodes
 * for which `live` says false (NULL: all live) are nobody's replica in the pools recomputed. A pool that changes
 * gets a new value (shallow copy): values shared with the model served are never edited.
 * 0, or an HTTP status with `e` filled. */
int model_replicas_sync(json_t *m, const char *touched, model_live_fn live, void *ctx,
                        struct model_err *e);
/* Promotion (C5): every range of `dead` in `pool` that has a live replica (`live`, NULL: all)
 * goes to it (the replica field dropped; model_replicas_sync gives another), and `dead` stops
 * being anyone's replica. *promoted: slots moved. Ranges without a live replica stay (the
 * gutter covers them). */
int model_promote(json_t *m, const char *pool, const char *dead, model_live_fn live, void *ctx,
                  uint32_t *promoted, struct model_err *e);
/* Drain: every slot s with slots[s] set, owned by `node` and with a replica, swaps: the
 * replica owns it, `node` becomes its replica. *swapped: slots swapped. */
int model_swap(json_t *m, const char *pool, const char *node, const uint8_t *slots,
               uint32_t *swapped, struct model_err *e);

/* Fill `e` and return `status`. */
int model_fail(struct model_err *e, int status, const char *field, const char *rule,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
