/* topo.h — the topology document (design.md): pools of nodes, their slot maps, namespaces and
 * the gutter pool, parsed from JSON into an immutable table, and the registry that swaps tables
 * under running workers.
 *
 * Workers read the current table through one atomic load and never lock. A reload (SIGHUP,
 * admin API) parses a whole new table first; an invalid document leaves the running one in
 * place. Publishing waits until every worker has passed a quiescent point (blocked in
 * epoll_wait, or between two batches) before freeing the old table, the scheme of
 * src/node/ns.c. Requests already sent upstream do not refer to the table, so a swap never
 * fails or loses one. */
#ifndef SHOAL_ROUTER_TOPO_H
#define SHOAL_ROUTER_TOPO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/qsbr.h"
#include "common/slot.h"

#define TOPO_NAME_MAX 64
#define TOPO_ADDR_MAX 128
#define TOPO_NODES_MAX 4096
#define TOPO_POOLS_MAX 1024 /* each pool holds a 32 KB slot map */
#define TOPO_NO_REPLICA UINT16_MAX

/* One upstream node, shared by every pool that lists it (same "host:port" text). */
struct topo_node {
    char addr[TOPO_ADDR_MAX]; /* as written in the document, e.g. "127.0.0.1:21001" */
    struct sockaddr_storage sa;
    socklen_t salen;
};

struct topo_pool {
    char name[TOPO_NAME_MAX + 1];
    uint32_t nnodes;
    uint32_t *nodes;  /* indices into topo->nodes, in document order */
    uint16_t *owner;  /* SLOT_COUNT entries: slot -> index into topo->nodes */
    uint16_t *replica; /* SLOT_COUNT entries: slot -> its range's "replica" (index into
                        * topo->nodes, TOPO_NO_REPLICA when the range names none); NULL when no
                        * range of the pool names one (FAILOVER.md C1, C6) */
    bool replicated;  /* "mode": "replicated": every key on every node (owner unused) */
    int32_t warm_from; /* index of the warm pool this (cold) pool fills from, -1 when none */
};

/* A token bucket shared by every worker (updated with atomics, see policy_take): `rate` tokens
 * a second, holding at most one second's worth. rate 0 = no limit. Tokens are counted in
 * thousandths. Refilled from the moment a table is published (a reload starts it full). */
struct topo_bucket {
    uint64_t rate;
    int64_t milli;
    uint64_t last_ms;
};

struct topo_ns {
    char name[TOPO_NAME_MAX + 1];
    size_t nname;
    uint32_t pool;            /* index into topo->pools */
    uint64_t default_ttl;     /* applied when a client sends 0 (0: none) */
    uint64_t max_ttl;         /* longer TTLs are clamped (0: no limit) */
    uint64_t max_value_bytes; /* larger values are refused (0: no limit) */
    struct topo_bucket ops;   /* requests (keys, for a multi-get) per second */
    struct topo_bucket bytes; /* value bytes written per second */
    uint8_t copies;           /* 1 or 2: with 2 its keys are on the slot's replica too (C2) */
};

struct topo {
    uint64_t version;
    uint32_t nnodes, npools, nns;
    struct topo_node *nodes;
    struct topo_pool *pools;
    struct topo_ns *ns;
    uint32_t default_ns; /* index of "default" in ns */
    int32_t gutter_pool; /* index into pools, -1 when none */
    uint64_t gutter_ttl; /* longest TTL of items stored in the gutter pool, seconds */
    char *doc;           /* the document this table was parsed from, as JSON (GET /v1/topology) */
};

#define TOPO_GUTTER_TTL_DEFAULT 10

/* topo_parse flags */
#define TOPO_NUMERIC_HOSTS 1u /* refuse host names instead of resolving them (no DNS; fuzzing) */

/* Parse a topology document. Returns 0 with *out set (free with topo_destroy), or -1 with a
 * message in err that names the offending field by its path, e.g.
 * "pools.main.nodes[1]: '127.0.0.1' is not host:port". Node names are resolved here (this may
 * block on DNS, so it runs on the main or admin thread, never on a worker). */
int topo_parse(const char *text, size_t len, unsigned flags, struct topo **out, char *err,
               size_t errlen);
/* Read and parse a file; errors name the file too. */
int topo_load_file(const char *path, struct topo **out, char *err, size_t errlen);
void topo_destroy(struct topo **t);

/* The namespace of a key: the one named by the text before its first ':', else default. */
const struct topo_ns *topo_namespace(const struct topo *t, const char *key, size_t nkey);
/* The node (index into t->nodes) that owns `key` in its namespace's pool. For a replicated
 * pool: the pool's node number `replica` (mod the pool's size), the one this router reads. */
uint32_t topo_route(const struct topo *t, const char *key, size_t nkey);
/* The node of pool `pool` (index into t->pools) for `key`: its slot's owner, or this router's
 * replica for a replicated pool. */
uint32_t topo_route_pool(const struct topo *t, uint32_t pool, const char *key, size_t nkey);
/* The pool that holds `key` (its namespace's). */
const struct topo_pool *topo_pool_of(const struct topo *t, const char *key, size_t nkey);
/* Which node of a replicated pool this process reads from: a stable hash of its client id,
 * set once at start (topo_set_replica). */
void topo_set_replica(uint32_t hash);
/* The replica of `key`'s slot in its namespace's pool (index into t->nodes), or -1 when the
 * slot has none or the namespace keeps one copy (only copies 2 is replicated). */
int64_t topo_replica_route(const struct topo *t, const char *key, size_t nkey);
/* Whether any pool has ranges with a replica (promotions and the recent-deletes log concern
 * those pools only). */
bool topo_has_replicas(const struct topo *t);
/* The gutter pool's node for `key` (same slot rule), or -1 when there is no gutter pool. */
int64_t topo_gutter_route(const struct topo *t, const char *key, size_t nkey);

/* The registry: the table in use, and the quiescence words of its readers. */
struct topo_registry {
    pthread_mutex_t lock; /* writers only */
    struct topo *cur;     /* read with topo_current() by an online reader */
    uint64_t gen;         /* bumped on every publish */
    uint64_t **seen;      /* per reader: gen + 1 when it went online, 0 when quiescent */
    size_t nreaders;
};

/* Start with `t` (owned by the registry from now on). */
void topo_registry_init(struct topo_registry *r, struct topo *t, uint64_t **seen, size_t nreaders);
void topo_registry_teardown(struct topo_registry *r);
/* Replace the table with `t` if its version is newer. Returns 0 when published (the old table
 * is freed once no reader can hold it), or -1 with a reason in err; `t` is freed either way. */
int topo_publish(struct topo_registry *r, struct topo *t, char *err, size_t errlen);

/* A reader goes online before it reads the table (after epoll_wait) and quiescent before it
 * blocks; pointers obtained while online are valid until it goes quiescent. */
static inline void topo_online(struct topo_registry *r, uint64_t *seen)
{
    qsbr_online(&r->gen, seen);
}
static inline void topo_quiescent(uint64_t *seen) { qsbr_quiescent(seen); }
static inline struct topo *topo_current(struct topo_registry *r)
{
    return __atomic_load_n(&r->cur, __ATOMIC_SEQ_CST);
}
static inline uint64_t topo_gen(struct topo_registry *r)
{
    return __atomic_load_n(&r->gen, __ATOMIC_SEQ_CST);
}

#endif
