/* repairlog.c — the bounded set of keys a replica must have deleted before it is read again
 * (see repairlog.h): an array of keys in the order logged, and an open-addressing index over
 * it for finding a key already held. Both grow by doubling up to the bound. */
#include "router/repairlog.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/buf.h"
#include "protocol/protocol.h"

#define REPAIRLOG_MIN_ROOM 16

void repairlog_init(struct repairlog *l, uint32_t cap)
{
    memset(l, 0, sizeof *l);
    l->cap = cap;
}

static void repairlog_drop_keys(struct repairlog *l)
{
    for (uint32_t i = 0; i < l->n; i++) free(l->keys[i]);
    free(l->keys);
    free(l->index);
    l->keys = NULL;
    l->index = NULL;
    l->n = l->room = l->mask = 0;
}

void repairlog_free(struct repairlog *l)
{
    repairlog_drop_keys(l);
    l->overflowed = false;
}

void repairlog_reset(struct repairlog *l) { repairlog_free(l); }

void repairlog_set_overflow(struct repairlog *l)
{
    repairlog_drop_keys(l);
    l->overflowed = true;
}

static uint32_t repairlog_slot(const struct repairlog *l, const char *key, size_t nkey)
{
    return (uint32_t)XXH3_64bits(key, nkey) & l->mask;
}

/* Make room for one more key: double the array and rebuild the index at twice its size, so
 * probes stay short. -1 when memory runs out (the log is unchanged). */
static int repairlog_grow(struct repairlog *l)
{
    uint32_t room = l->room ? l->room * 2 : REPAIRLOG_MIN_ROOM;
    if (room > l->cap) room = l->cap;
    uint32_t slots = 1;
    while (slots < 2 * room) slots <<= 1;
    char **keys = realloc(l->keys, room * sizeof *keys);
    if (keys == NULL) return -1;
    l->keys = keys;
    uint32_t *index = calloc(slots, sizeof *index);
    if (index == NULL) return -1; /* the larger array is kept; harmless */
    free(l->index);
    l->index = index;
    l->room = room;
    l->mask = slots - 1;
    for (uint32_t i = 0; i < l->n; i++) {
        uint32_t s = repairlog_slot(l, l->keys[i] + 1, (uint8_t)l->keys[i][0]);
        while (l->index[s]) s = (s + 1) & l->mask;
        l->index[s] = i + 1;
    }
    return 0;
}

enum repairlog_added repairlog_add(struct repairlog *l, const char *key, size_t nkey)
{
    if (l->overflowed) return REPAIRLOG_KEPT;
    if (nkey == 0 || nkey > PROTO_KEY_MAX) return REPAIRLOG_KEPT; /* cannot be a key */
    uint32_t s = 0;
    if (l->mask) {
        for (s = repairlog_slot(l, key, nkey); l->index[s]; s = (s + 1) & l->mask) {
            const char *k = l->keys[l->index[s] - 1];
            if ((uint8_t)k[0] == nkey && !memcmp(k + 1, key, nkey)) return REPAIRLOG_KEPT;
        }
    }
    if (l->n == l->cap) {
        repairlog_set_overflow(l);
        return REPAIRLOG_OVERFLOW;
    }
    char *k = malloc(nkey + 1);
    if (k == NULL || (l->n == l->room && repairlog_grow(l) < 0)) {
        free(k);
        repairlog_set_overflow(l);
        return REPAIRLOG_NOMEM;
    }
    k[0] = (char)nkey;
    memcpy(k + 1, key, nkey);
    /* the index may have been rebuilt: find the key's free slot again */
    for (s = repairlog_slot(l, key, nkey); l->index[s]; s = (s + 1) & l->mask) {}
    l->keys[l->n++] = k;
    l->index[s] = l->n;
    return REPAIRLOG_ADDED;
}

void repairlog_take(struct repairlog *l, struct repairlog_batch *b)
{
    b->keys = l->keys;
    b->n = l->n;
    free(l->index);
    l->keys = NULL;
    l->index = NULL;
    l->n = l->room = l->mask = 0;
}

void repairlog_batch_free(struct repairlog_batch *b)
{
    for (uint32_t i = 0; i < b->n; i++) free(b->keys[i]);
    free(b->keys);
    b->keys = NULL;
    b->n = 0;
}

int repairlog_delete_line(struct buf *out, const char *key, size_t nkey)
{
    bool text = nkey > 0 && nkey <= PROTO_KEY_MAX;
    for (size_t i = 0; i < nkey && text; i++)
        if ((unsigned char)key[i] <= ' ' || key[i] == 0x7f) text = false;
    if (text)
        return buf_append(out, "md ", 3) < 0 || buf_append(out, key, nkey) < 0 ||
                       buf_append(out, "\r\n", 2) < 0 ? -1 : 0;
    char b64[4 * ((PROTO_KEY_MAX + 2) / 3) + 1];
    int n = proto_base64_encode(key, nkey, b64, sizeof b64);
    if (n < 0) return -1;
    return buf_printf(out, "md %.*s b\r\n", n, b64) < 0 ? -1 : 0;
}
