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

struct cleaner;
/* Starts the cleaner when an invalidation table is configured (NULL and no error otherwise,
 * or on failure with err set: check err[0]). */
struct cleaner *cleaner_start(struct inv *inv, char *err, size_t errlen);
void cleaner_stop(struct cleaner **c);

#endif
