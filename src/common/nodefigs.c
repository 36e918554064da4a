/* nodefigs.c — reading a shoal-node's /metrics text (see nodefigs.h). */
#include "common/nodefigs.h"

#include <stdlib.h>
#include <string.h>

double nodefigs_metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, name, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    }
    return -1;
}

static struct nodefigs_ns *ns_slot(struct nodefigs *o, const char *name, size_t len)
{
    for (int i = 0; i < o->nns; i++)
        if (strlen(o->ns[i].name) == len && !strncmp(o->ns[i].name, name, len)) return &o->ns[i];
    if (o->nns == NODEFIGS_NS_MAX || len >= sizeof o->ns[0].name) return NULL;
    struct nodefigs_ns *s = &o->ns[o->nns++];
    memset(s, 0, sizeof *s);
    memcpy(s->name, name, len);
    s->name[len] = 0;
    return s;
}

/* Lines shoal_node_ns_<field>{namespace="x"} value. */
static void parse_ns(const char *text, struct nodefigs *o)
{
    static const char pre[] = "shoal_node_ns_";
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, pre, sizeof pre - 1)) continue;
        const char *f = p + sizeof pre - 1, *lb = strstr(f, "{namespace=\"");
        const char *eol = strchr(p, '\n');
        if (lb == NULL || (eol && lb > eol)) continue;
        const char *nm = lb + 12, *q = strchr(nm, '"');
        if (q == NULL || (eol && q > eol) || q[1] != '}') continue;
        struct nodefigs_ns *s = ns_slot(o, nm, (size_t)(q - nm));
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

void nodefigs_parse(const char *text, struct nodefigs *o)
{
    o->nns = 0;
    o->items = nodefigs_metric(text, "shoal_node_curr_items");
    o->bytes = nodefigs_metric(text, "shoal_node_bytes");
    o->limit = nodefigs_metric(text, "shoal_node_limit_maxbytes");
    o->hits = nodefigs_metric(text, "shoal_node_get_hits_total");
    o->misses = nodefigs_metric(text, "shoal_node_get_misses_total");
    o->version = nodefigs_metric(text, "shoal_node_topology_version");
    parse_ns(text, o);
}
