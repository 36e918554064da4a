/* failover.c — retrying on the gutter pool a request whose node failed it, and the mark-down
 * state the workers share (see failover.h). */
#include "router/failover.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "router/catchup.h"
#include "router/lineedit.h"
#include "router/outage.h"
#include "router/policy.h"
#include "router/replica.h"
#include "router/route.h"
#include "router/upstream.h"
#include "router/worker.h"

uint8_t failover_kind(const struct proto_req *req)
{
    switch (req->cmd) {
    case CMD_GET: case CMD_GETS: case CMD_GAT: case CMD_GATS: case CMD_MG: case CMD_ME:
    case CMD_SET: case CMD_REPLACE: case CMD_DELETE: case CMD_TOUCH:
        return FAILOVER_ANY;
    case CMD_MS:
        return !proto_meta_has(&req->meta, 'C') &&
                       (req->meta.mode == 0 || req->meta.mode == 'S' || req->meta.mode == 'R')
                   ? FAILOVER_ANY
                   : FAILOVER_UNSENT;
    case CMD_MD:
        return proto_meta_has(&req->meta, 'C') ? FAILOVER_UNSENT : FAILOVER_ANY;
    default: /* add, append, prepend, cas, incr, decr, ma */
        return FAILOVER_UNSENT;
    }
}

/* The gutter node a retry of `key` goes to, or NULL when there is none this worker can use:
 * no gutter pool, a key of a replicated pool (never sent to the gutter), the gutter node is
 * `from` itself, or it is marked down. */
static struct upnode *failover_gutter(struct rworker *w, const struct upnode *from,
                                      const char *key, size_t nkey)
{
    if (topo_pool_of(w->topo, key, nkey)->replicated) return NULL;
    int64_t g = topo_gutter_route(w->topo, key, nkey);
    if (g < 0) return NULL;
    struct upnode *gun = w->map[g];
    return gun != from && upnode_up(gun) ? gun : NULL;
}

/* f's request, as sent: the line (without \r\n) parsed into *req, and what follows it. */
struct failover_req {
    const char *line, *rest;
    size_t nline, nrest;
    struct proto_req req;
};

static bool failover_parse(struct rworker *w, const struct frag *f, struct failover_req *r)
{
    const char *p = buf_start(&f->out), *nl = memchr(p, '\n', buf_used(&f->out));
    const char *err;
    if (nl == NULL || nl == p || nl[-1] != '\r') return false;
    r->line = p;
    r->nline = (size_t)(nl - 1 - p);
    r->rest = nl + 1;
    r->nrest = buf_used(&f->out) - (size_t)(r->rest - p);
    return proto_parse(r->line, r->nline, w->r->cfg.item_max, &r->req, &err) == PROTO_OK;
}

/* A line built for the gutter is sent only if a node takes it (route_line_fits' rule): a TTL
 * capped by gutter_ttl can be longer than the one it replaces ("0" becomes "10"). */
static bool failover_fits(struct rworker *w, const struct buf *b)
{
    const char *nl = memchr(buf_start(b), '\n', buf_used(b));
    return nl && (size_t)(nl - buf_start(b)) <= w->r->cfg.line_max + 1;
}

/* The index of key's namespace in the routing table (a fragment's figures: route_tag). */
static int32_t failover_ns(const struct rworker *w, const char *key, size_t nkey)
{
    return (int32_t)(topo_namespace(w->topo, key, nkey) - w->topo->ns);
}

/* Send f, rebuilt for the gutter (or, moved, for wherever its key goes now) into `out`
 * (taken), to `gun`, counted for namespace `ns`. `read`: a read, which a slot's replica that
 * fails it (or goes down while it is held for the replica's catch-up) sends on to the gutter
 * as any read (failover_dest never picks the replica again for it); anything else is retried
 * once. */
static void failover_send(struct rworker *w, struct frag *f, struct buf *out, struct upnode *gun,
                          int32_t ns, bool gutter, bool replica, bool read)
{
    frag_unkeep(f); /* kept again, if it may be, when it is handed to a connection */
    buf_release(&f->out);
    f->out = *out;
    buf_init(out);
    f->failover = replica && read ? FAILOVER_ANY : FAILOVER_NONE; /* once */
    f->held = false;
    f->via_replica = replica; /* held while the replica's catch-up runs (catchup.h) */
    f->ns = ns;
    f->pool = gutter ? w->topo->gutter_pool : (int32_t)w->topo->ns[ns].pool;
    upnode_submit(gun, f);
}

