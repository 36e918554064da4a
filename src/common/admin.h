/* admin.h — every daemon's admin HTTP listener: /healthz and Prometheus /metrics.
 *
 * Built on libmicrohttpd with its own thread, so admin traffic never runs on a data-path
 * worker. The daemon supplies a callback that renders its metrics; later issues add routes. */
#ifndef SHOAL_COMMON_ADMIN_H
#define SHOAL_COMMON_ADMIN_H

#include <stddef.h>

struct buf;
struct admin;

/* Render the Prometheus text for /metrics into `out`. */
typedef void (*admin_metrics_fn)(void *ctx, struct buf *out);

/* Start listening on host:port (port 0 picks one; see admin_port()). Returns NULL with a
 * message in err on failure. */
struct admin *admin_create(const char *host, unsigned port, admin_metrics_fn metrics, void *ctx,
                           char *err, size_t errlen);
unsigned admin_port(const struct admin *a);
void admin_destroy(struct admin **a);

#endif
