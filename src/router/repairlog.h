/* repairlog.h — one worker's repair log for one node (replica.h, outage.h): the keys of writes
 * the node missed (skipped while it was marked down) or may have missed (failed on it: an error
 * or a timeout, applied or not), kept until a delete of each has been answered by it.
 *
 * Bounded: at most `cap` distinct keys (a hot key written a million times during an outage takes
 * one entry). One more distinct key overflows the log: it forgets its keys and keeps only the
 * fact that the node must be repaired as a whole. Running out of memory is treated the same
 * way, the safe answer. Storage grows with use, so an idle log costs a few words. */
#ifndef SHOAL_ROUTER_REPAIRLOG_H
#define SHOAL_ROUTER_REPAIRLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct buf;

struct repairlog {
    uint32_t cap;      /* most keys held */
    uint32_t n;        /* keys held */
    uint32_t room;     /* entries allocated in keys */
    uint32_t mask;     /* index slots - 1 (0 while nothing is allocated) */
    uint32_t *index;   /* open addressing: slot -> position in keys + 1, 0 when empty */
    char **keys;       /* n keys, in the order logged; each is a length byte, then the key */
    bool overflowed;   /* more distinct keys than cap (or no memory): repair the whole node */
};

/* A set of keys taken out of a log to be replayed (repairlog_take). */
struct repairlog_batch {
    char **keys;
    uint32_t n;
};

enum repairlog_added {
    REPAIRLOG_KEPT,      /* already held, or the log has overflowed and keeps no keys */
    REPAIRLOG_ADDED,     /* a new key */
    REPAIRLOG_OVERFLOW,  /* this key overflowed the log (cap reached) */
    REPAIRLOG_NOMEM,     /* no memory for it: the log overflowed */
};

void repairlog_init(struct repairlog *l, uint32_t cap);
void repairlog_free(struct repairlog *l);
/* Remember a key (1..250 bytes, any bytes). */
enum repairlog_added repairlog_add(struct repairlog *l, const char *key, size_t nkey);
/* Move every key into *b and empty the log (the overflow flag stays). Keys added while the
 * batch is replayed go into the log again. */
void repairlog_take(struct repairlog *l, struct repairlog_batch *b);
/* Key i of a batch, and its length. */
static inline const char *repairlog_key(const struct repairlog_batch *b, uint32_t i,
                                        size_t *nkey)
{
    *nkey = (uint8_t)b->keys[i][0];
    return b->keys[i] + 1;
}
void repairlog_batch_free(struct repairlog_batch *b);
/* Forget every key and the overflow: the node was repaired as a whole (or is being). */
void repairlog_reset(struct repairlog *l);
/* Mark the log overflowed (a whole-node repair failed and must be retried). */
void repairlog_set_overflow(struct repairlog *l);
/* Nothing to repair. */
static inline bool repairlog_clean(const struct repairlog *l) { return l->n == 0 && !l->overflowed; }

/* The request that repairs one key: `md <key>\r\n`, or `md <base64> b\r\n` when the key has
 * bytes a text key may not (space, control bytes, DEL). -1 when memory runs out. */
int repairlog_delete_line(struct buf *out, const char *key, size_t nkey);

#endif
