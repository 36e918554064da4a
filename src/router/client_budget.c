/* client_budget.c — shoal-router's clients within one budget for client buffers, and the
 * timeout of incomplete requests (common/membudget.h says what the budget does).
 *
 * A client accounts the capacity of its input and output buffers and of the line built for a
 * long get's part, the replies kept for it behind an earlier one still awaited (`held`), and
 * CLIENT_PENDING_COST per request in flight (a hundred clients with a thousand gets each in
 * flight held 300 MB in requests and fragments alone).
 * Each worker sweeps its own clients (nothing else may touch them) between batches while the
 * budget is over, so it closes the weightiest holders on its side; the loop's timeout brings it
 * back every MEMBUDGET_SWEEP_OVER_MS meanwhile, since the clients to close may be paused ones
 * that report no events. A closed client's requests still in flight are orphaned as when it
 * disconnects: their replies are read off the node's connection and dropped, and its gets not
 * yet sent are dropped before they are (upstream.c, frag_abandoned). */
#include <sys/ioctl.h>

#include "common/log.h"
#include "protocol/protocol.h"
#include "router/client.h"

void client_budget_account(struct client *c)
{
    uint64_t now = (uint64_t)c->rbuf.cap + c->wbuf.cap + c->lline.cap + c->held + c->req_bytes +
                   (uint64_t)c->npending * CLIENT_PENDING_COST;
    membudget_account(&c->w->r->budget, &c->acct, now);
}

/* Is the client in the middle of sending a request (a line or a data block not all here, the
 * rest of a refused one, a long get line) that the router is waiting to read? */
static bool client_partial(const struct client *c)
{
    if (c->paused || c->eof || c->closing || c->dead) return false;
    return buf_used(&c->rbuf) > 0 || c->swallow > 0 || c->lget.cmd != CMD_NONE;
}

/* Are the bytes the client holds there by its own doing: replies it does not read (the socket
 * takes no more), or a request it has not finished? NULL when not: they wait on the router or
 * its nodes. *since: when the client last made progress on that side. */
static const char *client_blame(const struct client *c, uint64_t *since)
{
    *since = c->last_in_ms;
    if (c->dead) return NULL;
    if (c->epollout && buf_used(&c->wbuf) > 0) {
        *since = c->last_out_ms;
        return "replies it does not read";
    }
    if (client_partial(c)) {
        if (c->unread_ms > *since) *since = c->unread_ms;
        return "a request it has not finished";
    }
    return NULL;
}

/* Has the client sent bytes the router has not read yet? Then a request it has not finished
 * is not stalled on its side: the worker, busy with thousands of others, has not come back to
 * it (a well-behaved client's 200 KB set, sent at once, was read in 16 KB .. 128 KB passes
 * 175 ms apart behind 2,000 slowloris connections, and closed as stalled). */
static bool client_unread(const struct client *c)
{
    int n = 0;
    return ioctl(c->fd, FIONREAD, &n) == 0 && n > 0;
}

/* The bytes a client's own doing will have it hold: an unfinished value counts as all it
 * declared (the rest is coming, or the client stalls holding it). */
static bool why_partial(const char *blame) { return blame[0] == 'a'; }

static uint64_t client_bytes(const struct client *c, const char *blame)
{
    bool partial = why_partial(blame);
    return partial && c->req_need > c->acct ? c->req_need : c->acct;
}

/* How much a client weighs in choosing whom to close: client_bytes x how long held (ms, from
 * when its unfinished request began, or since it last took a reply byte). By what each held
 * alone, a well-behaved client's 200 KB set, read in a few passes behind 2,000 slowloris
 * connections of 1 MB, tied with theirs (128 KB buffers each, mid-way) and was closed among
 * them, or after them when the rest on its worker held less than the floor so far. */
static uint64_t client_weight(const struct client *c, const char *blame, uint64_t since)
{
    uint64_t from = why_partial(blame) ? c->req_start_ms : since;
    uint64_t age = c->w->now_ms > from ? c->w->now_ms - from : 0;
    return client_bytes(c, blame) * (1 + (age < 60000 ? age : 60000));
}

