/* repl.c — replication's life cycle, per-slot roles from the topology, the handoff fence and
 * the figures (`stats repl`, /metrics, GET /v1/replication, POST /v1/replication/handoff). The
 * stream itself is repl_primary.c and repl_replica.c.
 *
 * Roles are written by the control follower only, one relaxed atomic byte per slot, and read
 * by workers without a lock; peer names live in a table of REPL_PEERS_MAX: when a document needs
 * a name and the table is full, names neither that document nor a live stream uses are
 * forgotten (peers_reclaim), so a long-lived node that saw many addresses still takes new ones. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "node/cmd.h"
#include "node/control.h"
#include "node/node.h"
#include "node/repl_int.h"
#include "node/repl_wire.h"

#define FENCE_MAX_MS 10000
#define HANDOFF_TIMEOUT_MS 2000

static const struct metric_desc repl_descs[] = {
#define X(name, kind, help) METRIC_DESC(struct repl_metrics, name, kind, help),
    REPL_METRICS(X)
#undef X
};

const struct metric_desc *repl_metric_table(size_t *n)
{
    *n = sizeof repl_descs / sizeof repl_descs[0];
    return repl_descs;
}

const char *repl_state_name(enum repl_state s)
{
    return s == REPL_ONLINE ? "online" : s == REPL_SYNC ? "sync" : "down";
}

size_t repl_max_payload(const struct repl *r)
{
    size_t p = repl_item_payload(255, r->n->cfg.store.item_max);
    return p > REPL_SLOT_BITMAP ? p : REPL_SLOT_BITMAP;
}

unsigned repl_peer_find(const struct repl *r, const char *addr)
{
    if (addr[0] == 0) return REPL_PEER_NONE; /* "" marks a forgotten entry */
    for (unsigned i = 0; i < r->npeers; i++)
        if (!strcmp(r->peers[i], addr)) return i;
    return REPL_PEER_NONE;
}

unsigned repl_peer_index(struct repl *r, const char *addr)
{
    unsigned i = repl_peer_find(r, addr);
    if (i != REPL_PEER_NONE) return i;
    if (r->npeers < REPL_PEERS_MAX) i = r->npeers++;
    else
        for (i = 0; i < REPL_PEERS_MAX && r->peers[i][0]; i++) {}
    if (i == REPL_PEERS_MAX) return REPL_PEERS_MAX;
    snprintf(r->peers[i], REPL_ADDR_MAX, "%s", addr);
    return i;
}

void repl_set_advertise(struct repl *r, const char *advertise)
{
    snprintf(r->me, sizeof r->me, "%s", advertise);
}

struct repl *repl_create(struct node *n, char *err, size_t errlen)
{
    struct repl *r = calloc(1, sizeof *r);
    if (r == NULL || (r->peers = calloc(REPL_PEERS_MAX, REPL_ADDR_MAX)) == NULL ||
        repl_backlog_init(&r->bl, (size_t)n->cfg.repl_backlog) < 0) {
        if (r) free(r->peers);
        free(r);
        snprintf(err, errlen, "out of memory for the replication backlog (--repl-backlog)");
        return NULL;
    }
    r->n = n;
    uint8_t rnd[8] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) {
        uint64_t t = clock_now_ms() ^ (uint64_t)getpid() << 32;
        memcpy(rnd, &t, sizeof rnd);
    }
    for (int i = 0; i < 8; i++) snprintf(r->replid + 2 * i, 3, "%02x", rnd[i]);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->appliers_done, NULL);
    if (n->store) store_set_move_hook(n->store, repl_note_move, n);
    return r;
}

void repl_stop(struct repl *r)
{
    if (r == NULL) return;
    pthread_mutex_lock(&r->lock);
    r->stopping = 1;
    struct repl_link *links = r->links;
    r->links = NULL;
    for (struct repl_src *s = r->srcs; s; s = s->next)
        if (s->fd >= 0) shutdown(s->fd, SHUT_RDWR);
    pthread_mutex_unlock(&r->lock);
    while (links) {
        struct repl_link *next = links->next;
        repl_link_join(links);
        free(links);
        links = next;
    }
    pthread_mutex_lock(&r->lock);
    while (r->appliers > 0) pthread_cond_wait(&r->appliers_done, &r->lock);
    pthread_mutex_unlock(&r->lock);
}

