/* nsfields.c — the namespace settings table and its checks (see nsfields.h). */
#include "common/nsfields.h"

#include <string.h>

const struct nsf_int nsf_ints[] = {
#define X(name, lo, hi, def, help) {#name, lo, hi, def, true, help},
    NSF_NODE_INTS(X)
#undef X
#define X(name, lo, hi, def, help) {#name, lo, hi, def, false, help},
    NSF_PLANE_INTS(X)
#undef X
};
const size_t nsf_nints = sizeof nsf_ints / sizeof nsf_ints[0];

const char *const nsf_evictions[] = {
#define X(name) #name,
    NSF_EVICTIONS(X)
#undef X
};
const size_t nsf_nevictions = sizeof nsf_evictions / sizeof nsf_evictions[0];

const struct nsf_int *nsf_int_find(const char *name)
{
    for (size_t i = 0; i < nsf_nints; i++)
        if (!strcmp(name, nsf_ints[i].name)) return &nsf_ints[i];
    return NULL;
}

bool nsf_int_ok(const struct nsf_int *f, const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    uint64_t x = (uint64_t)json_integer_value(v);
    if (x < f->lo || x > f->hi) return false;
    if (out) *out = x;
    return true;
}

int nsf_eviction_of(const json_t *v)
{
    const char *s = json_string_value(v);
    for (size_t i = 0; s && i < nsf_nevictions; i++)
        if (!strcmp(s, nsf_evictions[i])) return (int)i;
    return -1;
}

bool nsf_ttls_ok(uint64_t default_ttl, uint64_t max_ttl)
{
    return max_ttl == 0 || default_ttl <= max_ttl;
}

uint64_t nsf_share(uint64_t memory, uint64_t nnodes)
{
    return nnodes ? memory / nnodes : 0;
}
