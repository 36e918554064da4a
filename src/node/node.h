/* node.h — shoal-node's process-wide state: configuration, workers, connections, counters.
 *
 * One `struct node` exists per process. Each worker thread owns an epoll loop and the
 * connections handed to it at accept (to the worker with the fewest); connections never move
 * after that, so a connection's state is touched by one thread only. Request counters are per worker (no shared cache lines on the hot
 * path) and summed when `stats` or `/metrics` asks. */
#ifndef SHOAL_NODE_NODE_H
#define SHOAL_NODE_NODE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/connlist.h"
#include "common/follow.h"
#include "common/membudget.h"
#include "common/metrics.h"
#include "common/uring.h"
#include "node/detail.h"
#include "node/lease.h"
#include "node/ns.h"
#include "node/store.h"
#include "protocol/protocol.h"

#define SHOAL_VERSION "0.1.0"
/* What `version` answers: memcached's version first so client libraries that gate features on
 * it keep working, then ours. */
#define SHOAL_WIRE_VERSION "1.6.18-shoal-" SHOAL_VERSION

/* Node options beyond the engine's (STORE_OPTIONS): X(name, short, type, default, lo, hi, help,
 * memcached long name). */
#define NODE_OPTIONS(X)                                                                           \
    X(port, 'p', UINT, "11211", 0, 65535, "TCP port to listen on (0 picks a free port)", "port") \
    X(listen, 'l', STR, "", 0, 0, "address to listen on (default: all)", "listen")               \
    X(conn_limit, 'c', UINT, "1024", 1, 1000000, "most client connections at once", "conn-limit") \
    X(threads, 't', UINT, "4", 1, 256, "worker threads", "threads")                             \
    X(udp_port, 'U', UINT, "0", 0, 65535, "UDP port; UDP is not supported, only 0", "udp-port")  \
    X(verbose, 'v', COUNT, "0", 0, 0, "log more (-v events, -vv debug)", "verbose")              \
    X(line_max, 0, SIZE, "64k", 1024, 1 << 24, "longest request line, in bytes", NULL)           \
    X(out_max, 0, SIZE, "32m", 65536, 1ull << 32, "most reply bytes queued per connection",      \
      NULL)                                                                                      \
    X(backlog, 'b', UINT, "4096", 1, 65535,                                                      \
      "TCP listen backlog (the kernel caps it at net.core.somaxconn)", "listen-backlog")         \
    X(admin_port, 0, UINT, "0", 0, 65535, "admin HTTP port for /healthz and /metrics (0: off)",  \
      NULL)                                                                                      \
    X(admin_listen, 0, STR, "127.0.0.1", 0, 0, "address of the admin HTTP listener", NULL)     \
    X(port_file, 0, STR, NULL, 0, 0, "write the bound data port to this file (for tests)", NULL) \
    X(namespaces, 0, STR, NULL, 0, 0, "JSON file of namespaces to create at start", NULL)        \
    X(lease_keys, 0, UINT, "65536", 64, 1 << 24,                                                 \
      "keys whose last lease win is remembered, for lease_period and lease_ttl", NULL)            \
    X(inflight_max, 0, SIZE, "0", 0, 1ull << 40,                                                 \
      "most bytes of storage values still arriving, staged for all connections together "        \
      "(0: an eighth of -m, at least -I and 1m)", NULL)                                           \
    X(inflight_stall_ms, 0, UINT, "100", 0, 86400000,                                            \
      "a value whose staging sent no byte for this long is closed when another needs its room " \
      "under inflight_max, or while staging holds over 7/8 of it (0: never)", NULL)             \
    X(io_uring, 0, UINT, "1", 0, 1,                                                              \
      "1: batch the reads and sends of all ready connections with io_uring (0: a system call "  \
      "each)", NULL)                                                                             \
    X(worker_yield, 0, UINT, "1", 0, 1,                                                          \
      "1: after a batch of requests from 4 or more connections a worker lets threads waiting "  \
      "for its CPU run before its next batch (0: it runs on while requests keep coming)", NULL) \
    X(buffers_max, 0, SIZE, "64m", 1 << 20, 1ull << 40,                                         \
      "most bytes of client input and output buffers, all connections together: past half, a " \
      "connection takes no request while over 64 KB of its replies wait; past it, those "      \
      "holding the most that do not read their replies or finish their request are closed",     \
      NULL)                                                                                      \
    X(partial_timeout_ms, 0, UINT, "30000", 0, 86400000,                                         \
      "a connection whose request is incomplete and that sends no byte for this long is "        \
      "closed (0: never)", NULL)                                                                 \
    X(control, 0, STR, NULL, 0, 0,                                                               \
      "URL of shoal-control, or URL,URL... of one etcd-backed control group (the next is tried when one does "  \
      "not answer): follow its topology by long-poll (namespaces, slots owned)", NULL)  \
    X(advertise, 0, STR, NULL, 0, 0,                                                             \
      "host:port the topology names this node by (default: -l's address and the bound port)",  \
      NULL)                                                                                      \
    X(lease_renew_ms, 0, UINT, "250", 10, 60000,                                                 \
      "with --control: renew the slot lease this often, ms (replicated slots this node is "      \
      "primary of are refused once it runs out: docs/operations.md, Leases)", NULL)             \
    X(repl_backlog, 0, SIZE, "64m", 4096, 1ull << 40,                                           \
      "bytes of recent changes kept for replicas (a replica further behind resyncs in full)",   \
      NULL)                                                                                      \
    FOLLOW_OPTIONS(X)                                                                            \
    ADMIN_OPTIONS(X)

