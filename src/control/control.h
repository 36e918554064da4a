/* control.h — shoal-control, the control plane (the paper's config system): its options,
 * metrics, and the state every part shares.
 *
 * One process holds the model (pools, nodes, slot maps, namespaces; model.h) and serves it over
 * HTTP/JSON (api.c): every accepted change is checked whole, written to the state store
 * (state.h) and only then acknowledged, bumps the topology version, wakes the long polls held
 * for it (poll.h) and the pusher that brings nodes' namespace settings and memory shares in
 * line (push.h). The admin listener runs a few threads (so one slow request never holds up
 * another, lease renewals above all); API changes are handed to one change thread, the
 * failover thread makes its own, one at a time under `change_mu`; the poller and the pusher
 * read the model under `lock`. With --etcd several processes share the state: one is leader
 * and stores changes (leader.h, state_etcd.c), the others forward changes to it (forward.h)
 * and install each newer stored state from their sync thread, also under `change_mu`. */
#ifndef SHOAL_CONTROL_CONTROL_H
#define SHOAL_CONTROL_CONTROL_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/admin.h"
#include "common/metrics.h"

#define CONTROL_VERSION "0.1.0"

/* X(name, short, type, default, lo, hi, help, alias) — see common/options.h */
#define CONTROL_OPTIONS(X)                                                                       \
    X(port, 'p', UINT, "11500", 0, 65535,                                                        \
      "HTTP port of the API, /healthz and /metrics (0 picks a free port)", NULL)                 \
    X(listen, 'l', STR, "127.0.0.1", 0, 0, "address of the HTTP listener (IPv4)", NULL)         \
    X(data_dir, 0, STR, "shoal-control-data", 0, 0,                                              \
      "directory of the state file, created when missing", NULL)                                 \
    X(state, 0, STR, NULL, 0, 0, "the state file (default: DATA_DIR/state.json)", NULL)          \
    X(poll_timeout, 0, UINT, "30", 1, 600,                                                       \
      "longest a GET /v1/topology?after=V is held before it is answered 304, seconds", NULL)    \
    X(poll_max, 0, UINT, "512", 1, 65535,                                                        \
      "most long polls held at once (below --admin-conn-max); past it they are answered 503",   \
      NULL)                                                                                      \
    X(push_timeout_ms, 0, UINT, "2000", 50, 60000,                                               \
      "time allowed for one push of namespace settings to a node's admin port, ms", NULL)       \
    X(push_retry_ms, 0, UINT, "5000", 10, 600000,                                                \
      "longest wait before a failed push is tried again (the wait doubles from 100 ms)", NULL)  \
    X(etcd, 0, STR, NULL, 0, 0,                                                                  \
      "keep the state in etcd instead of the state file, shared by several shoal-control "       \
      "processes (one leader): the members' client URLs, URL[,URL...]", NULL)                   \
    X(etcd_prefix, 0, STR, "/shoal/control/", 0, 0,                                             \
      "etcd key prefix of this control plane (its keys: PREFIX state, PREFIX ns/0..63, PREFIX "   \
      "leader)", NULL)                                                                           \
    X(etcd_lease_ttl, 0, UINT, "3", 2, 60,                                                       \
      "seconds the leader's etcd lease lasts unrenewed (renewed every third of it): how soon "  \
      "another takes over when the leader dies", NULL)                                           \
    X(etcd_poll_ms, 0, UINT, "200", 10, 10000,                                                   \
      "how often a follower checks etcd for a newer state or a missing leader, ms", NULL)       \
    X(etcd_timeout_ms, 0, UINT, "1000", 50, 60000,                                               \
      "time allowed for one etcd request to one member before the next is tried, ms", NULL)     \
    X(advertise, 0, STR, NULL, 0, 0,                                                             \
      "the URL other shoal-control processes forward writes to (default http://LISTEN:PORT)",   \
      NULL)                                                                                      \
    X(stats_interval_ms, 0, UINT, "1000", 100, 60000,                                           \
      "time between two samples of every node's /metrics for the dashboard and /v1/stats, ms",  \
      NULL)                                                                                      \
    X(stats_window, 0, UINT, "600", 1, 86400,                                                    \
      "seconds of samples kept for the dashboard and /v1/stats", NULL)                           \
    X(stats_timeout_ms, 0, UINT, "800", 50, 60000,                                               \
      "time allowed for one node's /metrics when sampling, ms", NULL)                            \
    X(stats_workers, 0, UINT, "8", 1, 256,                                                       \
      "nodes sampled at once (a slow node holds one of them up to --stats-timeout-ms)", NULL)   \
    X(stats_namespaces, 0, UINT, "512", 1, 16384,                                                \
      "most namespaces whose series are kept (each costs 12 bytes per sample)", NULL)           \
    X(chart_js, 0, STR, "/usr/share/javascript/chart.js/chart.min.js", 0, 0,                     \
      "Chart.js served to the dashboard as /static/chart.js (Debian's libjs-chart.js)", NULL)   \
    X(port_file, 0, STR, NULL, 0, 0, "write the bound port to this file (for tests)", NULL)      \
    X(token_file, 0, STR, NULL, 0, 0,                                                            \
      "file holding the bearer token sent with pushes to nodes' admin ports (default: the "     \
      "SHOAL_TOKEN variable); an admin token where nodes run with --auth-file", NULL)            \
    X(probe_ms, 0, UINT, "200", 10, 60000,                                                       \
      "how often control probes the data port of every node of a pool with replicas (TCP "      \
      "connect and version, each allowed min(this, 200) ms), ms", NULL)                          \
    X(failure_timeout_ms, 0, UINT, "1000", 0, 600000,                                            \
      "how long a node must stay suspect (most reporting routers say down and probes fail) "    \
      "before it is dead and its slots are promoted to their replicas, ms", NULL)                \
    X(report_stale_ms, 0, UINT, "3000", 100, 600000,                                             \
      "a router's failure report older than this no longer counts, ms", NULL)                    \
    X(verbose, 'v', COUNT, "0", 0, 0, "log more (-v events, -vv debug)", NULL)                   \
    X(lease_ms, 0, UINT, "2000", 100, 600000,                                                    \
      "slot lease granted to nodes (POST /v1/leases), ms: a node that has not renewed for this " \
      "long plus a margin (1/20 of it + 100 ms) has stopped serving its replicated slots",      \
      NULL)                                                                                      \
    ADMIN_OPTIONS(X)

