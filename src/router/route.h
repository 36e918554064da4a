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
/* get/gets/gat/gats: one request when every key goes to one node, else split per node and
 * merged in key order. */
void route_get(struct client *c, const struct proto_req *req, const char *line, size_t len);
/* flush_all: to every node of the topology; OK when all say OK. */
void route_all(struct client *c, const struct proto_req *req, const char *line, size_t len);

/* Line edits, shared with replica.c. A replacement of the bytes [from, to) of a request line
 * by `text` (from == to inserts). */
struct line_cut {
    const char *from, *to;
    const char *text;
    size_t ntext;
};
/* Append the request line to `out` without a trailing "noreply" (text) and without the meta
 * flags whose letters are in `drop` (NULL: none), with the TTL edit `ttl` applied when it is
 * not NULL, then \r\n. -1 when memory runs out. */
int route_copy_line(struct buf *out, const char *line, size_t len, const struct proto_req *req,
                    bool strip_noreply, const char *drop, const struct line_cut *ttl);
/* Mark fragment f as one for key's namespace and pool (per-pool/namespace figures). */
void route_tag(const struct topo *t, struct frag *f, const char *key, size_t nkey);

#endif
