/* policy.c — namespace TTL rules and rate limits (see policy.h). */
#include "router/policy.h"

#define POLICY_REL_MAX (60 * 60 * 24 * 30) /* memcached: longer is an absolute time */

bool policy_ttl(const struct topo_ns *ns, int64_t ttl, int64_t now, int64_t *out)
{
    if (ns->default_ttl == 0 && ns->max_ttl == 0) return false;
    if (ttl < 0) return false; /* already expired: nothing to default or clamp */
    int64_t to;
    if (ttl == 0) {
        to = ns->default_ttl ? (int64_t)ns->default_ttl : (int64_t)ns->max_ttl;
        if (ns->max_ttl && to > (int64_t)ns->max_ttl) to = (int64_t)ns->max_ttl;
    } else {
        /* an absolute time stands unless it is clamped: sent as written, the node's clock
         * judges it, and no relative value over 30 days (read back as a 1970 time) appears */
        int64_t left = ttl > POLICY_REL_MAX ? ttl - now : ttl;
        if (left <= 0) return false; /* an absolute time in the past: expired */
        if (ns->max_ttl == 0 || left <= (int64_t)ns->max_ttl) return false;
        to = (int64_t)ns->max_ttl;
    }
    /* a rule longer than 30 days (not allowed by topo.c, but the wire must not lie) */
    if (to > POLICY_REL_MAX) to += now;
    if (to == ttl) return false;
    *out = to;
    return true;
}

bool policy_ttl_capped(const struct topo_ns *ns, uint64_t cap, int64_t ttl, int64_t now,
                       int64_t *out)
{
    struct topo_ns eff = {.default_ttl = ns->default_ttl, .max_ttl = ns->max_ttl};
    if (cap && (eff.max_ttl == 0 || eff.max_ttl > cap)) eff.max_ttl = cap;
    return policy_ttl(&eff, ttl, now, out);
}

int64_t policy_ttl_wire(int64_t left, int64_t now)
{
    if (left < 0) return 0;
    if (left == 0) return 1; /* its last second */
    return left > POLICY_REL_MAX ? now + left : left;
}

int64_t policy_ttl_left(int64_t ttl, int64_t now)
{
    if (ttl == 0) return -1;
    if (ttl < 0) return 0;
    if (ttl > POLICY_REL_MAX) return ttl > now ? ttl - now : 0;
    return ttl;
}

bool policy_take(struct topo_bucket *b, uint64_t now_ms, uint64_t cost)
{
    if (b->rate == 0) return true;
    uint64_t last = __atomic_load_n(&b->last_ms, __ATOMIC_RELAXED);
    /* one worker wins the refill for each new millisecond; last 0 = first use, already full */
    if (now_ms > last && __atomic_compare_exchange_n(&b->last_ms, &last, now_ms, false,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
        last != 0) {
        uint64_t elapsed = now_ms - last > 1000 ? 1000 : now_ms - last;
        int64_t cap = (int64_t)b->rate * 1000;
        int64_t cur = __atomic_add_fetch(&b->milli, (int64_t)(elapsed * b->rate), __ATOMIC_RELAXED);
        if (cur > cap) __atomic_fetch_sub(&b->milli, cur - cap, __ATOMIC_RELAXED); /* about full */
    }
    int64_t need = (int64_t)cost * 1000;
    if (__atomic_sub_fetch(&b->milli, need, __ATOMIC_RELAXED) < 0) {
        __atomic_add_fetch(&b->milli, need, __ATOMIC_RELAXED);
        return false;
    }
    return true;
}

void policy_give(struct topo_bucket *b, uint64_t cost)
{
    if (b->rate == 0) return;
    int64_t cap = (int64_t)b->rate * 1000;
    int64_t cur = __atomic_add_fetch(&b->milli, (int64_t)cost * 1000, __ATOMIC_RELAXED);
    /* a refill since the take may have filled it already */
    if (cur > cap) __atomic_fetch_sub(&b->milli, cur - cap, __ATOMIC_RELAXED);
}