struct control_config {
    uint64_t port, poll_timeout, poll_max, push_timeout_ms, push_retry_ms, verbose,
        admin_conn_max, admin_conn_per_ip, admin_header_timeout, etcd_lease_ttl, etcd_poll_ms, etcd_timeout_ms,
        lease_ms;
    uint64_t stats_interval_ms, stats_window, stats_timeout_ms, stats_workers, stats_namespaces;
    uint64_t probe_ms, failure_timeout_ms, report_stale_ms;
    const char *listen, *data_dir, *state, *port_file, *etcd, *etcd_prefix, *advertise,
        *auth_file, *token_file, *chart_js;
};

#define CONTROL_METRICS(X)                                                                       \
    X(requests_namespaces, COUNTER, "requests to /v1/namespaces and /v1/namespaces/<name>")      \
    X(requests_pools, COUNTER, "requests to /v1/pools and below")                               \
    X(requests_topology, COUNTER, "GET /v1/topology answered at once (no after=, or newer)")     \
    X(requests_topology_polls, COUNTER, "GET /v1/topology?after=V held until a change or timeout") \
    X(changes_applied, COUNTER, "changes accepted, each written to the state store and a new version") \
    X(changes_refused, COUNTER, "changes refused (invalid, conflicting, or not stored): nothing changed") \
    X(polls_held, GAUGE, "long polls held now")                                                  \
    X(polls_answered, COUNTER, "held long polls answered with a newer version")                  \
    X(polls_timed_out, COUNTER, "held long polls answered 304 at --poll-timeout")                \
    X(polls_refused, COUNTER, "long polls answered 503 because --poll-max were held")            \
    X(pushes, COUNTER, "namespace settings put on (or removed from) a node's admin port")        \
    X(push_failures, COUNTER, "pushes that failed (node unreachable or refusing); retried")      \
    X(push_pending, GAUGE, "node namespace settings not yet in place")                           \
    X(state_writes, COUNTER, "state store writes (each change is stored before it is acknowledged)") \
    X(state_write_failures, COUNTER, "state store writes that failed (the change was refused)") \
    X(topology_version, GAUGE, "version of the topology document served")                       \
    X(leader, GAUGE, "1 while this process is the leader (always 1 without --etcd)")            \
    X(leader_elections, COUNTER, "times this process won the etcd election and became leader") \
    X(leader_losses, COUNTER, "times this process stopped being leader (lease lost or resigned)") \
    X(writes_forwarded, COUNTER, "changes a follower forwarded to the leader and got an answer for") \
    X(forward_failures, COUNTER, "changes a follower could not forward (no leader, or it did not answer)") \
    X(deposed_refusals, COUNTER, "changes refused because etcd's guard showed this process had lost the lease") \
    X(state_refreshes, COUNTER, "newer states read from etcd and installed (followers, or a new leader)") \
    X(etcd_errors, COUNTER, "etcd requests no member answered (retried on the next tick)") \
    X(stats_samples, COUNTER, "dashboard samples taken (every node's /metrics read once)")      \
    X(stats_node_failures, COUNTER, "node /metrics reads that failed while sampling")            \
    X(stats_namespaces_dropped, COUNTER, "namespace figures not kept: --stats-namespaces were tracked") \
    X(lease_grants, COUNTER, "slot leases granted or renewed (POST /v1/leases answered 200)")  \
    X(lease_refusals, COUNTER, "renewals refused (409) while a promotion over the node was being stored") \
    X(reports, COUNTER, "router failure reports taken (POST /v1/reports)")                      \
    X(probe_failures, COUNTER, "probes of a node's data port that failed (connect or version)") \
    X(nodes_suspect, GAUGE, "nodes suspect now: most reporting routers say down and probes fail") \
    X(nodes_dead, GAUGE, "nodes dead now: suspect for --failure-timeout-ms")                     \
    X(promotions, COUNTER, "promotions published (each a dead node's slots to their replicas)")  \
    X(promotion_ms, GAUGE, "the last promotion's time from first suspicion to publication, ms") \
    X(returns, COUNTER, "dead nodes back (probes pass, routers say up), made replicas again")   \
    X(drains, COUNTER, "drains done (ranges handed off to their replicas and swapped)")          \
    X(handoff_failures, COUNTER, "drain handoffs a node refused or did not answer")

