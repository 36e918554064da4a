/* route.c — where a key's request goes and in what form: the node that owns the key's slot
 * (or the gutter pool's node while it is marked down, or every replica of a replicated pool for
 * a write), the namespace's limits and TTL rules, and the line rewrites that keep exactly one
 * reply per request on a shared upstream connection.
 *
 * Each valid request is sent on as the client wrote it, except: text `noreply` is removed (the
 * router reads the node's reply and drops it), the meta `q` flag is removed (the router drops
 * the routine reply, EN for mg and HD for ms/md/ma, as the node would have), and a TTL the
 * namespace's rules change is rewritten. `mn` is then answered by the router, in order. */
#include "router/route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "router/dellog.h"
#include "router/failover.h"
#include "router/lineedit.h"
#include "router/outage.h"
#include "router/policy.h"
#include "router/replica.h"
#include "router/upstream.h"
#include "router/warm.h"
#include "router/worker.h"

int64_t route_replica_takes(struct rworker *w, const char *key, size_t nkey, uint32_t owner,
                            enum route_use use)
{
    int64_t r = topo_replica_route(w->topo, key, nkey);
    if (r < 0 || (uint32_t)r == owner) return -1;
    struct upnode *ru = w->map[r];
    /* a replica whose own repair is under way takes writes again, as an owner does (outage.h):
     * else writes missed there and logged for it would keep its log from ever emptying */
    return outage_reads(ru) || (use != RU_READ && outage_writes(ru)) ? r : -1;
}

void route_replica_missed(struct rworker *w, const char *key, size_t nkey, uint32_t owner)
{
    int64_t r = topo_replica_route(w->topo, key, nkey);
    if (r >= 0 && (uint32_t)r != owner) replica_log(w->map[r], key, nkey, false);
}

/* The node a key's request goes to: its owner, or, while the owner is marked down or back from
 * an outage but not yet repaired (outage.h: a `write` goes to it again sooner), for any request
 * about a key of a copies-2 namespace the slot's replica when this worker can read it
 * (*replica; FAILOVER.md C6: reads, deletes, and the writes that follow, fills above all, so
 * that the next read finds what the last write left; the replica is the one promoted), else
 * the gutter pool's node for the key (when there is one and it is up; keys never move to other
 * regular nodes). *gutter says which; *held that the request
 * goes to an owner that cannot take it and must fail at once. In a replicated pool: this
 * router's replica, or another one while it is down or being repaired (replica.h), never the
 * gutter. *owner (when not NULL) gets the key's owner, so a caller that needs it does not
 * route the key twice. */
static uint32_t route_node(struct rworker *w, const char *key, size_t nkey, enum route_use use,
                           bool *gutter, bool *held, bool *replica, uint32_t *owner)
{
    uint32_t node = topo_route(w->topo, key, nkey);
    struct upnode *un = w->map[node];
    if (owner) *owner = node;
    *gutter = *held = *replica = false;
    if (!un->mending && replica_readable(un)) return node;
    const struct topo_pool *p = topo_pool_of(w->topo, key, nkey);
    if (p->replicated) return replica_read_node(w, p, node);
    if (use == RU_WRITE ? outage_writes(un) : outage_reads(un)) return node;
    if (p->replica) { /* writes follow reads: both go to the replica, or both to the gutter */
        int64_t r = route_replica_takes(w, key, nkey, node, use);
        if (r >= 0) {
            *replica = true;
            return (uint32_t)r;
        }
    }
    int64_t g = topo_gutter_route(w->topo, key, nkey);
    if (g < 0 || (uint32_t)g == node || !upnode_up(w->map[g])) { /* fails fast */
        *held = !un->down;
        return node;
    }
    *gutter = true;
    return (uint32_t)g;
}

uint32_t route_key_node(struct rworker *w, const char *key, size_t nkey, enum route_use use,
                        bool *gutter, bool *held, bool *replica)
{
    return route_node(w, key, nkey, use, gutter, held, replica, NULL);
}

