/* nsfields.h — a namespace's settings, declared once for shoal-control (which stores them),
 * shoal-router (which checks the topology document carrying them) and shoal-node (which
 * enforces them), so a document one accepts is one the others accept.
 *
 * The bounds are the node's: it is the one that acts on them. Also here: the eviction policy
 * names, the rule between default_ttl and max_ttl, a namespace's quota on each node, and the
 * `invalidation` field (key templates per database table, read by shoal-invalidator
 * --control). */
#ifndef SHOAL_COMMON_NSFIELDS_H
#define SHOAL_COMMON_NSFIELDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* Integer settings a node enforces: X(name, lo, hi, def, help). JSON type: a non-negative
 * integer in lo..hi; `def` when absent. The order is the node's rendering order. */
#define NSF_NODE_INTS(X)                                                                         \
    X(memory, 0, 1ull << 50, 0,                                                                  \
      "quota in bytes (0: none); shoal-control's is the pool's total, split evenly over its "   \
      "nodes")                                                                                   \
    X(default_ttl, 0, 2592000, 0, "TTL applied when a client sends 0, seconds (0: none)")        \
    X(max_ttl, 0, 2592000, 0, "longest TTL, seconds; longer ones are clamped (0: no limit)")     \
    X(lease_ttl, 0, 3600, 0, "longest life of an unfilled lease, seconds (0: the client's)")     \
    X(lease_period, 0, 3600, 0, "at most one lease win per key per this many seconds (0: off)")  \
    X(stale_ttl, 0, 86400, 0, "seconds an invalidated or expired item is served stale (0: none)")

/* Integer settings of the control plane and the routers: X(name, lo, hi, def, help). */
#define NSF_PLANE_INTS(X)                                                                        \
    X(copies, 1, 2, 1, "copies of each key")                                                     \
    X(max_value_bytes, 0, 1ull << 30, 0, "largest value in bytes (0: no limit)")                 \
    X(ops_per_sec, 0, 1000000000, 0, "requests per second on each router (0: no limit)")         \
    X(bytes_per_sec, 0, 1ull << 40, 0, "value bytes written per second on each router (0: none)")

#define NSF_INTS(X) NSF_NODE_INTS(X) NSF_PLANE_INTS(X)

/* Eviction policies as named in JSON, in the order of enum ns_eviction / store_policy. */
#define NSF_EVICTIONS(X) X(lru) X(lfu) X(s3fifo)
#define NSF_EVICTION_DEFAULT 2 /* s3fifo: it wins scripts/bench-hitratio.sh */

struct nsf_int {
    const char *name;
    uint64_t lo, hi, def;
    bool node; /* a node enforces it */
    const char *help;
};
extern const struct nsf_int nsf_ints[];
extern const size_t nsf_nints;
extern const char *const nsf_evictions[];
extern const size_t nsf_nevictions;

/* The integer setting called `name`, or NULL. */
const struct nsf_int *nsf_int_find(const char *name);
/* true when `v` is a JSON integer within f's bounds; then stored in *out (when not NULL). */
bool nsf_int_ok(const struct nsf_int *f, const json_t *v, uint64_t *out);
/* The optional `invalidation` field: {"tables": {"schema.table": ["template", ...]}}, the key
 * templates (common/template.h) shoal-invalidator --control evaluates on the rows of each
 * table. Absent: none. shoal-control and shoal-router check it with nsf_invalidation_check;
 * shoal-node ignores it. Each template must put its keys in the namespace itself: it fixes
 * (template.h) the namespace's name, or, in `default` only, no namespace at all. */
#define NSF_INVALIDATION "invalidation"
#define NSF_INV_TABLES_MAX 64    /* tables per namespace */
#define NSF_INV_KEYS_MAX 16      /* templates per table */
#define NSF_INV_TEMPLATE_MAX 512 /* bytes of one template */
#define NSF_INV_IDENT_MAX 63     /* bytes of a schema or table name (PostgreSQL's NAMEDATALEN-1) */

/* Why a value was refused: the field's path from "invalidation" on, a short rule name and a
 * message that names the path and the fix. */
struct nsf_err {
    char field[200];
    char rule[32];
    char msg[400];
};
/* Check namespace `ns`'s `invalidation` value. 0, or -1 with `e` filled; the rules: "type" (the
 * shape), "table_name" ("schema.table"), "template" (its syntax), "namespace" (a template whose
 * keys would be another namespace's), "limit" (the bounds above). */
int nsf_invalidation_check(const char *ns, const json_t *v, struct nsf_err *e);
/* A table name as the field writes it, "schema.table", split at the first '.'; false when it
 * is not of that form (each part 1-NSF_INV_IDENT_MAX bytes, no control bytes). */
bool nsf_table_name_ok(const char *s);

/* The index in nsf_evictions of the JSON string `v`, or -1 when it is not one. */
int nsf_eviction_of(const json_t *v);
/* The rule across fields: default_ttl is at most max_ttl unless max_ttl is 0 (no limit). */
bool nsf_ttls_ok(uint64_t default_ttl, uint64_t max_ttl);
/* A namespace's quota on each of a pool's `nnodes` nodes: `memory` split evenly, rounded
 * down; 0 (none) when the pool has no nodes. */
uint64_t nsf_share(uint64_t memory, uint64_t nnodes);

#endif