/* Close this worker's clients holding the most by their own doing (membudget_pick says which
 * first: stalled ones, then the weightiest by client_weight, among those holding client_bytes
 * of at least half the average share) until the budget is relieved or none is left. */
static void sweep_over(struct rworker *w)
{
    struct membudget *b = &w->r->budget;
    while (!membudget_relieved(b)) {
        struct membudget_pick pick;
        membudget_pick_start(&pick, b, __atomic_load_n(&w->r->curr_conns, __ATOMIC_RELAXED),
                             w->now_ms);
        for (struct client *c = w->clients; c; c = c->next) {
            uint64_t since;
            const char *blame = client_blame(c, &since);
            if (!blame || c->acct == 0) continue;
            /* a request begun this recently, and moving, is no cause yet: a well-behaved
             * client's set just begun was the only candidate left on its worker while the
             * slowloris ones to close were on the other */
            if (why_partial(blame) && w->now_ms - since < MEMBUDGET_STALL_MS &&
                w->now_ms - c->req_start_ms < MEMBUDGET_STALL_MS)
                continue;
            membudget_pick_offer(&pick, c, client_bytes(c, blame),
                                 client_weight(c, blame, since), blame, since);
        }
        const char *why;
        struct client *victim = membudget_pick_victim(&pick, &why);
        if (victim == NULL) return;
        if (victim == pick.stalled && why_partial(why) && client_unread(victim)) {
            victim->unread_ms = w->now_ms; /* moving, as far as it is concerned: look again */
            continue;
        }
        w->m.conns_closed_budget++;
        log_warn("closing client %s: it holds %llu bytes (%s) and client buffers went over "
                 "--buffers-max (now %llu of %llu bytes)",
                 victim->listed.addr, (unsigned long long)victim->acct, why,
                 (unsigned long long)membudget_used(b), (unsigned long long)b->max);
        client_destroy(victim);
    }
}

/* Close clients whose incomplete request saw no byte for --partial-timeout-ms. */
static void sweep_idle(struct rworker *w)
{
    uint64_t limit = w->r->cfg.partial_timeout_ms;
    for (struct client *c = w->clients, *next; c; c = next) {
        next = c->next;
        if (!client_partial(c) || w->now_ms - c->last_in_ms < limit) continue;
        w->m.conns_closed_idle++;
        log_warn("closing client %s: its request is incomplete and it sent nothing for %llu ms "
                 "(--partial-timeout-ms %llu)",
                 c->listed.addr, (unsigned long long)(w->now_ms - c->last_in_ms),
                 (unsigned long long)limit);
        client_destroy(c);
    }
}

void client_budget_sweep(struct rworker *w)
{
    struct router *r = w->r;
    if (membudget_over(&r->budget)) sweep_over(w);
    if (r->cfg.partial_timeout_ms && w->now_ms >= w->next_idle_ms) {
        sweep_idle(w);
        w->next_idle_ms = w->now_ms + membudget_idle_period(r->cfg.partial_timeout_ms);
    }
    membudget_trim(&r->budget, w->now_ms);
}

int client_budget_wait_ms(const struct rworker *w, int wait)
{
    const struct router *r = w->r;
    int due = -1;
    if (membudget_over(&r->budget)) due = MEMBUDGET_SWEEP_OVER_MS;
    else if (r->cfg.partial_timeout_ms && w->clients)
        due = w->next_idle_ms > w->now_ms ? (int)(w->next_idle_ms - w->now_ms) : 0;
    /* memory freed but not yet handed back: come back when the trim may run */
    if (membudget_trim_due(&r->budget) && (due < 0 || due > MEMBUDGET_SWEEP_IDLE_MAX_MS))
        due = MEMBUDGET_SWEEP_IDLE_MAX_MS;
    return due >= 0 && (wait < 0 || due < wait) ? due : wait;
}
