/* follow.h — shoal-router --control URL: following shoal-control's topology (the loop is
 * src/common/follow.h, shared with shoal-node).
 *
 * A thread of its own long-polls `GET URL/v1/topology?after=V`, V being the version in use
 * (or the newest version it refused, so an invalid document is not fetched again and again),
 * and hands every newer document to the router's one reload path (reload.h): published
 * atomically, or logged and skipped with the running version kept. While the control plane is
 * down or answers errors the router serves with the version it holds and retries with a
 * backoff of 100 ms doubling up to --control-backoff-max-ms; one line is logged when it goes
 * away and one when it answers again, and the first poll after that catches up.
 *
 * Before its first poll, and again each time the control plane comes back, the router
 * registers itself: `POST URL/v1/routers` with {"id", "listen", "admin"}. Registration is best
 * effort: a control plane without that call (404), or any other answer, does not stop the
 * following. */
#ifndef SHOAL_ROUTER_FOLLOW_H
#define SHOAL_ROUTER_FOLLOW_H

#include <stddef.h>

#include "common/follow.h" /* follow_url_ok */
#include "router/router.h"

struct buf;
struct follow;


/* At start with --control and no --config: wait up to cfg->control_wait_ms for a valid
 * document from the control plane. 0 with *out set, or -1 with the reason in err (the last
 * error seen: unreachable, or the document's own fault naming the field). */
int follow_first(const struct router_config *cfg, struct topo **out, char *err, size_t errlen);

/* The follower of r->cfg.control, not started yet: made before the admin listener, so that
 * /metrics shows its figures from the first request. NULL with a message when memory ran
 * out. */
struct follow *follow_create(struct router *r, char *err, size_t errlen);
/* Start following, once the router listens (registration names its ports). -1 with a message
 * when the thread cannot start. */
int follow_run(struct follow *f, char *err, size_t errlen);
/* Stop the thread if it runs (at once, even in the middle of a long poll) and wait for it;
 * follow_metrics still works until follow_free (the admin thread may be rendering /metrics). */
void follow_stop(struct follow *f);
/* Stop it if it was not and free everything; after the admin listener is gone. */
void follow_free(struct follow **f);

/* The follower's figures for /metrics: shoal_router_control_up, _polls, _failures, _applied,
 * _last_success_age_seconds. */
void follow_metrics(struct follow *f, struct buf *out);

#endif
