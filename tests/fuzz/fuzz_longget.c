/* fuzz_longget.c — libFuzzer target for the long-get splitter (src/protocol/longget.c).
 *
 * The input's first two bytes pick the part bound (`max`) and how many bytes arrive per read;
 * the rest is the line as a peer sends it. The line is taken in parts twice: once as it
 * trickles in under that bound, once whole with a bound that never binds. Invariants:
 * - every part is progress (consumes bytes) and lies inside what was buffered;
 * - waiting for more input happens only while fewer than `max` bytes are buffered, so a peer
 *   cannot make a caller hold more than the bound (plus a key);
 * - every key handed out is a valid key;
 * - how the bytes arrive changes nothing: both runs hand out the same keys in the same order,
 *   fail alike, and end alike. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/longget.h"
#include "protocol/protocol.h"

struct run {
    char *keys;      /* every key handed out, each followed by '\n' */
    size_t nkeys, cap;
    int bad;         /* a LGET_BAD was answered */
    int last;        /* the line ended (LGET_LAST) */
    const char *end; /* lget_end_reply at the end, when it ended */
};

static void take_keys(struct run *r, const char *k, const char *e)
{
    const char *cur = k, *key;
    uint8_t nk;
    while (proto_next_key(&cur, e, &key, &nk)) {
        if (r->nkeys + nk + 1 > r->cap) abort(); /* each key stood before a separator */
        memcpy(r->keys + r->nkeys, key, nk);
        r->nkeys += nk;
        r->keys[r->nkeys++] = '\n';
    }
}

static void run_once(const char *data, size_t size, size_t max, size_t step, struct run *r)
{
    struct lget g;
    const char *err = NULL;
    memset(r, 0, sizeof *r);
    r->cap = size + 1;
    r->keys = malloc(r->cap);
    if (r->keys == NULL) abort();
    size_t first = lget_start(&g, data, size, &err);
    if (first == 0) return;
    if (first > size) abort();
    size_t off = first, avail = off + step < size ? off + step : size;
    while (off < size) {
        const char *k, *e;
        size_t used = 0;
        size_t n = avail - off;
        enum lget_step st = lget_next(&g, data + off, n, max, &k, &e, &used, &err);
        switch (st) {
        case LGET_WAIT:
            if (n >= max) abort(); /* would hold more than the bound */
            if (avail == size) return; /* the peer stopped mid-key */
            avail = avail + step < size ? avail + step : size;
            continue;
        case LGET_BAD:
            if (!g.skip || err == NULL) abort();
            r->bad = 1;
            continue;
        case LGET_PART:
        case LGET_LAST:
            if (used == 0 || used > n) abort();
            if (k < data + off || e < k || e > data + off + used) abort();
            if (!proto_keys_valid(k, e)) abort();
            take_keys(r, k, e);
            off += used;
            if (avail < off) avail = off;
            if (st == LGET_LAST) {
                r->last = 1;
                r->end = lget_end_reply(&g);
                return;
            }
            if (avail == off && off < size) avail = avail + step < size ? avail + step : size;
            continue;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
    if (size < 2) return 0;
    size_t max = PROTO_KEY_MAX + 2 + (size_t)in[0] * 4;
    size_t step = 1 + (size_t)in[1];
    const char *data = (const char *)in + 2;
    size -= 2;
    struct run a, b;
    run_once(data, size, max, step, &a);
    run_once(data, size, (size_t)-1, size ? size : 1, &b);
    if (a.bad != b.bad || a.last != b.last) abort();
    if (!a.bad && (a.nkeys != b.nkeys || memcmp(a.keys, b.keys, a.nkeys))) abort();
    if (a.last && a.end != b.end && (a.end == NULL || b.end == NULL || strcmp(a.end, b.end)))
        abort();
    free(a.keys);
    free(b.keys);
    return 0;
}
