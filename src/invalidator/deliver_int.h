/* deliver_int.h — what the files of delivery share (deliver.c: queues, threads and the public
 * API; deliver_wire.c: the connection to a cluster and its batches; deliver_spill.c: the spill
 * file; deliver_replica.c: the replica's replay LSN; deliver_metrics.c: figures). Not for the
 * reader: its contract is deliver.h.
 *
 * A committed transaction (or one part of a large one) becomes one record, shared by every
 * cluster's queue and by the recent-deletes log through a reference count. A cluster's backlog is
 * in order: the records loaded from its spill file (`front`), the rest of that file, then its
 * memory queue. Only the cluster's thread takes records off; deliver_commit only appends. */
#ifndef SHOAL_INVALIDATOR_DELIVER_INT_H
#define SHOAL_INVALIDATOR_DELIVER_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/metrics.h"

#include "invalidator/deliver.h"

enum rec_kind { REC_KEYS = 1, REC_FLUSH = 2 };

/* Packed items of a record's data, one after the other: u16 length (little-endian), u8
 * namespace length, the key bytes, the namespace bytes (REC_KEYS); for REC_FLUSH each item is a
 * namespace, with no key (length 0) and the name as its namespace. The same bytes are the
 * payload of a spill record, so spilling copies them as they are. */
struct rec {
    int refs;            /* atomic: queues, batches and the replay log holding it */
    uint8_t kind;        /* enum rec_kind */
    uint8_t last;        /* the commit's last part: applying it makes `safe_after` safe */
    uint64_t lsn;        /* the commit's end LSN (a replica must have replayed it); 0: no gate */
    uint64_t safe_after; /* the LSN a cluster may count as safe once this record is applied */
    int64_t commit_us;   /* commit time (unix µs); 0 for replays: no latency is recorded */
    int64_t queued_us;   /* when it was handed over (unix µs), for the replay window */
    uint32_t n;          /* items */
    uint32_t ndata;
    char data[];
};

/* One item of a record, as rec_next reads it. */
struct ritem {
    const char *key;
    size_t nkey;
    const char *ns;
    size_t nns;
};

/* A record of `n` items over `ndata` packed bytes (not yet filled), refs 1; NULL without memory. */
struct rec *rec_new(uint8_t kind, uint32_t n, uint32_t ndata);
void rec_ref(struct rec *r);
void rec_unref(struct rec *r);
/* Read the item at *off (advanced past it); false at the end or on bytes that do not parse. */
bool rec_next(const struct rec *r, uint32_t *off, struct ritem *it);
/* Bytes a packed item takes. */
static inline size_t rec_item_size(size_t nkey, size_t nns) { return 3 + nkey + nns; }
/* Append one packed item at d (room checked by the caller); returns the bytes written. */
size_t rec_pack(char *d, const char *key, size_t nkey, const char *ns, size_t nns);
/* Memory a record is counted for in a cluster's budget. */
static inline uint64_t rec_bytes(const struct rec *r) { return sizeof *r + r->ndata + 16; }

/* A ring of record pointers in order. */
struct recq {
    struct rec **v;
    size_t cap, head, n;
    uint64_t bytes; /* rec_bytes of the records in it */
    uint64_t items; /* keys of its REC_KEYS records */
};
int recq_reserve(struct recq *q, size_t more);
void recq_push(struct recq *q, struct rec *r); /* room reserved first */
static inline struct rec *recq_at(const struct recq *q, size_t i)
{
    return q->v[(q->head + i) % q->cap];
}
struct rec *recq_pop(struct recq *q);
void recq_clear(struct recq *q); /* unrefs every record */
void recq_free(struct recq *q);

/* ---- spill file (deliver_spill.c) ---- */

/* A cluster's spill file: records appended at `end`, read back from `rd` in order. */
struct spill {
    int fd;            /* -1 until opened */
    char *path;
    uint64_t end;      /* bytes written (and fsync'ed) */
    uint64_t rd;       /* next record to load */
    uint64_t records;  /* records in [rd, end) plus those loaded and not applied */
    uint64_t keys;     /* their keys */
    uint64_t max_lsn;  /* the highest commit LSN written since the file was last emptied */
    /* namespaces the spilled records touch: what a flush that replaces them flushes.
     * ns_overflow: more than 32, or a key of no known namespace (or a flush_all) among them,
     * so only a flush_all covers them */
    char *ns[32];
    size_t nns;
    bool ns_overflow;
};

/* Open (creating if missing) `path`; read what an earlier run left: records are checked one by
 * one and a torn or corrupt tail is cut off (logged). *last_safe gets the highest safe_after of
 * the records kept, or 0. 0, or -1 with err set. */
int spill_open(struct spill *s, const char *path, uint64_t *last_safe, char *err, size_t errlen);
void spill_close(struct spill *s);
/* Append the records and fsync. Safe to count only after a 0 return; -1 (logged) leaves the
 * file as it was, logically: `end` is not advanced past a record that was not all written. */
