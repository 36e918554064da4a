/* cmd.h — shoal-node's request handlers: what each memcache command does to the store.
 *
 * The connection layer parses a line and calls cmd_run(). Storage commands come in steps:
 * cmd_store_check() vets the line, the connection receives the data block (into a staging
 * buffer while it is incomplete, conn_stage.c), cmd_store_alloc() makes the item once every
 * byte is in, then cmd_store_finish() applies the command. All replies go through conn_reply*. */
#ifndef SHOAL_NODE_CMD_H
#define SHOAL_NODE_CMD_H

#include <stdbool.h>

#include "node/conn.h"
#include "node/fence.h"

/* The namespace of a key, from the table current for this batch. */
static inline const struct ns *cmd_ns(const struct conn *c, const char *key, size_t nkey)
{
    return ns_of_key(ns_current(&c->node->ns), key, nkey);
}
/* Is `key` in a slot this node must not serve now (its slot lease ran out: fence.h)? The
 * refusal is counted; the caller answers FENCE_REPLY (text noreply: nothing). */
static inline bool cmd_fenced(const struct conn *c, const char *key, size_t nkey)
{
    return fence_refuses(c->node->fence, key, nkey);
}
/* This worker's counters for a namespace. */
static inline struct ns_metrics *cmd_nsm(const struct conn *c, const struct ns *ns)
{
    return &c->w->ns_m[ns->id];
}

/* Does the namespace ration lease wins (lease_period or lease_ttl set)? Its wins then go
 * through the node's lease table (lease.h); otherwise leases are memcached's, item-bound only. */
static inline bool cmd_lease_ruled(const struct ns *ns)
{
    return ns->cfg.lease_period != 0 || ns->cfg.lease_ttl != 0;
}

/* This worker's counters for the size class of `it`. */
static inline struct class_metrics *cmd_clsm(const struct conn *c, const struct item *it)
{
    return &c->w->cls[store_item_class(c->node->store, it)];
}

/* Count a delete request's outcome, node-wide and for its namespace. */
static inline void cmd_count_delete(struct conn *c, const struct ns *ns, bool hit)
{
    if (hit) {
        c->w->m.delete_hits++;
        cmd_nsm(c, ns)->deletes++;
    } else {
        c->w->m.delete_misses++;
    }
}

/* Run a parsed non-storage request. */
void cmd_run(struct conn *c, struct proto_req *req);

/* Is this a command followed by a data block (set/add/.../cas, ms)? */
static inline bool cmd_is_storage(enum proto_cmd cmd)
{
    return (cmd >= CMD_SET && cmd <= CMD_CAS) || cmd == CMD_MS;
}

/* Vet a storage request's line before its data block: false after replying with an error (the
 * item would be too large); the caller then discards the data block. */
bool cmd_store_check(struct conn *c, struct proto_req *req);
/* An item for the request's key, flags and req->nbytes of value, or NULL after replying
 * `SERVER_ERROR out of memory storing object` (and dropping a set's old value). May evict:
 * call it only once the value has arrived (in the input buffer or the socket's queue). */
struct item *cmd_store_alloc(struct conn *c, struct proto_req *req);
/* Finish a storage request whose value is complete. `crlf_ok` is false when the data block was
 * not followed by \r\n ("CLIENT_ERROR bad data chunk"); `it` may then be NULL. Consumes `it`. */
void cmd_store_finish(struct conn *c, struct proto_req *req, struct item *it, bool crlf_ok);

/* A part of a get line over line_max (conn_lget.c): answer the valid keys in [keys, end) like
 * get/gets/gat/gats `cmd` (gat's `exptime` as sent), without END, stopping after a key once
 * more than out_max/4 reply bytes are queued. Returns where it stopped, or NULL after answering
 * a SERVER_ERROR (a value would pass out_max). */
const char *cmd_get_part(struct conn *c, enum proto_cmd cmd, int64_t exptime, const char *keys,
                         const char *end);

/* Text and meta halves (cmd_text.c, cmd_meta.c, cmd_stats.c). */
void cmd_text_run(struct conn *c, struct proto_req *req);
void cmd_text_store(struct conn *c, struct proto_req *req, struct item *it, const struct ns *ns);
void cmd_meta_run(struct conn *c, struct proto_req *req);
void cmd_meta_store(struct conn *c, struct proto_req *req, struct item *it, const struct ns *ns);
void cmd_stats(struct conn *c, struct proto_req *req);

#endif
