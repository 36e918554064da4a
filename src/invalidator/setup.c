/* setup.c — PostgreSQL preparation, the invalidation table cleaner, and the watcher that keeps
 * the config's tables whole in the publication and a lost slot flushed (setup.h).
 *
 * Replica identity: an UPDATE's old row reaches a logical decoder only in the columns of the
 * table's replica identity (and only when one of them changed), a DELETE's likewise. A key
 * template evaluated on the old row therefore needs every templated column inside the
 * identity, or REPLICA IDENTITY FULL. When a table's identity does not cover its templates, the
 * table is altered to FULL (logged), unless --set-replica-identity=false, which refuses to
 * start and names the statement to run. */
#include "invalidator/setup.h"

#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "invalidator/invalidator.h"
#include "common/template.h"

/* PQexecParams with text parameters; NULL result on failure with err set. */
static PGresult *q(PGconn *c, const char *sql, int n, const char *const *params, char *err,
                   size_t errlen)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return r;
    snprintf(err, errlen, "%.200s: %s", sql, PQerrorMessage(c));
    char *nl = strrchr(err, '\n');
    if (nl && nl[1] == 0) *nl = 0;
    PQclear(r);
    return NULL;
}

/* "schema"."name", quoted for SQL, into out. */
static int qualified(PGconn *c, const char *schema, const char *name, char *out, size_t cap)
{
    char *s = PQescapeIdentifier(c, schema, strlen(schema));
    char *n = PQescapeIdentifier(c, name, strlen(name));
    int ok = s && n && (size_t)snprintf(out, cap, "%s.%s", s, n) < cap;
    PQfreemem(s);
    PQfreemem(n);
    return ok ? 0 : -1;
}

void setup_cols_clear(struct setup_cols *sc)
{
    PQclear(sc->res);
    memset(sc, 0, sizeof *sc);
}

int setup_table_cols(PGconn *c, const char *schema, const char *name, struct setup_cols *sc,
                     char *err, size_t errlen)
{
    memset(sc, 0, sizeof *sc);
    const char *p[2] = {schema, name};
    PGresult *r = q(c,
                    "SELECT c.oid::text, c.relreplident::text FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2 AND "
                    "c.relkind IN ('r', 'p')",
                    2, p, err, errlen);
    if (r == NULL) return -1;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return 0;
    }
    char oid[32];
    sc->exists = 1;
    sc->ident = PQgetvalue(r, 0, 1)[0];
    snprintf(oid, sizeof oid, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    const char *po[1] = {oid};
    /* every column, and whether it is in the identity ('d': the primary key, 'i': the chosen
     * index, 'f': all, 'n': none) */
    sc->res = q(c,
                "SELECT a.attname, COALESCE((SELECT true FROM pg_index i WHERE i.indrelid = "
                "a.attrelid AND a.attnum = ANY(i.indkey) AND (CASE c.relreplident WHEN 'd' THEN "
                "i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END) LIMIT 1), "
                "false)::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid WHERE "
                "a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped",
                1, po, err, errlen);
    return sc->res ? 0 : -1;
}

int setup_col(const struct setup_cols *sc, const char *col)
{
    for (int i = 0; sc->res && i < PQntuples(sc->res); i++)
        if (!strcmp(PQgetvalue(sc->res, i, 0), col))
            return sc->ident == 'f' || !strcmp(PQgetvalue(sc->res, i, 1), "true") ? 2 : 1;
    return 0;
}

/* Does the table's replica identity cover every templated column? Fails (-1) when the table
 * or a templated column does not exist. */
