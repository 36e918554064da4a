/* replica.c — compare-and-swap across the replicas of a replicated pool, and the repair of
 * replicas that missed writes (see replica.h). */
#include "router/replica.h"

#include "router/lineedit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "router/catchup.h"
#include "router/outage.h"
#include "router/worker.h"

uint32_t replica_read_node(struct rworker *w, const struct topo_pool *p, uint32_t home)
{
    if (replica_readable(w->map[home])) return home;
    for (uint32_t i = 0; i < p->nnodes; i++)
        if (replica_readable(w->map[p->nodes[i]])) return p->nodes[i];
    if (upnode_up(w->map[home])) return home;
    for (uint32_t i = 0; i < p->nnodes; i++)
        if (upnode_up(w->map[p->nodes[i]])) return p->nodes[i];
    return home;
}

bool replica_is_compare(const struct proto_req *req)
{
    switch (req->cmd) {
    case CMD_CAS:
        return true;
    case CMD_MS: case CMD_MD: case CMD_MA:
        return proto_meta_has(&req->meta, 'C');
    default:
        return false;
    }
}

/* Freed replica_writes are kept for reuse by the thread that freed them, as request.c keeps
 * fragments: every write to a sharded pool is tagged (outage.h), so this was a malloc and a free
 * per write. Each has room for any key; at most REPL_POOL_MAX are kept. */
#define REPL_POOL_MAX 1024
static __thread struct replica_write *repl_pool;
static __thread unsigned repl_pooled;

int replica_tag(struct frag *f, struct upnode *un, enum replica_kind kind, const char *key,
                size_t nkey)
{
    struct replica_write *rw = repl_pool;
    if (nkey > PROTO_KEY_MAX) return -1; /* never: keys are checked when parsed */
    if (rw) {
        repl_pool = rw->next;
        repl_pooled--;
    } else if ((rw = malloc(sizeof *rw + PROTO_KEY_MAX)) == NULL) {
        return -1;
    }
    rw->un = un;
    rw->kind = kind;
    rw->fan = NULL;
    buf_init(&rw->then);
    rw->nkey = (uint8_t)nkey;
    if (nkey) memcpy(rw->key, key, nkey);
    f->repl = rw;
    return 0;
}

struct replica_fanout {
    uint32_t pending;     /* parts joined whose answer has not been weighed */
    bool applied;         /* one of them took the write */
    uint32_t nrefused;
    char refused[][TOPO_ADDR_MAX]; /* the ones that refused it, by address: a node may have
                                    * left the topology (and been freed) by the last answer */
};

struct replica_fanout *replica_fanout_new(uint32_t n)
{
    struct replica_fanout *fan = malloc(sizeof *fan + (size_t)n * TOPO_ADDR_MAX);
    if (fan) *fan = (struct replica_fanout){.pending = 0}; /* room for n refusals */
    return fan;
}

void replica_fanout_join(struct replica_fanout *fan, struct replica_write *rw)
{
    rw->fan = fan;
    fan->pending++;
}

/* One replica's part of a fan-out is over: answered (`refused`: with an error of its own, else
 * taken), or never to be weighed (`gone`: not sent, or its node torn down). After the last,
 * the replicas that refused a write another one took are logged for repair. */
static void replica_fanout_done(struct replica_write *rw, bool gone, bool refused)
{
    struct replica_fanout *fan = rw->fan;
    rw->fan = NULL;
    if (!gone && refused) snprintf(fan->refused[fan->nrefused++], TOPO_ADDR_MAX, "%s",
                                   rw->un->node.addr);
    else if (!gone) fan->applied = true;
    if (--fan->pending > 0) return;
    for (uint32_t i = 0; fan->applied && i < fan->nrefused; i++)
        for (struct upnode *un = rw->un->w->upnodes; un; un = un->next)
            if (!un->retired && !un->destroying && !strcmp(un->node.addr, fan->refused[i])) {
                replica_log(un, rw->key, rw->nkey, true);
                break;
            }
    free(fan);
}

