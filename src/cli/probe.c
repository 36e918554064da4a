/* probe.c — the checks `shoal up` waits on and the figures `shoal status` and `shoal top` show:
 * a port accepting, a memcached get answered, /healthz, and shoal-node's /metrics (read by
 * common/nodefigs, which shoal-control's dashboard shares). */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/probe.h"

int probe_split(const char *addr, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || colon == addr || (size_t)(colon - addr) >= hostlen) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p <= 0 || p > 65535) return -1;
    *port = (int)p;
    return 0;
}

/* A connected socket to addr, or -1. */
static int dial(const char *addr, unsigned timeout_ms)
{
    char host[256], port[8];
    int p;
    if (probe_split(addr, host, sizeof host, &p) < 0) return -1;
    snprintf(port, sizeof port, "%d", p);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            close(fd);
            fd = -1;
        } else {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t len = sizeof err;
            if (poll(&pf, 1, (int)timeout_ms) != 1 ||
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    return fd;
}

bool probe_accepts(const char *addr, unsigned timeout_ms)
{
    int fd = dial(addr, timeout_ms);
    if (fd < 0) return false;
    close(fd);
    return true;
}

bool probe_get(const char *addr, unsigned timeout_ms)
{
    int fd = dial(addr, timeout_ms);
    if (fd < 0) return false;
    static const char req[] = "get shoal-up-probe\r\n";
    bool ok = send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1);
    char buf[256];
    size_t got = 0;
    while (ok && got < sizeof buf - 1) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, (int)timeout_ms) != 1) break;
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
        buf[got] = 0;
        if (strstr(buf, "\r\n")) break;
    }
    buf[got] = 0;
    close(fd);
    return ok && strcmp(buf, "END\r\n") == 0;
}

bool probe_healthz(const char *addr, unsigned timeout_ms)
{
    char url[300], err[256], *body = NULL;
    long status = 0;
    snprintf(url, sizeof url, "http://%s/healthz", addr);
    int rc = cli_http_get(url, timeout_ms, &status, &body, err, sizeof err);
    free(body);
    return rc == 0 && status == 200;
}

double probe_metric(const char *text, const char *name) { return nodefigs_metric(text, name); }

void probe_node(const char *admin, struct probe_node *o)
{
    memset(o, 0, sizeof *o);
    o->items = o->bytes = o->limit = o->hits = o->misses = o->version = -1;
    char url[300], *body = NULL;
    long status = 0;
    snprintf(url, sizeof url, "http://%s/healthz", admin);
    if (cli_http_get(url, 2000, &status, &body, o->error, sizeof o->error) < 0) return;
    o->reachable = true;
    o->healthy = status == 200;
    if (!o->healthy) snprintf(o->error, sizeof o->error, "/healthz answered %ld", status);
    free(body);
    body = NULL;
    snprintf(url, sizeof url, "http://%s/metrics", admin);
    if (cli_http_get(url, 2000, &status, &body, o->error, sizeof o->error) < 0 || status != 200) {
        free(body);
        return;
    }
    struct nodefigs *st = malloc(sizeof *st);
    if (st) {
        nodefigs_parse(body, st);
        o->items = st->items;
        o->bytes = st->bytes;
        o->limit = st->limit;
        o->hits = st->hits;
        o->misses = st->misses;
        o->version = st->version;
        o->nns = st->nns;
        memcpy(o->ns, st->ns, (size_t)st->nns * sizeof st->ns[0]);
        free(st);
    }
    free(body);
}