void repl_free(struct repl **rp)
{
    struct repl *r = *rp;
    if (r == NULL) return;
    repl_stop(r);
    while (r->srcs) {
        struct repl_src *s = r->srcs;
        r->srcs = s->next;
        free(s);
    }
    repl_backlog_free(&r->bl);
    free(r->peers);
    free(r);
    *rp = NULL;
}

/* ---- roles ---- */

struct repl_plan {
    struct repl *r;
    uint8_t role[SLOT_COUNT];
    char (*peer)[REPL_ADDR_MAX]; /* per slot */
};

struct repl_plan *repl_plan_begin(struct repl *r)
{
    struct repl_plan *p = calloc(1, sizeof *p);
    if (p && (p->peer = calloc(SLOT_COUNT, REPL_ADDR_MAX)) == NULL) {
        free(p);
        p = NULL;
    }
    if (p) p->r = r;
    return p;
}

void repl_plan_range(struct repl_plan *p, unsigned from, unsigned to, const char *node,
                     const char *replica)
{
    if (p == NULL) return;
    bool prim = !strcmp(node, p->r->me), rep = replica && !strcmp(replica, p->r->me);
    if (!prim && !rep) return;
    for (unsigned s = from; s <= to && s < SLOT_COUNT; s++) {
        if (prim) {
            p->role[s] = REPL_ROLE_PRIMARY | (replica && !rep ? REPL_ROLE_STREAMS : 0);
            if (replica && !rep) snprintf(p->peer[s], REPL_ADDR_MAX, "%s", replica);
        } else {
            p->role[s] = REPL_ROLE_REPLICA;
            snprintf(p->peer[s], REPL_ADDR_MAX, "%s", node);
        }
    }
}

void repl_plan_free(struct repl_plan *p)
{
    if (p == NULL) return;
    free(p->peer);
    free(p);
}

/* The table is full: forget every name that neither plan `p` nor a live stream (an applier
 * holds its primary's index) uses (lock held). A slot whose peer was forgotten gets index
 * REPL_PEER_GONE, which matches no applier and counts as a new peer for the slot (so a reused
 * index never passes for the old one). */
#define REPL_PEER_GONE 0xffff
static void peers_reclaim(struct repl *r, const struct repl_plan *p)
{
    uint8_t *keep = calloc(REPL_PEERS_MAX, 1);
    if (keep == NULL) return;
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        if (!p->peer[s][0] || (s > 0 && !strcmp(p->peer[s], p->peer[s - 1]))) continue;
        unsigned i = repl_peer_find(r, p->peer[s]);
        if (i != REPL_PEER_NONE) keep[i] = 1;
    }
    for (struct repl_src *src = r->srcs; src; src = src->next) {
        unsigned i = src->fd >= 0 ? repl_peer_find(r, src->addr) : REPL_PEER_NONE;
        if (i != REPL_PEER_NONE) keep[i] = 1;
    }
    unsigned forgot = 0;
    for (unsigned i = 0; i < r->npeers; i++)
        if (!keep[i] && r->peers[i][0]) {
            r->peers[i][0] = 0;
            forgot++;
        }
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        uint16_t i = r->peer[s];
        if (i < REPL_PEERS_MAX && !keep[i])
            __atomic_store_n(&r->peer[s], REPL_PEER_GONE, __ATOMIC_RELAXED);
    }
    free(keep);
    log_notice("replication: %d peer names known: %u no longer in use forgotten", REPL_PEERS_MAX,
               forgot);
}