/* Where a retry of `key` goes: for any request about a copies-2 key (a read, a delete, any
 * other write), the slot's replica when this worker can read it (*replica; the owner failed,
 * so it is as if it were down: route.c's rule; a replica that failed it sends it on to the
 * gutter), else the gutter pool's node (failover_gutter; *gutter); or with `moved`
 * wherever the worker's table routes it now (route_key_node: its owner, the replica, the
 * gutter). NULL when nowhere can take it. `from` NULL: the key's owner in the current table.
 * `parked`: a moved-retry falling back (the owner refused it, fenced; it is not marked down). */
static struct upnode *failover_dest(struct rworker *w, const struct upnode *from, const char *key,
                                    size_t nkey, bool moved, bool parked, enum route_use use,
                                    bool *gutter, bool *replica)
{
    *gutter = true;
    *replica = false;
    if (from == NULL) from = w->map[topo_route(w->topo, key, nkey)];
    if (moved) {
        bool held;
        struct upnode *un = w->map[route_key_node(w, key, nkey, use, gutter, &held, replica)];
        return held || !upnode_up(un) ? NULL : un;
    }
    /* parked (from NULL: a moved-retry falling back) writes keep to the gutter: the owner is
     * not marked down, and will serve the key again without a repair of the replica */
    uint32_t owner = topo_route(w->topo, key, nkey);
    int64_t r = use == RU_WRITE && parked ? -1 : route_replica_takes(w, key, nkey, owner, use);
    if (r >= 0 && w->map[r] != from) {
        *gutter = false;
        *replica = true;
        /* the owner failed it (or fences): the replica must first have the owner's recent
         * deletes (catchup.h; once per failure) */
        catchup_begin(w, w->map[owner]);
        return w->map[r];
    }
    return failover_gutter(w, from, key, nkey);
}

/* A request for one key. */
static bool failover_one(struct rworker *w, struct upnode *from, struct frag *f, bool sent,
                         struct failover_req *r, bool moved)
{
    const struct proto_req *req = &r->req;
    if (req->key == NULL || req->nkey == 0) return false;
    bool parked = from == NULL;
    if (parked) from = w->map[topo_route(w->topo, req->key, req->nkey)];
    bool write = proto_cmd_writes(req->cmd), gutter, replica;
    bool del = req->cmd == CMD_DELETE || req->cmd == CMD_MD;
    struct upnode *gun = failover_dest(w, from, req->key, req->nkey, moved, parked,
                                       del ? RU_DELETE : write ? RU_WRITE : RU_READ, &gutter,
                                       &replica);
    if (gun == NULL) return false;
    struct ledit_ttl e;
    int n = gutter ? ledit_ttl(req, r->line, r->nline,
                               topo_namespace(w->topo, req->key, req->nkey),
                               w->topo->gutter_ttl, (int64_t)time(NULL), &e)
                   : 0; /* the line's TTL already follows the namespace's rules */
    struct buf out;
    buf_init(&out);
    if (ledit_copy(&out, r->line, r->nline, req, false, NULL, e.cut, n) < 0 ||
        !failover_fits(w, &out) || buf_append(&out, r->rest, r->nrest) < 0) {
        buf_release(&out);
        return false;
    }
    if (write) {
        replica_write_free(f->repl);
        f->repl = NULL;
        uint32_t oi = topo_route(w->topo, req->key, req->nkey);
        struct upnode *owner = w->map[oi];
        if (!moved) { /* logged here, for the owner: the gutter's answer is not the owner's */
            replica_log(from, req->key, req->nkey, sent);
        } else if (outage_write(f, owner, gun, req->key, req->nkey) < 0) {
            buf_release(&out);
            return false;
        }
        /* a copies-2 key's write to the gutter: the slot's replica could not take it either
         * (not so a fenced owner's refusal falling back: the replica is fine, nothing missed) */
        if (gutter && (moved || (!parked && from == owner)))
            route_replica_missed(w, req->key, req->nkey, oi);
    }
    if (moved) w->m.moved_retries++;
    else w->m.gutter_retries++;
    if (replica && !write) w->m.replica_reads++;
    if (replica && write) w->m.replica_writes++;
    if (replica && del) route_gutter_delete(w, req, r->line, r->nline);
    w->inflight--; /* upnode_submit counts it again */
    failover_send(w, f, &out, gun, failover_ns(w, req->key, req->nkey), gutter, replica,
                  !write && !del);
    return true;
}