int spill_append(struct spill *s, struct rec *const *recs, size_t n);
/* Load the next record from rd (advancing rd); NULL at the end, or when the bytes do not parse
 * or memory cannot be had (*bad set: the rest of the file is given up, logged). */
struct rec *spill_load(struct spill *s, bool *bad);
/* Replace the whole file by the records given (a flush standing for everything it held; the keys
 * of a retry round that failed again): written to a new file, fsync'ed and renamed over the old
 * one, so a crash leaves one or the other. 0, or -1 (logged) with the old file kept. */
int spill_replace(struct spill *s, struct rec *const *recs, size_t n);
/* Forget everything in the file (truncate to 0). */
int spill_reset(struct spill *s);
static inline bool spill_pending(const struct spill *s) { return s->rd < s->end; }

/* ---- per-cluster state ---- */

/* Latency histogram: 8 sub-buckets per power of two of microseconds, so a quantile is within
 * 12.5% of the truth; the last bucket takes everything from about 2^30 µs (18 min). */
#define DHIST_SUB 8
#define DHIST_POW 31
#define DHIST_BUCKETS (DHIST_SUB * DHIST_POW)
struct dhist {
    uint64_t b[DHIST_BUCKETS];
    uint64_t count, sum_us;
};
void dhist_record(struct dhist *h, uint64_t us);
uint64_t dhist_quantile(const struct dhist *h, double q);

/* Per-second buckets of the last DRATE_SECS seconds, for deletes/s and deletes per batch. */
#define DRATE_SECS 16
struct drate {
    int64_t sec[DRATE_SECS];
    uint64_t keys[DRATE_SECS], batches[DRATE_SECS];
};
void drate_add(struct drate *r, int64_t now_s, uint64_t keys, uint64_t batches);
/* Sums over the `window` whole seconds before now_s. */
void drate_sum(const struct drate *r, int64_t now_s, int window, uint64_t *keys, uint64_t *batches);

#define DELIVER_CLUSTER_METRICS(X)                                                               \
    X(deletes, COUNTER, "keys deleted in the cluster (a miss counts: the key is gone)")          \
    X(batches, COUNTER, "pipelined batches of deletes the cluster answered")                     \
    X(commits, COUNTER, "commits applied in the cluster")                                        \
    X(keys_refused, COUNTER, "keys the cluster answered CLIENT_ERROR for, dropped")              \
    X(keys_unsendable, COUNTER, "keys no memcached request can carry (over 250 bytes, or over "  \
                                "186 with bytes that need base64), dropped")                     \
    X(server_errors, COUNTER, "SERVER_ERROR or other failed answers to a delete; retried")       \
    X(retried_keys, COUNTER, "keys written to the retry file to be sent again after an error")   \
    X(quiet_errors, COUNTER, "batches whose quiet replies held an error, sent again one reply "  \
                             "per key to tell which key it was")                                 \
    X(connects, COUNTER, "connections opened to the cluster")                                    \
    X(connect_failures, COUNTER, "connection attempts that failed")                              \
    X(timeouts, COUNTER, "batches not answered within timeout_ms (connection dropped)")          \
    X(spilled_records, COUNTER, "records written to the spill file")                             \
    X(spill_errors, COUNTER, "spill writes that failed (the records stay in memory)")            \
    X(flush_replacements, COUNTER, "backlogs past spill_max_bytes replaced by a flush of the "    \
                                   "namespaces they touch")                                      \
    X(flushes, COUNTER, "flushes applied (truncates and replacements)")                          \
    X(flush_all_fallbacks, COUNTER, "flushes sent as flush_all: no namespace known, or the "     \
                                    "cluster refused flush_ns (unknown namespace, or not shoal)") \
    X(replays, COUNTER, "keys queued again by deliver_replay")                                   \
    X(skipped, COUNTER, "commits not queued because an earlier run's spill file had them")

#define DELIVER_CLUSTER_GAUGES(X)                                                                \
    X(up, GAUGE, "1 while the connection to one of the cluster's routers answers")                \
    X(buffered_deletes, GAUGE, "deletes queued in memory")                                       \
    X(buffered_bytes, GAUGE, "memory held by the queued deletes")                                \
    X(spilled_deletes, GAUGE, "deletes in the spill file not yet applied")                       \
    X(retry_deletes, GAUGE, "deletes answered with an error, kept in the retry file")            \
    X(spill_bytes, GAUGE, "size of the spill file")                                              \
    X(safe_lsn, GAUGE, "LSN up to which every delete is applied or durably spilled")             \
    X(router_index, GAUGE, "which of the cluster's routers is in use (0: the first)")            \
    X(replica_lsn, GAUGE, "the replica's replay LSN (clusters with a replica)")                  \
    X(replica_up, GAUGE, "1 while the replica answers (clusters with a replica)")                \
    X(gated_deletes, GAUGE, "1 while deliveries wait for the replica to replay a commit")