void repl_plan_commit(struct repl *r, struct repl_plan *p)
{
    if (p == NULL) return;
    struct repl_link *gone = NULL, *fresh = NULL;
    pthread_mutex_lock(&r->lock);
    uint64_t fenced = 0;
    bool reclaimed = false, told = false;
    for (struct repl_link *l = r->links; l; l = l->next) memset(l->slots, 0, SLOT_COUNT);
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        uint8_t old = r->pub.role[s], nw = p->role[s];
        /* a fence stays while this node is still primary of the slot */
        if ((old & REPL_ROLE_FENCED) && (nw & REPL_ROLE_PRIMARY)) nw |= REPL_ROLE_FENCED;
        fenced += (nw & REPL_ROLE_FENCED) != 0;
        unsigned idx = p->peer[s][0] ? repl_peer_index(r, p->peer[s]) : 0;
        if (idx >= REPL_PEERS_MAX && !reclaimed) {
            peers_reclaim(r, p);
            reclaimed = true;
            idx = repl_peer_index(r, p->peer[s]);
        }
        if (idx >= REPL_PEERS_MAX && !told) {
            log_error("replication: more than %d peer names in use: slot %u (peer %s) and "
                      "others are not replicated", REPL_PEERS_MAX, s, p->peer[s]);
            told = true;
        }
        bool moved = !(old & REPL_ROLE_STREAMS) || r->peer[s] != idx; /* new to this replica */
        __atomic_store_n(&r->peer[s], (uint16_t)idx, __ATOMIC_RELAXED);
        __atomic_store_n(&r->pub.role[s], nw, __ATOMIC_RELAXED);
        if (!(nw & REPL_ROLE_STREAMS) || idx >= REPL_PEERS_MAX) continue;
        struct repl_link *l = r->links;
        while (l && strcmp(l->addr, p->peer[s])) l = l->next;
        for (struct repl_link *f = fresh; l == NULL && f; f = f->next)
            if (!strcmp(f->addr, p->peer[s])) l = f;
        if (l == NULL && !r->stopping && (l = calloc(1, sizeof *l)) != NULL) {
            l->r = r;
            snprintf(l->addr, sizeof l->addr, "%s", p->peer[s]);
            l->next = fresh;
            fresh = l;
        }
        if (l == NULL) continue;
        if (moved) l->resync = true; /* a slot it may lack: its next connection syncs in full */
        l->slots[s] = 1;
    }
    __atomic_store_n(&r->pub.nfenced, fenced, __ATOMIC_RELAXED);
    if (fenced == 0) __atomic_store_n(&r->fence_until_ms, 0, __ATOMIC_RELAXED);
    /* links left without a slot end */
    for (struct repl_link **lp = &r->links; *lp;) {
        struct repl_link *l = *lp;
        bool any = false;
        for (unsigned s = 0; s < SLOT_COUNT && !any; s++) any = l->slots[s];
        if (any) {
            lp = &l->next;
        } else {
            *lp = l->next;
            l->next = gone;
            gone = l;
        }
    }
    while (fresh) {
        struct repl_link *l = fresh;
        fresh = l->next;
        if (repl_link_start(l) < 0) {
            log_error("replication to %s: cannot start its sender thread", l->addr);
            free(l);
            continue;
        }
        l->next = r->links;
        r->links = l;
        log_notice("replication: streaming to replica %s", l->addr);
    }
    pthread_mutex_unlock(&r->lock);
    while (gone) {
        struct repl_link *l = gone;
        gone = l->next;
        log_notice("replication: %s replicates none of this node's slots any more", l->addr);
        repl_link_join(l);
        free(l);
    }
    free(p->peer);
    free(p);
}

uint8_t repl_slot_role(struct repl *r, unsigned slot, char *peer, size_t peercap)
{
    if (r == NULL || slot >= SLOT_COUNT) {
        if (peer && peercap) peer[0] = 0;
        return 0;
    }
    uint8_t role = __atomic_load_n(&r->pub.role[slot], __ATOMIC_RELAXED);
    if (peer && peercap) {
        pthread_mutex_lock(&r->lock);
        unsigned idx = r->peer[slot];
        snprintf(peer, peercap, "%s",
                 (role & (REPL_ROLE_STREAMS | REPL_ROLE_REPLICA)) && idx < r->npeers
                     ? r->peers[idx] : "");
        pthread_mutex_unlock(&r->lock);
    }
    return role;
}

