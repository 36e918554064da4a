/* client_budget.c — shoal-router's clients within one budget for client buffers, and the
 * timeout of incomplete requests (common/membudget.h says what the budget does).
 *
 * A client accounts the capacity of its input and output buffers and of the line built for a
 * long get's part, the replies kept for it behind an earlier one still awaited (`held`), and
 * CLIENT_PENDING_COST per request in flight (a hundred clients with a thousand gets each in
 * flight held 300 MB in requests and fragments alone).
 * Each worker sweeps its own clients (nothing else may touch them) between batches while the
 * budget is over, so it closes the largest holders on its side; the loop's timeout brings it
 * back every MEMBUDGET_SWEEP_OVER_MS meanwhile, since the clients to close may be paused ones
 * that report no events. A closed client's requests still in flight are orphaned as when it
 * disconnects: their replies are read off the node's connection and dropped, and its gets not
 * yet sent are dropped before they are (upstream.c, frag_abandoned). */
#include "common/log.h"
#include "protocol/protocol.h"
#include "router/client.h"

void client_budget_account(struct client *c)
{
    uint64_t now = (uint64_t)c->rbuf.cap + c->wbuf.cap + c->lline.cap + c->held +
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
    if (client_partial(c)) return "a request it has not finished";
    return NULL;
}

/* Close this worker's clients holding the most by their own doing (membudget_pick says which
 * first) until the budget is relieved or none is left. */
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
            membudget_pick_offer(&pick, c, c->acct, blame, since);
        }
        const char *why;
        struct client *victim = membudget_pick_victim(&pick, &why);
        if (victim == NULL) return;
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