static int check_table(PGconn *c, const struct inv_table *t, int *covered, char *err,
                       size_t errlen)
{
    struct setup_cols sc;
    if (setup_table_cols(c, t->schema, t->name, &sc, err, errlen) < 0) return -1;
    if (!sc.exists) {
        snprintf(err, errlen, "table %s.%s (in the config's \"tables\") does not exist", t->schema,
                 t->name);
        return -1;
    }
    *covered = 1;
    for (size_t k = 0; k < t->nkeys; k++) {
        for (size_t j = 0; j < tmpl_nrefs(t->keys[k]); j++) {
            const char *col = tmpl_ref(t->keys[k], j);
            int found = setup_col(&sc, col);
            if (found == 0) {
                snprintf(err, errlen, "table %s.%s has no column \"%s\" (template \"%s\")",
                         t->schema, t->name, col, tmpl_text(t->keys[k]));
                setup_cols_clear(&sc);
                return -1;
            }
            if (found == 1) *covered = 0;
        }
    }
    setup_cols_clear(&sc);
    return 0;
}

/* A statement without parameters, over the simple query protocol (all a replication
 * connection takes). */
static int exec(PGconn *c, const char *sql, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    PQclear(r);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return 0;
    snprintf(err, errlen, "%.200s: %s", sql, PQerrorMessage(c));
    char *nl = strrchr(err, '\n');
    if (nl && nl[1] == 0) *nl = 0;
    return -1;
}

static int partitions_identity(struct inv *inv, PGconn *c, const char *schema, const char *name,
                               char *err, size_t errlen);

int setup_identity_full(struct inv *inv, PGconn *c, const char *schema, const char *table,
                        char *err, size_t errlen)
{
    char name[600], sql[800];
    if (qualified(c, schema, table, name, sizeof name) < 0)
        return snprintf(err, errlen, "out of memory"), -1;
    snprintf(sql, sizeof sql, "ALTER TABLE %s REPLICA IDENTITY FULL", name);
    if (!inv->opt.set_replica_identity) {
        snprintf(err, errlen,
                 "table %s: its replica identity does not hold every templated column, so an "
                 "UPDATE or DELETE would not carry the old key's values; run `%s` (or make an "
                 "index over them the identity), or start without --set-replica-identity=false",
                 name, sql);
        return -1;
    }
    log_notice("table %s: replica identity does not cover its key templates: %s", name, sql);
    if (exec(c, sql, err, errlen) < 0) return -1;
    return partitions_identity(inv, c, schema, table, err, errlen); /* a partitioned table's */
}

/* A partitioned table's replica identity is its partitions': each one's WAL carries the old
 * row per its own identity, while pgoutput (publishing through the root) marks the old row
 * per the root's, so a root made FULL over DEFAULT partitions would send a "whole" old row
 * whose non-key columns are NULL. When the root is FULL, every leaf partition is made FULL too
 * (those created later: by the watcher, within a second). 0, or -1 with err set. */
static int partitions_identity(struct inv *inv, PGconn *c, const char *schema, const char *name,
                               char *err, size_t errlen)
{
    char qn[600];
    if (qualified(c, schema, name, qn, sizeof qn) < 0)
        return snprintf(err, errlen, "out of memory"), -1;
    const char *p[1] = {qn};
    PGresult *r = q(c,
                    "SELECT n.nspname::text, c.relname::text FROM pg_partition_tree($1::regclass) "
                    "t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = "
                    "c.relnamespace WHERE t.isleaf AND c.relreplident <> 'f' AND (SELECT "
                    "relreplident FROM pg_class WHERE oid = $1::regclass) = 'f' AND (SELECT "
                    "relkind FROM pg_class WHERE oid = $1::regclass) = 'p'",
                    1, p, err, errlen);
    if (r == NULL) return -1;
    int rc = 0;
    for (int i = 0; i < PQntuples(r) && rc == 0; i++)
        rc = setup_identity_full(inv, c, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), err, errlen);
    PQclear(r);
    return rc;
}

