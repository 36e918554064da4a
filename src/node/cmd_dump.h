/* cmd_dump.h — key dumps: `lru_crawler ...` and `stats cachedump` (see cmd_dump.c). */
#ifndef SHOAL_NODE_CMD_DUMP_H
#define SHOAL_NODE_CMD_DUMP_H

#include <stdbool.h>
#include <stddef.h>

#include "node/conn.h"

struct dump;

/* `lru_crawler <args>`: metadump starts a dump on c (c->dump); the rest answer at once. */
void cmd_lru_crawler(struct conn *c, struct proto_req *req);
/* `stats detail dump`: the prefix counts, in slices like a key dump. */
void cmd_detail_dump(struct conn *c);
/* `stats cachedump <args>` (arg: the text after "cachedump"). */
void cmd_cachedump(struct conn *c, const char *arg, size_t n);
/* Queue the next slice of c->dump. Returns true when the dump has ended (END or an error
 * queued, c->dump freed); false when more remains: call again once the output has drained. */
bool dump_continue(struct conn *c);
/* Drop a dump in progress (the connection is closing). Sets *dp to NULL. */
void dump_free(struct dump **dp);

#endif
