/* slotmap.h — a pool's slot map and how it changes when nodes join or leave (issue 13.3).
 *
 * A map is an owner per slot: owner[s] is the index, in the pool's node list, of the node that
 * owns slot s (0 .. SLOT_COUNT-1). Pure functions, no allocation beyond what the caller
 * passes, so they are easy to test exhaustively.
 *
 * Invariants kept by every function here, for a pool of n nodes: every slot has an owner
 * below n, and every node owns floor(16384/n) or ceil(16384/n) slots ("within one of even").
 * Adding a node moves only the slots the new node takes (floor(16384/(n+1))), taken from the
 * old nodes that hold most, none moving between old nodes; removing a node gives only its
 * slots away, to the survivors that hold fewest. Each giver gives (and each receiver gets) one
 * contiguous run of its slots where it can, so the map stays a short list of ranges. */
#ifndef SHOAL_CONTROL_SLOTMAP_H
#define SHOAL_CONTROL_SLOTMAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/slot.h"

#define SLOTMAP_NODES_MAX 1024 /* nodes in one pool */
#define SLOTMAP_NONE 0xFFFFu   /* a slot without a replica */

/* One inclusive range of the map, as in the topology document's "slots". */
struct slot_range {
    uint16_t from, to;
    uint16_t node;    /* index in the node list */
    uint16_t replica; /* index in the node list, or SLOTMAP_NONE */
};

/* The default map of design.md for n nodes (1..SLOTMAP_NODES_MAX): slot_default_owner's. */
void slotmap_even(uint16_t *owner, uint32_t n);
/* Give node n (a new last node) its share of a map of n nodes (n >= 1, n < SLOTMAP_NODES_MAX).
 * Returns how many slots moved. */
uint32_t slotmap_add(uint16_t *owner, uint32_t n);
/* Remove node `gone` (< n, n >= 2) from a map of n nodes: its slots go to the survivors and
 * every index above `gone` drops by one (as when it is taken out of the node list). Returns
 * how many slots moved. */
uint32_t slotmap_remove(uint16_t *owner, uint32_t n, uint32_t gone);
/* Slots owned by each of n nodes, into counts[n]. */
void slotmap_counts(const uint16_t *owner, uint32_t n, uint32_t *counts);
/* 0 when every slot has an owner below n and every node is within one of even; else -1. */
int slotmap_check_even(const uint16_t *owner, uint32_t n);
/* The map as ranges of consecutive slots with one owner, ascending. `out` has room for
 * SLOT_COUNT entries; returns how many were written. */
size_t slotmap_to_ranges(const uint16_t *owner, struct slot_range *out);
/* The same with replicas (replica NULL: none): a range is a run of slots with one owner and
 * one replica. */
size_t slotmap_to_ranges_r(const uint16_t *owner, const uint16_t *replica,
                           struct slot_range *out);

/* ---- replicas (issue 15, copies = 2) -------------------------------------------------------
 * replica[s] is the index of slot s's replica, or SLOTMAP_NONE. A replica is valid when it is
 * a live node other than the slot's owner and, when some live node is in another zone than the
 * owner, in another zone (zone[i]: any number naming node i's zone; zone NULL: no zones).
 * live NULL: every node is live. */

/* Bring `replica` in line with the owners, keeping what is valid and moving as few as it can:
 * invalid replicas are dropped; nodes holding more than the even share (ceil(slots that can
 * have a replica / live nodes)) give the excess back (a node that joined or came back takes
 * only that); every slot without one then gets one, preferring, from the owner on in node
 * order, the first node below the even share (so a fresh map is a ring: node i's slots on
 * node i+1), in runs; last, a node far under even takes slots from the one holding most,
 * directly or through a third node. Without zones (or with equal zones) every live node ends
 * within one slot of even; a slot gets none only when no valid node exists (a pool of one
 * live node). Returns how many slots' replica changed. */
uint32_t slotmap_replicas(const uint16_t *owner, uint16_t *replica, uint32_t n,
                          const uint16_t *zone, const uint8_t *live);
/* 0 when every slot that can have a valid replica has one and no slot has an invalid one; else
 * -1. */
int slotmap_check_replicas(const uint16_t *owner, const uint16_t *replica, uint32_t n,
                           const uint16_t *zone, const uint8_t *live);

#endif
