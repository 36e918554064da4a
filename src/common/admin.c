/* admin.c — admin HTTP listener on libmicrohttpd (see admin.h). */
#include "common/admin.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/buf.h"
#include "common/log.h"

struct admin {
    struct MHD_Daemon *d;
    unsigned header_timeout;
    admin_metrics_fn metrics;
    void *ctx;
    unsigned port;
    struct auth *auth;
    struct admin_route routes[ADMIN_ROUTES_MAX];
    size_t nroutes;
    unsigned held; /* requests held now (atomic) */
};

/* A held request's answer, handed from whichever thread answers to the listener's thread. */
struct admin_held {
    struct MHD_Connection *conn;
    int answered; /* atomic: status and body are set */
    int status;
    char *body;
    size_t len;
    void (*release)(void *); /* admin_answer_shared: body is shared, release(arg) frees it */
    void *arg;
    char *hdrs[2 * ADMIN_HEADERS_MAX]; /* extra header names and values */
};

/* Per-request state: the body as it arrives, and the hold if the handler took one. */
struct admin_req {
    struct buf body;
    int too_large;
    struct admin_held *held;
};

/* The request whose handler runs now on this listener thread (admin_hold() reads it). */
static __thread struct {
    struct MHD_Connection *conn;
    struct admin_req *rq;
    int may_hold;
    const struct auth_caller *caller;
    const char *authorization; /* the request's Authorization header, or NULL */
    const char *type; /* admin_set_type()'s, for the answer given now */
} admin_cur;

const struct auth_caller *admin_caller(void) { return admin_cur.caller; }
const char *admin_authorization(void) { return admin_cur.authorization; }
void admin_set_type(const char *content_type) { admin_cur.type = content_type; }

struct admin_held *admin_hold(void)
{
    if (!admin_cur.may_hold || admin_cur.rq == NULL || admin_cur.rq->held) return NULL;
    struct admin_held *h = calloc(1, sizeof *h);
    if (h == NULL) return NULL;
    h->conn = admin_cur.conn;
    admin_cur.rq->held = h;
    MHD_suspend_connection(h->conn);
    return h;
}

void admin_answer(struct admin_held *h, int status, const char *body, size_t len)
{
    h->status = status;
    if (len > 0 && (h->body = malloc(len)) != NULL) {
        memcpy(h->body, body, len);
        h->len = len;
    } else if (len > 0) {
        h->status = 503; /* out of memory for the answer: the client polls again */
    }
    __atomic_store_n(&h->answered, 1, __ATOMIC_RELEASE);
    MHD_resume_connection(h->conn);
}

void admin_answer_shared(struct admin_held *h, int status, const char *body, size_t len,
                         void (*release)(void *), void *arg, const char *const *headers)
{
    h->status = status;
    h->body = (char *)body;
    h->len = len;
    h->release = release;
    h->arg = arg;
    for (size_t i = 0; headers && headers[i] && i < 2 * ADMIN_HEADERS_MAX; i += 2)
        if ((h->hdrs[i] = strdup(headers[i])) == NULL ||
            (h->hdrs[i + 1] = strdup(headers[i + 1])) == NULL)
            break; /* out of memory: the answer goes without the rest */
    __atomic_store_n(&h->answered, 1, __ATOMIC_RELEASE);
    MHD_resume_connection(h->conn);
}

/* Free a held request's answer (the shared body given back) and the handle. */
static void held_free(struct admin_held *h)
{
    if (h->release) {
        if (h->body) h->release(h->arg);
    } else {
        free(h->body);
    }
    for (size_t i = 0; i < 2 * ADMIN_HEADERS_MAX; i++) free(h->hdrs[i]);
    free(h);
}

/* A held request's answer, queued on its connection: a shared body goes as it is. */
static enum MHD_Result held_reply(struct MHD_Connection *conn, struct admin_held *h)
{
    struct MHD_Response *r;
    if (h->release) {
        r = MHD_create_response_from_buffer_with_free_callback_cls(h->len, h->body, h->release,
                                                                   h->arg);
        if (r) h->body = NULL; /* the response gives it back */
    } else {
        r = MHD_create_response_from_buffer(h->len, h->body ? h->body : "",
                                            MHD_RESPMEM_MUST_COPY);
    }
    if (r == NULL) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    for (size_t i = 0; i < 2 * ADMIN_HEADERS_MAX && h->hdrs[i] && h->hdrs[i + 1]; i += 2)
        MHD_add_response_header(r, h->hdrs[i], h->hdrs[i + 1]);
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)h->status, r);
    MHD_destroy_response(r);
    return ok;
}

