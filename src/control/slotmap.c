/* slotmap.c — slot maps that stay even and move as little as possible (see slotmap.h). */
#include "control/slotmap.h"

#include <stdbool.h>
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
    return slotmap_to_ranges_r(owner, NULL, out);
}

size_t slotmap_to_ranges_r(const uint16_t *owner, const uint16_t *replica,
                           struct slot_range *out)
{
    size_t k = 0;
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        uint16_t r = replica ? replica[s] : SLOTMAP_NONE;
        if (k > 0 && out[k - 1].node == owner[s] && out[k - 1].replica == r &&
            out[k - 1].to + 1u == s) {
            out[k - 1].to = (uint16_t)s;
            continue;
        }
        out[k++] = (struct slot_range){(uint16_t)s, (uint16_t)s, owner[s], r};
    }
    return k;
}

/* ---- replicas ----------------------------------------------------------------------------- */

struct repl_ctx {
    const uint16_t *owner, *zone;
    const uint8_t *live;
    uint32_t n;
    bool other_zone[SLOTMAP_NODES_MAX]; /* owner i has a live node in another zone */
    bool has_cand[SLOTMAP_NODES_MAX];   /* owner i can have a replica at all */
};

static bool is_live(const struct repl_ctx *x, uint32_t i)
{
    return i < x->n && (x->live == NULL || x->live[i]);
}

static bool repl_valid(const struct repl_ctx *x, uint32_t s, uint32_t r)
{
    uint32_t o = x->owner[s];
    if (r == SLOTMAP_NONE || r == o || !is_live(x, r)) return false;
    return !(o < x->n && x->other_zone[o] && x->zone[r] == x->zone[o]);
}

static void repl_setup(struct repl_ctx *x, const uint16_t *owner, uint32_t n,
                       const uint16_t *zone, const uint8_t *live)
{
    x->owner = owner;
    x->zone = zone;
    x->live = live;
    x->n = n;
    for (uint32_t o = 0; o < n; o++) {
        x->other_zone[o] = x->has_cand[o] = false;
        for (uint32_t i = 0; i < n; i++) {
            if (i == o || !is_live(x, i)) continue;
            x->has_cand[o] = true;
            if (zone && zone[i] != zone[o]) x->other_zone[o] = true;
        }
    }
}

int slotmap_check_replicas(const uint16_t *owner, const uint16_t *replica, uint32_t n,
                           const uint16_t *zone, const uint8_t *live)
{
    static __thread struct repl_ctx x;
    if (n == 0 || n > SLOTMAP_NODES_MAX) return -1;
    repl_setup(&x, owner, n, zone, live);
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (owner[s] >= n) return -1;
        if (replica[s] == SLOTMAP_NONE) {
            if (x.has_cand[owner[s]]) return -1;
        } else if (!repl_valid(&x, s, replica[s])) {
            return -1;
        }
    }
    return 0;
}

/* Move up to `want` slots whose replica is `from` and for which `to` is valid, to `to`, from
 * the top down (so what moves is a few runs). Returns how many moved. */
static uint32_t repl_move(const struct repl_ctx *x, uint16_t *replica, uint32_t *cnt,
                          uint32_t from, uint32_t to, uint32_t want)
{
    uint32_t moved = 0;
    for (int s = SLOT_COUNT - 1; s >= 0 && moved < want; s--) {
        if (replica[s] != from || !repl_valid(x, (uint32_t)s, to)) continue;
        replica[s] = (uint16_t)to;
        moved++;
    }
    cnt[from] -= moved;
    cnt[to] += moved;
    return moved;
}

/* How many slots with replica `from` could take `to` instead. */
static uint32_t repl_movable(const struct repl_ctx *x, const uint16_t *replica, uint32_t from,
                             uint32_t to)
{
    uint32_t k = 0;
    for (uint32_t s = 0; s < SLOT_COUNT; s++)
        if (replica[s] == from && repl_valid(x, s, to)) k++;
    return k;
}