void replica_write_free(struct replica_write *rw)
{
    if (rw == NULL) return;
    if (rw->fan) replica_fanout_done(rw, true, false);
    buf_release(&rw->then);
    if (repl_pooled < REPL_POOL_MAX) {
        rw->next = repl_pool;
        repl_pool = rw;
        repl_pooled++;
        return;
    }
    free(rw);
}

void replica_pool_drain(void)
{
    while (repl_pool) {
        struct replica_write *rw = repl_pool;
        repl_pool = rw->next;
        free(rw);
    }
    repl_pooled = 0;
}

void replica_log(struct upnode *un, const char *key, size_t nkey, bool failed)
{
    struct rworker *w = un->w;
    if (failed && un->repair_at_ms < w->now_ms + w->r->cfg.probe_ms)
        un->repair_at_ms = w->now_ms + w->r->cfg.probe_ms;
    switch (repairlog_add(&un->repair, key, nkey)) {
    case REPAIRLOG_ADDED:
        w->m.repair_keys_logged++;
        break;
    case REPAIRLOG_NOMEM:
        w->m.out_of_memory++;
        /* fall through */
    case REPAIRLOG_OVERFLOW:
        w->m.repair_log_overflows++;
        log_warn("worker %d: node %s missed the writes of more than %u keys; it will be "
                 "flushed when it can be repaired", w->id, un->node.addr, un->repair.cap);
        break;
    case REPAIRLOG_KEPT:
        break;
    }
}

void replica_node_up(struct upnode *un)
{
    struct rworker *w = un->w;
    un->repair_at_ms = w->now_ms + w->r->cfg.probe_ms;
    if (!repairlog_clean(&un->repair))
        log_notice("worker %d: node %s missed writes while down; repairing it before it is "
                   "read again", w->id, un->node.addr);
    outage_check_mended(un); /* nothing to repair: back in use at once */
}

/* Queue one repair request for the node: a delete of `key`, or a flush_all (REPL_FLUSH).
 * False when memory ran out. */
static bool replica_send_repair(struct upnode *un, enum replica_kind kind, const char *key,
                                size_t nkey)
{
    struct frag *f = frag_create(NULL, 0);
    if (f == NULL || replica_tag(f, un, kind, key, nkey) < 0 ||
        (kind == REPL_FLUSH ? buf_append(&f->out, "flush_all\r\n", 11)
                            : repairlog_delete_line(&f->out, key, nkey)) < 0) {
        if (f) frag_destroy(f);
        un->w->m.out_of_memory++;
        return false;
    }
    un->repairs_inflight++; /* before submitting: a failure at once answers it */
    if (kind == REPL_FLUSH) un->w->m.repair_flushes++;
    else un->w->m.repair_deletes++;
    upnode_submit(un, f);
    return true;
}

/* Does node `i` of the worker's table own (as `node`, not as `replica`) a slot of pool p? */
static bool owns_primary(const struct topo_pool *p, uint32_t i)
{
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (p->owner[s] == i) return true;
    return false;
}

/* Is the node, in the worker's table, only ever a replica of pools with slot replicas (it owns
 * no primary range anywhere, and sits in no pool without replicas), and is every primary of
 * those pools up in this worker? Then full or resumed streams from live primaries restore what
 * it holds of them (their own repairs included), and the router's repair would delete what a
 * resync brought (docs/router.md, "Replicated slots and promotions"). */
static bool replica_only(struct rworker *w, uint32_t i)
{
    const struct topo *t = w->topo;
    bool listed = false;
    for (uint32_t k = 0; k < t->npools; k++) {
        const struct topo_pool *p = &t->pools[k];
        bool in = false;
        for (uint32_t j = 0; j < p->nnodes && !in; j++) in = p->nodes[j] == i;
        if (!in) continue;
        listed = true;
        if (p->replicated || p->replica == NULL || owns_primary(p, i)) return false;
        for (uint32_t s = 0; s < SLOT_COUNT; s++)
            if (p->owner[s] >= w->nmap || !upnode_up(w->map[p->owner[s]])) return false;
    }
    return listed;
}