const char *admin_header(const char *name)
{
    return admin_cur.conn ? MHD_lookup_connection_value(admin_cur.conn, MHD_HEADER_KIND, name)
                          : NULL;
}

/* "?k=v&k2" appended to the route's rest, for ADMIN_ROUTE_QUERY routes. */
static enum MHD_Result admin_query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value)
{
    struct buf *b = cls;
    buf_append_str(b, buf_used(b) && memchr(buf_start(b), '?', buf_used(b)) ? "&" : "?");
    buf_append_str(b, key);
    if (value) {
        buf_append_str(b, "=");
        buf_append_str(b, value);
    }
    return MHD_YES;
}

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

/* A refusal for want of a (good) token: 401 with WWW-Authenticate, or 403 for a team token on
 * a route that takes admin tokens only. The body is JSON in the API's error shape. */
static enum MHD_Result admin_refuse(struct MHD_Connection *conn, enum auth_result why,
                                    const struct auth_caller *who, const char *method,
                                    const char *url)
{
    char body[600];
    unsigned status = 401;
    const char *challenge = "Bearer realm=\"shoal\"";
    switch (why) {
    case AUTH_MISSING:
        snprintf(body, sizeof body,
                 "{\"error\": \"%s needs a token: send Authorization: Bearer <token> (this "
                 "daemon runs with --auth-file)\", \"field\": \"authorization\", \"rule\": "
                 "\"required\"}\n", method);
        break;
    case AUTH_SCHEME:
        challenge = "Bearer realm=\"shoal\", error=\"invalid_request\"";
        snprintf(body, sizeof body,
                 "{\"error\": \"the Authorization header must be Bearer <token>\", \"field\": "
                 "\"authorization\", \"rule\": \"bearer\"}\n");
        break;
    case AUTH_INVALID:
        challenge = "Bearer realm=\"shoal\", error=\"invalid_token\"";
        snprintf(body, sizeof body,
                 "{\"error\": \"the bearer token is not one this daemon knows (not in its "
                 "--auth-file)\", \"field\": \"authorization\", \"rule\": \"token\"}\n");
        break;
    case AUTH_OK:
        status = 403;
        snprintf(body, sizeof body,
                 "{\"error\": \"this %s needs an admin token; the token sent is team %s's, "
                 "which may change only that team's namespaces on shoal-control\", \"field\": "
                 "\"authorization\", \"rule\": \"admin\", \"team\": \"%s\"}\n",
                 method, who->team, who->team);
        break;
    }
    log_info_limited("admin HTTP: %s %.200s refused %u (%s)", method, url, status,
                     why == AUTH_MISSING ? "no token" : why == AUTH_SCHEME ? "not Bearer"
                     : why == AUTH_INVALID ? "unknown token" : who->name);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body,
                                                             MHD_RESPMEM_MUST_COPY);
    if (r == NULL) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", challenge);
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
    if (rq && rq->held) { /* resumed: a held request's answer is ready */
        struct admin_held *h = rq->held;
        if (!__atomic_load_n(&h->answered, __ATOMIC_ACQUIRE)) {
            MHD_suspend_connection(conn);
            return MHD_YES;
        }
        enum MHD_Result r = held_reply(conn, h);
        held_free(h);
        rq->held = NULL;
        __atomic_fetch_sub(&a->held, 1, __ATOMIC_RELAXED);
        return r;
    }
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
    struct auth_caller who;
    int writes = strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0;
    if (a->auth && writes) {
        enum auth_result ar = auth_check(
            a->auth, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization"), &who);
        if (ar != AUTH_OK || (!who.admin && !(rt && (rt->flags & ADMIN_ROUTE_TEAM))))
            return admin_refuse(conn, ar, &who, method, url);
    }
    if (rt) {
        struct buf out;
        buf_init(&out);
        if (buf_append(&rq->body, "", 1) < 0) return MHD_NO; /* NUL-terminate */
        struct buf rest;
        buf_init(&rest);
        buf_append_str(&rest, url + strlen(rt->prefix));
        if (rt->flags & ADMIN_ROUTE_QUERY)
            MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, admin_query_arg, &rest);
        if (buf_append(&rest, "", 1) < 0) {
            buf_release(&rest);
            return MHD_NO;
        }
        admin_cur.conn = conn;
        admin_cur.rq = rq;
        admin_cur.may_hold = (rt->flags & ADMIN_ROUTE_HOLD) != 0;
        admin_cur.caller = a->auth && writes ? &who : NULL;
        admin_cur.authorization = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                              "Authorization");
        admin_cur.type = NULL;
        int status = rt->fn(rt->ctx, method, buf_start(&rest), buf_start(&rq->body),
                            buf_used(&rq->body) - 1, &out);
        admin_cur.rq = NULL;
        admin_cur.may_hold = 0;
        admin_cur.caller = NULL;
        admin_cur.authorization = NULL;
        buf_release(&rest);
        if (rq->held) { /* suspended: the answer comes through admin_answer() */
            __atomic_fetch_add(&a->held, 1, __ATOMIC_RELAXED);
            buf_release(&out);
            return MHD_YES;
        }
        if (status == ADMIN_HELD) status = 500; /* a handler that meant to hold but could not */
        enum MHD_Result r = admin_reply(conn, (unsigned)status,
                                        admin_cur.type ? admin_cur.type : "application/json",
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
        if (rq->held) held_free(rq->held); /* the listener stopped with it still held */
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
    return admin_create_pool(1, host, port, lim, metrics, ctx, routes, nroutes, err, errlen);
}

