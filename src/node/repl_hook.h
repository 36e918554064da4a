/* repl_hook.h — the command path's calls into replication, inline so that a key of a namespace
 * with one copy costs one compare (the namespace's copies) and nothing else. Call with the
 * key's shard lock held, after the store changed, so the stream orders a key's changes as the
 * store did. */
#ifndef SHOAL_NODE_REPL_HOOK_H
#define SHOAL_NODE_REPL_HOOK_H

#include "node/node.h"
#include "node/repl.h"

/* Does a change to `key` of namespace `ns` stream to a replica? */
static inline bool repl_streams(const struct node *n, const struct ns *ns, const char *key,
                                size_t nkey)
{
    if (__builtin_expect(ns->cfg.copies < 2, 1) || n->repl == NULL) return false;
    return repl_slot_streams((const struct repl_pub *)n->repl, key, nkey);
}

static inline void repl_hook_item(struct node *n, const struct ns *ns, const struct item *it)
{
    if (repl_streams(n, ns, it->data, it->nkey)) repl_log_item(n, it);
}

static inline void repl_hook_del(struct node *n, const struct ns *ns, const char *key, size_t nkey)
{
    if (repl_streams(n, ns, key, nkey)) repl_log_del(n, key, nkey);
}

static inline void repl_hook_touch(struct node *n, const struct ns *ns, const char *key,
                                   size_t nkey, uint32_t exptime)
{
    if (repl_streams(n, ns, key, nkey)) repl_log_touch(n, key, nkey, exptime);
}

/* Reads are never fenced; a write to a slot a handoff fences is answered here (true). */
static inline bool repl_hook_fenced(struct conn *c, struct node *n, const struct proto_req *req)
{
    if (__builtin_expect(n->repl == NULL, 1) ||
        __atomic_load_n(&((const struct repl_pub *)n->repl)->nfenced, __ATOMIC_RELAXED) == 0)
        return false;
    return repl_fence_refuse(c, req);
}

#endif
