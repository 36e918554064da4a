/* warm.c — warm-pool lookups for keys a cold pool missed, and the writes that fill it (see
 * warm.h): get/gets/gat/gats through a split multi-get's fragments, mg through its one
 * fragment, which is sent again to the warm pool when the cold pool's answer calls for it. */
#include "router/warm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "router/client.h"
#include "router/metareply.h"
#include "router/policy.h"
#include "router/replica.h"
#include "router/upstream.h"
#include "router/worker.h"

/* The wire TTL `ttl` after the namespace rules of `key` (the topology must be ready). */
static int64_t warm_policy(struct rworker *w, const char *key, size_t nkey, int64_t ttl,
                           uint64_t cap, int64_t now)
{
    int64_t to;
    return policy_ttl_capped(topo_namespace(w->topo, key, nkey), cap, ttl, now, &to) ? to : ttl;
}

/* Fill the cold pool's node for `key` (routing bytes) with the warm item `it`: `ms WKEY LEN[ b]
 * F.. T<ttl> <how> E<cas>`, WKEY being the key as the client wrote it and `how` "ME" (an add)
 * or "C<cas>" (a vivified placeholder's fill). Nothing when the TTL has already run out or the
 * node is marked down; the node's reply is dropped. */
static void warm_fill(struct rworker *w, const char *key, size_t nkey, const char *wkey,
                      size_t nwkey, bool b64, const struct mreply_item *it, int64_t ttl,
                      const char *how, int64_t now)
{
    if (!worker_topology_ready(w)) return;
    ttl = warm_policy(w, key, nkey, ttl, 0, now);
    struct upnode *cold = w->map[topo_route(w->topo, key, nkey)];
    if (policy_ttl_left(ttl, now) == 0 || !upnode_up(cold)) return;
    struct frag *add = frag_create(NULL, 0);
    if (add == NULL ||
        buf_printf(&add->out, "ms %.*s %zu%s F%.*s T%lld %s E%.*s\r\n", (int)nwkey, wkey,
                   it->vlen, b64 ? " b" : "", (int)it->nflags, it->flags, (long long)ttl, how,
                   (int)it->ncas, it->cas) < 0 ||
        buf_append(&add->out, it->data, it->vlen + 2) < 0) {
        if (add) frag_destroy(add);
        w->m.out_of_memory++;
        return;
    }
    w->m.warm_fills++;
    add->pool = (int32_t)(topo_pool_of(w->topo, key, nkey) - w->topo->pools);
    upnode_submit(cold, add);
}

/* The node of cold pool `cold`'s warm pool that a lookup of `key` goes to: its owner, or in a
 * replicated warm pool this router's replica (another one while it is down). */
static struct upnode *warm_node(struct rworker *w, const struct topo_pool *cold, const char *key,
                                size_t nkey)
{
    const struct topo_pool *warm = &w->topo->pools[cold->warm_from];
    uint32_t node = topo_route_pool(w->topo, (uint32_t)cold->warm_from, key, nkey);
    if (warm->replicated) node = replica_read_node(w, warm, node);
    return w->map[node];
}

bool warm_start(struct rreq *rq)
{
    struct client *c = rq->cl;
    struct rworker *w = c->w;
    rq->warmed = true;
    if (!worker_topology_ready(w)) return false;
    for (uint16_t i = 0; i < rq->nfrags; i++)
        if (rq->frags[i]->failed) return false; /* answered with the error anyway */
    bool *miss = calloc(rq->nkeys ? rq->nkeys : 1, sizeof *miss);
    if (miss == NULL) return false;
    if (multiget_misses(rq, miss) == 0) {
        free(miss);
        return false;
    }
    const struct topo *t = w->topo;
    rq->pending = 1; /* held while lookups are submitted: one failing at once cannot finish it */
    const char *kp = rq->keys, *kend = rq->keys + rq->nkeys_bytes, *key;
    uint8_t nk;
    for (uint32_t i = 0; i < rq->nkeys && proto_next_key(&kp, kend, &key, &nk); i++) {
        if (!miss[i]) continue;
        const struct topo_pool *cold = topo_pool_of(t, key, nk);
        if (cold->warm_from < 0 || rq->nfrags >= rq->fcap) continue;
        struct frag *f = frag_create(rq, rq->nfrags);
        if (f == NULL || buf_append(&f->out, "mg ", 3) < 0 || buf_append(&f->out, key, nk) < 0 ||
            buf_append(&f->out, " v f t c k\r\n", 12) < 0) {
            if (f) frag_destroy(f);
            w->m.out_of_memory++;
            break;
        }
        f->warm = true;
        f->pool = cold->warm_from; /* no namespace: its failure is a miss, not an error */
        rq->frags[rq->nfrags++] = f;
        rq->keyfrag[i] = f->idx;
        rq->pending++;
        w->m.warm_lookups++;
        upnode_submit(warm_node(w, cold, key, nk), f);
    }
    free(miss);
    return --rq->pending > 0;
}

