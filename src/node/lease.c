/* lease.c — per-key lease memory for lease_period and lease_ttl (see lease.h). */
#include "node/lease.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define LEASE_WAYS 4      /* entries per bucket: one pair of cache lines */
#define LEASE_STRIPES 64  /* bucket locks */

struct lease_entry {
    uint64_t hv;           /* key hash; meaningful only while the entry blocks */
    uint64_t token;        /* CAS of the win in flight */
    uint64_t quiet_until;  /* no win before this (lease_period) */
    uint64_t busy_until;   /* the win is in flight until filled or this time (lease_ttl) */
};

struct lease_bucket {
    struct lease_entry e[LEASE_WAYS];
};

struct lease_table {
    size_t mask; /* buckets - 1 */
    struct lease_bucket *b;
    struct {
        pthread_mutex_t m;
    } __attribute__((aligned(64))) lock[LEASE_STRIPES];
};

uint64_t lease_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

struct lease_table *lease_table_create(size_t keys)
{
    size_t buckets = 16;
    while (buckets * LEASE_WAYS < keys && buckets < ((size_t)1 << 40)) buckets <<= 1;
    struct lease_table *t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    t->b = calloc(buckets, sizeof *t->b);
    if (t->b == NULL) {
        free(t);
        return NULL;
    }
    t->mask = buckets - 1;
    for (int i = 0; i < LEASE_STRIPES; i++) pthread_mutex_init(&t->lock[i].m, NULL);
    return t;
}

void lease_table_destroy(struct lease_table **tp)
{
    struct lease_table *t = *tp;
    if (t == NULL) return;
    for (int i = 0; i < LEASE_STRIPES; i++) pthread_mutex_destroy(&t->lock[i].m);
    free(t->b);
    free(t);
    *tp = NULL;
}

/* The index's shards use the hash's low bits and its buckets the high ones; mix both so keys of
 * one shard still spread over the whole table. */
static size_t lease_bucket_of(const struct lease_table *t, uint64_t hv)
{
    return (size_t)((hv ^ (hv >> 31)) * 0x9E3779B97F4A7C15ull >> 20) & t->mask;
}

static uint64_t lease_blocks_until(const struct lease_entry *e)
{
    return e->quiet_until > e->busy_until ? e->quiet_until : e->busy_until;
}

static pthread_mutex_t *lease_lock(struct lease_table *t, size_t bi)
{
    pthread_mutex_t *m = &t->lock[bi % LEASE_STRIPES].m;
    pthread_mutex_lock(m);
    return m;
}

/* The entry of `hv` that still blocks at `now`, or NULL. Bucket lock held. */
static struct lease_entry *lease_find(struct lease_bucket *b, uint64_t hv, uint64_t now)
{
    for (int i = 0; i < LEASE_WAYS; i++)
        if (b->e[i].hv == hv && lease_blocks_until(&b->e[i]) > now) return &b->e[i];
    return NULL;
}

bool lease_may_win(struct lease_table *t, uint64_t hv, uint64_t now, uint64_t *until)
{
    size_t bi = lease_bucket_of(t, hv);
    pthread_mutex_t *m = lease_lock(t, bi);
    struct lease_entry *e = lease_find(&t->b[bi], hv, now);
    uint64_t end = 0;
    if (e) {
        if (e->quiet_until > now) end = e->quiet_until;
        if (e->busy_until > now && e->busy_until > end) end = e->busy_until;
    }
    pthread_mutex_unlock(m);
    if (end && until) *until = end;
    return end == 0;
}

bool lease_record_win(struct lease_table *t, uint64_t hv, uint64_t token, uint64_t now,
                      uint64_t period_ms, uint64_t inflight_ms)
{
    size_t bi = lease_bucket_of(t, hv);
    struct lease_bucket *b = &t->b[bi];
    pthread_mutex_t *m = lease_lock(t, bi);
    bool clean = true;
    struct lease_entry *e = lease_find(b, hv, now);
    if (e == NULL) {
        /* a free entry, else the one whose windows end first */
        e = &b->e[0];
        for (int i = 0; i < LEASE_WAYS; i++) {
            if (lease_blocks_until(&b->e[i]) <= now) {
                e = &b->e[i];
                break;
            }
            if (lease_blocks_until(&b->e[i]) < lease_blocks_until(e)) e = &b->e[i];
        }
        clean = lease_blocks_until(e) <= now;
    }
    e->hv = hv;
    e->token = token;
    e->quiet_until = period_ms ? now + period_ms : 0;
    e->busy_until = inflight_ms ? now + inflight_ms : 0;
    pthread_mutex_unlock(m);
    return clean;
}

void lease_filled(struct lease_table *t, uint64_t hv, uint64_t token)
{
    size_t bi = lease_bucket_of(t, hv);
    struct lease_bucket *b = &t->b[bi];
    pthread_mutex_t *m = lease_lock(t, bi);
    for (int i = 0; i < LEASE_WAYS; i++)
        if (b->e[i].hv == hv && b->e[i].token == token) b->e[i].busy_until = 0;
    pthread_mutex_unlock(m);
}