/* The TTL edits the key's namespace asks for (lineedit.h), counted in ttl_rewrites. `cap`,
 * when not 0, is a further maximum: gutter_ttl for requests sent to the gutter pool. Returns
 * the number of edits in e. */
static int route_ttl_edit(struct client *c, const struct proto_req *req, const char *line,
                          size_t len, uint64_t cap, struct ledit_ttl *e)
{
    const struct topo_ns *ns = topo_namespace(c->w->topo, req->key, req->nkey);
    if (ledit_ttl(req, line, len, ns, cap, (int64_t)time(NULL), e) == 0) return 0;
    c->w->m.ttl_rewrites++;
    return e->n;
}

/* The exptime a gat/gats sends for one of its keys: `exptime` after the key's namespace rules
 * and, in the gutter pool, gutter_ttl. */
static int64_t route_gat_ttl(struct rworker *w, const char *key, size_t nkey, bool gutter,
                             int64_t exptime, int64_t now)
{
    int64_t to;
    return policy_ttl_capped(topo_namespace(w->topo, key, nkey),
                             gutter ? w->topo->gutter_ttl : 0, exptime, now, &to)
               ? to
               : exptime;
}

/* Deletes to a pool that warms from another carry a hold-off (warm.h): `delete k` becomes
 * `delete k 2` and `md k` gets H2, unless the client chose a hold-off itself. */
static bool route_holdoff_edit(struct client *c, const struct proto_req *req, const char *line,
                               size_t len, struct ledit_cut *cut)
{
    if ((req->cmd != CMD_DELETE && req->cmd != CMD_MD) ||
        topo_pool_of(c->w->topo, req->key, req->nkey)->warm_from < 0)
        return false;
    const char *tok;
    size_t ntok;
    if (req->cmd == CMD_DELETE) {
        if (req->has_arg || !ledit_token(line, len, 1, &tok, &ntok)) return false;
        static const char two[] = " 2";
        *cut = (struct ledit_cut){tok + ntok, tok + ntok, two, 2};
    } else {
        if (proto_meta_has(&req->meta, 'H')) return false;
        *cut = ledit_append(line, len, " H2", 3);
    }
    return true;
}

bool route_line_fits_quiet(struct rworker *w, size_t nline)
{
    return nline <= w->r->cfg.line_max + 1;
}

bool route_line_fits(struct client *c, const struct proto_req *req, size_t nline)
{
    if (nline <= c->w->r->cfg.line_max + 1) return true; /* as a node counts: through the \r */
    c->w->m.protocol_errors++;
    if (!(req->noreply && req->cmd < CMD_MG)) client_local_str(c, "CLIENT_ERROR line too long\r\n");
    return false;
}

/* Mark fragment f as one for key's namespace and for the pool it is sent to (per-pool/namespace
 * figures): the namespace's pool, or the gutter pool when `gutter` (route_node). */
void route_tag(const struct topo *t, struct frag *f, const char *key, size_t nkey,
                      bool gutter)
{
    const struct topo_ns *ns = topo_namespace(t, key, nkey);
    f->ns = (int32_t)(ns - t->ns);
    f->pool = gutter ? t->gutter_pool : (int32_t)ns->pool;
}

/* Apply the key's namespace limits to one request (or one key of a multi-get) carrying
 * `nvalue` value bytes: max_value_bytes, ops_per_sec, bytes_per_sec. On a violation, answers
 * with an error naming the namespace and the limit (unless `silent`: text noreply) and
 * returns false. */
