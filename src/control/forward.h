/* forward.h — a follower's changes go to the leader (--etcd).
 *
 * A change (POST, PUT, DELETE under /v1/namespaces or /v1/pools) that reaches a process which
 * is not the leader is held (admin_hold) and sent on, as it came, by one forwarding thread to
 * the leader's advertised URL; the leader's status and body are the answer. So clients may
 * send changes to any shoal-control of the group and never see a redirect. While no leader is
 * known (an election in progress) the change waits for one, up to --etcd-lease-ttl + 2
 * seconds, then is answered 503; if this process itself won meanwhile, the change is sent to
 * its own listener, whose admin thread runs it. A leader that does not answer is not asked again (the change
 * may have been applied before it died): the caller gets 503 and decides. After a forwarded
 * change is acknowledged the follower waits (briefly) until it serves that version itself, so
 * a read sent to it next shows the change. At most FORWARD_MAX changes wait at once; more get
 * 503 at once. */
#ifndef SHOAL_CONTROL_FORWARD_H
#define SHOAL_CONTROL_FORWARD_H

#include <stddef.h>

#define FORWARD_MAX 256

struct control;
struct forwarder;
struct buf;

struct forwarder *forward_create(struct control *c, char *err, size_t errlen);
/* From a route handler on the admin thread (an ADMIN_ROUTE_HOLD route): hold this request and
 * send it to the leader. `path` is the full path ("/v1/namespaces/x"). Returns ADMIN_HELD, or
 * an HTTP status with a JSON error written to `out` when it could not be held. */
int forward_request(struct forwarder *f, const char *method, const char *path,
                    const char *body, size_t len, struct buf *out);
/* Answer every waiting change 503 and stop the thread. */
void forward_destroy(struct forwarder **f);

#endif
