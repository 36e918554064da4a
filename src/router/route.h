/* route.h — routing of requests about keys: to the owner node, the gutter pool, every replica,
 * or several nodes at once, after the namespace's limits (see route.c). Each function answers
 * the client itself on any failure (an error reply in order), so callers only dispatch. */
#ifndef SHOAL_ROUTER_ROUTE_H
#define SHOAL_ROUTER_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"
#include "router/client.h"

/* Apply the key's namespace limits (max_value_bytes, ops_per_sec, bytes_per_sec) to one
 * request, or one key of a multi-get, carrying `nvalue` value bytes. On a violation, answers
 * with an error naming the namespace and the limit (unless `silent`: text noreply) and returns
 * false. */
bool route_admit(struct client *c, const char *key, size_t nkey, uint64_t nvalue, bool silent);
/* A write to a key of a replicated pool goes to every live replica. Returns false when the
 * command is not a write or the key's pool is not replicated (route it with route_forward). */
bool route_replicate(struct client *c, const struct proto_req *req, const char *line, size_t len,
                     const char *data, size_t ndata);
/* One request to the node for req->key. `data` is a storage command's block with its \r\n
 * (NULL otherwise). */
void route_forward(struct client *c, const struct proto_req *req, const char *line, size_t len,
                   const char *data, size_t ndata);
/* get/gets/gat/gats: one request when every key goes to one node, else split per node (and
 * per exptime, for a gat whose keys' namespaces rewrite it differently) and merged in key
 * order. Keys of a pool that warms from another are looked up there when they miss. */
void route_get(struct client *c, const struct proto_req *req, const char *line, size_t len);
/* flush_all: to every node of the topology; OK when all say OK. */
void route_all(struct client *c, const struct proto_req *req, const char *line, size_t len);
/* flush_ns <name>: to every node of the pools the namespace's keys live in (its own, the warm
 * pool it fills from, the gutter pool); OK when all say OK, else the first error. */
void route_flush_ns(struct client *c, const struct proto_req *req, const char *line, size_t len);

/* Is a request line of `nline` bytes (through its \r\n) the router built for a node within
 * --line-max? An edit (a TTL rewritten longer, a hold-off, a bare \n sent as \r\n) can
 * lengthen a line the client was allowed; a node would refuse it and close the connection all
 * the worker's clients share. When it is over, answers `CLIENT_ERROR line too long` (silent
 * under text noreply) and returns false: the caller sends nothing. */
bool route_line_fits(struct client *c, const struct proto_req *req, size_t nline);

/* Same rule, for a line the router sends of its own accord (nothing is answered). */
bool route_line_fits_quiet(struct rworker *w, size_t nline);

/* What a request does to its key, for routing (route.c's route_node). */
enum route_use { RU_READ, RU_WRITE, RU_DELETE };
/* Where a request for `key` goes now (the owner, the slot's replica for any request about a
 * copies-2 key while the owner is down, the gutter pool's node; *gutter, *held, *replica as route.c's
 * route_node says): for a request sent again after its node answered that the slot moved
 * (failover.c). */
uint32_t route_key_node(struct rworker *w, const char *key, size_t nkey, enum route_use use,
                        bool *gutter, bool *held, bool *replica);
/* The slot's replica of a copies-2 key whose owner (`owner`) cannot take a request of this
 * use, when it can (up and not mending; for a write or a delete also while its own repair is
 * under way), else -1 (no replica, a copies-1 key: the gutter's). */
int64_t route_replica_takes(struct rworker *w, const char *key, size_t nkey, uint32_t owner,
                            enum route_use use);
/* A write of a copies-2 key went to the gutter because neither its owner nor the slot's replica
 * could take it: log the key in the replica's repair log too (the owner's is logged as for any
 * pool), so that the replica, back, does not serve a value that write (a delete) replaced. */
void route_replica_missed(struct rworker *w, const char *key, size_t nkey, uint32_t owner);
/* A delete (req, its line) going to the slot's replica while the owner is down also goes to the
 * gutter pool's node for the key, as the router's own request (see route.c). */
void route_gutter_delete(struct rworker *w, const struct proto_req *req, const char *line,
                         size_t len);

/* Mark fragment f as one for key's namespace and for the pool it is sent to (per-pool/namespace
 * figures): the namespace's pool, or the gutter pool when `gutter`. */
void route_tag(const struct topo *t, struct frag *f, const char *key, size_t nkey,
               bool gutter);

#endif
