/* setup.h — getting PostgreSQL ready for the reader (tables checked, replica identity, the
 * invalidation table, the publication, the slot), and the cleaner thread that deletes consumed
 * invalidation table rows. Both use an ordinary (non-replication) connection. */
#ifndef SHOAL_INVALIDATOR_SETUP_H
#define SHOAL_INVALIDATOR_SETUP_H

#include <libpq-fe.h>
#include <stddef.h>

struct inv;

/* A replication connection (replication=database) to --pg, or NULL with PostgreSQL's message. */
PGconn *setup_replication_connect(struct inv *inv, char *err, size_t errlen);

/* Check and prepare everything the stream needs; idempotent. 0, or -1 with a message naming
 * the table, column or object and the fix. */
int setup_prepare(struct inv *inv, char *err, size_t errlen);

/* The slot again, after the reader found it missing or invalidated: created, and when it was
 * lost a flush of every mapped table's namespaces written for it (SETUP_MSG_PREFIX,
 * "flushall\n<publication>"). 0, or -1 with a message. */
int setup_slot(struct inv *inv, char *err, size_t errlen);

/* The pieces setup_prepare uses, for tables mapped later (--control, ctl.c), on an ordinary
 * connection to --pg: */
struct setup_cols {
    int exists; /* the table exists (an ordinary or partitioned table) */
    char ident; /* its replica identity: 'd' default, 'i' index, 'f' full, 'n' nothing */
    PGresult *res;
};
/* Table schema.name's columns and which are in its replica identity (sc->exists 0 when there
 * is no such table). 0, or -1 with PostgreSQL's message; setup_cols_clear after. */
int setup_table_cols(PGconn *c, const char *schema, const char *name, struct setup_cols *sc,
                     char *err, size_t errlen);
/* Column `col`: 0 absent, 1 present outside the replica identity, 2 inside it (or FULL). */
int setup_col(const struct setup_cols *sc, const char *col);
void setup_cols_clear(struct setup_cols *sc);
/* ALTER the table to REPLICA IDENTITY FULL (logged; a partitioned table's leaf partitions
 * too), or -1 naming the statement to run under --set-replica-identity=false. */
int setup_identity_full(struct inv *inv, PGconn *c, const char *schema, const char *name,
                        char *err, size_t errlen);
/* Add the table to --publication unless it is in it (a partitioned table: the publication
 * set to publish through the root first). */
int setup_publication_add(struct inv *inv, PGconn *c, const char *schema, const char *name,
                          char *err, size_t errlen);

/* The logical decoding message (pg_logical_emit_message, transactional) by which the watcher
 * asks the reader to flush a table's namespaces: prefix SETUP_MSG_PREFIX, content
 * "flush\n<publication>\n<schema>\n<table>". It is written in the transaction that adds the
 * table back to the publication, so the flush follows every change PostgreSQL did not send. */
#define SETUP_MSG_PREFIX "shoal_invalidator"

struct cleaner;
/* Starts the cleaner thread: it deletes consumed invalidation table rows (when that table is
 * configured) and, every second, checks that every table of the config is in the publication
 * (a table dropped and created again, or dropped from the publication, is not): such a table
 * is prepared and added back, and its namespaces flushed through the log. NULL on failure with
 * err set. */
struct cleaner *cleaner_start(struct inv *inv, char *err, size_t errlen);
void cleaner_stop(struct cleaner **c);

#endif
