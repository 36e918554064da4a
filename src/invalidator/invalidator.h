/* invalidator.h — shoal-invalidator's options, figures and shared state (issue 14; the daemon
 * that turns PostgreSQL commits into cache deletes; docs/invalidator.md).
 *
 * Threads: the reader (reader.c) owns the replication connection and every decoded
 * transaction; the cleaner (setup.c) deletes consumed rows of the invalidation table over its
 * own connection; the admin listener reads the figures below; delivery runs its own
 * (deliver.h). Figures shared across threads are atomics in struct inv_figs. */
#ifndef SHOAL_INVALIDATOR_H
#define SHOAL_INVALIDATOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/admin.h"
#include "common/follow.h"
#include "invalidator/config.h"

#define INVALIDATOR_VERSION "0.1"

#define INV_OPTIONS(X)                                                                           \
    X(pg, 0, STR, NULL, 0, 0,                                                                    \
      "libpq conninfo of the PostgreSQL primary to read (required), e.g. \"host=db "             \
      "dbname=app user=shoal\"", NULL)                                                           \
    X(slot, 0, STR, "shoal_invalidator", 0, 0,                                                   \
      "logical replication slot to read from (created with pgoutput when missing)", NULL)        \
    X(publication, 0, STR, "shoal_invalidator", 0, 0,                                            \
      "publication of the mapped tables (created when missing; missing tables are added)",       \
      NULL)                                                                                      \
    X(set_replica_identity, 0, BOOL, "yes", 0, 0,                                                \
      "ALTER a mapped table to REPLICA IDENTITY FULL when its identity does not cover every "   \
      "templated column (--set-replica-identity=false: refuse to start instead)", NULL)          \
    X(status_interval_ms, 0, UINT, "1000", 10, 600000,                                           \
      "longest time between standby status updates to PostgreSQL (one is also sent as soon as "  \
      "delivery confirms more)", NULL)                                                           \
    X(reconnect_max_ms, 0, UINT, "5000", 10, 600000,                                             \
      "longest wait between attempts to reconnect to PostgreSQL (doubling from 100 ms)", NULL)   \
    X(cleanup_interval_ms, 0, UINT, "1000", 10, 3600000,                                         \
      "how often consumed rows of the invalidation table are deleted", NULL)                     \
    X(spill_dir, 0, STR, "/var/tmp/shoal-invalidator", 0, 0,                                     \
      "directory of each cluster's spill file (created when missing)", NULL)                     \
    X(mem_max, 0, SIZE, "64m", 1 << 16, 1ull << 40,                                              \
      "per cluster: bytes of queued deletes held in memory before spilling to disk", NULL)       \
    X(spill_max, 0, SIZE, "1g", 1 << 16, 1ull << 50,                                             \
      "per cluster: spill file size past which the backlog is replaced by namespace flushes",    \
      NULL)                                                                                      \
    X(batch_max, 0, UINT, "512", 1, 1 << 20, "deletes per write to a cluster", NULL)             \
    X(replay_window, 0, UINT, "60", 0, 86400,                                                    \
      "seconds of recent deletes kept for POST /v1/replay", NULL)                                \
    X(timeout_ms, 0, UINT, "1000", 10, 600000,                                                   \
      "connect or reply timeout before a cluster counts as down", NULL)                          \
    X(admin_port, 0, UINT, "0", 0, 65535,                                                        \
      "admin HTTP port for /healthz, /metrics and /v1/replay (0: off)", NULL)                    \
    X(admin_listen, 0, STR, "127.0.0.1", 0, 0, "address of the admin HTTP listener", NULL)     \
    X(verbose, 'v', COUNT, "0", 0, 0, "log more (-v events, -vv debug)", NULL)                   \
    X(control, 0, STR, NULL, 0, 0,                                                               \
      "shoal-control URL(s), comma-separated: key templates also come from its namespaces' "    \
      "\"invalidation\" field; the reader starts once the first topology is in", NULL)          \
    FOLLOW_OPTIONS(X)                                                                            \
    ADMIN_OPTIONS(X)

struct inv_options {
    const char *pg, *slot, *publication, *spill_dir, *admin_listen, *auth_file, *control,
        *token_file;
    bool set_replica_identity;
    uint64_t status_interval_ms, reconnect_max_ms, cleanup_interval_ms, mem_max, spill_max,
        batch_max, replay_window, timeout_ms, admin_port, verbose, admin_conn_max,
        admin_conn_per_ip, admin_header_timeout, control_timeout_ms, control_backoff_max_ms;
};