/* May the repair of key on node i be skipped: a copies-2 key of a pool with slot replicas of
 * which the node owns no primary range (`primary` caches that per pool, -1 unknown), whose
 * slot's primary is up here (its stream restores the node; a key of a down primary's slot is
 * repaired: nothing else would, and the node may be read for it as its replica)? */
static bool repair_covered(struct rworker *w, uint32_t i, const char *key, size_t nkey,
                           int8_t *primary)
{
    const struct topo *t = w->topo;
    const struct topo_ns *ns = topo_namespace(t, key, nkey);
    if (ns == NULL || ns->copies != 2 || ns->pool >= t->npools) return false;
    const struct topo_pool *p = &t->pools[ns->pool];
    if (p->replicated || p->replica == NULL) return false;
    if (primary[ns->pool] < 0) primary[ns->pool] = owns_primary(p, i);
    if (primary[ns->pool]) return false;
    uint16_t o = p->owner[slot_of_key(key, nkey)];
    return o < w->nmap && upnode_up(w->map[o]);
}

void replica_repair(struct upnode *un)
{
    struct rworker *w = un->w;
    if (un->down || un->retired || un->destroying || un->repairs_inflight ||
        repairlog_clean(&un->repair) || w->now_ms < un->repair_at_ms)
        return;
    uint32_t me = UINT32_MAX;
    for (uint32_t i = 0; i < w->nmap; i++)
        if (w->map[i] == un) me = i;
    if (un->repair.overflowed) {
        /* Every key logged so far is covered by the flush; keys logged from now on may have
         * been written after it, so the log starts again. */
        repairlog_reset(&un->repair);
        if (me != UINT32_MAX && replica_only(w, me)) {
            log_notice("worker %d: node %s: no flush_all to repair it: it is only a replica now, "
                       "of live primaries whose streams restore it", w->id, un->node.addr);
            outage_check_mended(un);
            return;
        }
        log_warn("worker %d: node %s: sending flush_all to repair it (every item on it is "
                 "dropped, those of other pools that list it too)", w->id, un->node.addr);
        if (!replica_send_repair(un, REPL_FLUSH, NULL, 0)) repairlog_set_overflow(&un->repair);
        return;
    }
    struct repairlog_batch b;
    repairlog_take(&un->repair, &b);
    int8_t *primary = malloc(w->topo->npools ? w->topo->npools : 1);
    if (primary) memset(primary, -1, w->topo->npools ? w->topo->npools : 1);
    uint32_t covered = 0;
    for (uint32_t i = 0; i < b.n; i++) {
        size_t nkey;
        const char *key = repairlog_key(&b, i, &nkey);
        if (primary && me != UINT32_MAX && repair_covered(w, me, key, nkey, primary)) {
            covered++;
            continue;
        }
        if (!replica_send_repair(un, REPL_REPAIR, key, nkey)) {
            repairlog_set_overflow(&un->repair); /* the rest would be forgotten otherwise */
            break;
        }
    }
    free(primary);
    if (covered)
        log_notice("worker %d: node %s: %u of the %u keys whose writes it missed left to its "
                   "resync (it is only their replica, their primaries up)", w->id, un->node.addr,
                   covered, b.n);
    log_info("worker %d: node %s: deleting %u keys whose writes it missed", w->id, un->node.addr,
             b.n - covered);
    repairlog_batch_free(&b);
    outage_check_mended(un); /* nothing sent (all covered): back in use now */
}

/* Is this reply one the node gives when it stored, deleted or changed the item? */
static bool replica_reply_won(const char *r, size_t n)
{
    if (n >= 6 && !memcmp(r, "STORED", 6)) return true;
    return n >= 3 && ((r[0] == 'H' && r[1] == 'D') || (r[0] == 'V' && r[1] == 'A')) &&
           (r[2] == ' ' || r[2] == '\r');
}