struct control_metrics {
    CONTROL_METRICS(METRIC_FIELD)
};

struct state_store;
struct poller;
struct pusher;
struct ha;
struct forwarder;
struct sampler;
struct topo_doc;
struct render;
struct lease_table;
struct failover;
struct changer;

struct control {
    struct control_config cfg;
    /* Changes to the model are serialized by `change_mu`, held for a whole change: the fork,
     * the check, the state save (an etcd round trip, seconds when etcd elects) and the install.
     * `lock` guards model, doc and version and is held only to read them, to fork and check,
     * and to install: never across a save, so readers wait for a change's computation at most.
     * Order: change_mu, then lock, then a module's own (the lease table's innermost). Lease
     * renewals take neither (lease.h). */
    pthread_mutex_t change_mu;
    pthread_mutex_t lock; /* model, doc, version: installed by changes (the change thread, the
                           * failover thread) and a follower's sync thread, read under it */
    json_t *model;        /* model.h */
    struct topo_doc *doc; /* the topology document of `model`, as served (topodoc.h) */
    struct render *render; /* renders doc and the stored state (render.h); under `lock` */
    uint64_t version;
    struct control_metrics m; /* atomics */
    struct state_store *store;
    struct poller *poll;
    struct pusher *push;
    struct ha *ha;          /* --etcd: the election and the follower's sync (leader.h); else NULL */
    struct forwarder *fwd;  /* --etcd: changes sent on to the leader (forward.h); else NULL */
    char *auth_header; /* "Authorization: Bearer ..." for pushes (--token-file), or NULL */
    struct sampler *stats; /* the dashboard's samples (sampler.h) */
    struct lease_table *leases; /* nodes' slot leases (lease.h) */
    struct failover *fo;   /* failure detection, promotion, drain (failover.h); NULL in tests */
    struct changer *chg;   /* the change thread (api.c): writes run there, off the listener */
    /* Shutdown (control_close_writes): under `gate` (never held but to count). Once `closing`
     * is set every write is answered 503 "shutting down"; `writers` counts the writes still
     * inside a handler or queued for the change thread (they may use ha and fwd), and `idle` is
     * signalled when the last one leaves. */
    pthread_mutex_t gate;
    bool closing;
    unsigned writers;
    pthread_cond_t idle;
};

#define CTL_INC(c, f) __atomic_fetch_add(&(c)->m.f, 1, __ATOMIC_RELAXED)
#define CTL_SET(c, f, v) __atomic_store_n(&(c)->m.f, (v), __ATOMIC_RELAXED)

/* Refuse writes from now on (503 "shutting down") and wait for those under way to leave their
 * handlers, so that ha and fwd can go while the listener still answers. Main thread, once. */
void control_close_writes(struct control *c);

/* Make `model` the current state (it is consumed): render its topology document, set the
 * version, publish its view to the lease table (when there is one yet). Caller holds
 * c->change_mu and c->lock, or runs before any other thread starts. 0 or -1 (memory). */
int control_install(struct control *c, json_t *model);

struct model_err;
/* A change made by control itself (a promotion, a returning node, a drain's swap), through the
 * same path as the API's: fn edits a fork of the model in which pool `pool` is a deep copy,
 * then replicas are brought in line (model_replicas_sync), the model checked, stored, the
 * version bumped and long polls woken. `what` names it in the log. Returns 0 with *version set,
 * 304 when fn changed nothing (no version), or an HTTP status with `e` filled. fn runs under
 * c->lock; the save does not. Any thread but one holding c->change_mu or c->lock, and not the
 * admin listener's (a save may take seconds: the listener must go on answering renewals). */
typedef int (*control_fn)(json_t *m, void *arg, struct model_err *e);
int control_change(struct control *c, const char *pool, const char *what, control_fn fn,
                   void *arg, struct model_err *e, uint64_t *version);
/* As control_change, but the pool's replicas are left as fn made them (not re-planned): a
 * drain's swap, whose drained node must stay the replica of every slot it handed off. (The
 * plan would give the excess of the drained node, which keeps the replica slots it had, to
 * other nodes; routers would take such a range for a promotion and replay recent deletes.) */
int control_change_keeping_replicas(struct control *c, const char *pool, const char *what,
                                    control_fn fn, void *arg, struct model_err *e,
                                    uint64_t *version);

#endif