bool route_admit(struct client *c, const char *key, size_t nkey, uint64_t nvalue,
                 bool silent)
{
    struct rworker *w = c->w;
    if (!worker_topology_ready(w)) return true; /* answered later as out of memory */
    /* the table is immutable except for the buckets, which are updated atomically */
    struct topo_ns *ns = (struct topo_ns *)topo_namespace(w->topo, key, nkey);
    char msg[256];
    int n = 0;
    if (ns->max_value_bytes && nvalue > ns->max_value_bytes)
        n = snprintf(msg, sizeof msg,
                     "SERVER_ERROR shoal-router: namespace %s: value of %llu bytes is over "
                     "max_value_bytes %llu\r\n", ns->name, (unsigned long long)nvalue,
                     (unsigned long long)ns->max_value_bytes);
    else if (!policy_take(&ns->ops, w->now_ms, 1))
        n = snprintf(msg, sizeof msg,
                     "SERVER_ERROR shoal-router: namespace %s: over ops_per_sec %llu\r\n",
                     ns->name, (unsigned long long)ns->ops.rate);
    else if (nvalue && !policy_take(&ns->bytes, w->now_ms, nvalue)) {
        policy_give(&ns->ops, 1);
        n = snprintf(msg, sizeof msg,
                     "SERVER_ERROR shoal-router: namespace %s: over bytes_per_sec %llu\r\n",
                     ns->name, (unsigned long long)ns->bytes.rate);
    }
    int32_t nsi = (int32_t)(ns - w->topo->ns);
    SCOPESTAT_ADD(&w->r->scopes, w->id, -1, nsi, requests);
    if (n == 0) return true;
    SCOPESTAT_ADD(&w->r->scopes, w->id, -1, nsi, refusals);
    w->m.policy_refusals++;
    if (!silent) client_local(c, msg, (size_t)n);
    return false;
}

/* Give back the ops_per_sec tokens route_admit took for the first `n` keys of [keys, end) (a
 * multi-get refused at a later key is refused whole, so none of its keys is charged). */
static void route_refund(struct rworker *w, const char *keys, const char *end, uint32_t n)
{
    const char *kp = keys, *key;
    uint8_t nk;
    for (uint32_t i = 0; i < n && proto_next_key(&kp, end, &key, &nk); i++)
        policy_give(&((struct topo_ns *)topo_namespace(w->topo, key, nk))->ops, 1);
}

/* Where route_node sends a key's request. */
struct route_dest {
    uint32_t node, owner;
    bool gutter, held, replica;
};

static void route_forward_to(struct client *c, const struct proto_req *req, const char *line,
                             size_t len, const char *data, size_t ndata,
                             const struct route_dest *d);

/* A delete of a key whose owner is down, going to the slot's replica (route_node): today's
 * rule sends it to the gutter pool, which may hold a copy written during the outage and is read
 * when the replica goes too, so it goes there as well, as the router's own request (the
 * client's answer is the replica's; the gutter's is read and dropped). */
void route_gutter_delete(struct rworker *w, const struct proto_req *req, const char *line,
                         size_t len)
{
    int64_t g = topo_gutter_route(w->topo, req->key, req->nkey);
    if (g < 0 || !upnode_up(w->map[g])) return;
    struct frag *f = frag_create(NULL, 0);
    if (f == NULL ||
        ledit_copy(&f->out, line, len, req, req->noreply && req->cmd < CMD_MG,
                   frag_quiet_drop(req, req->meta.quiet && req->cmd >= CMD_MG), NULL, 0) < 0 ||
        !route_line_fits_quiet(w, buf_used(&f->out))) {
        if (f) frag_destroy(f);
        else w->m.out_of_memory++;
        return;
    }
    route_tag(w->topo, f, req->key, req->nkey, true);
    w->m.gutter_requests++;
    upnode_submit(w->map[g], f);
}

/* May a request for key, sent to `gutter` or not, be sent again to the slot's new owner when
 * its node answers that the slot moved (failover.h, moved-retry): a request to a node of a pool
 * whose ranges name replicas (only those are fenced or handed off), not to the gutter. */
static bool route_movable(struct rworker *w, const char *key, size_t nkey, bool gutter)
{
    return !gutter && topo_pool_of(w->topo, key, nkey)->replica != NULL;
}

