/* admin.c — admin HTTP listener on libmicrohttpd (see admin.h). */
#include "common/admin.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"

struct admin {
    struct MHD_Daemon *d;
    unsigned header_timeout;
    admin_metrics_fn metrics;
    void *ctx;
    unsigned port;
    struct admin_route routes[ADMIN_ROUTES_MAX];
    size_t nroutes;
};

/* Per-request state: the body as it arrives. */
struct admin_req {
    struct buf body;
    int too_large;
};

static enum MHD_Result admin_reply(struct MHD_Connection *conn, unsigned status,
                                   const char *type, const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    if (r == NULL) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static const struct admin_route *admin_match(const struct admin *a, const char *url)
{
    for (size_t i = 0; i < a->nroutes; i++) {
        size_t n = strlen(a->routes[i].prefix);
        if (!strncmp(url, a->routes[i].prefix, n) && (url[n] == 0 || url[n] == '/'))
            return &a->routes[i];
    }
    return NULL;
}

static enum MHD_Result admin_handle(void *cls, struct MHD_Connection *conn, const char *url,
                                    const char *method, const char *version,
                                    const char *upload, size_t *upload_size, void **state)
{
    struct admin *a = cls;
    struct admin_req *rq = *state;
    if (rq == NULL) { /* first call: headers only */
        rq = calloc(1, sizeof *rq);
        if (rq == NULL) return MHD_NO;
        buf_init(&rq->body);
        *state = rq;
        return MHD_YES;
    }
    if (*upload_size > 0) { /* body arrives in pieces before the final call */
        if (buf_used(&rq->body) == 0 && !rq->too_large)
            MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                      (unsigned)ADMIN_BODY_TIMEOUT);
        if (buf_used(&rq->body) + *upload_size > ADMIN_BODY_MAX ||
            buf_append(&rq->body, upload, *upload_size) < 0)
            rq->too_large = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    /* the next request on this connection gets the header allowance again */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, a->header_timeout);
    if (rq->too_large) {
        static const char msg[] = "{\"error\": \"request body over 1 MiB\"}\n";
        return admin_reply(conn, 413, "application/json", msg, sizeof msg - 1);
    }
    const struct admin_route *rt = admin_match(a, url);
    if (rt) {
        struct buf out;
        buf_init(&out);
        if (buf_append(&rq->body, "", 1) < 0) return MHD_NO; /* NUL-terminate */
        int status = rt->fn(rt->ctx, method, url + strlen(rt->prefix), buf_start(&rq->body),
                            buf_used(&rq->body) - 1, &out);
        enum MHD_Result r = admin_reply(conn, (unsigned)status, "application/json",
                                        out.data ? buf_start(&out) : "", buf_used(&out));
        buf_release(&out);
        return r;
    }
    if (strcmp(method, "GET") != 0) {
        static const char msg[] = "method not allowed: this path takes GET\n";
        return admin_reply(conn, 405, "text/plain", msg, sizeof msg - 1);
    }
    if (!strcmp(url, "/healthz")) return admin_reply(conn, 200, "text/plain", "ok\n", 3);
    if (!strcmp(url, "/metrics")) {
        struct buf b;
        buf_init(&b);
        a->metrics(a->ctx, &b);
        enum MHD_Result r = admin_reply(conn, 200, "text/plain; version=0.0.4",
                                        b.data ? buf_start(&b) : "", buf_used(&b));
        buf_release(&b);
        return r;
    }
    static const char nf[] = "not found: try /healthz or /metrics\n";
    return admin_reply(conn, 404, "text/plain", nf, sizeof nf - 1);
}

static void admin_done(void *cls, struct MHD_Connection *conn, void **state,
                       enum MHD_RequestTerminationCode code)
{
    struct admin_req *rq = *state;
    if (rq) {
        buf_release(&rq->body);
        free(rq);
        *state = NULL;
    }
}

/* libmicrohttpd's own messages ("reached connection limit", a failed accept) go to our log,
 * a few per 10 s: a client can make it repeat them at will. */
static void admin_log(void *cls, const char *fmt, va_list ap)
{
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    log_info_limited("admin HTTP: %s", msg);
}

struct admin *admin_create(const char *host, unsigned port, const struct admin_limits *lim,
                           admin_metrics_fn metrics, void *ctx, const struct admin_route *routes,
                           size_t nroutes, char *err, size_t errlen)
{
    struct admin *a = calloc(1, sizeof *a);
    if (a == NULL) {
        snprintf(err, errlen, "out of memory starting the admin listener");
        return NULL;
    }
    a->metrics = metrics;
    a->ctx = ctx;
    a->header_timeout = lim->header_timeout;
    if (nroutes > ADMIN_ROUTES_MAX) nroutes = ADMIN_ROUTES_MAX;
    memcpy(a->routes, routes, nroutes * sizeof *routes);
    a->nroutes = nroutes;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host && *host ? host : "127.0.0.1", &sin.sin_addr) != 1) {
        snprintf(err, errlen, "admin listen address '%s' is not an IPv4 address; use e.g. 127.0.0.1",
                 host);
        free(a);
        return NULL;
    }
    /* MHD_USE_AUTO picks epoll: select() would refuse every admin connection whose descriptor
     * is 1024 or more, which is every one on a node holding a thousand clients. */
    a->d = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port,
                            NULL, NULL, admin_handle, a, MHD_OPTION_SOCK_ADDR, &sin,
                            MHD_OPTION_CONNECTION_LIMIT, lim->conn_max,
                            MHD_OPTION_CONNECTION_TIMEOUT, lim->header_timeout,
                            MHD_OPTION_EXTERNAL_LOGGER, admin_log, NULL,
                            MHD_OPTION_NOTIFY_COMPLETED, admin_done, NULL, MHD_OPTION_END);
    if (a->d == NULL) {
        snprintf(err, errlen,
                 "cannot start admin HTTP listener on %s:%u (port in use?); choose another with "
                 "--admin-port",
                 host, port);
        free(a);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(a->d, MHD_DAEMON_INFO_BIND_PORT);
    a->port = info ? info->port : port;
    return a;
}

unsigned admin_port(const struct admin *a) { return a->port; }

void admin_destroy(struct admin **ap)
{
    if (*ap == NULL) return;
    MHD_stop_daemon((*ap)->d);
    free(*ap);
    *ap = NULL;
}