void warm_reply(struct frag *f, const char *reply, size_t n, bool failed)
{
    struct rreq *rq = f->rq;
    struct rworker *w = rq->cl->w;
    static const char end[] = "END\r\n";
    struct mreply_item it;
    if (failed || !mreply_hit(reply, n, &it) || it.key == NULL) {
        buf_append(&f->reply, end, sizeof end - 1); /* a miss there too (or no answer) */
        return;
    }
    w->m.warm_hits++;
    /* what the client gets: the warm value as a get reply */
    bool cas = rq->cmd == CMD_GETS || rq->cmd == CMD_GATS;
    if (buf_printf(&f->reply, "VALUE %.*s %.*s %zu", (int)it.nkey, it.key, (int)it.nflags,
                   it.flags, it.vlen) < 0 ||
        (cas && buf_printf(&f->reply, " %.*s", (int)it.ncas, it.cas) < 0) ||
        buf_append(&f->reply, "\r\n", 2) < 0 || buf_append(&f->reply, it.data, it.vlen + 2) < 0 ||
        buf_append(&f->reply, end, sizeof end - 1) < 0) {
        buf_release(&f->reply);
        buf_append(&f->reply, end, sizeof end - 1);
        return;
    }
    /* the fill: an add (fails if the cold pool has the key, or a delete's hold-off is on) with
     * the warm item's flags and CAS, and its remaining TTL, or for gat/gats the one asked for */
    bool touch = rq->cmd == CMD_GAT || rq->cmd == CMD_GATS;
    int64_t now = (int64_t)time(NULL);
    warm_fill(w, it.key, it.nkey, it.key, it.nkey, false, &it,
              touch ? rq->exptime : policy_ttl_wire(it.ttl, now), "ME", now);
}

bool warm_mg_prepare(struct rreq *rq, const struct proto_req *req, const char *line, size_t len,
                     bool gutter, struct ledit_cut *cut)
{
    rq->mgline = malloc(len + 1);
    if (rq->mgline == NULL) {
        rq->cl->w->m.out_of_memory++;
        return false;
    }
    memcpy(rq->mgline, line, len);
    rq->mgline[len] = '\0';
    rq->nmgline = len;
    rq->warm_mg = true;
    rq->warm_gutter = gutter;
    const struct proto_meta *m = &req->meta;
    rq->warm_lease = !gutter && proto_meta_has(m, 'N') && !proto_meta_has(m, 'R');
    if (!rq->warm_lease || proto_meta_has(m, 'c')) return false;
    rq->warm_cas_added = true;
    *cut = ledit_append(line, len, " c", 2);
    return true;
}

/* Is the meta reply line at r (n bytes) of code `code`? */
static bool warm_code(const char *r, size_t n, const char *code)
{
    return n >= 2 && r[0] == code[0] && r[1] == code[1] &&
           (n == 2 || r[2] == ' ' || r[2] == '\r' || r[2] == '\n');
}

/* Did the cold pool vivify a placeholder for this N mg and hand it the win? W without X (a
 * stale value) or Z; R, which wins on live values too, is never warmed. Sets rq->lease_cas. */
static bool warm_mg_won(struct rreq *rq, const char *r, size_t n)
{
    const char *nl = memchr(r, '\n', n), *cas;
    size_t k, ncas;
    if (!rq->warm_lease || nl == NULL || !(warm_code(r, n, "VA") || warm_code(r, n, "HD")) ||
        !mreply_flag(r, nl, 'W', &k) || mreply_flag(r, nl, 'X', &k) ||
        mreply_flag(r, nl, 'Z', &k) || (cas = mreply_flag(r, nl, 'c', &ncas)) == NULL)
        return false;
    return proto_parse_u64(cas, ncas, &rq->lease_cas);
}

/* The warm pool answered rq's lookup: on a hit, compose the client's answer into rq->held (it
 * holds the cold pool's answer, kept for a miss) and fill the cold pool. */