uint32_t slotmap_replicas(const uint16_t *owner, uint16_t *replica, uint32_t n,
                          const uint16_t *zone, const uint8_t *live)
{
    static __thread struct repl_ctx x;
    static __thread uint32_t cnt[SLOTMAP_NODES_MAX];
    static __thread uint16_t before[SLOT_COUNT];
    if (n == 0 || n > SLOTMAP_NODES_MAX) return 0;
    memcpy(before, replica, sizeof before);
    repl_setup(&x, owner, n, zone, live);
    memset(cnt, 0, n * sizeof *cnt);
    uint32_t total = 0, nlive = 0;
    for (uint32_t i = 0; i < n; i++) nlive += is_live(&x, i);
    /* keep what is valid */
    for (uint32_t s = 0; s < SLOT_COUNT; s++) {
        if (owner[s] < n && x.has_cand[owner[s]]) total++;
        if (!repl_valid(&x, s, replica[s])) replica[s] = SLOTMAP_NONE;
        else cnt[replica[s]]++;
    }
    if (nlive == 0 || total == 0) goto out;
    uint32_t hi = (total + nlive - 1) / nlive;
    /* nodes over the even share give the excess back, their highest slots first */
    for (int s = SLOT_COUNT - 1; s >= 0; s--) {
        uint16_t r = replica[s];
        if (r != SLOTMAP_NONE && cnt[r] > hi) {
            replica[s] = SLOTMAP_NONE;
            cnt[r]--;
        }
    }
    /* fill: runs of slots without one, each run to the first node after its owner below even */
    for (uint32_t s = 0; s < SLOT_COUNT;) {
        uint32_t o = owner[s];
        if (replica[s] != SLOTMAP_NONE || o >= n || !x.has_cand[o]) {
            s++;
            continue;
        }
        uint32_t pick = SLOTMAP_NONE;
        for (uint32_t k = 1; k < n && pick == SLOTMAP_NONE; k++) {
            uint32_t i = (o + k) % n;
            if (cnt[i] < hi && repl_valid(&x, s, i)) pick = i;
        }
        if (pick == SLOTMAP_NONE) /* every valid one is at even (zones): the one holding fewest */
            for (uint32_t i = 0; i < n; i++)
                if (repl_valid(&x, s, i) && (pick == SLOTMAP_NONE || cnt[i] < cnt[pick])) pick = i;
        if (pick == SLOTMAP_NONE) {
            s++;
            continue;
        }
        uint32_t room = cnt[pick] < hi ? hi - cnt[pick] : SLOT_COUNT;
        for (; s < SLOT_COUNT && room > 0 && owner[s] == o && replica[s] == SLOTMAP_NONE;
             s++, room--) {
            replica[s] = (uint16_t)pick;
            cnt[pick]++;
        }
    }
    /* rebalance: a node holding few takes from one holding many, directly or through a third
     * node, while two are more than one apart and something can move (with zones the fewest
     * and the most may be in zones that cannot trade, so the next pairs are tried too) */
    for (uint32_t round = 0; round < 4 * n + 64; round++) {
        uint32_t lows[8], highs[8], nl = 0, nh = 0;
        static __thread uint8_t used[SLOTMAP_NODES_MAX];
        memset(used, 0, n);
        for (; nl < 8; nl++) { /* the 8 holding fewest, fewest first */
            uint32_t u = SLOTMAP_NONE;
            for (uint32_t i = 0; i < n; i++)
                if (is_live(&x, i) && !used[i] && (u == SLOTMAP_NONE || cnt[i] < cnt[u])) u = i;
            if (u == SLOTMAP_NONE) break;
            used[u] = 1;
            lows[nl] = u;
        }
        memset(used, 0, n);
        for (; nh < 8; nh++) { /* the 8 holding most */
            uint32_t v = SLOTMAP_NONE;
            for (uint32_t i = 0; i < n; i++)
                if (is_live(&x, i) && !used[i] && (v == SLOTMAP_NONE || cnt[i] > cnt[v])) v = i;
            if (v == SLOTMAP_NONE) break;
            used[v] = 1;
            highs[nh] = v;
        }
        bool moved = false;
        for (uint32_t a = 0; a < nh && !moved; a++)
            for (uint32_t b = 0; b < nl && !moved; b++) {
                uint32_t v = highs[a], u = lows[b];
                if (cnt[v] <= cnt[u] + 1) continue;
                uint32_t need = (cnt[v] - cnt[u]) / 2;
                if (repl_move(&x, replica, cnt, v, u, need) > 0) {
                    moved = true;
                    break;
                }
                for (uint32_t w = 0; w < n && !moved; w++) {
                    if (w == u || w == v || !is_live(&x, w)) continue;
                    uint32_t ka = repl_movable(&x, replica, v, w), kb = repl_movable(&x, replica, w, u);
                    uint32_t k = need < ka ? need : ka;
                    if (kb < k) k = kb;
                    if (k == 0) continue;
                    repl_move(&x, replica, cnt, w, u, k); /* first, so v's slots do not come back */
                    repl_move(&x, replica, cnt, v, w, k);
                    moved = true;
                }
            }
        if (!moved) break;
    }
    /* zones that cannot trade with each other may still be uneven inside: even each zone out */
    for (uint32_t round = 0; zone && round < 4 * n + 64; round++) {
        bool moved = false;
        for (uint32_t z = 0; z < n; z++) {
            if (!is_live(&x, z)) continue;
            bool first = true; /* z is its zone's first live node */
            for (uint32_t j = 0; j < z && first; j++)
                if (is_live(&x, j) && zone[j] == zone[z]) first = false;
            if (!first) continue;
            uint32_t u = z, v = z;
            for (uint32_t i = z + 1; i < n; i++) {
                if (!is_live(&x, i) || zone[i] != zone[z]) continue;
                if (cnt[i] < cnt[u]) u = i;
                if (cnt[i] > cnt[v]) v = i;
            }
            if (cnt[v] > cnt[u] + 1 && repl_move(&x, replica, cnt, v, u, (cnt[v] - cnt[u]) / 2))
                moved = true;
        }
        if (!moved) break; /* as even as the owners and zones allow */
    }
out:;
    uint32_t changed = 0;
    for (uint32_t s = 0; s < SLOT_COUNT; s++) changed += replica[s] != before[s];
    return changed;
}