static int prepare_tables(struct inv *inv, PGconn *c, char *err, size_t errlen)
{
    char name[600], sql[1400];
    for (size_t i = 0; i < inv->conf.ntables; i++) {
        const struct inv_table *t = &inv->conf.tables[i];
        int covered;
        if (check_table(c, t, &covered, err, errlen) < 0) return -1;
        if (!covered && setup_identity_full(inv, c, t->schema, t->name, err, errlen) < 0)
            return -1;
        if (partitions_identity(inv, c, t->schema, t->name, err, errlen) < 0) return -1;
    }
    if (inv->conf.inv_name) {
        if (qualified(c, inv->conf.inv_schema, inv->conf.inv_name, name, sizeof name) < 0)
            return snprintf(err, errlen, "out of memory"), -1;
        snprintf(sql, sizeof sql,
                 "CREATE TABLE IF NOT EXISTS %s (id bigserial PRIMARY KEY, key text NOT NULL, "
                 "created_at timestamptz NOT NULL DEFAULT now())",
                 name);
        if (exec(c, sql, err, errlen) < 0) return -1;
        const char *p[2] = {inv->conf.inv_schema, inv->conf.inv_name};
        PGresult *r = q(c,
                        "SELECT count(*)::text FROM information_schema.columns WHERE "
                        "table_schema = $1 AND table_name = $2 AND ((column_name = 'key' AND "
                        "data_type IN ('text', 'character varying')) OR (column_name = 'id' AND "
                        "data_type IN ('bigint', 'integer')))",
                        2, p, err, errlen);
        if (r == NULL) return -1;
        int ok = !strcmp(PQgetvalue(r, 0, 0), "2");
        PQclear(r);
        if (!ok) {
            snprintf(err, errlen,
                     "invalidation table %s needs a text column \"key\" and an integer column "
                     "\"id\" (drop it and the invalidator creates it)",
                     name);
            return -1;
        }
    }
    return 0;
}

/* The publication, with every mapped table and the invalidation table in it. */
static int prepare_publication(struct inv *inv, PGconn *c, char *err, size_t errlen)
{
    const char *pub = inv->opt.publication;
    const char *p1[1] = {pub};
    PGresult *r = q(c, "SELECT 1 FROM pg_publication WHERE pubname = $1", 1, p1, err, errlen);
    if (r == NULL) return -1;
    int exists = PQntuples(r) > 0;
    PQclear(r);
    char *qp = PQescapeIdentifier(c, pub, strlen(pub));
    if (qp == NULL) return snprintf(err, errlen, "out of memory"), -1;
    int rc = 0;
    if (!exists) {
        char sql[200];
        snprintf(sql, sizeof sql, "CREATE PUBLICATION %s", qp);
        log_notice("creating publication %s", pub);
        rc = exec(c, sql, err, errlen);
    }
    PQfreemem(qp);
    size_t n = inv->conf.ntables + (inv->conf.inv_name ? 1 : 0);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *schema = i < inv->conf.ntables ? inv->conf.tables[i].schema
                                                   : inv->conf.inv_schema;
        const char *tname = i < inv->conf.ntables ? inv->conf.tables[i].name : inv->conf.inv_name;
        rc = setup_publication_add(inv, c, schema, tname, err, errlen);
    }
    return rc;
}