/* Send one request to the node that owns req->key. `data` is a storage command's block with
 * its \r\n (NULL otherwise). */
void route_forward(struct client *c, const struct proto_req *req, const char *line,
                   size_t len, const char *data, size_t ndata)
{
    struct rworker *w = c->w;
    if (!worker_topology_ready(w)) {
        client_oom(c);
        return;
    }
    struct route_dest d;
    /* writes reach here for sharded pools only (route_replicate) */
    bool del = req->cmd == CMD_DELETE || req->cmd == CMD_MD;
    d.node = route_node(w, req->key, req->nkey,
                        del ? RU_DELETE : proto_cmd_writes(req->cmd) ? RU_WRITE : RU_READ,
                        &d.gutter, &d.held, &d.replica, &d.owner);
    /* a delete sent to the replica itself (its primary down) is on the node a promotion
     * would pick: nothing to replay there (a failed one is in its repair log, replica.h) */
    if (del && !d.replica) dellog_note(w, req->key, req->nkey);
    if (d.replica && proto_cmd_writes(req->cmd)) w->m.replica_writes++;
    else if (d.replica) w->m.replica_reads++;
    route_forward_to(c, req, line, len, data, ndata, &d);
}

/* route_forward to `d`, route_node's answer for req->key (the topology is ready). */
static void route_forward_to(struct client *c, const struct proto_req *req, const char *line,
                             size_t len, const char *data, size_t ndata,
                             const struct route_dest *d)
{
    struct rworker *w = c->w;
    bool gutter = d->gutter, held = d->held, answered = false; /* refused with its own error */
    bool write = proto_cmd_writes(req->cmd);
    bool del = req->cmd == CMD_DELETE || req->cmd == CMD_MD;
    uint32_t owner = d->owner;
    struct upnode *un = w->map[d->node];
    if (gutter) w->m.gutter_requests++;
    if (d->replica && del) route_gutter_delete(w, req, line, len); /* and to the replica */
    struct rreq *rq = rreq_create(c, RQ_FORWARD, req->cmd);
    struct frag *f = rq ? frag_create(rq, 0) : NULL;
    if (f == NULL) goto oom;
    f->held = held;
    f->via_replica = d->replica; /* held while the replica's catch-up runs (catchup.h) */
    if (write && outage_write(f, w->map[owner], un, req->key, req->nkey) < 0)
        goto oom;
    if (write && gutter) route_replica_missed(w, req->key, req->nkey, owner);
    rq->noreply = req->noreply && req->cmd < CMD_MG;
    rq->quiet = req->meta.quiet && req->cmd >= CMD_MG;
    rq->frags = &rq->frag1;
    rq->frag1 = f;
    rq->nfrags = rq->pending = 1;
    route_tag(w->topo, f, req->key, req->nkey, gutter);
    struct ledit_ttl ttl;
    struct ledit_cut cuts[LEDIT_TTL_MAX + 2];
    int n = route_ttl_edit(c, req, line, len, gutter ? w->topo->gutter_ttl : 0, &ttl);
    memcpy(cuts, ttl.cut, (size_t)n * sizeof *cuts);
    if (route_holdoff_edit(c, req, line, len, &cuts[n])) n++;
    if (req->cmd == CMD_MG && topo_pool_of(w->topo, req->key, req->nkey)->warm_from >= 0 &&
        warm_mg_prepare(rq, req, line, len, gutter, &cuts[n]))
        n++;
    if (ledit_copy(&f->out, line, len, req, rq->noreply, frag_quiet_drop(req, rq->quiet), cuts,
                   n) < 0)
        goto oom;
    if (!route_line_fits(c, req, buf_used(&f->out))) {
        answered = true;
        goto oom;
    }
    if ((data && buf_append(&f->out, data, ndata) < 0) || frag_quiet_mn(f, req) < 0) goto oom;
    /* to the owner of a sharded pool's key: retried on the gutter if the owner fails it */
    f->movable = route_movable(w, req->key, req->nkey, gutter);
    if (!gutter && !held && !rq->warm_mg && (w->topo->gutter_pool >= 0 || f->movable) &&
        !topo_pool_of(w->topo, req->key, req->nkey)->replicated && !(d->replica && write))
        f->failover = failover_kind(req);
    client_enqueue(c, rq);
    upnode_submit(un, f);
    return;
oom:
    if (rq) rreq_destroy(rq); /* frees f too: it is not completed, so orphaned... */
    if (f) frag_destroy(f);   /* ...and never queued, so free it here */
    if (!answered) client_oom(c);
}