/* ---- handoff fence ---- */

void repl_fence_clear(struct repl *r)
{
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        uint8_t v = __atomic_load_n(&r->pub.role[s], __ATOMIC_RELAXED);
        if (v & REPL_ROLE_FENCED)
            __atomic_store_n(&r->pub.role[s], (uint8_t)(v & ~REPL_ROLE_FENCED), __ATOMIC_RELAXED);
    }
    __atomic_store_n(&r->pub.nfenced, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->fence_until_ms, 0, __ATOMIC_RELAXED);
    r->fence_lifts++;
}

/* Lift the fences of the slots in `want` only (lock held): a handoff that timed out must not
 * lift those of another one, already answered 200, whose swap is on its way. */
static void fence_lift_some(struct repl *r, const uint8_t *want)
{
    uint64_t fenced = 0;
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        uint8_t v = __atomic_load_n(&r->pub.role[s], __ATOMIC_RELAXED);
        if (want[s] && (v & REPL_ROLE_FENCED))
            __atomic_store_n(&r->pub.role[s], (uint8_t)(v & ~REPL_ROLE_FENCED), __ATOMIC_RELAXED);
        else fenced += (v & REPL_ROLE_FENCED) != 0;
    }
    __atomic_store_n(&r->pub.nfenced, fenced, __ATOMIC_RELAXED);
    if (fenced == 0) __atomic_store_n(&r->fence_until_ms, 0, __ATOMIC_RELAXED);
    r->fence_lifts++;
}

/* Keep the fences up until `until` at least (lock held). */
static void fence_extend(struct repl *r, uint64_t until)
{
    if (__atomic_load_n(&r->fence_until_ms, __ATOMIC_RELAXED) < until)
        __atomic_store_n(&r->fence_until_ms, until, __ATOMIC_RELAXED);
}

static bool write_cmd(enum proto_cmd c)
{
    return cmd_is_storage(c) || c == CMD_DELETE || c == CMD_INCR || c == CMD_DECR ||
           c == CMD_TOUCH || c == CMD_MD || c == CMD_MA;
}

bool repl_fence_refuse(struct conn *c, const struct proto_req *req)
{
    struct repl *r = c->node->repl;
    if (!write_cmd(req->cmd) || req->key == NULL) return false;
    uint64_t until = __atomic_load_n(&r->fence_until_ms, __ATOMIC_RELAXED);
    if (until && clock_now_ms() >= until) { /* lapsed: lift (racing lifts are harmless) */
        pthread_mutex_lock(&r->lock);
        if (__atomic_load_n(&r->fence_until_ms, __ATOMIC_RELAXED) == until) {
            repl_fence_clear(r);
            log_warn("replication: handoff fence lifted after %d ms without a topology that "
                     "moves its slots", FENCE_MAX_MS);
        }
        pthread_mutex_unlock(&r->lock);
        return false;
    }
    uint8_t role = __atomic_load_n(&r->pub.role[slot_of_key(req->key, req->nkey)],
                                   __ATOMIC_RELAXED);
    if (!(role & REPL_ROLE_FENCED)) return false;
    repl_inc(&r->pub.fence_refusals, 1);
    /* ms and meta always report errors; a text command's noreply silences it, as memcached */
    if (req->cmd >= CMD_MG || !req->noreply) conn_reply_str(c, "SERVER_ERROR slot moving\r\n");
    return true;
}

/* ---- figures ---- */