int setup_publication_add(struct inv *inv, PGconn *c, const char *schema, const char *tname,
                          char *err, size_t errlen)
{
    const char *pub = inv->opt.publication;
    const char *p3[3] = {pub, schema, tname};
    /* a partitioned table's changes come under its partitions' names unless the publication
     * publishes through the root: the root's name and columns are what the templates map */
    PGresult *r = q(c,
                    "SELECT 1 FROM pg_publication p, pg_class c JOIN pg_namespace n ON n.oid = "
                    "c.relnamespace WHERE p.pubname = $1 AND NOT p.pubviaroot AND n.nspname = $2 "
                    "AND c.relname = $3 AND c.relkind = 'p'",
                    3, p3, err, errlen);
    if (r == NULL) return -1;
    int viaroot = PQntuples(r) > 0;
    PQclear(r);
    if (viaroot) {
        char sql[300];
        char *qp = PQescapeIdentifier(c, pub, strlen(pub));
        if (qp == NULL) return snprintf(err, errlen, "out of memory"), -1;
        snprintf(sql, sizeof sql, "ALTER PUBLICATION %s SET (publish_via_partition_root = true)",
                 qp);
        PQfreemem(qp);
        log_notice("publication %s: %s.%s is partitioned: %s", pub, schema, tname, sql);
        if (exec(c, sql, err, errlen) < 0) return -1;
    }
    r = q(c,
                    "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 "
                    "AND tablename = $3",
                    3, p3, err, errlen);
    if (r == NULL) return -1;
    int in = PQntuples(r) > 0;
    PQclear(r);
    if (in) return 0;
    char name[600], sql[900];
    char *qp = PQescapeIdentifier(c, pub, strlen(pub));
    if (qp == NULL || qualified(c, schema, tname, name, sizeof name) < 0) {
        PQfreemem(qp);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    snprintf(sql, sizeof sql, "ALTER PUBLICATION %s ADD TABLE %s", qp, name);
    PQfreemem(qp);
    log_notice("publication %s: adding table %s", pub, name);
    return exec(c, sql, err, errlen);
}

/* <spill_dir>/<slot>.slot: an invalidator on this spill directory has read that slot, so a
 * slot found missing later was lost, not never made. (Slot names are [a-z0-9_].) */
static int slot_mark_path(struct inv *inv, char *out, size_t cap)
{
    return (size_t)snprintf(out, cap, "%s/%s.slot", inv->opt.spill_dir, inv->opt.slot) < cap ? 0
                                                                                            : -1;
}

static int slot_mark(struct inv *inv, char *err, size_t errlen)
{
    char path[1200];
    if (slot_mark_path(inv, path, sizeof path) < 0)
        return snprintf(err, errlen, "spill directory path too long"), -1;
    if (access(path, F_OK) == 0) return 0;
    if (mkdir(inv->opt.spill_dir, 0700) < 0 && errno != EEXIST)
        return snprintf(err, errlen, "spill directory %s: %s", inv->opt.spill_dir,
                        strerror(errno)), -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int ok = fd >= 0 && write(fd, inv->opt.slot, strlen(inv->opt.slot)) >= 0 && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok) return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    return 0;
}

/* Writes the message by which the reader flushes the namespaces of every table in its map. */
static int emit_flush_all(struct inv *inv, PGconn *c, char *err, size_t errlen)
{
    char content[300];
    snprintf(content, sizeof content, "flushall\n%s", inv->opt.publication);
    const char *p[2] = {SETUP_MSG_PREFIX, content};
    PGresult *r = q(c, "SELECT pg_logical_emit_message(true, $1, $2)", 2, p, err, errlen);
    PQclear(r);
    return r ? 0 : -1;
}

/* The slot, created on a replication connection when missing. A slot that this spill
 * directory's invalidator read before and is missing now, or that PostgreSQL invalidated
 * (wal_status lost: max_slot_wal_keep_size), lost the commits since its confirmed position:
 * the new slot's first message flushes the namespaces of every mapped table. */
