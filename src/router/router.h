/* router.h — shoal-router's process-wide state: options, workers, counters.
 *
 * Each worker thread owns an epoll loop, the client connections it accepted and its own
 * upstream connections to every node (struct upnode), so nothing on the request path is shared
 * between threads except the read-only topology table and whether each node is marked down
 * (failover.h) or being caught up on (catchup.h). Counters are per worker and summed when
 * `stats` or /metrics asks. */
#ifndef SHOAL_ROUTER_ROUTER_H
#define SHOAL_ROUTER_ROUTER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "common/admin.h"
#include "common/connlist.h"
#include "common/follow.h"
#include "common/membudget.h"
#include "common/metrics.h"
#include "common/uring.h"
#include "router/dellog.h"
#include "router/nodestats.h"
#include "router/request.h"
#include "router/scopestats.h"
#include "router/topo.h"

#define ROUTER_VERSION "0.1.0"
/* What `version` answers: memcached's version first, for clients that gate features on it. */
#define ROUTER_WIRE_VERSION "1.6.18-shoal-router-" ROUTER_VERSION

/* X(name, short, type, default, lo, hi, help, memcached long name) */
#define ROUTER_OPTIONS(X)                                                                        \
    X(port, 'p', UINT, "11211", 0, 65535, "TCP port to listen on (0 picks a free port)", "port") \
    X(listen, 'l', STR, "127.0.0.1", 0, 0, "address to listen on (a sidecar: loopback)",        \
      "listen")                                                                                  \
    X(conn_limit, 'c', UINT, "4096", 1, 1000000, "most client connections at once",             \
      "conn-limit")                                                                              \
    X(threads, 't', UINT, "2", 1, 256, "worker threads", "threads")                              \
    X(verbose, 'v', COUNT, "0", 0, 0, "log more (-v events, -vv debug)", "verbose")              \
    X(item_max, 'I', SIZE, "1m", 1024, 1 << 30,                                                  \
      "largest item accepted, in bytes: a value with its \\r\\n must fit, as on a node",          \
      "max-item-size")                                                                           \
    X(line_max, 0, SIZE, "64k", 1024, 1 << 24, "longest request line, in bytes", NULL)           \
    X(out_max, 0, SIZE, "32m", 65536, 1ull << 32,                                                \
      "reply bytes kept per client: input pauses at a quarter, replies past it get an error", \
      NULL)                          \
    X(client_pending, 0, UINT, "1024", 1, 1 << 20,                                               \
      "requests in flight per client before its input is paused", NULL)                          \
    X(upstream_conns, 0, UINT, "1", 1, 16, "connections per node per worker thread", NULL)      \
    X(upstream_window, 0, UINT, "512", 1, 1 << 20,                                               \
      "most requests outstanding per node per worker (the sliding window's ceiling)", NULL)  \
    X(upstream_window_bytes, 0, SIZE, "4m", 65536, 1ull << 32,                                    \
      "most reply bytes outstanding per node per worker, reckoned at the node's recent average "  \
      "reply size: with large values the window holds fewer requests", NULL)                       \
    X(timeout_ms, 0, UINT, "1000", 1, 600000,                                                    \
      "per-request upstream timeout, ms; answered SERVER_ERROR", NULL)                           \
    X(retry_ms, 0, UINT, "100", 0, 60000,                                                        \
      "after a failed connect, requests to that node fail at once for this long", NULL)          \
    X(down_after, 0, UINT, "3", 1, 1000,                                                         \
      "consecutive failures (timeouts, lost or refused connections) that mark a node down", NULL) \
    X(probe_ms, 0, UINT, "500", 10, 600000, "how often a node marked down is probed", NULL)      \
    X(repair_log, 0, UINT, "4096", 0, 1 << 24,                                                   \
      "keys remembered per node per worker whose writes the node missed (replicated, or while " \
      "marked down); past that it is flushed when it is back", NULL)                              \
    X(backlog, 'b', UINT, "4096", 1, 65535,                                                       \
      "TCP listen backlog (the kernel caps it at net.core.somaxconn)", "listen-backlog")          \
    X(admin_port, 0, UINT, "0", 0, 65535, "admin HTTP port for /healthz and /metrics (0: off)",  \
      NULL)                                                                                      \
    X(admin_listen, 0, STR, "127.0.0.1", 0, 0, "address of the admin HTTP listener", NULL)     \
    X(port_file, 0, STR, NULL, 0, 0, "write the bound data port to this file (for tests)", NULL) \
    X(client_id, 0, STR, NULL, 0, 0,                                                             \
      "picks the replica this router reads in replicated pools (default: the host name)", NULL)  \
    X(io_uring, 0, UINT, "1", 0, 1,                                                              \
      "1: batch the client reads and sends of each event-loop pass with io_uring (0: a system "  \
      "call each)", NULL)                                                                        \
    X(buffers_max, 0, SIZE, "128m", 1 << 20, 1ull << 40,                                         \
      "most bytes of client input and output buffers and replies kept for clients, all "         \
      "together: past half, a client sends no request while over 64 KB of its replies wait; "  \
      "past it, those holding the most that do not read their replies or finish their request " \
      "are closed", NULL)                                                                        \
    X(partial_timeout_ms, 0, UINT, "30000", 0, 86400000,                                         \
      "a client whose request is incomplete and that sends no byte for this long is closed "     \
      "(0: never)", NULL)                                                                          \
    X(control, 0, STR, NULL, 0, 0,                                                              \
      "URL of shoal-control, or URL,URL... of one etcd-backed control group (the next is tried when one does "  \
      "not answer): follow its topology by long-poll (with --config: start from the "  \
      "file, then follow; without: wait for the control plane's first document)", NULL)          \
    X(control_wait_ms, 0, UINT, "5000", 100, 3600000,                                            \
      "with --control and no --config: how long to wait at start for the first document "       \
      "before giving up (exit status 2)", NULL)                                                   \
    X(moved_wait_ms, 0, UINT, "1000", 0, 60000,                                                  \
      "a request a node refuses because its slot moved (lease expired, handoff) waits this long " \
      "for a newer topology and is sent to the slot's new owner; else a read falls back as for " \
      "a node down and a write is sent to the owner once more", NULL)                            \
    X(moved_keep_max, 0, SIZE, "32m", 0, 1ull << 40,                                             \
      "most bytes of requests over 16 KB to slots with a replica (all workers together) kept "  \
      "until answered, so that one refused as its slot moved is sent again to the new owner; "  \
      "past it (or past --buffers-max) they are not kept and such a refusal reaches the client " \
      "(0: none kept)", NULL)                                                                    \
    X(report_ms, 0, UINT, "1000", 50, 600000,                                                    \
      "with --control: how often the nodes' up/down states are reported (POST /v1/reports; at " \
      "once on a change)", NULL)                                                                  \
    X(replay_window_s, 0, UINT, "60", 0, 86400,                                                  \
      "seconds of recent deletes kept, sent again to a promoted slot's new primary (0: none)",  \
      NULL)                                                                                      \
    X(replay_margin_ms, 0, UINT, "1000", 0, 3600000,                                             \
      "after a promotion only deletes logged since the new primary's replication stamp (the "    \
      "dead primary's clock up to which it applied everything) minus this are replayed: covers " \
      "clock skew between hosts", NULL)                                                          \
    X(catchup_wait_ms, 0, UINT, "1000", 0, 60000,                                                \
      "when a copies-2 primary fails, requests routed to its slots' replicas wait at most this " \
      "long for every worker's catch-up of its recent deletes there (0: they do not wait)",      \
      NULL)                                                                                      \
    X(replay_log_bytes, 0, SIZE, "8m", 0, 1ull << 34,                                            \
      "memory for the recent-deletes log, all workers together (the oldest are forgotten first)", \
      NULL)                                                                                      \
    FOLLOW_OPTIONS(X)                                                                            \
    ADMIN_OPTIONS(X)