/* An RQ_FORWARD get of several keys on one node, about to be split over several gutter
 * nodes: make it the RQ_MULTIGET route_get would have built had its keys been on several
 * nodes (its keys, each carried by fragment 0, f). -1 when memory runs out (nothing changed). */
static int failover_to_multiget(struct rreq *rq, struct frag *f, const struct proto_req *req,
                                uint32_t nkeys)
{
    size_t nb = (size_t)(req->keys_end - req->keys);
    char *keys = malloc(nb + 1);
    uint16_t *keyfrag = calloc(nkeys, sizeof *keyfrag);
    struct frag **frags = malloc(sizeof *frags);
    if (keys == NULL || keyfrag == NULL || frags == NULL || rq->nfrags != 1 || f->idx != 0) {
        free(keys);
        free(keyfrag);
        free(frags);
        return -1;
    }
    memcpy(keys, req->keys, nb);
    frags[0] = f;
    rq->kind = RQ_MULTIGET;
    rq->keys = keys;
    rq->nkeys_bytes = nb;
    rq->nkeys = nkeys;
    rq->keyfrag = keyfrag;
    rq->frags = frags;
    rq->fcap = 1;
    rq->exptime = req->exptime;
    return 0;
}

/* get, gets, gat, gats: each key to its gutter node (and, for a gat, the exptime its namespace
 * and gutter_ttl give it). All to one node: f goes there whole. Else f is split, as route_get
 * splits a get over nodes: f takes the first group's keys, new fragments of the same request
 * the others, and the request's keys are re-assigned, so the merge keeps the client's order. */
static bool failover_get(struct rworker *w, struct upnode *from, struct frag *f,
                         struct failover_req *r, bool moved)
{
    const struct proto_req *req = &r->req;
    struct rreq *rq = f->rq;
    bool gat = req->cmd == CMD_GAT || req->cmd == CMD_GATS;
    const char *verb = req->cmd == CMD_GET ? "get" : req->cmd == CMD_GETS ? "gets"
                     : req->cmd == CMD_GAT ? "gat" : "gats";
    int64_t now = (int64_t)time(NULL);
    uint32_t nkeys = 0, ngroups = 0, cap = 16;
    struct group {
        struct upnode *gun;
        int64_t ttl;
        int32_t ns; /* its first key's namespace */
        bool gutter, replica; /* replica: one of its keys goes there for its failed owner */
        struct frag *f;
        struct buf out;
    } *groups;
    uint32_t *gof = NULL; /* per key of f, in order: its group */
    size_t gofcap = 64;
    bool ok = false;
    groups = malloc(cap * sizeof *groups);
    gof = malloc(gofcap * sizeof *gof);
    if (groups == NULL || gof == NULL) goto out;
    const char *kp = req->keys, *key;
    uint8_t nk;
    while (proto_next_key(&kp, req->keys_end, &key, &nk)) {
        bool gutter, replica;
        struct upnode *gun = failover_dest(w, from, key, nk, moved, from == NULL, RU_READ,
                                           &gutter, &replica);
        if (gun == NULL) goto out;
        if (replica) w->m.replica_reads++;
        int64_t ttl = 0;
        if (gat && (!gutter || !policy_ttl_capped(topo_namespace(w->topo, key, nk),
                                                  w->topo->gutter_ttl, req->exptime, now, &ttl)))
            ttl = req->exptime;
        uint32_t g = 0;
        while (g < ngroups && (groups[g].gun != gun || groups[g].ttl != ttl)) g++;
        if (g == ngroups) {
            if (ngroups == cap) {
                void *more = realloc(groups, 2 * cap * sizeof *groups);
                if (more == NULL) goto out;
                groups = more;
                cap *= 2;
            }
            groups[g] = (struct group){gun, ttl, failover_ns(w, key, nk), gutter, false, NULL,
                                       {0}};
            buf_init(&groups[g].out);
            ngroups++;
            if ((gat ? buf_printf(&groups[g].out, "%s %lld", verb, (long long)ttl)
                     : buf_append_str(&groups[g].out, verb)) < 0)
                goto out;
        }
        if (nkeys == gofcap) {
            void *more = realloc(gof, 2 * gofcap * sizeof *gof);
            if (more == NULL) goto out;
            gof = more;
            gofcap *= 2;
        }
        gof[nkeys++] = g;
        groups[g].replica |= replica;
        if (buf_append(&groups[g].out, " ", 1) < 0 || buf_append(&groups[g].out, key, nk) < 0)
            goto out;
    }
    if (nkeys == 0) goto out;
    for (uint32_t g = 0; g < ngroups; g++)
        if (buf_append(&groups[g].out, "\r\n", 2) < 0 || !failover_fits(w, &groups[g].out))
            goto out;
    if (ngroups > 1) {
        if (rq->kind == RQ_FORWARD && failover_to_multiget(rq, f, req, nkeys) < 0) goto out;
        if (rq->kind != RQ_MULTIGET || (size_t)rq->nfrags + ngroups - 1 > UINT16_MAX) goto out;
        uint32_t mine = 0; /* f's keys in the request's order are the keys of its line */
        for (uint32_t i = 0; i < rq->nkeys; i++) mine += rq->keyfrag[i] == f->idx;
        if (mine != nkeys) goto out;
        uint16_t need = (uint16_t)(rq->nfrags + ngroups - 1);
        if (need > rq->fcap) {
            struct frag **more = rq->frags == &rq->frag1 ? NULL : rq->frags;
            more = realloc(more, need * sizeof *more);
            if (more == NULL) goto out;
            if (rq->frags == &rq->frag1) more[0] = rq->frag1;
            rq->frags = more;
            rq->fcap = need;
        }
        for (uint32_t g = 1; g < ngroups; g++)
            if ((groups[g].f = frag_create(rq, (uint16_t)(rq->nfrags + g - 1))) == NULL) {
                for (uint32_t k = 1; k < g; k++) frag_destroy(groups[k].f);
                goto out;
            }
        for (uint32_t i = 0, j = 0; i < rq->nkeys; i++) {
            if (rq->keyfrag[i] != f->idx) continue;
            if (gof[j] > 0) rq->keyfrag[i] = groups[gof[j]].f->idx;
            j++;
        }
        for (uint32_t g = 1; g < ngroups; g++) rq->frags[rq->nfrags++] = groups[g].f;
        rq->pending = (uint16_t)(rq->pending + ngroups - 1);
    }
    groups[0].f = f;
    if (moved) w->m.moved_retries++;
    else w->m.gutter_retries++;
    w->inflight--; /* upnode_submit counts each fragment again */
    /* the last submission may complete the request: nothing of it is read after */
    for (uint32_t g = 0; g < ngroups; g++)
        failover_send(w, groups[g].f, &groups[g].out, groups[g].gun, groups[g].ns,
                      groups[g].gutter, groups[g].replica, true);
    ok = true;
out:
    for (uint32_t g = 0; groups && g < ngroups; g++) buf_release(&groups[g].out);
    free(groups);
    free(gof);
    return ok;
}