static void gauges(struct repl *r, struct repl_metrics *m)
{
    memset(m, 0, sizeof *m);
    const uint64_t *src = (const uint64_t *)&r->m;
    uint64_t *dst = (uint64_t *)m;
    for (size_t i = 0; i < sizeof *m / sizeof(uint64_t); i++) dst[i] = repl_ld(&src[i]);
    uint64_t now = clock_now_ms();
    pthread_mutex_lock(&r->bl.lock);
    m->offset = r->bl.end;
    m->backlog_bytes = r->bl.end - r->bl.start;
    m->backlog_oversize += r->bl.dropped;
    pthread_mutex_unlock(&r->bl.lock);
    pthread_mutex_lock(&r->lock);
    for (struct repl_link *l = r->links; l; l = l->next) {
        m->replicas++;
        m->replicas_online += repl_ld(&l->state) == REPL_ONLINE;
        uint64_t acked = repl_ld(&l->acked), lag = m->offset > acked ? m->offset - acked : 0;
        if (lag > m->lag_bytes) m->lag_bytes = lag;
        uint64_t since = repl_ld(&l->behind_since_ms);
        if (lag && now > since && now - since > m->lag_ms) m->lag_ms = now - since;
    }
    for (struct repl_src *s = r->srcs; s; s = s->next) m->primaries += s->fd >= 0;
    uint64_t until = __atomic_load_n(&r->fence_until_ms, __ATOMIC_RELAXED);
    if (until && now >= until) { /* lapsed with no write to notice it */
        repl_fence_clear(r);
        log_warn("replication: handoff fence lifted after %d ms without a topology that moves "
                 "its slots", FENCE_MAX_MS);
    }
    pthread_mutex_unlock(&r->lock);
    m->fenced_slots = __atomic_load_n(&r->pub.nfenced, __ATOMIC_RELAXED);
    m->fence_refusals = __atomic_load_n(&r->pub.fence_refusals, __ATOMIC_RELAXED);
}

void repl_stats_text(struct repl *r, struct buf *out)
{
    if (r == NULL) {
        buf_append_str(out, "STAT repl_enabled 0\r\n");
        return;
    }
    struct repl_metrics m;
    gauges(r, &m);
    buf_printf(out, "STAT repl_enabled 1\r\nSTAT replid %s\r\n", r->replid);
    metrics_write_stats(out, repl_descs, sizeof repl_descs / sizeof repl_descs[0], &m);
    uint64_t now = clock_now_ms();
    pthread_mutex_lock(&r->lock);
    int i = 0;
    for (struct repl_link *l = r->links; l; l = l->next, i++) {
        uint64_t acked = repl_ld(&l->acked), lag = m.offset > acked ? m.offset - acked : 0;
        uint64_t since = repl_ld(&l->behind_since_ms);
        buf_printf(out,
                   "STAT replica:%d:node %s\r\nSTAT replica:%d:state %s\r\n"
                   "STAT replica:%d:sent %llu\r\nSTAT replica:%d:acked %llu\r\n"
                   "STAT replica:%d:lag_bytes %llu\r\nSTAT replica:%d:lag_seconds %.3f\r\n",
                   i, l->addr, i, repl_state_name((enum repl_state)repl_ld(&l->state)), i,
                   (unsigned long long)repl_ld(&l->sent), i, (unsigned long long)acked, i,
                   (unsigned long long)lag, i,
                   lag && now > since ? (double)(now - since) / 1000.0 : 0.0);
    }
    i = 0;
    for (struct repl_src *s = r->srcs; s; s = s->next, i++)
        buf_printf(out,
                   "STAT primary:%d:node %s\r\nSTAT primary:%d:replid %s\r\n"
                   "STAT primary:%d:applied %llu\r\nSTAT primary:%d:applied_wall_ms %llu\r\n"
                   "STAT primary:%d:state %s\r\n",
                   i, s->addr, i, s->replid, i, (unsigned long long)s->applied, i,
                   (unsigned long long)s->applied_wall_ms, i, repl_state_name(s->state));
    pthread_mutex_unlock(&r->lock);
}