struct router_config {
    uint64_t port, conn_limit, threads, verbose, item_max, line_max, out_max, client_pending,
        upstream_conns, upstream_window, upstream_window_bytes, timeout_ms, retry_ms, down_after, probe_ms, repair_log,
        backlog, admin_port, io_uring, buffers_max, partial_timeout_ms, admin_conn_max,
        admin_conn_per_ip, admin_header_timeout, control_wait_ms, control_timeout_ms, control_backoff_max_ms,
        moved_wait_ms, moved_keep_max, report_ms, replay_window_s, replay_margin_ms, replay_log_bytes,
        catchup_wait_ms;
    const char *listen, *admin_listen, *port_file, *client_id, *control, *auth_file, *token_file;
    const char *topology; /* --config FILE */
};

#define ROUTER_METRICS(X)                                                                        \
    X(cmd_get, COUNTER, "keys requested by get, gets, gat, gats and mg")                          \
    X(cmd_set, COUNTER, "storage requests (text and ms)")                                        \
    X(cmd_other, COUNTER, "other routed requests (delete, incr, touch, md, ma, ...)")            \
    X(cmd_local, COUNTER, "requests answered by the router itself (version, mn, stats, ...)")    \
    X(multiget_split, COUNTER, "multi-key gets split over more than one node")                  \
    X(long_gets, COUNTER, "get, gets, gat and gats lines over --line-max, routed in parts")     \
    X(replicated_writes, COUNTER, "writes sent to every replica of a replicated pool")           \
    X(replicated_cas, COUNTER, "compare-and-swap writes to a replicated pool (compared on one)")  \
    X(repair_keys_logged, COUNTER, "keys logged for deletion on a node that missed a write")     \
    X(repair_deletes, COUNTER, "deletes sent to repair a node back from down or a failure")      \
    X(repair_log_overflows, COUNTER, "repair logs that overflowed (the node is then flushed)")   \
    X(repair_flushes, COUNTER, "flush_all sent to repair a node whose repair log overflowed")    \
    X(warm_lookups, COUNTER, "keys a cold pool missed that were looked up in its warm pool")    \
    X(warm_hits, COUNTER, "warm-pool lookups that found the key")                                \
    X(warm_fills, COUNTER, "adds sent into a cold pool with a warm pool's value")               \
    X(upstream_requests, COUNTER, "requests sent to nodes")                                      \
    X(upstream_timeouts, COUNTER, "requests answered SERVER_ERROR for a node's timeout")         \
    X(upstream_errors, COUNTER, "requests answered SERVER_ERROR for a lost or refused node")     \
    X(upstream_connects, COUNTER, "connections opened to nodes")                                 \
    X(upstream_connect_failures, COUNTER, "connections to nodes that failed")                    \
    X(upstream_protocol_errors, COUNTER, "node replies that did not parse or fit their request") \
    X(client_caused_reply_errors, COUNTER,                                                       \
      "replies of a request's kind that did not echo it, failing that request alone (not the node)") \
    X(window_waits, COUNTER, "requests that waited for room in a node's window")                 \
    X(window_timeouts, COUNTER, "requests that waited --timeout-ms for room in a node's window, " \
      "never sent (not counted against the node)")                                                \
    X(nodes_marked_down, COUNTER, "times a worker marked a node down (after failures of its " \
      "own, or adopting another worker's mark)")                                                  \
    X(nodes_marked_up, COUNTER, "times a worker marked a node up again (its probe, or another " \
      "worker's, found it healthy)")                                                              \
    X(gutter_requests, COUNTER, "requests sent to the gutter pool: their node is down or being " \
      "repaired")                                                                                 \
    X(gutter_retries, COUNTER, "requests retried on the gutter pool after their node refused, " \
      "reset or timed out (failover.h)")                                                           \
    X(replica_reads, COUNTER, "reads sent to a slot's replica while its primary is down or " \
      "being repaired (FAILOVER.md C6)")                                                          \
    X(replica_writes, COUNTER, "writes (fills, deletes, any other) sent to a slot's replica " \
      "while its primary is down or being repaired, instead of to the gutter (FAILOVER.md C6)")   \
    X(moved_retries, COUNTER, "requests a node refused as its slot moved (lease expired, " \
      "moving), sent again to the slot's owner in a newer topology")                              \
    X(moved_keep_refused, COUNTER, "requests over 16 KB to a slot with a replica that could not " \
      "keep their bytes (--moved-keep-max or --buffers-max full): not sent again if refused as " \
      "their slot moved")                                                                         \
    X(replayed_deletes, COUNTER, "recent deletes sent again to a promoted slot's new primary")   \
    X(catchups, COUNTER, "catch-ups run by a worker: a primary failed, its recent deletes sent " \
      "to its slots' replicas before they serve its keys (catchup.h)")                            \
    X(catchup_deletes, COUNTER, "recent deletes sent to a failed primary's slot replicas")       \
    X(catchup_held, COUNTER, "requests held until every worker's catch-up was answered")         \
    X(catchup_timeouts, COUNTER, "catch-ups not finished by every worker within "                \
      "--catchup-wait-ms: the held requests went ahead")                                          \
    X(catchup_failures, COUNTER, "catch-up batches the replica failed (refused, reset, timed out)") \
    X(down_node_requests, COUNTER, "requests failed at once: node down (or being repaired) and " \
      "no gutter for it")                                                                         \
    X(window_shrinks, COUNTER, "times a node's window was halved after a timeout")               \
    X(protocol_errors, COUNTER, "client requests answered ERROR or CLIENT_ERROR")               \
    X(ttl_rewrites, COUNTER, "requests whose TTL a namespace's default or maximum changed")      \
    X(policy_refusals, COUNTER, "requests refused by a namespace limit (size, ops/s, bytes/s)")  \
    X(out_of_memory, COUNTER, "requests answered SERVER_ERROR for lack of memory")              \
    X(replies_dropped, COUNTER,                                                                  \
      "replies replaced by SERVER_ERROR: the client's unread replies were over --out-max")     \
    X(bytes_read, COUNTER, "bytes read from clients")                                            \
    X(bytes_written, COUNTER, "bytes sent to clients")                                           \
    X(conns_total, COUNTER, "client connections accepted")                                     \
    X(conns_paused_budget, COUNTER,                                                              \
      "times a client's input was paused because client buffers were over half --buffers-max")  \
    X(conns_closed_budget, COUNTER,                                                              \
      "clients closed because client buffers were over --buffers-max")                          \
    X(conns_closed_idle, COUNTER,                                                                \
      "clients closed: an incomplete request saw no byte for --partial-timeout-ms")              \
    /* process-wide, from struct router's budget (router_metrics_sum); kept by `stats reset` */   \
    X(client_buffer_bytes, GAUGE,                                                                \
      "bytes held by clients' input and output buffers and the replies kept for them, and by " \
      "large requests kept for a moved-retry (moved_kept_bytes)")                                  \
    X(moved_kept_bytes, GAUGE, "bytes of requests over 16 KB kept until answered for a "        \
      "moved-retry (within --moved-keep-max)")

