/* admin.h — every daemon's admin HTTP listener: /healthz, Prometheus /metrics, and routes the
 * daemon adds (e.g. shoal-node's /v1/namespaces).
 *
 * Built on libmicrohttpd with its own thread (epoll, so descriptor numbers past 1024 are fine),
 * so admin traffic never runs on a data-path worker. Handlers run on that thread, one request
 * at a time, or (admin_create_pool) on a pool of threads, each running the requests of the
 * connections it accepted (handlers must then be thread-safe). Request bodies are
 * capped at ADMIN_BODY_MAX bytes (413 beyond).
 *
 * Health probes must get through whatever other admin clients do: up to --admin-conn-max
 * connections are served at once (past that, new ones wait in the listen queue), at most
 * --admin-conn-per-ip of them from one client address (past that its new ones are closed at
 * once, so a flood from one address leaves room for every other client), and one
 * silent for --admin-header-timeout seconds before its request is whole is closed, so
 * connections that send part of a request and stop hold a slot only that long. While a body
 * arrives the allowance is ADMIN_BODY_TIMEOUT seconds of silence.
 *
 * Long polls: a route flagged ADMIN_ROUTE_HOLD may hold a request (admin_hold()) and answer it
 * later from any thread (admin_answer()); a held request is suspended in libmicrohttpd, so the
 * listener goes on serving others meanwhile. It still counts against --admin-conn-max: the
 * daemon bounds how many it holds.
 *
 * Access (--auth-file, common/auth.h): when the limits carry a token table, every request other
 * than GET and HEAD needs `Authorization: Bearer <token>`: none or an unknown one is answered 401
 * with WWW-Authenticate: Bearer, before any handler runs. An admin token may do everything; a
 * team token is answered 403 unless the route is flagged ADMIN_ROUTE_TEAM, whose handler then
 * judges it (admin_caller()). /healthz, /metrics and every GET stay open. */
#ifndef SHOAL_COMMON_ADMIN_H
#define SHOAL_COMMON_ADMIN_H

#include <stddef.h>

#include "common/auth.h"

#define ADMIN_BODY_MAX (1 << 20)
#define ADMIN_ROUTES_MAX 16
#define ADMIN_BODY_TIMEOUT 10
#define ADMIN_HEADERS_MAX 3 /* extra headers on a shared answer */

/* The admin listener's options, in each daemon's options table (its config struct has a
 * uint64_t field of each number's name and `const char *auth_file`). */
#define ADMIN_OPTIONS(X)                                                                         \
    X(admin_conn_max, 0, UINT, "1024", 1, 65536,                                                 \
      "admin HTTP connections served at once; past it new ones wait to be accepted", NULL)      \
    X(admin_conn_per_ip, 0, UINT, "256", 1, 65536,                                               \
      "admin HTTP connections one client address may hold at once; past it its new ones are "  \
      "closed at once, so no one client can take every --admin-conn-max slot", NULL)           \
    X(admin_header_timeout, 0, UINT, "2", 1, 3600,                                               \
      "seconds an admin HTTP connection may stay silent before its request headers are whole",  \
      NULL)                                                                                      \
    X(auth_file, 0, STR, NULL, 0, 0,                                                             \
      "JSON file of bearer tokens (admin or one team's); with it every admin request that "      \
      "changes something needs one (docs/admin-api.md, Access)", NULL)

struct auth_caller;

struct admin_limits {
    unsigned conn_max, header_timeout; /* --admin-conn-max, --admin-header-timeout */
    unsigned conn_per_ip;              /* --admin-conn-per-ip */
    const char *auth_file;             /* --auth-file (loaded and checked by admin_create), or
                                        * NULL: writes are open */
};
/* The limits from a daemon's config struct (which has ADMIN_OPTIONS' fields). */
#define ADMIN_LIMITS_OF(cfg)                                                                     \
    ((struct admin_limits){(unsigned)(cfg).admin_conn_max, (unsigned)(cfg).admin_header_timeout, \
                           (unsigned)(cfg).admin_conn_per_ip, (cfg).auth_file})

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
    unsigned flags; /* ADMIN_ROUTE_* */
};

/* `rest` carries the query string too: "/x?after=5" (decoded pairs joined by '&'). Without the
 * flag a query string is dropped. */
#define ADMIN_ROUTE_QUERY 1u
/* The handler may call admin_hold(). */
#define ADMIN_ROUTE_HOLD 2u
/* Writes with a team token reach the handler, which must check admin_caller()'s team. */
#define ADMIN_ROUTE_TEAM 4u

/* Inside a handler: who sent the request, when it is a write on a listener with tokens; NULL
 * otherwise (a GET, or no --auth-file: anyone may). */
const struct auth_caller *admin_caller(void);
/* Inside a handler: the request's Authorization header value as it came (NULL: none), valid
 * until the handler returns; a handler that passes the request on to another daemon (a
 * shoal-control follower to its leader) copies it so the other judges the same caller. */
const char *admin_authorization(void);

/* A handler's return value after admin_hold(): no answer yet. */
#define ADMIN_HELD 0

struct admin_held;
/* Called inside a handler of an ADMIN_ROUTE_HOLD route: hold the request. The handler must then
 * return ADMIN_HELD, and admin_answer() must be called exactly once on the handle (from any
 * thread, even before the handler returns); until then the connection is suspended (a client
 * that goes away is noticed only when the answer is sent). NULL (out of memory): answer now. */
struct admin_held *admin_hold(void);
/* Called inside a handler: answer with this Content-Type (a string that outlives the call)
 * instead of application/json. Not for held requests. */
void admin_set_type(const char *content_type);

/* Answer a held request with `status` and a JSON body (copied; len 0: none). The handle is
 * gone once this returns. */
void admin_answer(struct admin_held *h, int status, const char *body, size_t len);

/* Answer a held request with `body` shared rather than copied (a long poll's document, the
 * same megabytes for every follower): release(arg) is called exactly once, when the answer
 * has been sent or dropped (on the listener's thread), and
 * the body must stay valid until then. `headers`: NULL, or "Name", "value" pairs ended by
 * NULL, at most ADMIN_HEADERS_MAX (copied). The handle is gone once this returns. */
void admin_answer_shared(struct admin_held *h, int status, const char *body, size_t len,
                         void (*release)(void *), void *arg, const char *const *headers);
/* Inside a handler: a request header's value (NULL: absent), valid until it returns. */
const char *admin_header(const char *name);

/* Start listening on host:port (port 0 picks one; see admin_port()) with the given routes
 * (copied; at most ADMIN_ROUTES_MAX) and limits. Returns NULL with a message in err on
 * failure (a bad auth file among them: the message names the entry). */
struct admin *admin_create(const char *host, unsigned port, const struct admin_limits *lim,
                           admin_metrics_fn metrics, void *ctx, const struct admin_route *routes,
                           size_t nroutes, char *err, size_t errlen);
/* The same on a pool of `threads` listener threads (shoal-control): each serves the
 * connections it accepted, so a handler that blocks stalls only its own thread's connections.
 * The connection limit stays lim->conn_max in all (shared out among the threads, at least one
 * each: threads is cut to conn_max), and --admin-header-timeout holds per connection as
 * before. threads 0 or 1: admin_create. */
struct admin *admin_create_pool(unsigned threads, const char *host, unsigned port,
                                const struct admin_limits *lim, admin_metrics_fn metrics,
                                void *ctx, const struct admin_route *routes, size_t nroutes,
                                char *err, size_t errlen);
unsigned admin_port(const struct admin *a);
void admin_destroy(struct admin **a);

#endif