void repl_metrics_prom(struct repl *r, struct buf *out)
{
    struct repl_metrics m;
    gauges(r, &m);
    metrics_write_prom(out, "shoal_node_repl", repl_descs, sizeof repl_descs / sizeof repl_descs[0],
                       &m, NULL);
}

static void render_json(struct repl *r, struct buf *out)
{
    json_t *doc = json_object(), *reps = json_array(), *prims = json_array();
    uint64_t now = clock_now_ms(), end = repl_backlog_end(&r->bl);
    json_object_set_new(doc, "replid", json_string(r->replid));
    json_object_set_new(doc, "offset", json_integer((json_int_t)end));
    pthread_mutex_lock(&r->lock);
    for (struct repl_link *l = r->links; l; l = l->next) {
        uint64_t acked = repl_ld(&l->acked), lag = end > acked ? end - acked : 0;
        uint64_t since = repl_ld(&l->behind_since_ms);
        json_array_append_new(
            reps, json_pack("{s:s, s:s, s:I, s:I, s:I, s:f}", "node", l->addr, "state",
                            repl_state_name((enum repl_state)repl_ld(&l->state)), "sent",
                            (json_int_t)repl_ld(&l->sent), "acked", (json_int_t)acked, "lag_bytes",
                            (json_int_t)lag, "lag_seconds",
                            lag && now > since ? (double)(now - since) / 1000.0 : 0.0));
    }
    for (struct repl_src *s = r->srcs; s; s = s->next)
        json_array_append_new(prims, json_pack("{s:s, s:s, s:I, s:I, s:s}", "node", s->addr, "replid",
                                               s->replid, "applied", (json_int_t)s->applied,
                                               "applied_wall_ms", (json_int_t)s->applied_wall_ms,
                                               "state", repl_state_name(s->state)));
    pthread_mutex_unlock(&r->lock);
    json_object_set_new(doc, "replicas", reps);
    json_object_set_new(doc, "primaries", prims);
    char *text = json_dumps(doc, JSON_COMPACT);
    if (text) buf_printf(out, "%s\n", text);
    free(text);
    json_decref(doc);
}

/* ---- handoff ---- */

struct handoff {
    struct repl *r;
    struct admin_held *held;
    char to[REPL_ADDR_MAX];
    uint64_t target, deadline_ms;
    uint64_t lifts; /* r->fence_lifts when this one fenced */
    uint8_t *want;  /* its slots */
};

/* A handoff counted in r->handoffs has answered (or never will be): repl_handoffs_end may go
 * on once none is left. */
static void handoff_done(struct repl *r)
{
    pthread_mutex_lock(&r->lock);
    if (--r->handoffs == 0) pthread_cond_broadcast(&r->appliers_done);
    pthread_mutex_unlock(&r->lock);
}

