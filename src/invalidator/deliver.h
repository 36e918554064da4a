/* deliver.h — the invalidator's delivery side: every committed transaction's deletes go, in
 * commit order, to every configured cluster in pipelined batches, and the reader learns which
 * LSN it may confirm to PostgreSQL (issue 14, points 3 and 4; docs/invalidator.md).
 *
 * This header is the contract between the log reader (pgoutput decoding and key templates,
 * src/invalidator/reader*.c, main.c) and delivery (src/invalidator/deliver*.c). The reader calls
 * it from one thread; delivery runs its own threads (at least one per cluster) so an
 * unreachable cluster never stops the reader or the other clusters.
 *
 * Ordering and durability: commits are handed over in LSN order. A cluster applies them in that
 * order, except keys it answered with an error to be retried (a router's node down), which go
 * to its retry file (fsync'ed, so safe) and are sent again apart from newer deletes (deletes
 * commute; see docs/invalidator.md, Delivery). deliver_safe_lsn() is the LSN the reader may confirm to PostgreSQL (flush position of
 * the replication stream): every commit at or below it has had each of its deletes applied, or
 * replaced by an applied namespace flush, in every cluster, or written durably (fsync) to that
 * cluster's spill file, which a restarted invalidator replays before anything newer. */
#ifndef SHOAL_INVALIDATOR_DELIVER_H
#define SHOAL_INVALIDATOR_DELIVER_H

#include <stddef.h>
#include <stdint.h>

struct buf;
struct deliver;

struct deliver_cluster_cfg {
    const char *name;           /* the config's key under "clusters" */
    const char *const *routers; /* "host:port" of anything speaking memcached's protocol (a
                                 * shoal-router or one shoal-node); tried in order on failure */
    size_t nrouters;
    const char *replica;        /* PostgreSQL conninfo of the replica serving this cluster, or
                                 * NULL: deletes are held until its replay LSN passes the
                                 * commit (point 4) */
};

/* A numeric field left 0 takes its default: mem_max_bytes 64 MiB, spill_max_bytes 1 GiB,
 * batch_max 256 (at most 65536), replay_window_s 60, timeout_ms 1000. */
struct deliver_cfg {
    const struct deliver_cluster_cfg *clusters;
    size_t nclusters;
    const char *spill_dir;       /* where each cluster's spill file lives (created if missing) */
    uint64_t mem_max_bytes;      /* per cluster: queued deletes held in memory before spilling */
    uint64_t spill_max_bytes;    /* per cluster: spill file size past which the queue is
                                  * replaced by a flush of the namespaces it touches, logged */
    uint64_t batch_max;          /* deletes per write */
    uint64_t replay_window_s;    /* how long deletes are remembered for deliver_replay */
    uint64_t timeout_ms;         /* connect / reply timeout before a cluster counts as down */
};

/* One key to delete; `ns` is the namespace it belongs to (used when a flush replaces a backlog),
 * NULL when unknown. Bytes are copied by deliver_commit. */
struct deliver_key {
    const char *key;
    size_t nkey;
    const char *ns;
};

/* Starts the delivery threads and replays any spill files left by an earlier run. Returns NULL
 * with a message naming the problem in err on a bad configuration or an unusable spill_dir. */
struct deliver *deliver_create(const struct deliver_cfg *cfg, char *err, size_t errlen);
/* Stops the threads; undelivered deletes in memory are lost (PostgreSQL still has them, since
 * they are above deliver_safe_lsn). */
void deliver_destroy(struct deliver *d);

/* One committed transaction: `end_lsn` is the commit's end LSN, `commit_time_us` its commit
 * timestamp (unix microseconds, for the commit-to-delete latency). A transaction with no keys
 * is still handed over, so the safe LSN can pass it. May be called in several parts for one
 * large transaction: `more` nonzero means further keys of the same commit follow. Returns 0,
 * or -1 when memory cannot be had (the reader then stops confirming and retries). */
int deliver_commit(struct deliver *d, uint64_t end_lsn, int64_t commit_time_us,
                   const struct deliver_key *keys, size_t nkeys, int more);

/* A truncate of a mapped table: flush every listed namespace (in order with the deletes), as
 * `flush_ns <name>`; `flush_all` when none is listed or the cluster refuses one (it does not have
 * that namespace, or speaks no flush_ns), logged and counted. */
int deliver_flush(struct deliver *d, uint64_t end_lsn, int64_t commit_time_us,
                  const char *const *namespaces, size_t nns);

/* See above. 0 before anything was applied. */
uint64_t deliver_safe_lsn(struct deliver *d);

/* Sends again, to every cluster (or the one named), the deletes of the last `since_s` seconds
 * (capped at replay_window_s) whose keys fall in the given slots (common/slot.h). Returns the
 * number of keys queued, or -1 with err set. For POST /v1/replay. */
long deliver_replay(struct deliver *d, const char *cluster, const uint16_t *slots, size_t nslots,
                    uint64_t since_s, char *err, size_t errlen);

/* Prometheus text for /metrics: per cluster commit-to-delete latency p50/p99, deletes/s,
 * deletes per batch, buffered and spilled deletes, up/down, flushes that replaced a backlog. */
void deliver_metrics(struct deliver *d, struct buf *out);

/* 1 when every cluster is reachable (for /healthz), 0 otherwise. */
int deliver_healthy(struct deliver *d);

#endif
