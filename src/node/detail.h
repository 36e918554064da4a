/* detail.h — `stats detail on|off|dump`: memcached's per-prefix request counts.
 *
 * A key's prefix is its text before the first ':' (memcached's default delimiter, and shoal's
 * namespace rule, so the key of a namespace counts under the namespace's name); a key without
 * ':' is not counted, as in memcached. Like memcached, only the text protocol's commands count:
 * get/gets/gat/gats per key (get, and hit when found), storage commands (set), delete (del,
 * found or not). Counting is off until `stats detail on`; while on, each counted request takes
 * one node-wide lock, the price memcached pays too, so it is a debugging aid, not a metric. */
#ifndef SHOAL_NODE_DETAIL_H
#define SHOAL_NODE_DETAIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct buf;

#define DETAIL_BUCKETS 256
/* Prefixes remembered at most: a client sending random prefixes cannot grow the table without
 * bound. Requests under further new prefixes are not counted (detail_dropped says how many). */
#define DETAIL_PREFIX_MAX 65536

enum detail_op { DETAIL_GET, DETAIL_SET, DETAIL_DEL };

struct detail_prefix;

struct detail {
    bool on; /* relaxed atomic: read on every text get/set/delete */
    pthread_mutex_t lock; /* everything below */
    struct detail_prefix *bucket[DETAIL_BUCKETS];
    size_t count;
    uint64_t dropped;
};

void detail_init(struct detail *d);
/* Free every prefix. */
void detail_teardown(struct detail *d);

static inline bool detail_enabled(const struct detail *d)
{
    return __atomic_load_n(&d->on, __ATOMIC_RELAXED);
}
void detail_set(struct detail *d, bool on);
/* Count one request on `key` (call only when detail_enabled). `hit`: a get that found it. */
void detail_record(struct detail *d, const char *key, size_t nkey, enum detail_op op, bool hit);
/* Append "PREFIX <p> get N hit N set N del N\r\n" for the prefixes of buckets `from` on (no
 * END), stopping after the bucket that brings what was appended to `max_bytes`. Returns the
 * next bucket to dump, DETAIL_BUCKETS when every one was. Prefixes added meanwhile to buckets
 * already dumped are missed, as a memcached dump is no snapshot either. */
int detail_dump(struct detail *d, struct buf *out, int from, size_t max_bytes);
/* Forget every prefix (`stats reset`). */
void detail_clear(struct detail *d);

#endif