static void *handoff_main(void *arg)
{
    struct handoff *h = arg;
    struct repl *r = h->r;
    char body[128];
    int status = 504;
    for (;;) {
        bool found = false, lifted;
        uint64_t acked = 0;
        pthread_mutex_lock(&r->lock);
        /* online only: during a full sync `acked` is where the stream resumes once the
         * replica has the snapshot, not what it has (nor, when down, what it still has) */
        for (struct repl_link *l = r->links; l; l = l->next)
            if (!strcmp(l->addr, h->to) && repl_ld(&l->state) == REPL_ONLINE) {
                found = true;
                acked = repl_ld(&l->acked);
            }
        /* a fence lifted meanwhile (another handoff's timeout, the 10 s limit) let writes in
         * after h->target: the replica having it proves nothing any more */
        lifted = r->fence_lifts != h->lifts;
        if (found && acked >= h->target && !lifted)
            fence_extend(r, clock_now_ms() + FENCE_MAX_MS); /* time for the swap to come */
        pthread_mutex_unlock(&r->lock);
        if (lifted) {
            status = 409;
            break;
        }
        if (found && acked >= h->target) {
            status = 200;
            break;
        }
        if (__atomic_load_n(&r->handoffs_ending, __ATOMIC_RELAXED)) {
            status = 503;
            break;
        }
        if (clock_now_ms() >= h->deadline_ms || __atomic_load_n(&r->stopping, __ATOMIC_RELAXED))
            break;
        usleep(2000);
    }
    if (status == 200) {
        snprintf(body, sizeof body, "{\"lag_bytes\": 0, \"offset\": %llu}\n",
                 (unsigned long long)h->target);
    } else if (status == 409) {
        log_warn("replication: handoff to %s failed: a fence was lifted while it waited", h->to);
        snprintf(body, sizeof body, "{\"error\": \"a fence was lifted while this handoff "
                 "waited: hand off again\", \"offset\": %llu}\n", (unsigned long long)h->target);
    } else if (status == 503) {
        pthread_mutex_lock(&r->lock);
        fence_lift_some(r, h->want);
        pthread_mutex_unlock(&r->lock);
        snprintf(body, sizeof body, "{\"error\": \"the node is shutting down\", \"offset\": "
                 "%llu}\n", (unsigned long long)h->target);
    } else {
        pthread_mutex_lock(&r->lock);
        fence_lift_some(r, h->want);
        pthread_mutex_unlock(&r->lock);
        log_warn("replication: handoff to %s timed out before its lag drained; fence lifted",
                 h->to);
        snprintf(body, sizeof body, "{\"error\": \"lag did not drain in time\", \"offset\": %llu}\n",
                 (unsigned long long)h->target);
    }
    admin_answer(h->held, status, body, strlen(body));
    free(h->want);
    free(h);
    handoff_done(r); /* the last touch of r */
    return NULL;
}

void repl_handoffs_end(struct repl *r)
{
    if (r == NULL) return;
    pthread_mutex_lock(&r->lock);
    __atomic_store_n(&r->handoffs_ending, 1, __ATOMIC_RELAXED);
    while (r->handoffs > 0) pthread_cond_wait(&r->appliers_done, &r->lock);
    pthread_mutex_unlock(&r->lock);
}

