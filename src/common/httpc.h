/* httpc.h — a small HTTP/JSON client over libcurl, for the control traffic between shoal's
 * processes: a router or node following shoal-control's topology, shoal-control pushing quotas
 * to nodes, the shoal CLI calling the admin API.
 *
 * One struct httpc is one reusable connection (kept alive between requests to the same host)
 * used by one thread at a time. Every request has a deadline, and a request in progress can be
 * ended at once from another thread (httpc_cancel), so a thread held in a long poll can be
 * stopped without waiting for the server. Replies are read into a struct buf, capped at a size
 * the caller chooses, so a misbehaving server cannot make the process grow without bound.
 * No proxy is ever used, whatever http_proxy, HTTPS_PROXY or ALL_PROXY say: this traffic is
 * between shoal's own processes.
 *
 * Never on a data-path thread: a request blocks its caller (name resolution included). */
#ifndef SHOAL_COMMON_HTTPC_H
#define SHOAL_COMMON_HTTPC_H

#include <stdbool.h>
#include <stddef.h>

#include "common/buf.h"

#define HTTPC_BODY_MAX_DEFAULT (16u << 20)

struct httpc;

/* Outcome of one request: `status` is the HTTP status (0 when no reply came), `body` the reply
 * body (owned by the caller: buf_release it; empty for 304 and HEAD-like replies). */
struct httpc_reply {
    long status;
    struct buf body;
};

/* A new client whose replies may be at most body_max bytes (0: HTTPC_BODY_MAX_DEFAULT).
 * Loads and initialises libcurl on first use (thread-safe; dlopen, so a program that never
 * makes a client never maps it). NULL when memory ran out or libcurl cannot be loaded (logged). */
struct httpc *httpc_create(size_t body_max);
void httpc_destroy(struct httpc **h);

/* Send `line` ("Name: value", e.g. "Authorization: Bearer <token>") with every later request
 * of this client. 0, or -1 when memory ran out. */
int httpc_add_header(struct httpc *h, const char *line);

/* Give up connecting after ms (0: the default, the request's deadline up to 5 s), for every
 * later request of this client: a caller that moves on to other hosts when one is down (e.g.
 * shoal-control's pushes) sets it short. */
void httpc_set_connect_timeout(struct httpc *h, unsigned ms);
/* Ask for compressed replies (Accept-Encoding: whatever libcurl can decode) and get them
 * decoded, for every later request of this client: a follower's topology is megabytes of
 * JSON with 10,000 namespaces, several times smaller gzip'd. body_max applies decoded. */
void httpc_set_compressed(struct httpc *h, bool on);

/* Send one request and wait for the whole reply, at most timeout_ms (connection included).
 * `method` is "GET", "PUT", "POST" or "DELETE"; `body` (len bytes, may be NULL) is sent with
 * Content-Type: application/json. Returns 0 when a reply came, whatever its status (the caller
 * judges 4xx/5xx), with *reply filled (initialise it with httpc_reply_init; the previous body
 * is dropped); -1 with a message in err when none came: connection refused or lost, timeout,
 * reply over body_max, cancelled (httpc_cancelled() then says so). */
int httpc_request(struct httpc *h, const char *method, const char *url, const char *body,
                  size_t len, unsigned timeout_ms, struct httpc_reply *reply, char *err,
                  size_t errlen);
/* httpc_request with one more header line ("Name: value"; NULL: none) for this request only. */
int httpc_request_hdr(struct httpc *h, const char *method, const char *url, const char *line,
                      const char *body, size_t len, unsigned timeout_ms,
                      struct httpc_reply *reply, char *err, size_t errlen);
static inline int httpc_get(struct httpc *h, const char *url, unsigned timeout_ms,
                            struct httpc_reply *reply, char *err, size_t errlen)
{
    return httpc_request(h, "GET", url, NULL, 0, timeout_ms, reply, err, errlen);
}

/* From any thread: end the request in progress (and every later one) at once with -1, until
 * httpc_uncancel. Safe to call while another thread is inside httpc_request. */
void httpc_cancel(struct httpc *h);
void httpc_uncancel(struct httpc *h);
bool httpc_cancelled(const struct httpc *h);

void httpc_reply_init(struct httpc_reply *r);
void httpc_reply_release(struct httpc_reply *r);

#endif
