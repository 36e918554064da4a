/* promote.c — promoted slots between two topology documents (see promote.h). */
#include "common/promote.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/slot.h"

/* Fill per-slot node (and replica) names of one pool's slot map: pointers into the document,
 * NULL where no range covers the slot or names no replica. */
static void promote_expand(json_t *slots, const char **node, const char **replica)
{
    size_t i;
    json_t *r;
    json_array_foreach(slots, i, r) {
        json_t *jf = json_object_get(r, "from"), *jt = json_object_get(r, "to");
        const char *n = json_string_value(json_object_get(r, "node"));
        const char *rep = json_string_value(json_object_get(r, "replica"));
        if (!json_is_integer(jf) || !json_is_integer(jt) || n == NULL) continue;
        json_int_t from = json_integer_value(jf), to = json_integer_value(jt);
        if (from < 0) from = 0;
        if (to >= SLOT_COUNT) to = SLOT_COUNT - 1;
        for (json_int_t s = from; s <= to; s++) {
            node[s] = n;
            if (replica) replica[s] = rep;
        }
    }
}

size_t promote_diff(json_t *old_doc, json_t *new_doc, const char *pool, uint16_t *slots_out)
{
    json_t *op = json_object_get(old_doc, "pools"), *np = json_object_get(new_doc, "pools");
    if (!json_is_object(op) || !json_is_object(np)) return 0;
    const char **onode = malloc(SLOT_COUNT * sizeof *onode);
    const char **orep = malloc(SLOT_COUNT * sizeof *orep);
    const char **nnode = malloc(SLOT_COUNT * sizeof *nnode);
    const char **nrep = malloc(SLOT_COUNT * sizeof *nrep);
    uint8_t *hit = calloc(SLOT_COUNT, 1);
    size_t n = 0;
    if (onode == NULL || orep == NULL || nnode == NULL || nrep == NULL ||
        hit == NULL)
        goto out;
    const char *name;
    json_t *npv;
    json_object_foreach(np, name, npv) {
        if (pool && strcmp(pool, name)) continue;
        json_t *os = json_object_get(json_object_get(op, name), "slots");
        json_t *ns = json_object_get(npv, "slots");
        if (!json_is_array(os) || !json_is_array(ns)) continue;
        memset(onode, 0, SLOT_COUNT * sizeof *onode);
        memset(orep, 0, SLOT_COUNT * sizeof *orep);
        memset(nnode, 0, SLOT_COUNT * sizeof *nnode);
        memset(nrep, 0, SLOT_COUNT * sizeof *nrep);
        promote_expand(os, onode, orep);
        promote_expand(ns, nnode, nrep);
        /* a swap (the old node is now the replica) is a drain's planned switch, made after a
         * handoff with no lag: nothing was lost, and replaying deletes there would delete
         * values set after them (a promotion never names the dead node as the replica) */
        for (uint32_t s = 0; s < SLOT_COUNT; s++)
            if (orep[s] && nnode[s] && !strcmp(orep[s], nnode[s]) &&
                !(nrep[s] && onode[s] && !strcmp(nrep[s], onode[s])))
                hit[s] = 1;
    }
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (hit[s]) slots_out[n++] = (uint16_t)s;
out:
    free(onode);
    free(orep);
    free(nnode);
    free(nrep);
    free(hit);
    return n;
}
