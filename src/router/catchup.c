/* catchup.c — a failed primary's recent deletes sent to its slots' replicas before they serve
 * its keys, and the requests held meanwhile (see catchup.h). */
#include "router/catchup.h"

#include <stdint.h>
#include <unistd.h>

#include "common/log.h"
#include "router/dellog.h"
#include "router/upstream.h"
#include "router/worker.h"

/* Does node `un` own, in the worker's table, a slot of a pool whose ranges name replicas, with
 * a replica other than itself? (Only such a node's keys are read from a replica.) */
static bool catchup_owns_replicated(struct rworker *w, const struct upnode *un)
{
    const struct topo *t = w->topo;
    uint32_t me = UINT32_MAX;
    for (uint32_t i = 0; i < w->nmap; i++)
        if (w->map[i] == un) me = i;
    if (me == UINT32_MAX) return false;
    for (uint32_t k = 0; k < t->npools; k++) {
        const struct topo_pool *p = &t->pools[k];
        if (p->replica == NULL || p->replicated) continue;
        for (uint32_t s = 0; s < SLOT_COUNT; s++)
            if (p->owner[s] == me && p->replica[s] != TOPO_NO_REPLICA && p->replica[s] != me)
                return true;
    }
    return false;
}

/* Wake the other workers: an episode started, or this worker's part of one ended. */
static void catchup_kick(struct rworker *w)
{
    struct router *r = w->r;
    for (uint64_t i = 0; i < r->cfg.threads; i++) {
        if (&r->workers[i] == w) continue;
        uint64_t one = 1;
        ssize_t n = write(r->workers[i].kickfd, &one, sizeof one);
        (void)n; /* a counter already due to wake it is as good */
    }
}

/* Publish, for each node whose episode this worker ran, that its batches were all answered. */
static void catchup_publish(struct rworker *w)
{
    bool any = false;
    for (struct upnode *un = w->upnodes; un; un = un->next) {
        if (un->catchup_published == un->catchup_joined) continue;
        un->catchup_published = un->catchup_joined;
        if (un->stat)
            __atomic_store_n(&un->stat->catchup_done, un->catchup_joined, __ATOMIC_RELEASE);
        any = true;
    }
    if (any) {
        w->catchup_due = true;
        catchup_kick(w); /* those waiting for it look again at once */
    }
}

/* Run this worker's catch-up for episode `gen` of node p: its logged deletes of p's keys since
 * its last reply from p, less --replay-margin-ms, to their slots' replicas; then hold requests
 * routed to replicas until every worker has finished episode `gen`. */
static void catchup_join(struct rworker *w, struct upnode *p, uint64_t gen)
{
    struct router *r = w->r;
    p->catchup_joined = gen;
    p->catchup_spent = true;
    w->m.catchups++;
    uint64_t base = p->last_reply_ms ? p->last_reply_ms : w->now_ms;
    uint64_t since = base > r->cfg.replay_margin_ms ? base - r->cfg.replay_margin_ms : 0;
    /* a primary that fails again soon (flapping, sporadic timeouts): what an earlier catch-up
     * sent is on the replicas already; sending it again would cost each key a miss more */
    if (since < p->catchup_sent_ms) since = p->catchup_sent_ms;
    p->catchup_sent_ms = w->now_ms;
    uint32_t batches = 0;
    uint64_t sent = dellog_catchup(w, p, since, &batches);
    log_notice("worker %d: node %s failed: %llu of its recent deletes (since %llu ms ago) sent "
               "to its slots' replicas in %u batches before they serve its keys", w->id,
               p->node.addr, (unsigned long long)sent,
               (unsigned long long)(w->now_ms - since), batches);
    if (r->cfg.catchup_wait_ms && p->stat) {
        /* an episode joined while this worker still waits for an earlier one waits within the
         * earlier one's bound: a primary failing again and again faster than its replica
         * answered the batches held the first request held until the failures stopped */
        if (p->catchup_wait == 0) {
            w->catchup_waits++;
            p->catchup_until_ms = w->now_ms + r->cfg.catchup_wait_ms;
        }
        p->catchup_wait = gen;
    }
    if (w->catchup_inflight == 0) catchup_publish(w);
}