struct deliver_cstats {
    DELIVER_CLUSTER_METRICS(METRIC_FIELD)
    DELIVER_CLUSTER_GAUGES(METRIC_FIELD)
};

struct dcluster {
    struct deliver *d;
    size_t idx;
    char *name;
    char **routers;
    size_t nrouters;
    char *replica;

    pthread_t thread;
    bool started;
    pthread_mutex_t lock; /* q, stats, hist, rate, wake */
    pthread_cond_t cv;    /* new records, replica progress, stop */
    bool wake;

    struct recq q;        /* memory queue (lock) */
    struct recq front;    /* loaded from the spill file, not yet applied (thread only) */
    uint32_t head_done;   /* items of the first backlog record already applied (thread only) */
    uint32_t head_off;    /* ... and where the next one starts in its data */
    struct spill spill;   /* thread only, after deliver_create */
    struct spill retry;   /* keys answered with an error, sent again in rounds (thread only) */
    uint64_t retry_next_ms, retry_backoff_ms;
    uint64_t gen;         /* bumped when a flush replaces the backlog (thread only) */
    uint64_t skip_upto;   /* commits at or below: in the spill file left by an earlier run */
    uint64_t safe;        /* atomic: applied or durably spilled up to here */

    int fd;               /* connection, -1 when none (thread only) */
    size_t router_at;
    bool answering;       /* the connection answered its last exchange (thread only) */
    uint64_t retry_at_ms; /* next connection attempt */
    uint64_t backoff_ms;

    /* replica gating (deliver_replica.c) */
    pthread_t rthread;
    bool rstarted;
    uint64_t replica_lsn; /* atomic: the replica's last replay LSN seen */
    uint64_t gate_want;   /* atomic: the LSN the cluster waits for (0: none) */
    int replica_passthrough; /* atomic: the replica is not in recovery: no gating */

    struct deliver_cstats st; /* under lock (counters bumped by the thread) */
    struct dhist lat;         /* under lock */
    struct drate rate;        /* under lock */
};

struct deliver {
    struct deliver_cfg cfg;  /* strings owned below */
    char *spill_dir;
    struct dcluster *c;
    size_t nc;
    volatile int stop;       /* atomic */

    pthread_mutex_t lock;    /* the commit side: last_safe and the replay log */
    pthread_mutex_t enq;     /* one enqueue at a time (reader, replays) */
    uint64_t last_complete;  /* end LSN of the last commit handed over whole */
    struct recq replay;      /* recent records, oldest first */
};

/* ---- wire (deliver_wire.c) ---- */

/* One key of a batch. */
struct bkey {
    const char *key;
    uint32_t nkey;
    uint8_t done;
};

/* The outcome of a batch sent to a cluster. */
enum batch_res {
    BATCH_OK,      /* every key applied, refused (CLIENT_ERROR, counted) or unsendable */
    BATCH_RETRY,   /* the cluster answered errors for some keys: send the rest again later */
    BATCH_DOWN,    /* the connection failed or timed out: closed */
};

/* Connect to the first router of the cluster that accepts (in order), within timeout_ms each.
 * 0 (c->fd set), or -1. */
int wire_connect(struct dcluster *c);
void wire_close(struct dcluster *c);
/* Send the keys not yet done as quiet `md` requests closed by `mn` and read the replies; when an
 * error comes back, send them again one reply per key to learn which key each error is for.
 * Keys end done when applied (HD or NF), refused (CLIENT_ERROR) or unsendable. */
enum batch_res wire_delete(struct dcluster *c, struct bkey *keys, size_t n);
/* `mn`, answered MN: is the idle connection still there? */
enum batch_res wire_probe(struct dcluster *c);
/* A flush record: `flush_ns <name>` for each of its namespaces (pipelined), each answered OK.
 * flush_all instead when it names none, when a name cannot go on the wire, or when the cluster
 * answers ERROR (no flush_ns: memcached) or CLIENT_ERROR (a namespace it does not have: its keys
 * are in `default` there) for any of them; logged, counted in flush_all_fallbacks. BATCH_RETRY
 * when any other answer (SERVER_ERROR: a router's node down) comes back. */
enum batch_res wire_flush(struct dcluster *c, const struct rec *r);
/* How a key goes on the wire: 0 plain, 1 base64 (`b`), -1 no request can carry it. */
int wire_key_form(const char *key, size_t nkey);

/* ---- a cluster's thread (deliver_cluster.c) ---- */
void *deliver_cluster_main(void *arg); /* arg: the struct dcluster */
void deliver_wake(struct dcluster *c);   /* new work or stop: the thread looks again */

/* ---- replica (deliver_replica.c) ---- */
int replica_start(struct dcluster *c);
void replica_stop(struct dcluster *c);

/* ---- helpers ---- */
/* Thread-side bump of a counter under the cluster's lock. */
void dc_count(struct dcluster *c, size_t offset, uint64_t n);
#define DC_COUNT(c, field, n) dc_count((c), offsetof(struct deliver_cstats, field), (n))

#endif
