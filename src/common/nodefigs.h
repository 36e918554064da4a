/* nodefigs.h — a shoal-node's figures read from its Prometheus /metrics text: node totals and
 * every namespace's counters and gauges (the shoal_node_ns_* series). Shared by the shoal CLI
 * (`shoal status`, `shoal top`) and shoal-control's dashboard sampler, so both read the same
 * series the same way. Parsing only: fetching the text is the caller's. */
#ifndef SHOAL_COMMON_NODEFIGS_H
#define SHOAL_COMMON_NODEFIGS_H

#include <stddef.h>

#define NODEFIGS_NS_MAX 300 /* above a node's 256 namespaces */
#define NODEFIGS_NAME_MAX 72

struct nodefigs_ns {
    char name[NODEFIGS_NAME_MAX];
    double hits, misses, sets, deletes, memory, quota, items, bytes;
};

/* Node totals are -1 when their series is absent; a namespace's fields are 0 when absent. */
struct nodefigs {
    double items, bytes, limit, hits, misses, version;
    int nns;
    struct nodefigs_ns ns[NODEFIGS_NS_MAX];
};

/* The value of series `name` (exact, labels included) in Prometheus text, or -1. */
double nodefigs_metric(const char *text, const char *name);
/* Fill `out` from shoal-node's /metrics text. Namespaces past NODEFIGS_NS_MAX are left out. */
void nodefigs_parse(const char *text, struct nodefigs *out);

#endif
