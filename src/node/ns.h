/* ns.h — namespaces: which team a key belongs to, and that team's rules.
 *
 * A key's namespace is the text before its first ':' (design.md); a key without ':' or with an
 * unknown prefix belongs to `default`, which always exists. A namespace carries a memory quota,
 * TTL rules (default applied when a client sends 0, maximum that clamps longer ones), an eviction
 * policy, and lease/stale settings.
 *
 * Readers (workers, on every request) see an immutable table through one atomic pointer load
 * and take no lock. A change (admin API, start-up file) builds a new table under the registry
 * mutex, publishes it, and frees the old one once every worker has passed a quiescent point
 * (idle in epoll_wait, or between two request batches): see ns_quiescent()/ns_online(). */
#ifndef SHOAL_NODE_NS_H
#define SHOAL_NODE_NS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"
#include "common/nsfields.h"
#include "common/qsbr.h"
#include "node/store.h"

#define NS_NAME_MAX 64
#define NS_MAX 256 /* namespaces at once, default included */
#define NS_DEFAULT_ID 0
_Static_assert(NS_MAX <= STORE_NS_MAX, "the engine keeps figures for every namespace id");

struct buf;

/* Eviction policies, as named in JSON (common/nsfields.h); same values as store_policy. */
enum ns_eviction { NS_EVICT_LRU, NS_EVICT_LFU, NS_EVICT_S3FIFO };
#define NS_EVICT_DEFAULT ((enum ns_eviction)NSF_EVICTION_DEFAULT)

/* Numeric settings a node enforces: X(name, lo, hi, def, help), from the table shared with
 * shoal-control and shoal-router (common/nsfields.h). It drives JSON parsing, validation,
 * defaults (all 0) and rendering. */
#define NS_SETTINGS(X) NSF_NODE_INTS(X)

struct ns_config {
#define X(name, lo, hi, def, help) uint64_t name;
    NS_SETTINGS(X)
#undef X
    enum ns_eviction eviction;
    uint64_t copies; /* the document's "copies" (2: its keys stream to replicas); 0/1 one copy */
};

/* Request counters per namespace, kept per worker (indexed by namespace id) and summed. */
#define NS_METRICS(X)                                                                            \
    X(get_hits, COUNTER, "keys found by a get")                                                  \
    X(get_misses, COUNTER, "keys not found by a get")                                            \
    X(sets, COUNTER, "storage requests")                                                         \
    X(deletes, COUNTER, "delete requests that removed or invalidated an item")                   \
    X(lease_wins, COUNTER, "W flags handed out")                                                 \
    X(lease_waits, COUNTER, "Z flags handed out")                                                \
    X(stale_hits, COUNTER, "reads served a stale (X) value")

struct ns_metrics {
    NS_METRICS(METRIC_FIELD)
};

struct ns {
    uint16_t id;
    uint8_t nname;
    char name[NS_NAME_MAX + 1];
    struct ns_config cfg;
    struct ns_metrics base; /* counter sums when this id was (re)used: reported = sum - base */
};

/* An immutable snapshot of every namespace. */
struct ns_table {
    uint64_t version;
    uint32_t count;
    struct ns *byid[NS_MAX];
    uint16_t index[NS_MAX * 2]; /* open addressing by name hash: id + 1, 0 = empty */
};

struct ns_registry {
    pthread_mutex_t lock;   /* writers only */
    struct ns_table *table; /* read with ns_current() */
    uint64_t gen;           /* bumped on every publish */
    uint16_t next_id;       /* ids are handed out round-robin, so a removed namespace's id
                               (and items still tagged with it) is reused as late as possible */
    uint64_t **seen;        /* per reader: gen seen when it went online, 0 = quiescent */
    size_t nreaders;
    /* sums the registry needs to set `base` of a new namespace */
    void (*sum_metrics)(void *ctx, uint16_t id, struct ns_metrics *out);
    void *sum_ctx;
    /* Called (registry lock held) before a namespace's settings are published, with cfg NULL
     * when it is removed: the engine checks and applies the quota and policy. Returns 0, or an
     * HTTP status (400, 507) with a message in err naming the field; then nothing changes. */
    int (*apply)(void *ctx, uint16_t id, const struct ns_config *cfg, char *err, size_t errlen);
    void *apply_ctx;
    /* told of every table published, once readers may see it (the node passes stale_ttl on to
       the store's grace); may be NULL */
    void (*published)(void *ctx, const struct ns_table *t);
    void *published_ctx;
};