struct node_config {
    uint64_t port, conn_limit, threads, udp_port, verbose, line_max, out_max, backlog,
        admin_port, lease_keys, inflight_max, inflight_stall_ms, io_uring, worker_yield, buffers_max,
        partial_timeout_ms, repl_backlog, admin_conn_max, admin_conn_per_ip, admin_header_timeout, control_timeout_ms,
        control_backoff_max_ms, lease_renew_ms;
    const char *listen, *admin_listen, *port_file, *namespaces, *control, *advertise,
        *auth_file, *token_file;
    struct store_options store;
};

/* Request counters, one set per worker. Names follow memcached's `stats` where the concept
 * exists. */
#define NODE_METRICS(X)                                                                          \
    X(cmd_get, COUNTER, "keys requested by get, gets, gat, gats and mg")                          \
    X(cmd_set, COUNTER, "storage requests")                                                      \
    X(cmd_flush, COUNTER, "flush_all requests")                                                  \
    X(cmd_flush_ns, COUNTER, "flush_ns requests that flushed a namespace")                       \
    X(cmd_touch, COUNTER, "touch and gat requests")                                              \
    X(cmd_meta, COUNTER, "meta protocol requests")                                               \
    X(get_hits, COUNTER, "keys found by a get")                                                  \
    X(get_misses, COUNTER, "keys not found by a get")                                            \
    X(get_expired, COUNTER, "gets that found an expired item")                                   \
    X(get_flushed, COUNTER, "gets that found a flushed item")                                    \
    X(delete_misses, COUNTER, "deletes of absent keys")                                          \
    X(delete_hits, COUNTER, "deletes that removed an item")                                      \
    X(incr_misses, COUNTER, "incr of absent keys")                                               \
    X(incr_hits, COUNTER, "successful incr")                                                     \
    X(decr_misses, COUNTER, "decr of absent keys")                                               \
    X(decr_hits, COUNTER, "successful decr")                                                     \
    X(cas_misses, COUNTER, "cas of absent keys")                                                 \
    X(cas_hits, COUNTER, "successful cas")                                                       \
    X(cas_badval, COUNTER, "cas with a stale value")                                             \
    X(touch_hits, COUNTER, "touches that found the key")                                         \
    X(touch_misses, COUNTER, "touches of absent keys")                                           \
    X(store_too_large, COUNTER, "stores refused: item larger than the item size limit")          \
    X(store_no_memory, COUNTER, "stores refused: no memory could be freed")                      \
    X(lease_wins, COUNTER, "W flags handed out (the right to fill or recache)")                  \
    X(lease_waits, COUNTER, "Z flags handed out (another client holds the win)")                 \
    X(stale_hits, COUNTER, "reads served a stale (X) value")                                     \
    X(lease_table_overflows, COUNTER, "lease wins recorded by forgetting a still-blocking key")  \
    X(bytes_read, COUNTER, "bytes read from clients")                                            \
    X(bytes_written, COUNTER, "bytes sent to clients")                                           \
    X(protocol_errors, COUNTER, "requests answered ERROR or CLIENT_ERROR")                       \
    X(conn_closed_line_too_long, COUNTER, "connections closed for a request line over line_max") \
    X(long_gets, COUNTER, "get, gets, gat and gats lines over line_max, answered in parts")      \
    X(conn_closed_out_limit, COUNTER, "replies refused because out_max would be exceeded")      \
    X(conn_oom, COUNTER, "connection buffer allocations that failed")                            \
    X(store_inflight_refused, COUNTER,                                                           \
      "stores refused: staging their value would pass inflight_max")                             \
    X(store_inflight_direct, COUNTER,                                                            \
      "values staging had no room for that went into their item, the rest having arrived")       \
    X(conns_paused_budget, COUNTER,                                                              \
      "times a connection stopped taking requests because client buffers were over half "       \
      "buffers_max")                                                                             \
    X(conns_closed_budget, COUNTER,                                                              \
      "connections closed because client buffers were over buffers_max")                         \
    X(conns_closed_idle, COUNTER,                                                                \
      "connections closed: an incomplete request saw no byte for partial_timeout_ms")            \
    X(conns_closed_inflight, COUNTER,                                                            \
      "connections closed: their value stalled while staged values held inflight_max")           \
    /* node-wide, from struct node's budget (node_metrics_sum) */                                \
    X(client_buffer_bytes, GAUGE, "bytes held by client connections' input and output buffers") \
    /* node-wide, from struct node's inflight_bytes (node_metrics_sum): not counted per worker */ \
    X(inflight_bytes, GAUGE, "bytes staged for storage values still arriving")

