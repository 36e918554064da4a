/* slotmap.c — slot maps that stay even and move as little as possible (see slotmap.h). */
#include "control/slotmap.h"

#include <string.h>

void slotmap_even(uint16_t *owner, uint32_t n)
{
    for (uint32_t s = 0; s < SLOT_COUNT; s++) owner[s] = (uint16_t)slot_default_owner(s, n);
}

void slotmap_counts(const uint16_t *owner, uint32_t n, uint32_t *counts)
{
    memset(counts, 0, n * sizeof *counts);
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (owner[s] < n) counts[owner[s]]++;
}

uint32_t slotmap_add(uint16_t *owner, uint32_t n)
{
    static __thread uint32_t counts[SLOTMAP_NODES_MAX], give[SLOTMAP_NODES_MAX];
    slotmap_counts(owner, n, counts);
    memset(give, 0, n * sizeof *give);
    uint32_t take = SLOT_COUNT / (n + 1);
    /* One slot at a time from whoever holds most after what it already gives: the old nodes
     * end within one of each other, and the new node at the floor of even, so nothing more
     * than its share moves. */
    for (uint32_t k = 0; k < take; k++) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; i++)
            if (counts[i] - give[i] > counts[best] - give[best]) best = i;
        give[best]++;
    }
    /* Each giver gives its highest-numbered slots: one run off the end of its range. */
    uint32_t moved = 0;
    for (int s = SLOT_COUNT - 1; s >= 0 && moved < take; s--) {
        uint16_t o = owner[s];
        if (o < n && give[o] > 0) {
            give[o]--;
            owner[s] = (uint16_t)n;
            moved++;
        }
    }
    return moved;
}

uint32_t slotmap_remove(uint16_t *owner, uint32_t n, uint32_t gone)
{
    static __thread uint32_t counts[SLOTMAP_NODES_MAX], recv[SLOTMAP_NODES_MAX];
    slotmap_counts(owner, n, counts);
    memset(recv, 0, n * sizeof *recv);
    /* Each of the leaver's slots goes to the survivor that holds fewest so far. */
    for (uint32_t k = 0; k < counts[gone]; k++) {
        uint32_t best = gone == 0 ? 1 : 0;
        for (uint32_t i = 0; i < n; i++)
            if (i != gone && counts[i] + recv[i] < counts[best] + recv[best]) best = i;
        recv[best]++;
    }
    /* Hand them out in ascending runs, one receiver after another. */
    uint32_t moved = 0, r = 0;
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (owner[s] != gone) continue;
        while (r < n && (r == gone || recv[r] == 0)) r++;
        if (r == n) break; /* cannot happen: the receipts add up to the leaver's slots */
        recv[r]--;
        owner[s] = (uint16_t)r;
        moved++;
    }
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (owner[s] > gone) owner[s]--;
    return moved;
}

int slotmap_check_even(const uint16_t *owner, uint32_t n)
{
    if (n == 0 || n > SLOTMAP_NODES_MAX) return -1;
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (owner[s] >= n) return -1;
    uint32_t counts[SLOTMAP_NODES_MAX];
    slotmap_counts(owner, n, counts);
    uint32_t lo = SLOT_COUNT / n, hi = lo + (SLOT_COUNT % n ? 1 : 0);
    for (uint32_t i = 0; i < n; i++)
        if (counts[i] < lo || counts[i] > hi) return -1;
    return 0;
}

size_t slotmap_to_ranges(const uint16_t *owner, struct slot_range *out)
{
    size_t k = 0;
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (k > 0 && out[k - 1].node == owner[s] && out[k - 1].to + 1u == s) {
            out[k - 1].to = (uint16_t)s;
            continue;
        }
        out[k++] = (struct slot_range){(uint16_t)s, (uint16_t)s, owner[s]};
    }
    return k;
}