struct router_metrics {
    ROUTER_METRICS(METRIC_FIELD)
};

struct client;
struct upnode;
struct upconn;

struct rworker {
    struct router *r;
    int id;
    uint64_t topo_seen __attribute__((aligned(64))); /* quiescence word (topo.h) */
    int epfd, wakefd;
    pthread_t thread;
    uint64_t now_ms;            /* monotonic ms at the start of the batch */
    uint64_t now_us;            /* the same in microseconds (latency figures) */
    const struct topo *topo;    /* table in use during this batch */
    uint64_t topo_gen;          /* generation `map` was built for */
    struct upnode **map;        /* topo node index -> this worker's upstream */
    uint32_t nmap;
    int32_t *scratch;           /* nmap entries of -1, for splitting multi-gets */
    struct upnode *upnodes;     /* every upstream, current or retired */
    struct client *clients;
    struct client *dirty;       /* clients to service at the end of the batch */
    struct upconn *dirty_up;    /* upstream connections with bytes to send */
    uint64_t inflight;          /* fragments queued or outstanding on any upstream */
    uint64_t health_seen;       /* router.health_gen when it last adopted mark-downs (failover.h) */
    struct uring ring;          /* batches client reads and sends when use_ring (--io-uring) */
    bool use_ring;
    uint64_t next_idle_ms;      /* next look for idle incomplete requests (client_budget.c) */
    struct dellog dellog;       /* its recent deletes (dellog.h) */
    uint64_t promo_seen;        /* router.promo_seq it last replayed for */
    struct frag *parked, *parked_tail; /* waiting for a newer topology (moved-retry, failover.h) */
    int kickfd;                 /* written to wake it: another worker started a catch-up */
    uint32_t catchup_inflight;  /* its catch-up batches not answered yet (catchup.h) */
    uint32_t catchup_waits;     /* nodes whose episode it waits for: requests to replicas held */
    bool catchup_due;           /* an episode may have ended: poll at once */
    struct router_metrics m __attribute__((aligned(64)));
};