static int prepare_slot(struct inv *inv, PGconn *c, char *err, size_t errlen)
{
    const char *p1[1] = {inv->opt.slot};
    PGresult *r = q(c,
                    "SELECT plugin, slot_type, COALESCE(wal_status, '') FROM "
                    "pg_replication_slots WHERE slot_name = $1",
                    1, p1, err, errlen);
    if (r == NULL) return -1;
    int lost = 0;
    if (PQntuples(r) > 0) {
        int ok = !strcmp(PQgetvalue(r, 0, 0), "pgoutput");
        lost = !strcmp(PQgetvalue(r, 0, 2), "lost");
        PQclear(r);
        if (!ok) {
            snprintf(err, errlen, "replication slot %s exists but is not a pgoutput logical "
                                  "slot: name another with --slot", inv->opt.slot);
            return -1;
        }
        if (!lost) return slot_mark(inv, err, errlen);
        log_error("replication slot %s was invalidated by PostgreSQL (max_slot_wal_keep_size): "
                  "dropping it", inv->opt.slot);
        r = q(c, "SELECT pg_drop_replication_slot($1)", 1, p1, err, errlen);
        if (r == NULL) return -1;
    } else {
        char path[1200];
        lost = slot_mark_path(inv, path, sizeof path) == 0 && access(path, F_OK) == 0;
    }
    PQclear(r);
    PGconn *rc = setup_replication_connect(inv, err, errlen);
    if (rc == NULL) return -1;
    char *qs = PQescapeIdentifier(rc, inv->opt.slot, strlen(inv->opt.slot));
    char sql[300];
    snprintf(sql, sizeof sql, "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput NOEXPORT_SNAPSHOT",
             qs ? qs : "");
    PQfreemem(qs);
    log_notice("creating replication slot %s", inv->opt.slot);
    int res = exec(rc, sql, err, errlen);
    PQfinish(rc);
    if (res == 0 && lost) {
        log_error("replication slot %s was lost (dropped or invalidated): the commits since its "
                  "last confirmed position will never be sent, so the namespaces of every "
                  "mapped table are flushed",
                  inv->opt.slot);
        res = emit_flush_all(inv, c, err, errlen);
    }
    return res < 0 ? -1 : slot_mark(inv, err, errlen);
}

int setup_slot(struct inv *inv, char *err, size_t errlen)
{
    PGconn *c = PQconnectdb(inv->opt.pg);
    int rc = -1;
    if (PQstatus(c) != CONNECTION_OK)
        snprintf(err, errlen, "--pg: cannot connect: %s", PQerrorMessage(c));
    else
        rc = prepare_slot(inv, c, err, errlen);
    PQfinish(c);
    return rc;
}

PGconn *setup_replication_connect(struct inv *inv, char *err, size_t errlen)
{
    /* --pg's conninfo, with replication=database added (expand_dbname reads it whole) */
    const char *kw[] = {"dbname", "replication", NULL};
    const char *vals[] = {inv->opt.pg, "database", NULL};
    PGconn *c = PQconnectdbParams(kw, vals, 1);
    if (PQstatus(c) == CONNECTION_OK) return c;
    snprintf(err, errlen, "replication connection: %s", PQerrorMessage(c));
    char *nl = strrchr(err, '\n');
    if (nl && nl[1] == 0) *nl = 0;
    PQfinish(c);
    return NULL;
}

