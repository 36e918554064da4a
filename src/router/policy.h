/* policy.h — namespace rules the router enforces on requests: default and maximum TTL, and
 * the token buckets behind ops_per_sec and bytes_per_sec.
 *
 * design.md: a namespace may set a default TTL (applied when a client sends 0) and a maximum
 * (longer TTLs, "never" included, are clamped). The router rewrites the TTL a request carries
 * before it goes to the node, so the rule holds whatever the node's own settings. Same
 * arithmetic as shoal-node's ns_exptime(). */
#ifndef SHOAL_ROUTER_POLICY_H
#define SHOAL_ROUTER_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "router/topo.h"

/* The TTL to send for a client's `ttl` (memcached's rules: 0 never, up to 30 days relative,
 * larger an absolute unix time, negative already expired) in namespace `ns` at unix time
 * `now`. Returns true with *out set when the request must be rewritten: 0 becomes default_ttl
 * (else max_ttl), and a TTL with more than max_ttl left (an absolute time measured from `now`)
 * becomes max_ttl. *out is a wire TTL meaning what was decided: relative seconds, or an
 * absolute time should a rule exceed 30 days. False when `ttl` stands as sent: negative TTLs,
 * absolute times past or within max_ttl (the node's clock judges those). */
bool policy_ttl(const struct topo_ns *ns, int64_t ttl, int64_t now, int64_t *out);
/* policy_ttl with `cap`, when not 0, as a further maximum over the namespace's: gutter_ttl for
 * requests sent to the gutter pool. */
bool policy_ttl_capped(const struct topo_ns *ns, uint64_t cap, int64_t ttl, int64_t now,
                       int64_t *out);
/* The wire TTL for an item with `left` seconds to live at unix time `now` (-1: never): 0 for
 * never, at least 1, relative up to 30 days and an absolute time beyond (a relative TTL that
 * long would be read as a unix time). */
int64_t policy_ttl_wire(int64_t left, int64_t now);
/* The seconds an item stored with the wire TTL `ttl` at unix time `now` has left: -1 for
 * "never" (0), 0 for already expired (negative, or an absolute time not in the future). */
int64_t policy_ttl_left(int64_t ttl, int64_t now);

/* Take `cost` tokens from the bucket at monotonic time `now_ms`. Returns false (taking
 * nothing) when the bucket holds fewer: the request is over the limit. Lock-free; safe from
 * every worker at once; a bucket with rate 0 always admits. */
bool policy_take(struct topo_bucket *b, uint64_t now_ms, uint64_t cost);
/* Give back `cost` tokens policy_take took for a request that was then refused for another
 * reason (a later key of its multi-get, or its bytes), so a refused request costs nothing. */
void policy_give(struct topo_bucket *b, uint64_t cost);

#endif
