/* cmd.c — dispatch and the storage path shared by text and meta commands.
 *
 * Every store (set/add/replace/append/prepend/cas and ms in all modes) ends in cmd_store_apply,
 * so the rules for CAS, modes, stale sets and failure clean-up exist once. */
#include "node/cmd.h"

#include <string.h>

#include "common/clock.h"
#include "node/cmd_store.h"
#include "node/repl_hook.h"

void cmd_run(struct conn *c, struct proto_req *req)
{
    if (repl_hook_fenced(c, c->node, req)) return;
    if (req->cmd >= CMD_MG) cmd_meta_run(c, req);
    else cmd_text_run(c, req);
}

/* memcached removes the old value when a set cannot be stored, so a failed refresh never leaves
 * stale data behind. */
static void cmd_drop_key(struct conn *c, const char *key, size_t nkey)
{
    struct store *st = c->node->store;
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *old = store_find(st, hv, key, nkey, clock_now(), NULL);
    if (old) {
        store_unlink(st, hv, old);
        repl_hook_del(c->node, cmd_ns(c, key, nkey), key, nkey);
    }
    store_unlock(st, hv);
}

void cmd_store_refuse(struct conn *c, struct proto_req *req, const char *msg)
{
    bool meta = req->cmd == CMD_MS;
    if (meta || req->cmd == CMD_SET) cmd_drop_key(c, req->key, req->nkey);
    if (meta || !req->noreply) conn_reply_str(c, msg); /* ms always reports errors */
}

bool cmd_store_check(struct conn *c, struct proto_req *req)
{
    if (repl_hook_fenced(c, c->node, req)) return false; /* its data block is swallowed */
    /* Flags are part of the item's size: they are known before the value arrives. */
    uint32_t flags = req->cmd == CMD_MS ? req->meta.flags : req->flags;
    if (store_item_size(c->node->store, req->nkey, (size_t)req->nbytes, flags) == 0) {
        c->w->m.store_too_large++;
        cmd_store_refuse(c, req, "SERVER_ERROR object too large for cache\r\n");
        return false;
    }
    if (req->cmd != CMD_MS && detail_enabled(&c->node->detail))
        detail_record(&c->node->detail, req->key, req->nkey, DETAIL_SET, false);
    return true;
}

struct item *cmd_store_alloc(struct conn *c, struct proto_req *req)
{
    uint32_t flags = req->cmd == CMD_MS ? req->meta.flags : req->flags;
    uint16_t nsid = cmd_ns(c, req->key, req->nkey)->id;
    struct item *it =
        store_alloc(c->node->store, nsid, req->key, req->nkey, (size_t)req->nbytes, flags);
    if (it == NULL) {
        c->w->m.store_no_memory++;
        cmd_store_refuse(c, req, "SERVER_ERROR out of memory storing object\r\n");
    }
    return it;
}

void cmd_store_finish(struct conn *c, struct proto_req *req, struct item *it, bool crlf_ok)
{
    if (!crlf_ok) {
        if (it) store_free(c->node->store, it);
        c->w->m.protocol_errors++;
        if (req->cmd == CMD_MS || !req->noreply) conn_reply_str(c, "CLIENT_ERROR bad data chunk\r\n");
        return;
    }
    if (cmd_fenced(c, req->key, req->nkey)) { /* checked as the value lands, not before */
        store_free(c->node->store, it);
        if (req->cmd == CMD_MS || !req->noreply) conn_reply_str(c, FENCE_REPLY);
        return;
    }
    const struct ns *ns = cmd_ns(c, req->key, req->nkey);
    c->w->m.cmd_set++;
    cmd_nsm(c, ns)->sets++;
    cmd_clsm(c, it)->cmd_set++;
    if (req->cmd == CMD_MS) cmd_meta_store(c, req, it, ns);
    else cmd_text_store(c, req, it, ns);
}

/* Build append/prepend's combined item under the shard lock. */
static struct item *cmd_concat(struct store *st, struct item *old, struct item *it, bool append)
{
    size_t n = (size_t)old->nbytes + it->nbytes;
    uint32_t flags = item_flags(old); /* appended data's own flags are ignored, as in memcached */
    if (store_item_size(st, old->nkey, n, flags) == 0) return NULL;
    struct item *nit = store_alloc(st, old->nsid, item_key(old), old->nkey, n, flags);
    if (nit == NULL) return NULL;
    nit->exptime = old->exptime;
    char *v = item_value(nit);
    if (append) {
        memcpy(v, item_value(old), old->nbytes);
        memcpy(v + old->nbytes, item_value(it), it->nbytes);
    } else {
        memcpy(v, item_value(it), it->nbytes);
        memcpy(v + it->nbytes, item_value(old), old->nbytes);
    }
    item_set_cas(nit, item_cas(it)); /* an explicit E cas carries over */
    /* nit echoes its key as sent, never in base64: memcached's appended item loses the flag */
    return nit;
}