struct node_metrics {
    NODE_METRICS(METRIC_FIELD)
};

/* Request counters per size class, memcached's `stats slabs` <id>:<field> figures; per worker
 * like the others, indexed by the class of the item the request found or stored. */
#define CLASS_METRICS(X)                                                                         \
    X(get_hits) X(cmd_set) X(delete_hits) X(incr_hits) X(decr_hits) X(cas_hits) X(cas_badval)    \
    X(touch_hits)
struct class_metrics {
#define X(name) uint64_t name;
    CLASS_METRICS(X)
#undef X
};
#define NODE_CLASS_SLOTS 256 /* class ids are a uint8_t (slab.h) */

struct node;
struct node_control;
struct fence;
struct repl;

struct worker {
    struct node *node;
    int id;
    /* namespace-table quiescence word (ns.h), alone on its cache line: written per batch */
    uint64_t ns_seen __attribute__((aligned(64)));
    int epfd;
    int wakefd; /* eventfd to stop the loop */
    int handfd; /* eventfd: another worker queued accepted sockets in `hand` for us */
    pthread_t thread;
    /* connections owned or handed to this worker, read by acceptors to balance the load */
    uint64_t nconns;
    pthread_mutex_t hand_lock; /* guards hand, nhand, handcap */
    int *hand;                 /* accepted sockets waiting for this worker to adopt them */
    size_t nhand, handcap;
    struct node_metrics m __attribute__((aligned(64)));
    struct ns_metrics ns_m[NS_MAX]; /* per namespace id */
    struct class_metrics cls[NODE_CLASS_SLOTS]; /* per size class id */
    struct conn *conns;             /* list of this worker's connections */
    uint64_t reaped_ms;             /* when worker_conn_room last reaped, monotonic ms */
    struct uring ring;              /* batches socket I/O when use_ring (--io-uring) */
    bool use_ring;
    uint64_t now_ms;                /* clock_now_ms() when the batch began */
    uint64_t next_idle_ms;          /* next look for idle incomplete requests (conn_budget.c) */
    bool doomed;                    /* some connection is marked doomed (conn_stage.c) */
};

struct node {
    struct node_config cfg;
    struct store *store;
    struct lease_table *leases; /* lease_period / lease_ttl memory per key (lease.h) */
    struct ns_registry ns;
    struct detail detail; /* `stats detail` prefix counts (detail.h) */
    struct worker *workers;
    int listen_fd;
    unsigned bound_port;
    time_t started;
    volatile int stopping;
    /* connection counts: changed on accept/close only */
    uint64_t curr_conns;
    uint64_t total_conns;
    uint64_t rejected_conns;
    /* bytes of every connection's staging buffers (conn_stage.c), at most cfg.inflight_max */
    uint64_t inflight_bytes;
    struct membudget budget; /* every connection's buffers, within cfg.buffers_max */
    struct connlist conns; /* every worker's connections, for `stats conns` (connlist.h) */
    uint64_t next_worker; /* rotates the first worker considered for a new connection */
    bool crawler_off;     /* `lru_crawler disable`: metadump refused, as memcached (relaxed) */
    struct node_control *control; /* --control's follower (control.h), or NULL */
    struct fence *fence;          /* --control's slot lease (fence.h), or NULL */
    struct repl *repl;            /* replication (repl.h), with --control only, else NULL */
};

/* The metric tables behind `stats` and /metrics (defined in cmd_stats.c). */
const struct metric_desc *node_metric_table(size_t *n);
const struct metric_desc *store_metric_table(size_t *n);

/* Sum every worker's counters into `out`. */
void node_metrics_sum(struct node *n, struct node_metrics *out);
/* Sum every worker's counters of namespace id `id` (the registry's sum_metrics hook). */
void node_ns_metrics_sum(void *node, uint16_t id, struct ns_metrics *out);
/* The namespace registry's apply hook: check a namespace's quota against the engine (0 or at
 * least one slab page, at most -m) and give the engine its quota and policy (cfg NULL: removed,
 * its pool keeps no quota and its pages go to whoever needs them). */
int node_ns_apply(void *node, uint16_t id, const struct ns_config *cfg, char *err, size_t errlen);

#endif