int setup_prepare(struct inv *inv, char *err, size_t errlen)
{
    PGconn *c = PQconnectdb(inv->opt.pg);
    if (PQstatus(c) != CONNECTION_OK) {
        snprintf(err, errlen, "--pg: cannot connect: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    PGresult *r = q(c, "SHOW wal_level", 0, NULL, err, errlen);
    int rc = -1;
    if (r && PQserverVersion(c) < 140000) {
        /* pgoutput's protocol version 2 (streamed transactions) came with PostgreSQL 14 */
        snprintf(err, errlen, "PostgreSQL %d.%d is too old: 14 or later is needed",
                 PQserverVersion(c) / 10000, PQserverVersion(c) % 10000);
    } else if (r && strcmp(PQgetvalue(r, 0, 0), "logical")) {
        snprintf(err, errlen, "PostgreSQL runs with wal_level=%s; logical decoding needs "
                              "wal_level=logical (postgresql.conf, then a restart)",
                 PQgetvalue(r, 0, 0));
    } else if (r) {
        rc = prepare_tables(inv, c, err, errlen);
        if (rc == 0) rc = prepare_publication(inv, c, err, errlen);
        if (rc == 0) rc = prepare_slot(inv, c, err, errlen);
    }
    PQclear(r);
    PQfinish(c);
    return rc;
}

/* The publication is checked this often: a table out of it gets no delete at all */
#define WATCH_MS 1000

/* Writes the watcher's flush of table schema.name into the log (setup.h), in the transaction
 * open on c if any. */
static int emit_flush(struct inv *inv, PGconn *c, const char *schema, const char *name,
                      char *err, size_t errlen)
{
    char content[800];
    snprintf(content, sizeof content, "flush\n%s\n%s\n%s", inv->opt.publication, schema, name);
    const char *p[2] = {SETUP_MSG_PREFIX, content};
    PGresult *r = q(c, "SELECT pg_logical_emit_message(true, $1, $2)", 2, p, err, errlen);
    PQclear(r);
    return r ? 0 : -1;
}

/* The publication must publish every kind of change: `ALTER PUBLICATION ... SET (publish =
 * 'insert')` stops updates, deletes and truncates reaching the reader. Put back, with a flush
 * of every config table's namespaces, in one transaction. */
static void watch_actions(struct inv *inv, PGconn *c)
{
    char err[600], e2[600], sql[300];
    const char *p1[1] = {inv->opt.publication};
    PGresult *r = q(c,
                    "SELECT 1 FROM pg_publication WHERE pubname = $1 AND NOT (pubinsert AND "
                    "pubupdate AND pubdelete AND pubtruncate)",
                    1, p1, err, sizeof err);
    int narrowed = r && PQntuples(r) > 0;
    PQclear(r);
    if (!narrowed) return;
    char *qp = PQescapeIdentifier(c, inv->opt.publication, strlen(inv->opt.publication));
    if (qp == NULL) return;
    snprintf(sql, sizeof sql,
             "ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate')", qp);
    PQfreemem(qp);
    int ok = exec(c, "BEGIN", err, sizeof err) == 0 && exec(c, sql, err, sizeof err) == 0;
    for (size_t i = 0; ok && i < inv->conf.ntables; i++)
        ok = emit_flush(inv, c, inv->conf.tables[i].schema, inv->conf.tables[i].name, err,
                        sizeof err) == 0;
    if (ok && exec(c, "COMMIT", err, sizeof err) == 0) {
        log_error("publication %s did not publish every kind of change, so some were not sent: "
                  "%s, and the tables' namespaces flushed",
                  inv->opt.publication, sql);
        return;
    }
    exec(c, "ROLLBACK", e2, sizeof e2);
    log_warn_limited("publication %s does not publish every kind of change: %s",
                     inv->opt.publication, err);
}

/* ALTER PUBLICATION ... DROP TABLE schema.name (to add it back whole). */
static int publication_drop(struct inv *inv, PGconn *c, const char *schema, const char *name,
                            char *err, size_t errlen)
{
    char qn[600], sql[900];
    char *qp = PQescapeIdentifier(c, inv->opt.publication, strlen(inv->opt.publication));
    if (qp == NULL || qualified(c, schema, name, qn, sizeof qn) < 0) {
        PQfreemem(qp);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    snprintf(sql, sizeof sql, "ALTER PUBLICATION %s DROP TABLE %s", qp, qn);
    PQfreemem(qp);
    return exec(c, sql, err, errlen);
}

/* Every table of the config (and the invalidation table) must be in the publication, or
 * PostgreSQL sends none of its changes: DROP TABLE takes a table out of it (and sends no
 * delete for its rows), so does ALTER PUBLICATION ... DROP TABLE, and a table created again
 * under the same name is a new table outside it. Such a table is prepared as at start and
 * added back, and its namespaces flushed, in one transaction (so the flush follows every
 * change that was not sent); one that cannot be added yet (no such table, a column missing)
 * has its namespaces flushed once, and is retried. A table in it with a row filter or a
 * column list (PostgreSQL 15: ALTER PUBLICATION ... SET TABLE t WHERE (...) or t (cols)) is
 * taken out and added back whole the same way. `gone[i]`: table i was found out and
 * flushed already. Tables of --control's map are not watched here. */
static void watch_tables(struct inv *inv, PGconn *c, uint8_t *gone)
{
    char err[600], e2[600];
    const char *pub = inv->opt.publication;
    const char *p1[1] = {pub};
    /* narrowed: in the publication with a row filter or a column list (PostgreSQL 15), so
     * some of its changes or columns are not sent */
    PGresult *r = q(c,
                    PQserverVersion(c) >= 150000
                        ? "SELECT n.nspname::text, c.relname::text, (pr.prqual IS NOT NULL OR "
                          "pr.prattrs IS NOT NULL)::int FROM pg_publication_rel pr JOIN "
                          "pg_publication p ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = "
                          "pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
                          "p.pubname = $1 UNION ALL SELECT schemaname::text, tablename::text, 0 "
                          "FROM pg_publication_tables WHERE pubname = $1"
                        : "SELECT schemaname::text, tablename::text, 0 FROM "
                          "pg_publication_tables WHERE pubname = $1",
                    1, p1, err, sizeof err);
    if (r == NULL) {
        log_warn_limited("checking publication %s: %s", pub, err);
        return;
    }
    watch_actions(inv, c);
    size_t n = inv->conf.ntables + (inv->conf.inv_name ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        int mapped = i < inv->conf.ntables;
        const struct inv_table *t = mapped ? &inv->conf.tables[i] : NULL;
        const char *schema = mapped ? t->schema : inv->conf.inv_schema;
        const char *name = mapped ? t->name : inv->conf.inv_name;
        int in = 0, narrowed = 0;
        for (int k = 0; k < PQntuples(r); k++)
            if (!strcmp(PQgetvalue(r, k, 0), schema) && !strcmp(PQgetvalue(r, k, 1), name)) {
                in = 1;
                narrowed |= !strcmp(PQgetvalue(r, k, 2), "1");
            }
        if (in && !narrowed) {
            gone[i] = 0;
            /* an identity changed back under us (the reader flushes meanwhile) */
            int cov = 1;
            if (mapped && (check_table(c, t, &cov, err, sizeof err) < 0 ||
                           (!cov && setup_identity_full(inv, c, schema, name, err, sizeof err) < 0) ||
                           partitions_identity(inv, c, schema, name, err, sizeof err) < 0))
                log_warn_limited("table %s.%s: %s", schema, name, err);
            continue;
        }
        int covered = 1;
        int ok = exec(c, "BEGIN", err, sizeof err) == 0 &&
                 (!narrowed || publication_drop(inv, c, schema, name, err, sizeof err) == 0) &&
                 (!mapped || check_table(c, t, &covered, err, sizeof err) == 0) &&
                 (covered || setup_identity_full(inv, c, schema, name, err, sizeof err) == 0) &&
                 (!mapped || partitions_identity(inv, c, schema, name, err, sizeof err) == 0) &&
                 setup_publication_add(inv, c, schema, name, err, sizeof err) == 0 &&
                 (!mapped || emit_flush(inv, c, schema, name, err, sizeof err) == 0) &&
                 exec(c, "COMMIT", err, sizeof err) == 0;
        if (ok) {
            log_error("table %s.%s was %s publication %s (%s), so PostgreSQL did not send "
                      "all its changes: added back%s",
                      schema, name, narrowed ? "narrowed in" : "out of", pub,
                      narrowed ? "a row filter or a column list"
                               : "dropped and created again, or dropped from the publication",
                      mapped ? ", its namespaces flushed"
                             : " (keys inserted into it meanwhile were not deleted)");
            gone[i] = 0;
            continue;
        }
        exec(c, "ROLLBACK", e2, sizeof e2);
        if (gone[i]) {
            log_warn_limited("table %s.%s is still out of publication %s: %s", schema, name,
                             pub, err);
            continue;
        }
        /* its rows may be gone without a delete, and its changes are not sent meanwhile */
        if (mapped && emit_flush(inv, c, schema, name, e2, sizeof e2) < 0) {
            log_warn_limited("table %s.%s: flushing its namespaces: %s", schema, name, e2);
            continue;
        }
        gone[i] = 1;
        log_error("table %s.%s is out of publication %s and cannot be added back: %s;%s "
                  "retrying every second",
                  schema, name, pub, err, mapped ? " its namespaces flushed;" : "");
    }
    PQclear(r);
}

struct cleaner {
    struct inv *inv;
    pthread_t th;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int stop;
};

static void *cleaner_main(void *arg)
{
    struct cleaner *cl = arg;
    struct inv *inv = cl->inv;
    PGconn *c = NULL;
    uint64_t done = 0, watched = clock_mono_ms();
    char name[600], sql[800], err[600];
    uint8_t *gone = calloc(inv->conf.ntables + 1, 1);
    uint64_t wait_ms = inv->opt.cleanup_interval_ms < WATCH_MS ? inv->opt.cleanup_interval_ms
                                                               : WATCH_MS;
    pthread_mutex_lock(&cl->lock);
    while (!cl->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + wait_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&cl->wake, &cl->lock, &ts);
        uint64_t upto = atomic_load(&inv->cleanup_upto);
        int clean = inv->conf.inv_name && upto > done;
        int watch = gone && clock_mono_ms() - watched >= WATCH_MS;
        if (cl->stop || (!clean && !watch)) continue;
        pthread_mutex_unlock(&cl->lock);
        if (c == NULL || PQstatus(c) != CONNECTION_OK) {
            PQfinish(c);
            c = PQconnectdb(inv->opt.pg);
        }
        if (PQstatus(c) != CONNECTION_OK) {
            log_warn_limited("cleaner: cannot connect: %s", PQerrorMessage(c));
        } else {
            if (watch) {
                watch_tables(inv, c, gone);
                watched = clock_mono_ms();
            }
            if (clean && qualified(c, inv->conf.inv_schema, inv->conf.inv_name, name,
                                   sizeof name) == 0) {
                /* rows are only the carrier of a key into the WAL: once their commit is
                 * confirmed the row has done its work */
                snprintf(sql, sizeof sql, "DELETE FROM %s WHERE id <= %llu", name,
                         (unsigned long long)upto);
                PGresult *r = q(c, sql, 0, NULL, err, sizeof err);
                if (r) {
                    atomic_fetch_add(&inv->figs.cleaned_rows,
                                     strtoull(PQcmdTuples(r), NULL, 10));
                    done = upto;
                } else {
                    log_warn_limited("cleaning the invalidation table: %s", err);
                }
                PQclear(r);
            }
        }
        pthread_mutex_lock(&cl->lock);
    }
    pthread_mutex_unlock(&cl->lock);
    PQfinish(c);
    free(gone);
    return NULL;
}

struct cleaner *cleaner_start(struct inv *inv, char *err, size_t errlen)
{
    err[0] = 0;
    struct cleaner *cl = calloc(1, sizeof *cl);
    if (cl == NULL) return snprintf(err, errlen, "out of memory"), NULL;
    cl->inv = inv;
    pthread_mutex_init(&cl->lock, NULL);
    pthread_cond_init(&cl->wake, NULL);
    if (pthread_create(&cl->th, NULL, cleaner_main, cl) != 0) {
        snprintf(err, errlen, "cannot start the cleaner thread");
        free(cl);
        return NULL;
    }
    return cl;
}

void cleaner_stop(struct cleaner **pc)
{
    struct cleaner *cl = *pc;
    if (cl == NULL) return;
    pthread_mutex_lock(&cl->lock);
    cl->stop = 1;
    pthread_cond_signal(&cl->wake);
    pthread_mutex_unlock(&cl->lock);
    pthread_join(cl->th, NULL);
    pthread_mutex_destroy(&cl->lock);
    pthread_cond_destroy(&cl->wake);
    free(cl);
    *pc = NULL;
}
