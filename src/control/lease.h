/* lease.h — slot leases, control side (issue 15, FAILOVER.md C3): when each node last renewed,
 * so that a replica is promoted over a primary only once that primary has stopped serving.
 *
 * A node following with --control renews every --lease-renew-ms: `POST /v1/leases`
 * {"node": "host:port"} -> 200 {"node", "lease_ms": L, "version": V}. The node holds its lease
 * until (when it SENT that renewal) + L and fences its replicated slots after that; control
 * counts from when it RECEIVED the renewal, which is later, and adds a margin for clock rate
 * skew, so when lease_lapsed() says true the node has stopped accepting reads and writes for
 * those slots.
 *
 * Only the leader grants (a standby of an --etcd group answers 503 naming the leader; the
 * node moves on to the next --control URL). The table is memory only: a process that starts,
 * or becomes leader, counts every node as granted at that moment (lease_takeover), so it waits
 * a full lease before it may call any node lapsed.
 *
 * A promotion must check lease_lapsed and install its new version in one hold of c->lock:
 * a grant happens under that lock too, so a renewal that races the promotion either keeps the
 * node alive or is answered with the promotion's version (the node then fences until it has
 * that document).
 *
 * Times are monotonic milliseconds: clock_mono_ms() (common/clock.h). Thread-safe (own mutex,
 * never held while taking another lock). */
#ifndef SHOAL_CONTROL_LEASE_H
#define SHOAL_CONTROL_LEASE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct lease_table;
struct control;
struct buf;

/* A table for leases of lease_ms. NULL when out of memory. No node is granted and there is no
 * takeover time yet: every node is lapsed until lease_grant or lease_takeover. */
struct lease_table *lease_table_new(uint64_t lease_ms);
void lease_table_free(struct lease_table **t);

uint64_t lease_length_ms(const struct lease_table *t);
/* The margin added before a lease counts as lapsed: L/20 + 100 ms. */
uint64_t lease_margin_ms(uint64_t lease_ms);

/* `node` renewed at now_ms. 0, or -1 when out of memory (nothing recorded). */
int lease_grant(struct lease_table *t, const char *node, uint64_t now_ms);
/* This process starts granting at now_ms (started alone, or won the election): every node
 * counts as granted at now_ms unless it renews later. */
void lease_takeover(struct lease_table *t, uint64_t now_ms);

/* True when now_ms >= (its last grant, or the takeover time if later) + L + margin; a node
 * never granted with no takeover is lapsed. Safe from any thread. */
bool lease_lapsed(struct lease_table *t, const char *node, uint64_t now_ms);
/* Milliseconds since `node` was last granted (or since the takeover, if later); -1: never. */
int64_t lease_age_ms(struct lease_table *t, const char *node, uint64_t now_ms);

/* {"node": {"age_ms": N|null, "lapsed": bool}} for every node of `nodes` (an array of
 * strings) and every node granted. NULL when out of memory. */
json_t *lease_list(struct lease_table *t, const json_t *nodes, uint64_t now_ms);
/* Prometheus lines: shoal_control_lease_age_seconds{node=...} per node granted. */
void lease_metrics(struct lease_table *t, struct buf *out, uint64_t now_ms);

/* shoal-control's route for /v1/leases (POST renews, GET lists): an admin_handler_fn whose ctx
 * is the struct control. */
int lease_route(void *ctx, const char *method, const char *rest, const char *body, size_t len,
                struct buf *out);

#endif