/* get/gets/gat/gats: one fragment when every key lives on one node (the request goes on
 * unchanged but for a gat's exptime), else one per node (per node and exptime for a gat whose
 * keys' namespaces rewrite its exptime differently), merged in key order when the last
 * answers. */
void route_get(struct client *c, const struct proto_req *req, const char *line,
               size_t len)
{
    struct rworker *w = c->w;
    if (req->keys == req->keys_end || req->key == NULL) { /* gat with no keys */
        client_local_str(c, "END\r\n");
        return;
    }
    if (!worker_topology_ready(w)) {
        client_oom(c);
        return;
    }
    const char *kp = req->keys, *key;
    uint8_t nk;
    uint32_t nkeys = 0;
    bool split = false, warm = false, mixed = false, rewritten = false, held_any = false;
    bool gat = req->cmd == CMD_GAT || req->cmd == CMD_GATS;
    int64_t now = (int64_t)time(NULL);
    /* each key's route, kept for the split (routing a key costs a CRC16 and a table walk) */
    struct key_route { struct route_dest d; int64_t ttl; } stack[32], *kr = stack;
    size_t krcap = sizeof stack / sizeof *stack;
    while (proto_next_key(&kp, req->keys_end, &key, &nk)) {
        if (!route_admit(c, key, nk, 0, false)) { /* the whole get is refused */
            route_refund(w, req->keys, req->keys_end, nkeys);
            if (kr != stack) free(kr);
            return;
        }
        if (nkeys == krcap) {
            struct key_route *more = malloc(2 * krcap * sizeof *kr);
            if (more == NULL) {
                w->m.cmd_get += nkeys;
                if (kr != stack) free(kr);
                client_oom(c);
                return;
            }
            memcpy(more, kr, krcap * sizeof *kr);
            if (kr != stack) free(kr);
            kr = more;
            krcap *= 2;
        }
        struct key_route *r = &kr[nkeys];
        r->d.node = route_node(w, key, nk, RU_READ, &r->d.gutter, &r->d.held, &r->d.replica,
                               &r->d.owner);
        if (r->d.replica) w->m.replica_reads++;
        if (r->d.node != kr[0].d.node) split = true;
        held_any |= r->d.held;
        r->ttl = gat ? route_gat_ttl(w, key, nk, r->d.gutter, req->exptime, now) : 0;
        if (r->ttl != kr[0].ttl) mixed = true;
        if (gat && r->ttl != req->exptime) rewritten = true;
        if (topo_pool_of(w->topo, key, nk)->warm_from >= 0) warm = true;
        nkeys++;
    }
    w->m.cmd_get += nkeys;
    if (!split && !mixed && !warm) { /* as the client sent it, to the first key's node */
        route_forward_to(c, req, line, len, NULL, 0, &kr[0].d);
        if (kr != stack) free(kr);
        return;
    }
    if (split) w->m.multiget_split++;
    if (rewritten) w->m.ttl_rewrites++;
    struct rreq *rq = rreq_create(c, RQ_MULTIGET, req->cmd);
    if (rq == NULL) {
        if (kr != stack) free(kr);
        client_oom(c);
        return;
    }
    rq->exptime = req->exptime;
    rq->nkeys_bytes = (size_t)(req->keys_end - req->keys);
    rq->keys = malloc(rq->nkeys_bytes + 1);
    rq->keyfrag = malloc(nkeys * sizeof *rq->keyfrag);
    /* a fragment per node (per key at most), and room for a warm-pool lookup per key */
    size_t fcap = (mixed || held_any || w->nmap > nkeys ? nkeys : w->nmap) + (warm ? nkeys : 0);
    if (fcap > UINT16_MAX) fcap = UINT16_MAX;
    rq->fcap = (uint16_t)fcap;
    rq->warmable = warm;
    rq->frags = calloc(fcap, sizeof *rq->frags);
    if (rq->keys == NULL || rq->keyfrag == NULL || rq->frags == NULL) goto oom;
    memcpy(rq->keys, req->keys, rq->nkeys_bytes);
    rq->nkeys = nkeys;
    const char *verb = req->cmd == CMD_GET ? "get" : req->cmd == CMD_GETS ? "gets"
                     : req->cmd == CMD_GAT ? "gat" : "gats";
    kp = req->keys;
    /* per fragment */
    struct { uint32_t node; int64_t ttl; bool held; } *dest = malloc(fcap * sizeof *dest);
    if (dest == NULL) goto oom;
    uint32_t i = 0;
    bool bad = false;
    while (proto_next_key(&kp, req->keys_end, &key, &nk)) {
        uint32_t node = kr[i].d.node;
        bool gutter = kr[i].d.gutter, held = kr[i].d.held;
        int64_t ttl = kr[i].ttl;
        if (gutter) w->m.gutter_requests++;
        int32_t fi = w->scratch[node];
        /* a gat's other exptime on this node, or its own keys while it is a gutter too */
        if (fi >= 0 && (dest[fi].ttl != ttl || dest[fi].held != held))
            for (fi = rq->nfrags - 1; fi >= 0; fi--)
                if (dest[fi].node == node && dest[fi].ttl == ttl && dest[fi].held == held)
                    break;
        if (fi < 0) {
            struct frag *f = rq->nfrags < fcap ? frag_create(rq, rq->nfrags) : NULL;
            if (f == NULL || (gat ? buf_printf(&f->out, "%s %lld", verb, (long long)ttl)
                                  : buf_append_str(&f->out, verb)) < 0) {
                if (f) frag_destroy(f);
                bad = true;
                break;
            }
            route_tag(w->topo, f, key, nk, gutter); /* by the fragment's first key */
            f->held = held;
            if (!warm && (w->topo->gutter_pool >= 0 || route_movable(w, key, nk, gutter)))
                f->failover = FAILOVER_ANY; /* see below */
            f->movable = !warm && route_movable(w, key, nk, gutter);
            fi = rq->nfrags++;
            rq->frags[fi] = f;
            w->scratch[node] = fi;
            dest[fi].node = node;
            dest[fi].ttl = ttl;
            dest[fi].held = held;
        }
        /* a fragment retried on the gutter if its node fails it carries only keys of sharded
         * pools sent to their owner */
        if (rq->frags[fi]->failover &&
            (gutter || held || topo_pool_of(w->topo, key, nk)->replicated))
            rq->frags[fi]->failover = FAILOVER_NONE;
        rq->frags[fi]->via_replica |= kr[i].d.replica; /* held during a catch-up */
        rq->keyfrag[i++] = (uint16_t)fi;
        struct buf *o = &rq->frags[fi]->out;
        if (buf_append(o, " ", 1) < 0 || buf_append(o, key, nk) < 0) {
            bad = true;
            break;
        }
    }
    if (kr != stack) free(kr);
    kr = stack;
    for (uint16_t k = 0; k < rq->nfrags; k++) {
        w->scratch[dest[k].node] = -1;
        if (buf_append(&rq->frags[k]->out, "\r\n", 2) < 0) bad = true;
    }
    bool refused = false; /* a part over --line-max (a gat's exptime made longer): all of it */
    for (uint16_t k = 0; !bad && !refused && k < rq->nfrags; k++)
        refused = !route_line_fits(c, req, buf_used(&rq->frags[k]->out));
    if (bad || refused) {
        free(dest);
        if (refused) {
            rreq_discard(rq);
            return;
        }
        goto oom; /* which discards rq */
    }
    rq->pending = rq->nfrags;
    client_enqueue(c, rq);
    /* The last submission may complete the request at once (a node marked down fails it) and
     * free it, so nothing of rq is read after it. */
    uint16_t nfrags = rq->nfrags;
    for (uint16_t k = 0; k < nfrags; k++) upnode_submit(w->map[dest[k].node], rq->frags[k]);
    free(dest);
    return;
oom:
    if (kr != stack) free(kr);
    rreq_discard(rq); /* no fragment was submitted yet */
    client_oom(c);
}

