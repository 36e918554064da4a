/* fence.h — slot leases, node side (issue 15, FAILOVER.md C3): a primary that cannot renew its
 * lease with the control plane stops serving its replicated slots before anyone is promoted
 * over it, so two primaries never accept writes for one slot.
 *
 * With --control a thread renews every --lease-renew-ms: `POST <control>/v1/leases`
 * {"node": "<advertise>"} on one kept-alive connection, each try given FENCE_TRY_MS. The lease
 * is valid until the time the last successful renewal was SENT + its "lease_ms". Control
 * counts from when it received it, plus a margin, before it promotes (control/lease.h).
 *
 * Fenced slots: those where this node is the `node` of a range that has a `replica` in the
 * topology document in use (fence_apply_doc). While the lease is not valid, or the document in
 * use is older than the last lease's "version" (a promotion may be in a version this node has
 * not seen), every read and write of a key in a fenced slot is refused with
 * `SERVER_ERROR slot lease expired`. Slots of pools without replicas are never fenced; nothing
 * is before the first document or without --control. One log line when fencing starts and one
 * when it ends.
 *
 * The check (fence_refuses) is on the request path: one relaxed load of `armed` for a node
 * none of whose slots is fenced; the rest only for nodes that are primary of a replicated range. */
#ifndef SHOAL_NODE_FENCE_H
#define SHOAL_NODE_FENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/slot.h"

#define FENCE_TRY_MS 400 /* longest one renewal may take before it counts as failed */
#define FENCE_REPLY "SERVER_ERROR slot lease expired\r\n"

struct buf;
struct json_t;
struct fence_run;

struct fence {
    /* read by workers on every key: written rarely (a document, a renewal every 250 ms) */
    uint8_t armed;        /* some slot is primary of a range with a replica (slot[] != 0) */
    uint8_t stale;        /* the document in use is older than the last lease's version */
    uint64_t valid_until; /* clock_mono_ms() the lease ends at; 0: never granted */
    uint8_t slot[SLOT_COUNT];
    uint64_t refusals __attribute__((aligned(64))); /* requests refused (atomic) */
    struct fence_run *run; /* the rest: fence.c's */
};

/* A fence for node `n`'s options (--control, --lease-renew-ms, --token-file), not renewing
 * yet. NULL with a message. */
struct node;
struct fence *fence_create(struct node *n, char *err, size_t errlen);
/* Start renewing as `advertise` ("host:port", copied). -1 with a message. */
int fence_start(struct fence *f, const char *advertise, char *err, size_t errlen);
/* Stop the thread (at once, even mid-request) and free everything; sets *f to NULL. */
void fence_free(struct fence **f);

/* The take hook's call once document `doc` (topology version `version`) is in use: the slots
 * this node (`advertise`) is primary of in ranges with a replica become the fenced ones.
 * Follower thread. */
void fence_apply_doc(struct fence *f, struct json_t *doc, const char *advertise,
                     uint64_t version);

/* The slow half of fence_refuses. */
bool fence_refuses_slot(struct fence *f, const char *key, size_t nkey);

/* Must a request for `key` be refused (FENCE_REPLY) now? Counts the refusal. f may be NULL
 * (no --control). */
static inline bool fence_refuses(struct fence *f, const char *key, size_t nkey)
{
    if (f == NULL || !__atomic_load_n(&f->armed, __ATOMIC_RELAXED)) return false;
    return fence_refuses_slot(f, key, nkey);
}

/* /metrics: shoal_node_lease_valid, _remaining_ms, _version, _fenced, _fenced_slots,
 * _refusals_total, _renewals_total, _renewal_failures_total. */
void fence_metrics(struct fence *f, struct buf *out);

#endif
