/* poll.h — long polls of the topology: GET /v1/topology?after=V held until a version newer
 * than V exists (answered 200 with the document) or --poll-timeout passes (answered 304).
 *
 * Held requests are suspended in the admin listener (admin_hold), so it serves others
 * meanwhile; one thread here answers them when poll_notify() announces a version or a
 * deadline passes. At most --poll-max are held; poll_add refuses more. */
#ifndef SHOAL_CONTROL_POLL_H
#define SHOAL_CONTROL_POLL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/admin.h"

struct control;
struct poller;

/* Start the poller's thread. NULL with a message on failure. */
struct poller *poll_create(struct control *c, char *err, size_t errlen);
/* Hold `h` until a version above `after` or the timeout; `gzip`: the client accepts a gzip'd
 * document. -1 when --poll-max are held (the caller answers `h` itself). */
int poll_add(struct poller *p, struct admin_held *h, uint64_t after, bool gzip);
/* Version `v` is current: answer every poll waiting for it. */
void poll_notify(struct poller *p, uint64_t v);
/* Answer every held poll (304) and stop the thread; later poll_add calls are refused. The
 * poller stays valid for the HTTP listener's threads until poll_destroy. */
void poll_stop(struct poller *p);
/* poll_stop, then free it: only once the HTTP listener is gone. */
void poll_destroy(struct poller **p);

#endif
