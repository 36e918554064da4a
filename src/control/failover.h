/* failover.h — shoal-control's failure handling (issue 15; FAILOVER.md C4, C5;
 * docs/operations.md "Failure handling"): routers' failure reports, control's own probes of
 * nodes, the suspect/dead rule, promotion of a dead node's slots to their replicas, a returning
 * node made replica again, and drains.
 *
 * Who is watched: every node of a pool that holds a namespace with copies 2 (only those have
 * replicas to promote to). A node is SUSPECT while a strict majority of the routers with a
 * fresh report (younger than --report-stale-ms) that list it say "down" (at least one), AND
 * control's last probe of it failed (TCP connect to its data port and `version\r\n` answered
 * `VERSION ...`, within min(--probe-ms, 200) ms). It is DEAD once suspect without a break for
 * --failure-timeout-ms. Once dead and its lease lapsed (the lease hook) its ranges that have a
 * replica go to it in one new version (model_promote); a node dead and then probed fine and no
 * longer reported down by a majority is back: it is made replica of its share again.
 *
 * One thread ("failover") probes every --probe-ms with non-blocking sockets (all nodes at once,
 * poll()), evaluates the rule, asks replicas' admin ports for `applied` (common/httpc) and
 * publishes changes with control_change; a second thread runs drains (one at a time), so
 * neither the admin thread nor failure detection ever waits for a handoff. Only the leader (or a lone control) decides and promotes; a standby forwards
 * reports to it (api.c). Reports and node states live in memory only: a new leader starts
 * from nothing and needs fresh reports (a few seconds) before it can promote. */
#ifndef SHOAL_CONTROL_FAILOVER_H
#define SHOAL_CONTROL_FAILOVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct control;
struct failover;
struct model_err;
struct buf;


/* Whether `node`'s lease has lapsed at monotonic time now_ms (so no write can be accepted by
 * it any more and its slots may be promoted). */
typedef bool (*failover_lease_fn)(void *ctx, const char *node, uint64_t now_ms);
/* The promotion's own check (lease.h lease_promote_begin/_end): `begin` says whether the lease
 * has lapsed and, if so, refuses the node's renewals until `end`. */
struct failover_lease_hooks {
    failover_lease_fn lapsed, begin;
    void (*end)(void *ctx, const char *node);
    void *ctx;
};

struct failover *failover_create(struct control *c, char *err, size_t errlen);
/* The lease checks (main.c: control's lease table); without them (unit tests) a dead node
 * counts as lapsed at once. Before failover_start. */
void failover_set_lease(struct failover *f, const struct failover_lease_hooks *hooks);
int failover_start(struct failover *f, char *err, size_t errlen);
/* Stop the thread; held drains are answered 503. */
void failover_destroy(struct failover **f);

/* POST /v1/reports body {"router": ID, "nodes": {"host:port": "up"|"down"}}: 0, or a status
 * with `e` filled (400). Any thread. */
int failover_report(struct failover *f, json_t *body, struct model_err *e);
/* model_live_fn for model_replicas_sync: false for a node held dead. Called under c->lock. */
bool failover_live(void *f, const char *node);
/* GET /v1/failures: {"nodes": {"host:port": {"pool", "state": "up|suspect|dead",
 * "down_reports": "k/n", "probe": "ok|failing|off", "promoted", "suspect_ms", "dead_ms"}},
 * "routers": {id: {"age_ms", "fresh"}}, and the three timing options}. A new reference. */
json_t *failover_status(struct failover *f);
/* POST /v1/pools/P/nodes/N/drain on the admin thread: checks, then holds the request and
 * queues the drain for the failover thread, which answers it. ADMIN_HELD, or a status with the
 * error in `out`. */
int failover_drain(struct failover *f, const char *pool, const char *node, json_t *body,
                   struct buf *out);

/* The quorum rule of C4 on counts, for tests: `listed` fresh reports list the node, `down`
 * of them say down. */
static inline bool failover_quorum_down(unsigned down, unsigned listed)
{
    return down >= 1 && 2 * down > listed;
}

#endif