struct admin *admin_create_pool(unsigned threads, const char *host, unsigned port,
                                const struct admin_limits *lim, admin_metrics_fn metrics,
                                void *ctx, const struct admin_route *routes, size_t nroutes,
                                char *err, size_t errlen)
{
    struct admin *a = calloc(1, sizeof *a);
    if (a == NULL) {
        snprintf(err, errlen, "out of memory starting the admin listener");
        return NULL;
    }
    a->metrics = metrics;
    a->ctx = ctx;
    a->header_timeout = lim->header_timeout;
    if (lim->auth_file && (a->auth = auth_load(lim->auth_file, err, errlen)) == NULL) {
        free(a);
        return NULL;
    }
    if (nroutes > ADMIN_ROUTES_MAX) nroutes = ADMIN_ROUTES_MAX;
    memcpy(a->routes, routes, nroutes * sizeof *routes);
    a->nroutes = nroutes;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host && *host ? host : "127.0.0.1", &sin.sin_addr) != 1) {
        snprintf(err, errlen, "admin listen address '%s' is not an IPv4 address; use e.g. 127.0.0.1",
                 host);
        auth_destroy(&a->auth);
        free(a);
        return NULL;
    }
    /* MHD_USE_AUTO picks epoll: select() would refuse every admin connection whose descriptor
     * is 1024 or more, which is every one on a node holding a thousand clients. */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    for (size_t i = 0; i < nroutes; i++)
        if (routes[i].flags & ADMIN_ROUTE_HOLD) flags |= MHD_ALLOW_SUSPEND_RESUME;
    /* a pool shares conn_max out among its threads (libmicrohttpd divides it): at least one
     * connection each. One thread: no pool option at all, as before pools existed. */
    if (threads > lim->conn_max) threads = lim->conn_max;
    struct MHD_OptionItem pool[] = {{MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)threads, NULL},
                                    {MHD_OPTION_END, 0, NULL}};
    a->d = MHD_start_daemon(flags, (uint16_t)port,
                            NULL, NULL, admin_handle, a, MHD_OPTION_SOCK_ADDR, &sin,
                            MHD_OPTION_ARRAY, threads > 1 ? pool : pool + 1,
                            MHD_OPTION_CONNECTION_LIMIT, lim->conn_max,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, lim->conn_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, lim->header_timeout,
                            MHD_OPTION_EXTERNAL_LOGGER, admin_log, NULL,
                            MHD_OPTION_NOTIFY_COMPLETED, admin_done, NULL, MHD_OPTION_END);
    if (a->d == NULL) {
        snprintf(err, errlen,
                 "cannot start admin HTTP listener on %s:%u (port in use?); choose another with "
                 "--admin-port",
                 host, port);
        auth_destroy(&a->auth);
        free(a);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(a->d, MHD_DAEMON_INFO_BIND_PORT);
    a->port = info ? info->port : port;
    if (a->auth)
        log_notice("admin writes need a bearer token: %zu tokens from %s", auth_count(a->auth),
                   lim->auth_file);
    return a;
}

unsigned admin_port(const struct admin *a) { return a->port; }

void admin_destroy(struct admin **ap)
{
    if (*ap == NULL) return;
    /* Stopping with suspended connections is not allowed: give answered ones up to a second
     * to be sent (the daemon's owner answers every held request first). */
    for (int i = 0; i < 100 && __atomic_load_n(&(*ap)->held, __ATOMIC_RELAXED) > 0; i++)
        usleep(10000);
    MHD_stop_daemon((*ap)->d);
    auth_destroy(&(*ap)->auth);
    free(*ap);
    *ap = NULL;
}
