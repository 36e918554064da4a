/* policy.c — namespace TTL rules (see policy.h). */
#include "router/policy.h"

#define POLICY_REL_MAX (60 * 60 * 24 * 30) /* memcached: longer is an absolute time */

bool policy_ttl(const struct topo_ns *ns, int64_t ttl, int64_t now, int64_t *out)
{
    if (ns->default_ttl == 0 && ns->max_ttl == 0) return false;
    if (ttl < 0) return false; /* already expired: nothing to default or clamp */
    int64_t rel = ttl; /* 0 = never */
    if (ttl > POLICY_REL_MAX) {
        rel = ttl - now;
        if (rel <= 0) return false; /* an absolute time in the past: expired */
    }
    if (rel == 0 && ns->default_ttl) rel = (int64_t)ns->default_ttl;
    if (ns->max_ttl && (rel == 0 || rel > (int64_t)ns->max_ttl)) rel = (int64_t)ns->max_ttl;
    if (rel == ttl) return false;
    *out = rel;
    return true;
}
