/* probe.c — the checks `shoal up` waits on and the figures `shoal status` and `shoal top` show:
 * a port accepting, a memcached get answered, /healthz, and shoal-node's /metrics. */
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

double probe_metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, name, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    }
    return -1;
}

static struct probe_ns *ns_slot(struct probe_node *o, const char *name, size_t len)
{
    for (int i = 0; i < o->nns; i++)
        if (strlen(o->ns[i].name) == len && !strncmp(o->ns[i].name, name, len)) return &o->ns[i];
    if (o->nns == PROBE_NS_MAX || len >= sizeof o->ns[0].name) return NULL;
    struct probe_ns *s = &o->ns[o->nns++];
    memset(s, 0, sizeof *s);
    memcpy(s->name, name, len);
    s->name[len] = 0;
    return s;
}

/* Lines shoal_node_ns_<field>{namespace="x"} value. */
static void parse_ns(const char *text, struct probe_node *o)
{
    static const char pre[] = "shoal_node_ns_";
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, pre, sizeof pre - 1)) continue;
        const char *f = p + sizeof pre - 1, *lb = strstr(f, "{namespace=\"");
        const char *eol = strchr(p, '\n');
        if (lb == NULL || (eol && lb > eol)) continue;
        const char *nm = lb + 12, *q = strchr(nm, '"');
        if (q == NULL || (eol && q > eol) || q[1] != '}') continue;
        struct probe_ns *s = ns_slot(o, nm, (size_t)(q - nm));
        if (s == NULL) continue;
        double v = strtod(q + 3, NULL);
        size_t fl = (size_t)(lb - f);
#define FIELD(lit, dst) if (fl == sizeof lit - 1 && !strncmp(f, lit, fl)) s->dst = v
        FIELD("get_hits_total", hits);
        FIELD("get_misses_total", misses);
        FIELD("sets_total", sets);
        FIELD("deletes_total", deletes);
        FIELD("memory_bytes", memory);
        FIELD("quota_bytes", quota);
        FIELD("items", items);
        FIELD("bytes", bytes);
#undef FIELD
    }
}

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
    o->items = probe_metric(body, "shoal_node_curr_items");
    o->bytes = probe_metric(body, "shoal_node_bytes");
    o->limit = probe_metric(body, "shoal_node_limit_maxbytes");
    o->hits = probe_metric(body, "shoal_node_get_hits_total");
    o->misses = probe_metric(body, "shoal_node_get_misses_total");
    o->version = probe_metric(body, "shoal_node_topology_version");
    parse_ns(body, o);
    free(body);
}