/* The reader's figures (Prometheus prefix shoal_invalidator_): counters and gauges the reader
 * writes and the admin thread reads. */
#define INV_METRICS(X)                                                                           \
    X(streaming, GAUGE, "1 while the replication stream is up")                                  \
    X(received_lsn, GAUGE, "end of the WAL received from PostgreSQL (LSN as a number)")          \
    X(server_lsn, GAUGE, "PostgreSQL's WAL end as it last reported it")                          \
    X(confirmed_lsn, GAUGE, "LSN last confirmed to PostgreSQL (flush position)")                 \
    X(lag_bytes, GAUGE, "WAL bytes between PostgreSQL's end and the confirmed LSN")              \
    X(lag_seconds, GAUGE, "age of the oldest commit handed to delivery and not yet confirmed")   \
    X(transactions, COUNTER, "committed transactions decoded")                                   \
    X(streamed_transactions, COUNTER, "of those, large ones PostgreSQL streamed in blocks")     \
    X(aborted_streams, COUNTER, "streamed transactions aborted (their keys dropped)")            \
    X(changes, COUNTER, "row inserts, updates and deletes decoded on mapped tables")             \
    X(keys, COUNTER, "keys handed to delivery")                                                  \
    X(invalidation_rows, COUNTER, "keys read from the invalidation table")                       \
    X(truncates, COUNTER, "truncates of mapped tables (each a namespace flush)")                 \
    X(keys_null, COUNTER, "templates not evaluated because a column was NULL")                   \
    X(keys_unusable, COUNTER,                                                                    \
      "keys dropped: longer than 250 bytes, or holding a space or control byte")                 \
    X(keys_missing, COUNTER,                                                                     \
      "keys that could not be made, a column's value unknown (column renamed or dropped, "      \
      "identity no longer FULL, TOAST not sent): the table's namespaces flushed instead")        \
    X(receive_delay_us, COUNTER, "sum over commits of their commit timestamp to their hand-over to " \
                                 "delivery, microseconds (PostgreSQL's decoding and sending, and " \
                                 "the reader's; delivery's part is commit_to_delete minus it)")    \
    X(received_late, COUNTER, "commits handed to delivery more than 50 ms after their commit "  \
                              "timestamp")                                                       \
    X(reconnects, COUNTER, "replication connections re-established")                             \
    X(cleaned_rows, COUNTER, "consumed invalidation table rows deleted")                         \
    X(templates_version, GAUGE, "--control: the topology version whose key templates commits "  \
                                "decoded from now on use (0: none yet)")                         \
    X(mapped_tables, GAUGE, "--control: tables in the map of key templates handed to the reader") \
    X(templates_refused, GAUGE, "--control: namespace tables left out of the map (no such "     \
                                "table or column, identity not changed), retried every 5 s")

struct inv_figs {
#define INV_FIG_FIELD(name, kind, help) _Atomic uint64_t name;
    INV_METRICS(INV_FIG_FIELD)
#undef INV_FIG_FIELD
};

struct deliver;
struct rows;
struct inv_ctl;

struct inv {
    struct inv_options opt;
    struct inv_config conf;
    struct deliver *d;
    /* the reader's relation cache; it owns the namespace strings handed to delivery with
     * invalidation table keys, so it is freed only after delivery is destroyed */
    struct rows *rows;
    struct inv_figs figs;
    atomic_bool stop;
    /* the highest invalidation table id in a commit delivery has confirmed; the cleaner
     * deletes rows up to it */
    _Atomic uint64_t cleanup_upto;
    /* --control (ctl.h): the newest map of tables to templates, not yet taken by the reader
     * (which takes it between transactions and owns it from then on), and whether one was
     * ever handed over (the reader streams only after that) */
    struct inv_ctl *ctl;
    _Atomic(struct inv_config *) next_map;
    atomic_bool map_ready;
};

/* reader.c: read, decode and hand over until inv->stop; reconnects on errors. Prepares
 * PostgreSQL first (setup.c) and returns -1 with a message when that fails for a reason a
 * retry cannot fix (a missing table, a template naming a missing column, an identity that may
 * not be changed). */
int reader_run(struct inv *inv, char *err, size_t errlen);

#endif
