/* admin.h — every daemon's admin HTTP listener: /healthz, Prometheus /metrics, and routes the
 * daemon adds (e.g. shoal-node's /v1/namespaces).
 *
 * Built on libmicrohttpd with its own thread, so admin traffic never runs on a data-path
 * worker. Handlers run on that thread, one request at a time. Request bodies are capped at
 * ADMIN_BODY_MAX bytes (413 beyond). */
#ifndef SHOAL_COMMON_ADMIN_H
#define SHOAL_COMMON_ADMIN_H

#include <stddef.h>

#define ADMIN_BODY_MAX (1 << 20)
#define ADMIN_ROUTES_MAX 8

struct buf;
struct admin;

/* Render the Prometheus text for /metrics into `out`. */
typedef void (*admin_metrics_fn)(void *ctx, struct buf *out);

/* Answer a request under a route's prefix: write the body (JSON) into `out` and return the
 * HTTP status. `rest` is the path after the prefix ("" or "/name"); `body` is NUL-terminated. */
typedef int (*admin_handler_fn)(void *ctx, const char *method, const char *rest,
                                const char *body, size_t len, struct buf *out);

struct admin_route {
    const char *prefix; /* e.g. "/v1/namespaces" */
    admin_handler_fn fn;
    void *ctx;
};

/* Start listening on host:port (port 0 picks one; see admin_port()) with the given routes
 * (copied; at most ADMIN_ROUTES_MAX). Returns NULL with a message in err on failure. */
struct admin *admin_create(const char *host, unsigned port, admin_metrics_fn metrics, void *ctx,
                           const struct admin_route *routes, size_t nroutes, char *err,
                           size_t errlen);
unsigned admin_port(const struct admin *a);
void admin_destroy(struct admin **a);

#endif
