/* control.h — shoal-node --control URL: following shoal-control's topology on a node.
 *
 * The loop is src/common/follow.h (shared with shoal-router). Each newer document is applied
 * whole by the follower thread:
 *  - namespaces: every namespace whose pool lists this node (by its --advertise address) is
 *    set up with the document's settings, its memory quota being the document's `memory`
 *    divided by the pool's node count (rounded down: the share shoal-control pushes too); the
 *    rest are removed and `default` is reset unless listed; one table publish (ns.h
 *    ns_replace_all). A namespace whose settings the node refuses keeps what it had; logged.
 *  - slots: the node owns, in each pool that lists it, the slots its explicit `slots` ranges
 *    name it for (as `node` or `replica`), or its share of the default map; every slot of a
 *    replicated pool. Every slot whose ownership changed, lost or won back, is dropped
 *    (store_drop_slots): what the node held in it before the change reads as a miss at once
 *    and the sweeper reclaims its memory, so a slot that comes back never serves a value that
 *    may have missed deletes while away. Before the first document the node counts as owning
 *    every slot (it serves whatever it is sent), so the first document drops the slots it does
 *    not own. Stores to slots it does not own are accepted (a router on an older version keeps
 *    working); they are dropped when the slot comes back.
 * The node registers with `POST URL/v1/nodes` {"id", "listen", "admin"}, best effort. */
#ifndef SHOAL_NODE_CONTROL_H
#define SHOAL_NODE_CONTROL_H

#include <stddef.h>
#include <stdint.h>

struct buf;
struct node;
struct node_control;

/* The follower of n->cfg.control, not started yet (made before the admin listener). NULL with
 * a message when the URL is not http(s) or memory ran out. */
struct node_control *node_control_create(struct node *n, char *err, size_t errlen);
/* Start following once the node listens (its advertise address needs the bound port). */
int node_control_run(struct node_control *c, char *err, size_t errlen);
/* Stop the follower (at once, even mid-poll) and wait for it; /metrics may still read it
 * (node_control_metrics) until node_control_free. */
void node_control_stop(struct node_control *c);
/* Stop it if it was not and free everything; after the admin listener is gone. */
void node_control_free(struct node_control **c);
/* "host:port" pools name this node by (--advertise or its default); set by node_control_run. */
const char *node_control_advertise(struct node_control *c);
/* The topology version in use (0: none yet, or no --control). */
uint64_t node_control_version(struct node_control *c);
/* /metrics: shoal_node_control_* (the follower's figures), shoal_node_slots_owned,
 * shoal_node_slot_drops_total, shoal_node_slot_items_dropped_total, shoal_node_slot_drop_pending. */
void node_control_metrics(struct node_control *c, struct buf *out);

#endif