/* Registry with only `default`, with no quota (it shares the memory the quotas leave), no TTL
 * rules and the default policy. `seen` points at each reader's quiescence word (one per
 * worker). */
int ns_registry_init(struct ns_registry *r, uint64_t **seen, size_t nreaders);
/* Install the apply hook and run it for every namespace defined now. 0, or -1 with a message. */
int ns_registry_set_apply(struct ns_registry *r,
                          int (*apply)(void *, uint16_t, const struct ns_config *, char *, size_t),
                          void *ctx, char *err, size_t errlen);
/* "lru", "lfu" or "s3fifo". */
const char *ns_eviction_name(enum ns_eviction e);
/* Apply the settings in the JSON object `obj` onto `cfg` (checked against common/nsfields.h;
 * default_ttl at most max_ttl). With NS_JSON_DOC, `obj` is a namespace of a topology document:
 * the settings a node does not act on (copies, ops_per_sec, ...) and memory (the pool's
 * total; the caller sets the node's share) are checked but not stored, other fields (pool,
 * team) are skipped. Without it those are errors. Returns 0, or -1 with `why` naming the
 * field. */
#define NS_JSON_DOC 1u
int ns_config_from_json(struct ns_config *cfg, const json_t *obj, unsigned flags, char *why,
                        size_t whylen);
void ns_registry_teardown(struct ns_registry *r);

static inline const struct ns_table *ns_current(struct ns_registry *r)
{
    return __atomic_load_n(&r->table, __ATOMIC_SEQ_CST);
}

/* A reader goes online before touching the table (after epoll_wait) and offline before
 * blocking; the writer frees a replaced table once no reader online saw the old one. */
static inline void ns_online(struct ns_registry *r, uint64_t *seen) { qsbr_online(&r->gen, seen); }
static inline void ns_quiescent(uint64_t *seen) { qsbr_quiescent(seen); }

/* The namespace of `key`: its prefix before ':' if defined, else default. Never NULL. */
const struct ns *ns_of_key(const struct ns_table *t, const char *key, size_t nkey);
const struct ns *ns_find(const struct ns_table *t, const char *name, size_t nname);

/* Create or change namespace `name` from a JSON object of settings. Fields not given keep
 * their current value (or the default for a new namespace). Returns an HTTP status (200, 201
 * created, 400 with a message naming the field, 409/507 for limits) with a JSON body in out. */
int ns_put_json(struct ns_registry *r, const char *name, const char *json, size_t len,
                struct buf *out);
/* One namespace wanted by ns_replace_all. */
struct ns_want {
    const char *name;
    struct ns_config cfg;
};
/* Make the table exactly `want` (n entries, names valid and distinct) in one publish: the
 * control-plane follower's path (shoal-node --control). Namespaces not listed are removed,
 * `default` is reset to its defaults when not listed; a namespace that keeps its name keeps its
 * id (its items stay its own). A namespace whose settings the apply hook refuses (e.g. a quota
 * share below one segment) keeps its current settings, or is not created, and is named in err;
 * the rest are applied. Returns the number refused (0: all applied; err then empty), or -1 when
 * memory ran out or more than NS_MAX are wanted (nothing published). *changed says whether a
 * table was published. */
int ns_replace_all(struct ns_registry *r, const struct ns_want *want, size_t n, bool *changed,
                   char *err, size_t errlen);
/* Remove a namespace (its keys fall back to default). 200, 404, or 400 for `default`. */
int ns_delete(struct ns_registry *r, const char *name, struct buf *out);
/* Load {"name": {settings}, ...} (or {"namespaces": {...}}) at start. 0, or -1 with a
 * message naming the file and field. */
int ns_load_file(struct ns_registry *r, const char *path, char *err, size_t errlen);
/* JSON of one namespace's settings, or of all ({"version": n, "namespaces": {...}}). */
void ns_render_json(const struct ns_table *t, const struct ns *one, struct buf *out);

/* Apply the namespace's TTL rules to a client's exptime (as sent) and convert it to the store
 * clock: 0 becomes default_ttl, longer than max_ttl is clamped. */
uint32_t ns_exptime(const struct ns *ns, int64_t exptime, uint32_t now);

#endif
