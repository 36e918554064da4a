/* conn_budget.c — shoal-node's connections within one budget for client buffers, and the
 * timeout of incomplete requests (common/membudget.h says what the budget does).
 *
 * A connection accounts the capacity of its input and output buffers and of its kept request
 * line; a value still arriving is staged within --inflight-max (conn_stage.c) and is not counted
 * again here. Each worker sweeps its own connections (nothing else may touch them) after every
 * batch while the budget is over, so it closes the largest holders on its side; a worker with
 * nothing to do wakes every MEMBUDGET_SWEEP_OVER_MS meanwhile, since the connections to close
 * may be paused ones that report no events. */
#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/conn.h"

void conn_budget_account(struct conn *c)
{
    uint64_t now = (uint64_t)c->rbuf.cap + c->wbuf.cap + c->plinecap;
    membudget_account(&c->node->budget, &c->acct, now);
}

/* Is the client in the middle of sending a request (a line or a data block not all here) that
 * the connection is waiting to read? A paused connection is waiting on its own output, so what
 * it holds is not counted as the client's unfinished request. */
static bool conn_partial(const struct conn *c)
{
    if (c->paused || c->dump) return false;
    switch (c->state) {
    case CONN_VALUE:
    case CONN_SWALLOW:
    case CONN_LGET: return true;
    case CONN_LINE: return buf_used(&c->rbuf) > 0;
    default: return false;
    }
}

/* Are the bytes the connection holds there by its client's doing: replies it does not read (the
 * socket takes no more), or a request it has not finished? NULL when not: its bytes are in use.
 * *since: when the client last made progress on that side. */
static const char *conn_blame(const struct conn *c, uint64_t *since)
{
    if (c->epollout && buf_used(&c->wbuf) > 0) {
        *since = c->last_out_ms;
        return "replies it does not read";
    }
    *since = c->last_in_ms;
    if (conn_partial(c)) return "a request it has not finished";
    return NULL;
}

/* Close this worker's connections holding the most by their client's doing (membudget_pick says
 * which first) until the budget is relieved or none is left. */
static void sweep_over(struct worker *w)
{
    struct membudget *b = &w->node->budget;
    while (!membudget_relieved(b)) {
        struct membudget_pick pick;
        membudget_pick_start(&pick, b, __atomic_load_n(&w->node->curr_conns, __ATOMIC_RELAXED),
                             w->now_ms);
        for (struct conn *c = w->conns; c; c = c->next) {
            uint64_t since;
            const char *blame = conn_blame(c, &since);
            membudget_pick_offer(&pick, c, c->acct, c->acct, blame, since);
        }
        const char *why;
        struct conn *victim = membudget_pick_victim(&pick, &why);
        if (victim == NULL) return;
        w->m.conns_closed_budget++;
        log_warn("closing connection %s: its buffers hold %llu bytes (%s) and client buffers "
                 "went over --buffers-max (now %llu of %llu bytes)",
                 victim->listed.addr, (unsigned long long)victim->acct, why,
                 (unsigned long long)membudget_used(b), (unsigned long long)b->max);
        conn_destroy(victim);
    }
}

/* Close connections whose incomplete request saw no byte for --partial-timeout-ms. */
static void sweep_idle(struct worker *w)
{
    uint64_t limit = w->node->cfg.partial_timeout_ms;
    for (struct conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (!conn_partial(c) || w->now_ms - c->last_in_ms < limit) continue;
        w->m.conns_closed_idle++;
        log_warn("closing connection %s: its request is incomplete and it sent nothing for "
                 "%llu ms (--partial-timeout-ms %llu)",
                 c->listed.addr, (unsigned long long)(w->now_ms - c->last_in_ms),
                 (unsigned long long)limit);
        conn_destroy(c);
    }
}

/* What staging is brought back under while stalled stagers are closed: 7/8 of --inflight-max. */
static uint64_t inflight_target(const struct node *n) { return n->cfg.inflight_max / 8 * 7; }

/* Staged values hold more than inflight_target: a value that arrives in parts may find no room. */
static bool inflight_pressed(const struct node *n)
{
    return n->cfg.inflight_stall_ms &&
           __atomic_load_n(&n->inflight_bytes, __ATOMIC_RELAXED) > inflight_target(n);
}

/* Close the connections conn_stage_reclaim marked, and, while staged values press the cap, this
 * worker's stalled stagers: a client on another worker may need the room. */
static void sweep_staged(struct worker *w)
{
    struct node *n = w->node;
    if (inflight_pressed(n)) conn_stage_reclaim(w, NULL, 0, inflight_target(n));
    if (w->doomed) {
        w->doomed = false;
        for (struct conn *c = w->conns, *next; c; c = next) {
            next = c->next;
            if (c->doomed) conn_destroy(c);
        }
    }
}

void conn_budget_sweep(struct worker *w)
{
    struct node *n = w->node;
    sweep_staged(w);
    if (membudget_over(&n->budget)) sweep_over(w);
    if (n->cfg.partial_timeout_ms && w->now_ms >= w->next_idle_ms) {
        sweep_idle(w);
        w->next_idle_ms = w->now_ms + membudget_idle_period(n->cfg.partial_timeout_ms);
    }
    membudget_trim(&n->budget, w->now_ms);
}

int conn_budget_wait_ms(const struct worker *w)
{
    const struct node *n = w->node;
    if (membudget_over(&n->budget) || (w->conns && inflight_pressed(n)))
        return MEMBUDGET_SWEEP_OVER_MS;
    int wait = -1;
    if (n->cfg.partial_timeout_ms && w->conns) {
        uint64_t now = clock_now_ms();
        wait = w->next_idle_ms > now ? (int)(w->next_idle_ms - now) : 0;
    }
    /* memory freed but not yet handed back: come back when the trim may run */
    if (membudget_trim_due(&n->budget) && (wait < 0 || wait > MEMBUDGET_SWEEP_IDLE_MAX_MS))
        wait = MEMBUDGET_SWEEP_IDLE_MAX_MS;
    return wait;
}
