/* test_httpc.c — unit tests for the shared HTTP client (src/common/httpc.c), against the
 * project's own admin listener (src/common/admin.c) on a loopback port: a GET's status and
 * body, a PUT's JSON body arriving whole, an error status returned as a reply, a refused
 * connection and a silent server reported as errors within the deadline, an oversized reply
 * refused, a request held by the server ended at once by httpc_cancel from another thread,
 * header lines added to a client sent with its requests (and a request's own line with that
 * request only), and a proxy named in the environment never used. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/admin.h"
#include "common/buf.h"
#include "common/httpc.h"

static void metrics(void *ctx, struct buf *out) { buf_append_str(out, "x_metric 1\n"); }

/* /echo answers 201 with "<method> <body>"; /big answers 64 KB; /missing 404. */
static int echo(void *ctx, const char *method, const char *rest, const char *body, size_t len,
                struct buf *out)
{
    if (!strcmp(rest, "/big")) {
        for (int i = 0; i < 1024; i++)
            buf_append_str(out, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n");
        return 200;
    }
    if (!strcmp(rest, "/missing")) {
        buf_append_str(out, "{\"error\": \"none\"}");
        return 404;
    }
    buf_append_str(out, method);
    buf_append_str(out, " ");
    buf_append(out, body, len);
    return 201;
}

static struct admin *start(char *url, size_t n)
{
    struct admin_route routes[] = {{"/t", echo, NULL, 0}};
    struct admin_limits lim = {.conn_max = 16, .header_timeout = 2, .conn_per_ip = 16};
    char err[256];
    struct admin *a = admin_create("127.0.0.1", 0, &lim, metrics, NULL, routes, 1, err, sizeof err);
    if (a == NULL) fail_msg("admin_create: %s", err);
    snprintf(url, n, "http://127.0.0.1:%u", admin_port(a));
    return a;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void test_get_and_put(void **state)
{
    char base[64], url[128], err[256];
    struct admin *a = start(base, sizeof base);
    struct httpc *h = httpc_create(0);
    struct httpc_reply r;
    httpc_reply_init(&r);
    snprintf(url, sizeof url, "%s/healthz", base);
    assert_int_equal(httpc_get(h, url, 2000, &r, err, sizeof err), 0);
    assert_int_equal(r.status, 200);
    assert_true(buf_used(&r.body) >= 2 && !memcmp(buf_start(&r.body), "ok", 2));

    snprintf(url, sizeof url, "%s/t/echo", base);
    const char *doc = "{\"a\": [1, 2, 3]}";
    assert_int_equal(httpc_request(h, "PUT", url, doc, strlen(doc), 2000, &r, err, sizeof err), 0);
    assert_int_equal(r.status, 201);
    assert_int_equal(buf_used(&r.body), 4 + strlen(doc));
    assert_memory_equal(buf_start(&r.body), "PUT {\"a\": [1, 2, 3]}", buf_used(&r.body));

    /* a body over 1 KB (libcurl would otherwise wait for 100-continue) */
    char *large = malloc(5000);
    memset(large, 'x', 4999);
    large[4999] = 0;
    assert_int_equal(httpc_request(h, "POST", url, large, 4999, 2000, &r, err, sizeof err), 0);
    assert_int_equal(r.status, 201);
    assert_int_equal(buf_used(&r.body), 5 + 4999);
    free(large);

    snprintf(url, sizeof url, "%s/t/missing", base);
    assert_int_equal(httpc_get(h, url, 2000, &r, err, sizeof err), 0);
    assert_int_equal(r.status, 404); /* an error status is a reply, judged by the caller */

    httpc_reply_release(&r);
    httpc_destroy(&h);
    assert_null(h);
    admin_destroy(&a);
}

static void test_reply_over_the_cap_is_refused(void **state)
{
    char base[64], url[128], err[256] = "";
    struct admin *a = start(base, sizeof base);
    struct httpc *h = httpc_create(4096);
    struct httpc_reply r;
    httpc_reply_init(&r);
    snprintf(url, sizeof url, "%s/t/big", base);
    assert_int_equal(httpc_get(h, url, 2000, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "larger than 4096"));
    assert_true(buf_used(&r.body) <= 4096);
    httpc_reply_release(&r);
    httpc_destroy(&h);
    admin_destroy(&a);
}

/* A listening socket that never answers (its backlog accepts the connection). */
static int silent_listener(unsigned *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *port = ntohs(sa.sin_port);
    return fd;
}

static void test_refused_and_silent_servers_fail_in_time(void **state)
{
    char url[128], err[256] = "";
    unsigned port;
    int fd = silent_listener(&port);
    struct httpc *h = httpc_create(0);
    struct httpc_reply r;
    httpc_reply_init(&r);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/x", port);
    uint64_t t0 = now_ms();
    assert_int_equal(httpc_get(h, url, 300, &r, err, sizeof err), -1);
    uint64_t took = now_ms() - t0;
    assert_true(took >= 250 && took < 2000);
    assert_int_equal(r.status, 0);
    close(fd); /* nothing listens there now */
    assert_int_equal(httpc_get(h, url, 2000, &r, err, sizeof err), -1);
    assert_true(strlen(err) > 0);
    httpc_reply_release(&r);
    httpc_destroy(&h);
}

struct canceller {
    struct httpc *h;
    unsigned ms;
};

static void *cancel_later(void *arg)
{
    struct canceller *c = arg;
    usleep(c->ms * 1000);
    httpc_cancel(c->h);
    return NULL;
}

static void test_cancel_ends_a_held_request_at_once(void **state)
{
    char url[128], err[256] = "";
    unsigned port;
    int fd = silent_listener(&port);
    struct httpc *h = httpc_create(0);
    struct httpc_reply r;
    httpc_reply_init(&r);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/poll", port);
    struct canceller c = {h, 100};
    pthread_t th;
    pthread_create(&th, NULL, cancel_later, &c);
    uint64_t t0 = now_ms();
    assert_int_equal(httpc_get(h, url, 30000, &r, err, sizeof err), -1);
    uint64_t took = now_ms() - t0;
    pthread_join(th, NULL);
    assert_true(took < 900); /* not the poll's 1 s tick, nor the 30 s deadline */
    assert_true(httpc_cancelled(h));
    assert_non_null(strstr(err, "cancelled"));
    httpc_uncancel(h);
    assert_false(httpc_cancelled(h));
    close(fd);
    httpc_reply_release(&r);
    httpc_destroy(&h);
}

/* Serves one connection: answers 200 with the request's head as the body. */
static void *mirror_once(void *arg)
{
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    char req[4096];
    size_t n = 0;
    while (n < sizeof req - 1) {
        ssize_t r = read(fd, req + n, sizeof req - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        req[n] = 0;
        if (strstr(req, "\r\n\r\n")) break;
    }
    char head[128];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", n);
    ssize_t w = write(fd, head, (size_t)hn);
    w += write(fd, req, n);
    (void)w;
    close(fd);
    return NULL;
}

static void test_added_headers_go_with_every_request(void **state)
{
    char url[128], err[256] = "";
    unsigned port;
    int fd = silent_listener(&port);
    pthread_t th;
    pthread_create(&th, NULL, mirror_once, &fd);
    struct httpc *h = httpc_create(0);
    assert_int_equal(httpc_add_header(h, "Authorization: Bearer t0k"), 0);
    struct httpc_reply r;
    httpc_reply_init(&r);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/x", port);
    assert_int_equal(httpc_get(h, url, 2000, &r, err, sizeof err), 0);
    pthread_join(th, NULL);
    assert_int_equal(r.status, 200);
    buf_append(&r.body, "", 1);
    assert_non_null(strstr(buf_start(&r.body), "GET /v1/x HTTP/1.1\r\n"));
    assert_non_null(strstr(buf_start(&r.body), "\r\nAuthorization: Bearer t0k\r\n"));
    close(fd);
    httpc_reply_release(&r);
    httpc_destroy(&h);
}

static void test_request_header_goes_with_that_request_only(void **state)
{
    char url[128], err[256] = "";
    unsigned port;
    int fd = silent_listener(&port);
    struct httpc *h = httpc_create(0);
    struct httpc_reply r;
    httpc_reply_init(&r);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/x", port);
    for (int i = 0; i < 2; i++) {
        pthread_t th;
        pthread_create(&th, NULL, mirror_once, &fd);
        assert_int_equal(httpc_request_hdr(h, "PUT", url, i ? NULL : "Authorization: Bearer c1",
                                           "{}", 2, 2000, &r, err, sizeof err), 0);
        pthread_join(th, NULL);
        assert_int_equal(r.status, 200);
        buf_append(&r.body, "", 1);
        assert_non_null(strstr(buf_start(&r.body), "PUT /v1/x HTTP/1.1\r\n"));
        assert_true((strstr(buf_start(&r.body), "\r\nAuthorization: Bearer c1\r\n") != NULL) ==
                    (i == 0));
    }
    close(fd);
    httpc_reply_release(&r);
    httpc_destroy(&h);
}

/* Control traffic is between shoal's own processes: a proxy from the environment (here one
 * that refuses every connection) must not be used. */
static void test_environment_proxy_is_not_used(void **state)
{
    char base[64], url[128], err[256] = "";
    struct admin *a = start(base, sizeof base);
    unsigned dead;
    int fd = silent_listener(&dead);
    close(fd); /* nothing listens there now: a proxy at that address refuses */
    char proxy[64];
    snprintf(proxy, sizeof proxy, "http://127.0.0.1:%u", dead);
    static const char *const vars[] = {"http_proxy", "HTTP_PROXY", "https_proxy", "ALL_PROXY",
                                       "all_proxy"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) setenv(vars[i], proxy, 1);
    unsetenv("no_proxy");
    unsetenv("NO_PROXY");
    struct httpc *h = httpc_create(0);
    struct httpc_reply r;
    httpc_reply_init(&r);
    snprintf(url, sizeof url, "%s/t/echo", base);
    int rc = httpc_request(h, "PUT", url, "{}", 2, 2000, &r, err, sizeof err);
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    assert_int_equal(rc, 0);
    assert_int_equal(r.status, 201);
    httpc_reply_release(&r);
    httpc_destroy(&h);
    admin_destroy(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_and_put),
        cmocka_unit_test(test_reply_over_the_cap_is_refused),
        cmocka_unit_test(test_refused_and_silent_servers_fail_in_time),
        cmocka_unit_test(test_cancel_ends_a_held_request_at_once),
        cmocka_unit_test(test_added_headers_go_with_every_request),
        cmocka_unit_test(test_request_header_goes_with_that_request_only),
        cmocka_unit_test(test_environment_proxy_is_not_used),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
