/* admin.c — admin HTTP listener on libmicrohttpd (see admin.h). */
#include "common/admin.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"

struct admin {
    struct MHD_Daemon *d;
    admin_metrics_fn metrics;
    void *ctx;
    unsigned port;
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

static enum MHD_Result admin_handle(void *cls, struct MHD_Connection *conn, const char *url,
                                    const char *method, const char *version,
                                    const char *upload, size_t *upload_size, void **state)
{
    struct admin *a = cls;
    if (*state == NULL) { /* first call: headers only */
        *state = a;
        return MHD_YES;
    }
    if (strcmp(method, "GET") != 0) {
        static const char msg[] = "method not allowed: the admin API here takes GET\n";
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

struct admin *admin_create(const char *host, unsigned port, admin_metrics_fn metrics, void *ctx,
                           char *err, size_t errlen)
{
    struct admin *a = calloc(1, sizeof *a);
    if (a == NULL) {
        snprintf(err, errlen, "out of memory starting the admin listener");
        return NULL;
    }
    a->metrics = metrics;
    a->ctx = ctx;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host && *host ? host : "127.0.0.1", &sin.sin_addr) != 1) {
        snprintf(err, errlen, "admin listen address '%s' is not an IPv4 address; use e.g. 127.0.0.1",
                 host);
        free(a);
        return NULL;
    }
    a->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port,
                            NULL, NULL, admin_handle, a, MHD_OPTION_SOCK_ADDR, &sin,
                            MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_END);
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