void catchup_begin(struct rworker *w, struct upnode *p)
{
    if (p->catchup_spent || p->nstat == NULL || !worker_topology_ready(w)) return;
    if (!catchup_owns_replicated(w, p)) {
        p->catchup_spent = true; /* nothing of it is read from a replica */
        return;
    }
    /* one episode for every worker: start one unless another worker did since this one last
     * joined (that one started after p's failure too, so it covers this one's need) */
    uint64_t gen = p->catchup_joined;
    if (__atomic_compare_exchange_n(&p->nstat->catchup, &gen, gen + 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        gen++;
        __atomic_add_fetch(&w->r->health_gen, 1, __ATOMIC_RELEASE);
        catchup_kick(w);
    }
    catchup_join(w, p, gen);
}

void catchup_sync(struct rworker *w)
{
    if (!worker_topology_ready(w)) return;
    for (struct upnode *un = w->upnodes; un; un = un->next) {
        if (un->nstat == NULL || un->retired) continue;
        uint64_t gen = __atomic_load_n(&un->nstat->catchup, __ATOMIC_ACQUIRE);
        if (gen > un->catchup_joined) catchup_join(w, un, gen);
    }
}

/* Has every worker finished episode `gen` of the node? */
static bool catchup_all_done(struct rworker *w, const struct upnode *un, uint64_t gen)
{
    for (uint64_t i = 0; i < w->r->cfg.threads; i++)
        if (__atomic_load_n(&un->nstat->slots[i].catchup_done, __ATOMIC_ACQUIRE) < gen)
            return false;
    return true;
}

/* While other episodes still run: send the requests held --catchup-wait-ms already (the
 * oldest of each node's list: its order is kept). Nodes failing one after another, each
 * episode starting before the last one ended, held the first request for as long as that
 * went on. They count as a catch-up not finished in time. */
static void catchup_release_overdue(struct rworker *w)
{
    for (struct upnode *un = w->upnodes; un; un = un->next) {
        if (un->held == NULL || un->held->deadline_ms > w->now_ms) continue;
        w->m.catchup_timeouts++;
        log_warn_limited("worker %d: requests to %s held for --catchup-wait-ms (%llu ms) go "
                         "ahead while replicas still catch up", w->id, un->node.addr,
                         (unsigned long long)w->r->cfg.catchup_wait_ms);
        while (un->held && un->held->deadline_ms <= w->now_ms) {
            struct frag *f = un->held;
            un->held = f->next;
            if (un->held == NULL) un->held_tail = NULL;
            f->next = NULL;
            f->via_replica = false; /* not held again by the episodes still running */
            upnode_submit(un, f);
        }
    }
}

void catchup_poll(struct rworker *w)
{
    w->catchup_due = false;
    if (w->catchup_waits == 0) return;
    for (struct upnode *un = w->upnodes; un; un = un->next) {
        if (un->catchup_wait == 0) continue;
        if (!catchup_all_done(w, un, un->catchup_wait)) {
            if (w->now_ms < un->catchup_until_ms) continue;
            w->m.catchup_timeouts++;
            log_warn("worker %d: node %s: the catch-up of its slots' replicas was not finished "
                     "by every worker within %llu ms (--catchup-wait-ms): requests go ahead",
                     w->id, un->node.addr, (unsigned long long)w->r->cfg.catchup_wait_ms);
        }
        un->catchup_wait = 0;
        w->catchup_waits--;
    }
    if (w->catchup_waits) {
        catchup_release_overdue(w);
        return;
    }
    /* in the order they were held, per node: a client's requests to one node keep theirs */
    for (struct upnode *un = w->upnodes; un; un = un->next) {
        struct frag *f = un->held;
        un->held = un->held_tail = NULL;
        while (f) {
            struct frag *next = f->next;
            f->next = NULL;
            upnode_submit(un, f);
            f = next;
        }
    }
}

bool catchup_hold(struct upnode *un, struct frag *f)
{
    struct rworker *w = un->w;
    if (!f->via_replica || w->catchup_waits == 0) return false;
    f->next = NULL;
    if (un->held_tail) un->held_tail->next = f;
    else un->held = f;
    un->held_tail = f;
    f->deadline_ms = w->now_ms + w->r->cfg.catchup_wait_ms; /* held at most this long */
    w->m.catchup_held++;
    return true;
}

void catchup_batch_done(struct rworker *w, bool failed)
{
    if (failed) {
        w->m.catchup_failures++;
        /* what it held may not be on its replica: the next catch-up sends the whole margin */
        for (struct upnode *un = w->upnodes; un; un = un->next) un->catchup_sent_ms = 0;
        log_warn_limited("worker %d: a catch-up batch of recent deletes to a replica failed",
                         w->id);
    }
    if (w->catchup_inflight > 0 && --w->catchup_inflight == 0) catchup_publish(w);
}

void catchup_drop_held(struct upnode *un)
{
    static const char gone[] = "SERVER_ERROR shoal-router: shutting down\r\n";
    for (struct frag *f = un->held, *next; f; f = next) {
        next = f->next;
        if (f->rq == NULL) {
            frag_destroy(f);
            continue;
        }
        f->next = NULL;
        frag_complete(f, gone, sizeof gone - 1, true);
    }
    un->held = un->held_tail = NULL;
}
