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
 * Renewals never take c->lock (so never wait for a change, a big render or an etcd save): what
 * they need from the model, whether a pool lists the node and the version to name, comes from
 * a view every install publishes (lease_publish, under c->lock, into the table under its own
 * lock).
 *
 * Why a promotion stays safe. A promotion of node N's slots runs lease_promote_begin(N) in its
 * change function, under c->lock, before its new version V is stored; it goes on only if N's
 * lease has lapsed then, and from that moment until lease_promote_end(N), which it calls once
 * V is installed and published (or the change failed), every renewal of N is refused (409).
 * The check, the mark and every grant happen under the table's one lock, so a renewal of N is
 * in one of three places: (1) granted before begin: begin sees the fresh grant, N is not
 * lapsed, no promotion (N stays primary); (2) between begin and end: refused, N gets no new
 * lease and stays fenced (it already was: lapsed means N's own count, from the earlier send
 * time, ended at least the margin before); (3) after end: V was published before end, so the
 * grant names V (or later) and N fences its replicated slots until it has that document, in
 * which it is no longer their primary (or the change failed: nothing was promoted, and N
 * rightly stays primary). No renewal can name a version older than V once the promotion may
 * be served: there are never two primaries accepting writes. A renewal's grant and the
 * version it names are read in one hold of the lock, after the promotion mark is checked, so
 * a renewal cannot read the version before V and be granted after end.
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

/* `node` renewed at now_ms. 0, or -1 when out of memory (nothing recorded). Unconditional: a
 * renewal from the API goes through lease_renew. */
int lease_grant(struct lease_table *t, const char *node, uint64_t now_ms);

/* The model just installed (c->model, under c->lock, or before other threads run): its nodes
 * and version become what renewals are judged by. 0, or -1 when out of memory (the view
 * before stays). */
int lease_publish(struct lease_table *t, const json_t *model);
/* The version of the view published last. */
uint64_t lease_version(struct lease_table *t);
/* Every node of the view published last: an array of strings (NULL: out of memory). */
json_t *lease_listed(struct lease_table *t);

#define LEASE_UNLISTED 1  /* no pool of the published view lists the node */
#define LEASE_PROMOTING 2 /* a promotion over the node is in progress */
/* A renewal: when a pool of the view lists `node` and no promotion over it is in progress,
 * grant it at now_ms. 0 (granted), LEASE_UNLISTED, LEASE_PROMOTING (nothing granted), or -1
 * (out of memory). *version: the view's version, the one a grant names. */
int lease_renew(struct lease_table *t, const char *node, uint64_t now_ms, uint64_t *version);
/* A promotion over `node` may be committed: true when its lease has lapsed at now_ms, and from
 * then renewals of it are refused until lease_promote_end (see the top of this file). Call
 * in the promotion's change function; call lease_promote_end once after the change returns,
 * whatever it returned. False: not lapsed (or out of memory): do not promote. */
bool lease_promote_begin(struct lease_table *t, const char *node, uint64_t now_ms);
void lease_promote_end(struct lease_table *t, const char *node);
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
