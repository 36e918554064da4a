/* fuzz_topology.c — libFuzzer target for the router's topology document parser (topo_parse).
 *
 * Any bytes must yield a table or an error message; never a crash, an over-read or a leak. A
 * table that parses must route every slot of every pool to one of that pool's nodes, and every
 * namespace to a pool. Host names are refused rather than resolved, so no run waits on DNS. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "router/topo.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct topo *t = NULL;
    char err[512];
    err[0] = 0;
    int rc = topo_parse((const char *)data, size, TOPO_NUMERIC_HOSTS, &t, err, sizeof err);
    if (rc != 0) {
        if (t != NULL || err[0] == 0) __builtin_trap();
        return 0;
    }
    for (uint32_t p = 0; p < t->npools; p++) {
        const struct topo_pool *pool = &t->pools[p];
        for (uint32_t s = 0; s < SLOT_COUNT; s++) {
            int found = 0;
            for (uint32_t k = 0; k < pool->nnodes; k++) found |= pool->nodes[k] == pool->owner[s];
            if (!found) __builtin_trap();
        }
    }
    for (uint32_t i = 0; i < t->nns; i++)
        if (t->ns[i].pool >= t->npools) __builtin_trap();
    if (topo_route(t, "a:b", 3) >= t->nnodes) __builtin_trap();
    topo_destroy(&t);
    return 0;
}