/* After a compare on `un` answered: send rw->then to every other live replica of the key's
 * pool (`apply`), attached to the client's request `rq` while it has room so that its reply
 * waits for them; a replica marked down, or every other one when the compare's outcome is
 * unknown (!apply), gets the key logged for repair instead. */
static void replica_follow(struct rworker *w, const struct replica_write *rw, struct rreq *rq,
                           bool apply)
{
    if (!worker_topology_ready(w)) {
        w->m.out_of_memory++;
        return;
    }
    const struct topo *t = w->topo; /* the table of this batch: it may be newer than the
                                     * compare's, so the replicas are looked up again */
    const struct topo_pool *p = topo_pool_of(t, rw->key, rw->nkey);
    if (!p->replicated) return; /* the key lives on one node now */
    for (uint32_t i = 0; i < p->nnodes; i++) {
        struct upnode *o = w->map[p->nodes[i]];
        if (o == rw->un) continue;
        if (!apply || !upnode_up(o)) {
            replica_log(o, rw->key, rw->nkey, false);
            continue;
        }
        bool attach = rq && rq->nfrags < rq->fcap;
        struct frag *f = frag_create(attach ? rq : NULL, attach ? rq->nfrags : 0);
        if (f == NULL || replica_tag(f, o, REPL_WRITE, rw->key, rw->nkey) < 0 ||
            buf_append(&f->out, buf_start(&rw->then), buf_used(&rw->then)) < 0) {
            if (f) frag_destroy(f);
            w->m.out_of_memory++;
            replica_log(o, rw->key, rw->nkey, false);
            continue;
        }
        route_tag(t, f, rw->key, rw->nkey, false);
        if (attach) {
            rq->frags[rq->nfrags++] = f;
            rq->pending++;
        }
        upnode_submit(o, f);
    }
}

void replica_frag_done(struct frag *f, const char *reply, size_t n, bool failed)
{
    struct replica_write *rw = f->repl;
    struct upnode *un = rw->un;
    struct rworker *w = un->w;
    if (un->destroying) return; /* shutting down: other nodes may be gone already */
    bool bad = failed || (n >= 12 && !memcmp(reply, "SERVER_ERROR", 12));
    switch (rw->kind) {
    case REPL_WRITE:
        if (rw->fan && !failed) replica_fanout_done(rw, false, bad);
        else if (bad) replica_log(un, rw->key, rw->nkey, true);
        break;
    case REPL_OWNER:
        if (failed) replica_log(un, rw->key, rw->nkey, true);
        break;
    case REPL_COMPARE:
        /* an error of the node's own: the compare-and-swap was not applied there, nothing is
         * pending anywhere (a client's cas the node refuses must not fill the logs) */
        if (failed) { /* it may have been applied there: the others may be behind */
            replica_log(un, rw->key, rw->nkey, true);
            replica_follow(w, rw, NULL, false);
        } else if (!bad && replica_reply_won(reply, n)) {
            replica_follow(w, rw, f->rq, true);
        }
        break;
    case REPL_REPAIR:
        un->repairs_inflight--;
        if (bad) replica_log(un, rw->key, rw->nkey, true);
        outage_check_mended(un);
        break;
    case REPL_FLUSH_ALL:
        if (bad) {
            log_warn_limited("worker %d: node %s missed a flush_all; it will be flushed when it can be "
                     "repaired", w->id, un->node.addr);
            repairlog_set_overflow(&un->repair);
        }
        break;
    case REPL_CATCHUP:
        catchup_batch_done(w, failed);
        break;
    case REPL_FLUSH:
        un->repairs_inflight--;
        if (bad || n < 2 || memcmp(reply, "OK", 2)) {
            repairlog_set_overflow(&un->repair);
            un->repair_at_ms = w->now_ms + w->r->cfg.probe_ms;
        }
        outage_check_mended(un);
        break;
    }
}

/* The request the other replicas get when the compare succeeds: text cas becomes a set with
 * the same flags, TTL (edited) and data; ms, md and ma lose C (and q). An ms with I may have
 * stored its value marked stale, which a plain write cannot express: the others delete the
 * key instead (the cache may lose any item; it must not serve a stale one as fresh). */
