/* detail.c — per-prefix request counts for `stats detail` (see detail.h). */
#include "node/detail.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/buf.h"

struct detail_prefix {
    struct detail_prefix *next;
    uint64_t get, hit, set, del;
    size_t n;
    char name[];
};

void detail_init(struct detail *d)
{
    memset(d, 0, sizeof *d);
    pthread_mutex_init(&d->lock, NULL);
}

static void detail_free_all(struct detail *d)
{
    for (int i = 0; i < DETAIL_BUCKETS; i++) {
        struct detail_prefix *p = d->bucket[i];
        while (p) {
            struct detail_prefix *next = p->next;
            free(p);
            p = next;
        }
        d->bucket[i] = NULL;
    }
    d->count = 0;
}

void detail_teardown(struct detail *d)
{
    detail_free_all(d);
    pthread_mutex_destroy(&d->lock);
}

void detail_set(struct detail *d, bool on) { __atomic_store_n(&d->on, on, __ATOMIC_RELAXED); }

void detail_clear(struct detail *d)
{
    pthread_mutex_lock(&d->lock);
    detail_free_all(d);
    d->dropped = 0;
    pthread_mutex_unlock(&d->lock);
}

/* The prefix record for name[0..n), created if absent; NULL when the table is full or memory
 * ran out. Lock held. */
static struct detail_prefix *detail_find(struct detail *d, const char *name, size_t n)
{
    struct detail_prefix **head = &d->bucket[XXH3_64bits(name, n) % DETAIL_BUCKETS];
    for (struct detail_prefix *p = *head; p; p = p->next)
        if (p->n == n && !memcmp(p->name, name, n)) return p;
    if (d->count >= DETAIL_PREFIX_MAX) return NULL;
    struct detail_prefix *p = calloc(1, sizeof *p + n);
    if (p == NULL) return NULL;
    memcpy(p->name, name, n);
    p->n = n;
    p->next = *head;
    *head = p;
    d->count++;
    return p;
}

void detail_record(struct detail *d, const char *key, size_t nkey, enum detail_op op, bool hit)
{
    const char *colon = memchr(key, ':', nkey);
    if (colon == NULL) return; /* no prefix: memcached does not count it either */
    pthread_mutex_lock(&d->lock);
    struct detail_prefix *p = detail_find(d, key, (size_t)(colon - key));
    if (p == NULL) {
        d->dropped++;
    } else if (op == DETAIL_GET) {
        p->get++;
        if (hit) p->hit++;
    } else if (op == DETAIL_SET) {
        p->set++;
    } else {
        p->del++;
    }
    pthread_mutex_unlock(&d->lock);
}

int detail_dump(struct detail *d, struct buf *out, int from, size_t max_bytes)
{
    size_t start = buf_used(out);
    int i = from < 0 ? 0 : from;
    pthread_mutex_lock(&d->lock);
    for (; i < DETAIL_BUCKETS && buf_used(out) - start < max_bytes; i++)
        for (const struct detail_prefix *p = d->bucket[i]; p; p = p->next)
            buf_printf(out, "PREFIX %.*s get %llu hit %llu set %llu del %llu\r\n", (int)p->n,
                       p->name, (unsigned long long)p->get, (unsigned long long)p->hit,
                       (unsigned long long)p->set, (unsigned long long)p->del);
    pthread_mutex_unlock(&d->lock);
    return i;
}