static int handoff(struct repl *r, const char *body, size_t len, struct buf *out)
{
    json_error_t je;
    json_t *doc = json_loadb(body ? body : "", len, 0, &je);
    const char *to = json_string_value(json_object_get(doc, "to"));
    json_t *slots = json_object_get(doc, "slots"), *tmo = json_object_get(doc, "timeout_ms");
    int st = 400;
    uint8_t *want = calloc(SLOT_COUNT, 1);
    if (want == NULL) {
        buf_append_str(out, "{\"error\": \"out of memory\"}\n");
        json_decref(doc);
        return 500;
    }
    if (to == NULL || strlen(to) >= REPL_ADDR_MAX || !json_is_array(slots) ||
        (tmo && (!json_is_integer(tmo) || json_integer_value(tmo) < 0 ||
                 json_integer_value(tmo) > 60000))) {
        buf_append_str(out, "{\"error\": \"want {\\\"to\\\": \\\"host:port\\\", \\\"slots\\\": "
                            "[[from, to], ...], \\\"timeout_ms\\\": N}\"}\n");
        goto out;
    }
    size_t i;
    json_t *rg;
    json_array_foreach(slots, i, rg) {
        json_t *a = json_array_get(rg, 0), *b = json_array_get(rg, 1);
        if (json_array_size(rg) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 0 || json_integer_value(b) >= SLOT_COUNT ||
            json_integer_value(a) > json_integer_value(b)) {
            buf_printf(out, "{\"error\": \"slots[%zu]: want [from, to] within 0..16383\"}\n", i);
            goto out;
        }
        for (json_int_t s = json_integer_value(a); s <= json_integer_value(b); s++) want[s] = 1;
    }
    pthread_mutex_lock(&r->lock);
    if (__atomic_load_n(&r->handoffs_ending, __ATOMIC_RELAXED)) { /* set under this lock */
        pthread_mutex_unlock(&r->lock);
        buf_append_str(out, "{\"error\": \"the node is shutting down\"}\n");
        st = 503;
        goto out;
    }
    /* a name no document gave cannot be this node's replica: looked up, never added */
    unsigned idx = repl_peer_find(r, to);
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        uint8_t role = r->pub.role[s];
        if (want[s] && (!(role & REPL_ROLE_STREAMS) || r->peer[s] != idx)) {
            pthread_mutex_unlock(&r->lock);
            buf_printf(out, "{\"error\": \"slot %u: this node is not its primary with replica "
                            "%.64s\"}\n", s, to);
            st = 409;
            goto out;
        }
    }
    uint64_t fenced = 0;
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        uint8_t role = r->pub.role[s];
        if (want[s]) role |= REPL_ROLE_FENCED;
        __atomic_store_n(&r->pub.role[s], role, __ATOMIC_RELAXED);
        fenced += (role & REPL_ROLE_FENCED) != 0;
    }
    __atomic_store_n(&r->pub.nfenced, fenced, __ATOMIC_RELAXED);
    /* up for this wait at least (timeout_ms may exceed 10 s), and never shortened: another
     * handoff's fence may be waiting for its swap */
    uint64_t now = clock_now_ms(),
             deadline = now + (tmo ? (uint64_t)json_integer_value(tmo) : HANDOFF_TIMEOUT_MS);
    fence_extend(r, deadline > now + FENCE_MAX_MS ? deadline : now + FENCE_MAX_MS);
    uint64_t lifts = r->fence_lifts;
    r->handoffs++; /* from here on repl_handoffs_end waits for this one */
    pthread_mutex_unlock(&r->lock);
    /* every worker past its current batch: no write to these slots can still be on its way into
     * the backlog, so its end now is all that was accepted for them */
    qsbr_synchronize(&r->n->ns.gen, r->n->ns.seen, r->n->ns.nreaders);
    struct handoff *h = calloc(1, sizeof *h);
    if (h == NULL || (h->held = admin_hold()) == NULL) {
        free(h);
        handoff_done(r);
        buf_append_str(out, "{\"error\": \"out of memory\"}\n");
        st = 500;
        goto out;
    }
    h->r = r;
    snprintf(h->to, sizeof h->to, "%s", to);
    h->target = repl_backlog_end(&r->bl);
    h->deadline_ms = deadline;
    h->lifts = lifts;
    h->want = want;
    want = NULL;
    log_notice("replication: handoff to %s, writes fenced, waiting for offset %llu", to,
               (unsigned long long)h->target);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, handoff_main, h) != 0) {
        admin_answer(h->held, 500, "{\"error\": \"no thread\"}\n", 23);
        free(h->want);
        free(h);
        handoff_done(r);
    }
    pthread_attr_destroy(&at);
    st = ADMIN_HELD;
out:
    free(want);
    json_decref(doc);
    return st;
}

int repl_admin_route(void *ctx, const char *method, const char *rest, const char *body, size_t len,
                     struct buf *out)
{
    struct node *n = ctx;
    struct repl *r = n->repl;
    bool get = !strcmp(method, "GET");
    if (rest[0] == 0 || !strcmp(rest, "/")) {
        if (!get) {
            buf_append_str(out, "{\"error\": \"use GET\"}\n");
            return 405;
        }
        if (r == NULL) {
            buf_append_str(out, "{\"replid\": \"\", \"offset\": 0, \"replicas\": [], "
                                "\"primaries\": []}\n");
            return 200;
        }
        render_json(r, out);
        return 200;
    }
    if (!strcmp(rest, "/handoff")) {
        if (strcmp(method, "POST") != 0) {
            buf_append_str(out, "{\"error\": \"use POST\"}\n");
            return 405;
        }
        if (r == NULL) {
            buf_append_str(out, "{\"error\": \"replication needs --control\"}\n");
            return 409;
        }
        return handoff(r, body, len, out);
    }
    buf_append_str(out, "{\"error\": \"no such resource\"}\n");
    return 404;
}