bool failover_retry(struct upnode *from, struct frag *f, bool sent)
{
    struct rworker *w = from->w;
    if (f->failover == FAILOVER_NONE || f->rq == NULL || f->probe ||
        (sent && f->failover != FAILOVER_ANY) || !worker_topology_ready(w))
        return false; /* with no gutter pool, only a slot's replica can take it */
    struct failover_req r;
    if (!failover_parse(w, f, &r)) return false;
    switch (r.req.cmd) {
    case CMD_GET: case CMD_GETS: case CMD_GAT: case CMD_GATS:
        return failover_get(w, from, f, &r, false);
    default:
        return failover_one(w, from, f, sent, &r, false);
    }
}

bool failover_is_moved(const char *reply, size_t n)
{
    static const char *const moved[] = {"SERVER_ERROR slot lease expired",
                                        "SERVER_ERROR slot moving"};
    for (size_t i = 0; i < sizeof moved / sizeof moved[0]; i++) {
        size_t k = strlen(moved[i]);
        if (n > k && !memcmp(reply, moved[i], k) && (reply[k] == '\r' || reply[k] == ' '))
            return true;
    }
    return false;
}

bool failover_park(struct upnode *from, struct frag *f, const char *reply, size_t n)
{
    struct rworker *w = from->w;
    if (w->r->cfg.moved_wait_ms == 0 || f->rq == NULL || f->probe) return false;
    buf_release(&f->reply);
    if (buf_append(&f->reply, reply, n) < 0) return false; /* kept for the fallback */
    /* the window runs from the first refusal: a new owner that fences for a moment (its lease
     * names a version it has not received yet) parks it again within it, never longer */
    if (!f->moved) f->moved_until_ms = w->now_ms + w->r->cfg.moved_wait_ms;
    f->moved = true;
    f->deadline_ms = f->moved_until_ms;
    /* the node refused it: nothing is pending there for the repair logic */
    replica_write_free(f->repl);
    f->repl = NULL;
    f->next = NULL;
    if (w->parked_tail) w->parked_tail->next = f;
    else w->parked = f;
    w->parked_tail = f;
    return true;
}

