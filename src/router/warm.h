/* warm.h — warm-up routes (the paper's §4.3 cold cluster warm-up): a pool may name a
 * `warm_from` pool; a get, gets, gat, gats or mg that misses in the cold pool is looked up in
 * the warm one and, on a hit, answered from it and added into the cold pool with the warm item's
 * flags, CAS and remaining TTL (gat, gats and mg T: the TTL they ask for), after the namespace's
 * TTL rules. Deletes to a cold pool carry a 2-second hold-off (route.c), so an add racing a
 * delete fails instead of caching the old value.
 *
 * Leases: an mg with N (and no R) whose miss made the cold pool vivify a placeholder and hand
 * this client the win (W) is looked up in the warm pool too. A warm hit fills the placeholder
 * (a set compared with its CAS, so a delete in between wins) and the client gets the value with
 * no W, instead of recomputing it; a warm miss leaves the client its win. W from R (an early
 * recache of a live value), X (stale) or Z (someone else fills) answers from the cold pool alone,
 * as does an mg sent to the gutter pool that wins there. A warm-pool value flagged X, W or Z is
 * a miss: an invalidated value or a placeholder is never copied as a fresh value. */
#ifndef SHOAL_ROUTER_WARM_H
#define SHOAL_ROUTER_WARM_H

#include <stdbool.h>
#include <stddef.h>

#include "router/lineedit.h"
#include "router/request.h"

#define WARM_HOLDOFF_S 2

/* Every fragment of a warmable multi-get answered: look up the keys that missed in a cold
 * pool in its warm pool. Returns true when lookups are in flight (their answers complete the
 * request), false when the request can be merged now. */
bool warm_start(struct rreq *rq);
/* Turn a warm lookup's meta reply into a get fragment's reply in f->reply (a VALUE block and
 * END, or END for a miss or failure) and, on a hit, send the add into the cold pool. */
void warm_reply(struct frag *f, const char *reply, size_t n, bool failed);

/* An mg for a key whose pool warms from another, about to be sent (to the gutter pool when
 * `gutter`): keep what answering it from the warm pool needs. Returns true with *cut set when
 * the router must ask the cold node for the c flag itself (an N mg: a vivified placeholder is
 * filled by its CAS). On no memory the mg is simply not warmed. */
bool warm_mg_prepare(struct rreq *rq, const struct proto_req *req, const char *line, size_t len,
                     bool gutter, struct ledit_cut *cut);
/* Fragment f of a warm_mg request answered (`reply`, n bytes; `failed`: a router error). Returns
 * true when a warm lookup is in flight instead (nothing of rq may be touched after: the lookup
 * may have failed and finished it already); else sets *reply, *n and *failed to the client's
 * answer (valid until rq is destroyed). */
bool warm_mg_step(struct rreq *rq, struct frag *f, const char **reply, size_t *n, bool *failed);

#endif
