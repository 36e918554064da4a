/* probe.h — looking at one process from outside: is its port open, does it answer a get, is
 * its /healthz ok, and its figures from /metrics (totals and per namespace). */
#ifndef SHOAL_CLI_PROBE_H
#define SHOAL_CLI_PROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/nodefigs.h"

#define PROBE_NS_MAX NODEFIGS_NS_MAX

/* What one node's admin port told (fields left at -1 when absent). */
struct probe_node {
    bool reachable;      /* /healthz answered */
    bool healthy;        /* ... with 200 */
    char error[160];     /* why not, when not */
    double items, bytes, limit, hits, misses, version;
    int nns;
    struct nodefigs_ns ns[PROBE_NS_MAX];
};

/* "host:port" -> host (NUL-terminated, at most hostlen) and port; -1 when malformed. */
int probe_split(const char *addr, char *host, size_t hostlen, int *port);
/* A TCP connection to addr is accepted within timeout_ms. */
bool probe_accepts(const char *addr, unsigned timeout_ms);
/* A memcached `get` of a key that does not exist is answered END within timeout_ms. */
bool probe_get(const char *addr, unsigned timeout_ms);
/* GET http://addr/healthz == 200 within timeout_ms. */
bool probe_healthz(const char *addr, unsigned timeout_ms);
/* /healthz and /metrics of a shoal-node's admin address `admin`. metrics_prefix is the series'
 * prefix ("shoal_node_"). */
void probe_node(const char *admin, struct probe_node *out);
/* The value of series `name` (exact, labels included) in Prometheus text, or -1. */
double probe_metric(const char *text, const char *name);

#endif