/* Send one request to several nodes (`nodes`, indices into the topology's nodes) and answer
 * with the merged reply (request.c merge_all): flush_all to every node, writes to every
 * replica of a replicated pool. `data` is a storage command's block (or NULL). A node that
 * fails its part is repaired later (replica.h). */
static void route_fanout(struct client *c, const struct proto_req *req, const char *line,
                         size_t len, const char *data, size_t ndata, const uint32_t *nodes,
                         uint32_t n, const struct ledit_cut *cuts, int ncuts)
{
    bool answered = false; /* the request was refused with its own error */
    struct rreq *rq = rreq_create(c, RQ_ALL, req->cmd);
    struct replica_fanout *fan = NULL; /* a write's replicas' answers, weighed together */
    bool joined = false;
    if (rq == NULL || (rq->frags = calloc(n, sizeof *rq->frags)) == NULL) goto oom;
    bool flush = req->cmd == CMD_FLUSH_ALL || req->cmd == CMD_FLUSH_NS;
    if (!flush && (fan = replica_fanout_new(n)) == NULL) goto oom;
    rq->noreply = req->noreply && req->cmd < CMD_MG;
    rq->quiet = req->meta.quiet && req->cmd >= CMD_MG;
    for (uint32_t i = 0; i < n; i++) {
        struct frag *f = frag_create(rq, (uint16_t)i);
        if (f == NULL) goto oom;
        rq->frags[rq->nfrags++] = f;
        if (req->key && req->nkey) route_tag(c->w->topo, f, req->key, req->nkey, false);
        if (replica_tag(f, c->w->map[nodes[i]],
                        flush ? REPL_FLUSH_ALL : REPL_WRITE, req->key,
                        req->nkey) < 0)
            goto oom;
        if (fan) { /* each part's answer is weighed with the others' */
            replica_fanout_join(fan, f->repl);
            joined = true;
        }
        if (ledit_copy(&f->out, line, len, req, rq->noreply, frag_quiet_drop(req, rq->quiet),
                       cuts, ncuts) < 0)
            goto oom;
        if (i == 0 && !route_line_fits(c, req, buf_used(&f->out))) { /* the lines are alike */
            answered = true;
            goto oom;
        }
        if ((data && buf_append(&f->out, data, ndata) < 0) || frag_quiet_mn(f, req) < 0)
            goto oom;
    }
    rq->pending = rq->nfrags;
    client_enqueue(c, rq);
    for (uint32_t i = 0; i < n; i++) upnode_submit(c->w->map[nodes[i]], rq->frags[i]);
    return;
oom:
    if (fan && !joined) free(fan); /* else the last part to go frees it */
    if (rq) rreq_discard(rq);
    if (!answered) client_oom(c);
}