struct opt_def;
struct follow;
struct reporter;
struct json_t;

struct router {
    struct router_config cfg;
    const struct opt_def *opts; /* the table cfg was parsed with (`stats settings`) */
    size_t nopts;
    struct topo_registry topo;
    struct nodestats nodes;     /* per-node figures for /metrics */
    struct scopestats scopes;   /* per-pool and per-namespace figures for /metrics */
    struct rworker *workers;
    int listen_fd;
    unsigned bound_port;
    unsigned admin_bound_port;  /* 0: no admin listener */
    struct follow *follow;      /* --control's follower (follow.h), or NULL */
    time_t started;
    uint64_t curr_conns, rejected_conns;
    struct membudget budget;    /* every client's buffers, within cfg.buffers_max */
    struct keepbudget keep;     /* large requests kept for a moved-retry (request.h) */
    struct connlist conns;      /* every worker's clients, for `stats conns` (connlist.h) */
    uint64_t reloads, reload_failures;
    /* bumped whenever a worker marks a node down or up, so the others adopt it (failover.h) */
    uint64_t health_gen __attribute__((aligned(64)));
    /* `stats reset`: the counters' sums at the last reset, which `stats` subtracts (the workers'
     * own counters, and /metrics, keep counting: nothing writes another thread's counters) */
    pthread_mutex_t reset_lock;
    struct router_metrics reset_base;
    /* promotions of published versions, for the workers' replay (dellog.h) */
    pthread_mutex_t promo_lock;
    uint64_t promo_seq;
    struct dellog_promo promo[DELLOG_PROMOS];
    /* router_apply_topology: one at a time; the document in use, parsed (promote_diff) */
    pthread_mutex_t apply_lock;
    struct json_t *applied_doc;
    struct reporter *reporter;  /* --control's node reports (report.h), or NULL */
};

void router_metrics_sum(struct router *r, struct router_metrics *out);

#endif