static int replica_then(struct buf *out, const struct proto_req *req, const char *line,
                        size_t len, const char *data, size_t ndata, const struct ledit_cut *cuts,
                        int ncuts)
{
    if (req->cmd == CMD_MS && req->meta.invalidate)
        return repairlog_delete_line(out, req->key, req->nkey);
    if (req->cmd != CMD_CAS)
        return ledit_copy(out, line, len, req, false, "qC", cuts, ncuts) < 0 ||
                       (data && buf_append(out, data, ndata) < 0) ? -1 : 0;
    /* cas KEY FLAGS EXPTIME BYTES UNIQUE [noreply] -> set KEY FLAGS EXPTIME BYTES */
    struct ledit_cut all[LEDIT_TTL_MAX + 4];
    const char *tok;
    size_t ntok;
    int n = 0;
    if (ncuts > LEDIT_TTL_MAX + 2 || !ledit_token(line, len, 5, &tok, &ntok)) return -1;
    memcpy(all, cuts, (size_t)ncuts * sizeof *cuts);
    n = ncuts;
    const char *from = tok;
    while (from > line && from[-1] == ' ') from--;
    all[n++] = (struct ledit_cut){line, line + 3, "set", 3};
    all[n++] = (struct ledit_cut){from, tok + ntok, NULL, 0};
    return ledit_copy(out, line, len, req, req->noreply, NULL, all, n) < 0 ||
                   buf_append(out, data, ndata) < 0 ? -1 : 0;
}

void replica_compare(struct client *c, const struct proto_req *req, const char *line,
                     size_t len, const char *data, size_t ndata, const struct topo_pool *p,
                     const struct ledit_cut *cuts, int ncuts)
{
    struct rworker *w = c->w;
    uint32_t node = replica_read_node(w, p, topo_route(w->topo, req->key, req->nkey));
    struct upnode *un = w->map[node];
    w->m.replicated_cas++;
    struct rreq *rq = rreq_create(c, RQ_CAS, req->cmd);
    struct frag *f = NULL;
    bool answered = false; /* refused with its own error */
    if (rq == NULL) goto oom;
    rq->fcap = (uint16_t)(p->nnodes < UINT16_MAX ? p->nnodes : UINT16_MAX);
    rq->noreply = req->noreply && req->cmd < CMD_MG;
    rq->quiet = req->meta.quiet && req->cmd >= CMD_MG;
    if ((rq->frags = calloc(rq->fcap, sizeof *rq->frags)) == NULL ||
        (f = frag_create(rq, 0)) == NULL ||
        replica_tag(f, un, REPL_COMPARE, req->key, req->nkey) < 0)
        goto oom;
    rq->frags[rq->nfrags++] = f;
    route_tag(w->topo, f, req->key, req->nkey, false);
    /* the compare's reply decides, so it is always asked for (q and noreply are applied to
     * the client's reply instead; a quiet ma's node hides a hit's reply, and the router takes
     * that for the HD it was: frag_quiet_mn) */
    if (ledit_copy(&f->out, line, len, req, rq->noreply, frag_quiet_drop(req, true), cuts,
                   ncuts) < 0)
        goto oom;
    if (!route_line_fits(c, req, buf_used(&f->out))) { /* the follow-up is no longer */
        answered = true;
        goto oom;
    }
    if ((data && buf_append(&f->out, data, ndata) < 0) || frag_quiet_mn(f, req) < 0 ||
        replica_then(&f->repl->then, req, line, len, data, ndata, cuts, ncuts) < 0)
        goto oom;
    rq->pending = 1;
    client_enqueue(c, rq);
    upnode_submit(un, f);
    return;
oom:
    if (rq) rreq_destroy(rq); /* f, not completed, is only orphaned by it... */
    if (f) frag_destroy(f);   /* ...and was never queued: freed here */
    if (!answered) client_oom(c);
}