/* flush_all goes to every node of the topology. */
void route_all(struct client *c, const struct proto_req *req, const char *line,
               size_t len)
{
    struct rworker *w = c->w;
    uint32_t *nodes = worker_topology_ready(w) ? malloc(w->nmap * sizeof *nodes) : NULL;
    if (nodes == NULL) {
        client_oom(c);
        return;
    }
    for (uint32_t i = 0; i < w->nmap; i++) nodes[i] = i;
    /* a node that misses it (down, or failing) is flushed when it can be repaired */
    route_fanout(c, req, line, len, NULL, 0, nodes, w->nmap, NULL, 0);
    free(nodes);
}

/* flush_ns <name>: to every node of the pools the namespace's keys can be in: its pool (that of
 * `default` when the topology does not name it, as for its keys), the warm pool that pool fills
 * from, and the gutter pool. Each node judges the name itself. A node that misses it (down,
 * failing) is flushed whole when it can be repaired, as for flush_all: the router keeps no
 * per-namespace repair. */
void route_flush_ns(struct client *c, const struct proto_req *req, const char *line, size_t len)
{
    struct rworker *w = c->w;
    const struct topo *t = worker_topology_ready(w) ? w->topo : NULL;
    uint32_t *nodes = t ? malloc(t->nnodes * sizeof *nodes) : NULL;
    bool *seen = t ? calloc(t->nnodes ? t->nnodes : 1, sizeof *seen) : NULL;
    if (nodes == NULL || seen == NULL) {
        free(nodes);
        free(seen);
        client_oom(c);
        return;
    }
    char key[PROTO_KEY_MAX + 2]; /* "<name>:" finds the namespace as its keys do */
    memcpy(key, req->arg, req->narg);
    key[req->narg] = ':';
    const struct topo_ns *ns = topo_namespace(t, key, req->narg + 1);
    int32_t pools[3] = {(int32_t)ns->pool, t->pools[ns->pool].warm_from, t->gutter_pool};
    uint32_t n = 0;
    for (int k = 0; k < 3; k++) {
        if (pools[k] < 0) continue;
        const struct topo_pool *p = &t->pools[pools[k]];
        for (uint32_t i = 0; i < p->nnodes; i++) {
            if (seen[p->nodes[i]]) continue;
            seen[p->nodes[i]] = true;
            nodes[n++] = p->nodes[i];
        }
    }
    free(seen);
    route_fanout(c, req, line, len, NULL, 0, nodes, n, NULL, 0);
    free(nodes);
}