/* A parked fragment leaves: to where its key goes now (`newer`: the worker's table is newer
 * than the one it was sent under), or to the gutter pool as for a node down. False: it cannot
 * go anywhere; the caller answers it. */
static bool failover_resend(struct rworker *w, struct frag *f, bool newer)
{
    struct failover_req r;
    if (!worker_topology_ready(w) || !failover_parse(w, f, &r)) return false;
    /* no newer topology: the owner is alive (it answered) and keeps its slots, so a write
     * applied in the gutter would be acknowledged and then shadowed by its older value once
     * its lease is renewed (no mark-down, so no repair). It goes once more to where the table
     * routes it (the owner, whose fence may have lifted: a node whose lease names a version it
     * has not received yet fences for a moment); a second refusal reaches the client. */
    if (!newer && (proto_cmd_writes(r.req.cmd) || r.req.cmd == CMD_DELETE ||
                   r.req.cmd == CMD_MD))
        newer = true;
    if (!newer && f->failover == FAILOVER_NONE) return false;
    w->inflight++; /* a parked fragment is not counted; the send paths count it down first */
    bool ok;
    switch (r.req.cmd) {
    case CMD_GET: case CMD_GETS: case CMD_GAT: case CMD_GATS:
        ok = failover_get(w, NULL, f, &r, newer);
        break;
    default:
        ok = failover_one(w, NULL, f, false, &r, newer);
        break;
    }
    if (!ok) w->inflight--;
    return ok;
}

void failover_unpark(struct rworker *w, bool expired)
{
    struct frag *list = w->parked, *next;
    w->parked = w->parked_tail = NULL;
    for (struct frag *f = list; f; f = next) {
        next = f->next;
        f->next = NULL;
        if (f->rq == NULL) { /* its client has gone */
            frag_destroy(f);
            continue;
        }
        bool newer = worker_topology_ready(w) && w->topo->version > f->park_version;
        if (!newer && !(expired && w->now_ms >= f->deadline_ms)) {
            if (w->parked_tail) w->parked_tail->next = f;
            else w->parked = f;
            w->parked_tail = f;
            continue;
        }
        char reply[256];
        size_t n = buf_used(&f->reply) < sizeof reply ? buf_used(&f->reply) : 0;
        memcpy(reply, buf_start(&f->reply), n);
        buf_release(&f->reply);
        if (failover_resend(w, f, newer)) continue;
        if (n == 0) n = (size_t)snprintf(reply, sizeof reply, "SERVER_ERROR slot moved\r\n");
        frag_complete(f, reply, n, false); /* the node's own answer, as it came */
    }
}

void failover_unpark_all(struct rworker *w)
{
    for (struct frag *f = w->parked, *next; f; f = next) {
        next = f->next;
        frag_destroy(f); /* its client was destroyed first, which orphaned it */
    }
    w->parked = w->parked_tail = NULL;
}

void failover_publish(struct upnode *un, bool down)
{
    if (un->health == NULL) return;
    uint64_t e = __atomic_load_n(un->health, __ATOMIC_ACQUIRE);
    while (((e & 1) != 0) != down) {
        if (__atomic_compare_exchange_n(un->health, &e, e + 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            e++;
            __atomic_add_fetch(&un->w->r->health_gen, 1, __ATOMIC_RELEASE);
            break;
        }
    }
    un->health_seen = e;
}

void failover_sync(struct rworker *w)
{
    uint64_t gen = __atomic_load_n(&w->r->health_gen, __ATOMIC_ACQUIRE);
    if (gen == w->health_seen) return;
    w->health_seen = gen;
    for (struct upnode *un = w->upnodes; un; un = un->next) {
        if (un->health == NULL || un->retired) continue;
        uint64_t e = __atomic_load_n(un->health, __ATOMIC_ACQUIRE);
        if (e == un->health_seen) continue;
        un->health_seen = e;
        if ((e & 1) != un->down) upnode_adopt(un, e & 1);
    }
    catchup_sync(w); /* catch-ups other workers started (catchup.h) */
}