static void warm_mg_answer(struct rreq *rq, const char *reply, size_t n, bool failed)
{
    struct rworker *w = rq->cl->w;
    struct mreply_item it;
    struct proto_req req;
    const char *err, *wkey;
    size_t nwkey;
    if (failed || !mreply_hit(reply, n, &it) || !worker_topology_ready(w) ||
        proto_parse(rq->mgline, rq->nmgline, w->r->cfg.item_max, &req, &err) != PROTO_OK ||
        !ledit_token(rq->mgline, rq->nmgline, 1, &wkey, &nwkey))
        return;
    w->m.warm_hits++;
    int64_t now = (int64_t)time(NULL);
    bool touch = proto_meta_has(&req.meta, 'T');
    /* the item as the cold pool will hold it: the warm TTL left, or T's, after the rules */
    int64_t fill = touch ? req.meta.ttl : policy_ttl_wire(it.ttl, now);
    int64_t kept = warm_policy(w, req.key, req.nkey, policy_ttl_wire(it.ttl, now), 0, now);
    int64_t touched = touch ? warm_policy(w, req.key, req.nkey, req.meta.ttl,
                                          rq->warm_gutter ? w->topo->gutter_ttl : 0, now)
                            : kept;
    it.ttl = policy_ttl_left(kept, now); /* what t reports before any T */
    struct buf out;
    buf_init(&out);
    if (mreply_compose_mg(&out, &req, &it, policy_ttl_left(touched, now)) < 0) {
        buf_release(&out);
        w->m.out_of_memory++;
        return; /* the cold answer stands */
    }
    buf_release(&rq->held);
    rq->held = out;
    char how[32] = "ME"; /* an add, or the fill of the placeholder the client won */
    if (rq->lease_cas) snprintf(how, sizeof how, "C%llu", (unsigned long long)rq->lease_cas);
    warm_fill(w, req.key, req.nkey, wkey, nwkey, req.meta.base64, &it, fill, how, now);
}

bool warm_mg_step(struct rreq *rq, struct frag *f, const char **reply, size_t *n, bool *failed)
{
    struct rworker *w = rq->cl->w;
    if (f->warm) {
        warm_mg_answer(rq, *reply, *n, *failed);
        *reply = buf_start(&rq->held);
        *n = buf_used(&rq->held);
        *failed = false;
        return false;
    }
    const char *r = *reply;
    size_t rn = *n;
    bool lookup = !*failed && (warm_code(r, rn, "EN") || warm_mg_won(rq, r, rn));
    /* c comes back on hits only (VA, HD) */
    bool strip = rq->warm_cas_added && !*failed &&
                 (warm_code(r, rn, "VA") || warm_code(r, rn, "HD"));
    if (!strip && !lookup) return false; /* the cold answer as it is */
    /* the client's answer to the cold pool's reply, without the c the router asked for */
    buf_release(&rq->held);
    int rc = strip ? mreply_drop_flag(&rq->held, r, rn, 'c') : buf_append(&rq->held, r, rn);
    if (rc < 0) { /* the node's answer as it is, c included: better than none */
        w->m.out_of_memory++;
        buf_release(&rq->held);
        return false;
    }
    *reply = buf_start(&rq->held);
    *n = buf_used(&rq->held);
    struct proto_req req;
    const char *err, *wkey;
    size_t nwkey;
    if (!lookup || !worker_topology_ready(w) ||
        proto_parse(rq->mgline, rq->nmgline, w->r->cfg.item_max, &req, &err) != PROTO_OK ||
        !ledit_token(rq->mgline, rq->nmgline, 1, &wkey, &nwkey))
        return false;
    const struct topo_pool *cold = topo_pool_of(w->topo, req.key, req.nkey);
    if (cold->warm_from < 0) return false; /* a reload ended the warm-up meanwhile */
    struct frag *wf = frag_create(rq, 0);
    if (wf == NULL ||
        buf_printf(&wf->out, "mg %.*s%s v f t c%s%s\r\n", (int)nwkey, wkey,
                   req.meta.base64 ? " b" : "", proto_meta_has(&req.meta, 'h') ? " h" : "",
                   proto_meta_has(&req.meta, 'l') ? " l" : "") < 0) {
        if (wf) frag_destroy(wf);
        w->m.out_of_memory++;
        return false;
    }
    wf->warm = true;
    wf->pool = cold->warm_from; /* no namespace: its failure is a miss, not an error */
    rq->frag1 = wf;
    rq->pending = 1;
    w->m.warm_lookups++;
    upnode_submit(warm_node(w, cold, req.key, req.nkey), wf);
    return true;
}