/* A write to a key of a replicated pool: to every replica not marked down. Returns false when
 * the key's pool is not replicated (the caller routes it as usual). */
bool route_replicate(struct client *c, const struct proto_req *req, const char *line,
                     size_t len, const char *data, size_t ndata)
{
    struct rworker *w = c->w;
    if (!worker_topology_ready(w) || !proto_cmd_writes(req->cmd)) return false;
    const struct topo_pool *p = topo_pool_of(w->topo, req->key, req->nkey);
    if (!p->replicated) return false;
    struct ledit_ttl ttl;
    struct ledit_cut cuts[LEDIT_TTL_MAX + 1];
    int ncuts = route_ttl_edit(c, req, line, len, 0, &ttl);
    memcpy(cuts, ttl.cut, (size_t)ncuts * sizeof *cuts);
    if (route_holdoff_edit(c, req, line, len, &cuts[ncuts])) ncuts++;
    w->m.replicated_writes++;
    if (replica_is_compare(req)) { /* on the replica reads go to, then the others */
        replica_compare(c, req, line, len, data, ndata, p, cuts, ncuts);
        return true;
    }
    uint32_t *nodes = malloc(p->nnodes * sizeof *nodes), n = 0;
    if (nodes == NULL) {
        client_oom(c);
        return true;
    }
    for (uint32_t i = 0; i < p->nnodes; i++) {
        struct upnode *un = w->map[p->nodes[i]];
        if (upnode_up(un)) nodes[n++] = p->nodes[i];
        else replica_log(un, req->key, req->nkey, false); /* deleted when it is back */
    }
    if (n == 0) nodes[n++] = p->nodes[0]; /* all down: fails at once with the reason */
    route_fanout(c, req, line, len, data, ndata, nodes, n, cuts, ncuts);
    free(nodes);
    return true;
}
