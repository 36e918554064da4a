/* statsmerge.h — `stats`, its subcommands and key dumps through the router: asked of every
 * node of the topology and answered as one memcached would answer them (see statsmerge.c).
 *
 * Summed figures (`stats`, `stats items|slabs|sizes`, `stats detail dump`) are kept per node
 * until every node answered or failed, then merged; key dumps (`stats cachedump`,
 * `lru_crawler metadump`) are passed on line by line as the nodes send them, with one END at
 * the end. */
#ifndef SHOAL_ROUTER_STATSMERGE_H
#define SHOAL_ROUTER_STATSMERGE_H

#include <stddef.h>

#include "protocol/protocol.h"
#include "router/client.h"
#include "router/request.h"
#include "router/statslist.h" /* enum statsmerge_kind: how rreq.merge merges */

/* The most of one node's stats reply the router keeps for a merge (a node's `stats items` with
 * every class is about 100 KB); a longer reply counts as that node failing. */
#define STATSMERGE_REPLY_MAX (4u << 20)

/* Answer `stats [args]` (req parsed as CMD_STATS): locally, or by asking every node. */
void statsmerge_stats(struct client *c, const struct proto_req *req);
/* Answer an `lru_crawler ...` line (len bytes, no \n): metadump is asked of every node. */
void statsmerge_lru_crawler(struct client *c, const char *line, size_t len);

/* Every fragment of RQ_STATS request rq has completed: put the merged reply in rq->reply.
 * -1 when memory ran out. */
int statsmerge_reply(struct rreq *rq);
/* Every fragment of RQ_DUMP request rq has completed: end its reply (END, or the error when no
 * node answered or lines were dropped). -1 when memory ran out. */
int statsmerge_dump_end(struct rreq *rq);

#endif