bool cmd_delete_holdoff(struct conn *c, const struct ns *ns, const char *key, size_t nkey,
                        int64_t secs, bool *ok)
{
    struct store *st = c->node->store;
    uint32_t now = clock_now();
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *old = store_find_raw(st, hv, key, nkey, now, NULL);
    bool existed = old && !(old->iflags & ITEM_HOLD);
    if (existed) cmd_clsm(c, old)->delete_hits++;
    struct item *t = store_alloc(st, ns->id, key, nkey, 0, 0);
    if (t) {
        t->iflags |= ITEM_HOLD;
        t->exptime = clock_exptime(secs, now);
        if (old) {
            store_replace(st, hv, old, t, now);
        } else if (!store_link(st, hv, t, now)) { /* index shard full: as out of memory */
            store_free(st, t);
            t = NULL;
        }
    }
    if (t) repl_hook_item(c->node, ns, t);
    store_unlock(st, hv);
    *ok = t != NULL;
    if (t) cmd_count_delete(c, ns, existed);
    return existed;
}

enum cmd_store_res cmd_store_apply(struct conn *c, struct item *it, const struct cmd_store_args *a,
                                   uint64_t *cas_out)
{
    struct store *st = c->node->store;
    uint32_t now = clock_now();
    uint64_t hv = store_hash(item_key(it), it->nkey);
    enum cmd_store_res res;
    struct item *stored = NULL;
    enum store_miss why;
    store_lock(st, hv);
    struct item *old = store_find_ex(st, hv, item_key(it), it->nkey, now, &why,
                                     STORE_FIND_HELD | STORE_FIND_GRACE);
    if (old && why == STORE_MISS_EXPIRED) {
        /* an expired value kept for stale readers (stale_ttl): absent to every store except the
         * fill of the win it handed out, which carries its CAS */
        bool fill = a->has_cas && a->cas == item_cas(old) &&
                    (a->mode == CS_SET || a->mode == CS_REPLACE);
        if (fill || (!a->has_cas && (a->mode == CS_SET || a->mode == CS_ADD))) {
            store_replace(st, hv, old, it, now);
            stored = it;
            res = CS_STORED;
        } else {
            res = a->has_cas ? CS_NOT_FOUND : CS_NOT_STORED;
        }
    } else if (old && (old->iflags & ITEM_HOLD)) {
        /* delete hold-off (§4.3): add, replace, append, prepend and cas fail as if the key
         * were absent and add could not win; a plain set stores and ends the hold */
        if (a->mode == CS_SET && !a->has_cas) {
            store_replace(st, hv, old, it, now);
            stored = it;
            res = CS_STORED;
        } else {
            res = a->has_cas ? CS_NOT_FOUND : CS_NOT_STORED;
        }
    } else if (old == NULL) {
        /* as memcached: a CAS makes set and replace a cas (NOT_FOUND on a miss); add ignores it
         * and stores; append and prepend need an item whatever the CAS */
        if (a->mode == CS_SET || a->mode == CS_ADD) res = CS_STORED;
        else res = CS_NOT_STORED;
        if (a->has_cas && (a->mode == CS_SET || a->mode == CS_REPLACE)) res = CS_NOT_FOUND;
        if (res == CS_STORED) {
            if (store_link(st, hv, it, now)) stored = it;
            else res = CS_NO_MEMORY; /* index shard full; `it` is freed below */
        }
    } else if (a->mode == CS_ADD) {
        store_bump(st, old, now);
        res = CS_NOT_STORED;
    } else {
        res = CS_STORED;
        /* append and prepend check a CAS only when it is not 0, as memcached does */
        bool concat = a->mode == CS_APPEND || a->mode == CS_PREPEND;
        if (a->has_cas && a->cas != item_cas(old) && !(concat && a->cas == 0)) {
            if (a->set_stale && a->cas != 0 && a->cas < item_cas(old)) {
                /* a fill that lost a race with an invalidation: keep it, marked stale, with the
                 * old item's TTL and win state (memcached's ms I) */
                it->exptime = old->exptime;
                it->iflags |= ITEM_STALE | (old->iflags & ITEM_TOKEN);
            } else {
                res = CS_EXISTS;
            }
        }
        if (res == CS_STORED) {
            if (a->mode == CS_APPEND || a->mode == CS_PREPEND) {
                struct item *nit = cmd_concat(st, old, it, a->mode == CS_APPEND);
                if (nit == NULL) {
                    res = CS_NO_MEMORY;
                } else {
                    store_free(st, it);
                    it = nit;
                }
            }
            if (res == CS_STORED) {
                store_replace(st, hv, old, it, now);
                stored = it;
            }
        }
    }
    if (a->has_cas && res == CS_STORED) cmd_clsm(c, stored ? stored : it)->cas_hits++;
    else if (a->has_cas && res == CS_EXISTS && old) cmd_clsm(c, old)->cas_badval++;
    if (stored && cas_out) *cas_out = item_cas(stored);
    /* a fill with a win's CAS, stored or refused, ends that win's time in flight */
    if (a->has_cas && cmd_lease_ruled(cmd_ns(c, item_key(it), it->nkey)))
        lease_filled(c->node->leases, hv, a->cas);
    if (stored) repl_hook_item(c->node, cmd_ns(c, item_key(stored), stored->nkey), stored);
    store_unlock(st, hv);
    if (stored == NULL) store_free(st, it);
    if (a->has_cas) {
        if (res == CS_STORED) c->w->m.cas_hits++;
        else if (res == CS_EXISTS) c->w->m.cas_badval++;
        else if (res == CS_NOT_FOUND) c->w->m.cas_misses++;
    }
    if (res == CS_NO_MEMORY) c->w->m.store_no_memory++;
    return res;
}
