/* deliver_rec.c — delivery's records (one committed transaction's keys, or a flush) and the
 * rings that queue them; the small helpers the other deliver*.c files share. */
#include "invalidator/deliver_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct rec *rec_new(uint8_t kind, uint32_t n, uint32_t ndata)
{
    struct rec *r = malloc(sizeof *r + ndata);
    if (!r) return NULL;
    memset(r, 0, sizeof *r);
    r->refs = 1;
    r->kind = kind;
    r->n = n;
    r->ndata = ndata;
    return r;
}

void rec_ref(struct rec *r) { __atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED); }

void rec_unref(struct rec *r)
{
    if (r && __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) == 0) free(r);
}

size_t rec_pack(char *d, const char *key, size_t nkey, const char *ns, size_t nns)
{
    d[0] = (char)(nkey & 0xff);
    d[1] = (char)(nkey >> 8);
    d[2] = (char)nns;
    if (nkey) memcpy(d + 3, key, nkey);
    if (nns) memcpy(d + 3 + nkey, ns, nns);
    return 3 + nkey + nns;
}

bool rec_next(const struct rec *r, uint32_t *off, struct ritem *it)
{
    uint32_t o = *off;
    if (o + 3 > r->ndata) return false;
    const unsigned char *p = (const unsigned char *)r->data + o;
    size_t nkey = p[0] | (size_t)p[1] << 8, nns = p[2];
    if (o + 3 + nkey + nns > r->ndata) return false;
    it->key = r->data + o + 3;
    it->nkey = nkey;
    it->ns = r->data + o + 3 + nkey;
    it->nns = nns;
    *off = o + 3 + (uint32_t)(nkey + nns);
    return true;
}

int recq_reserve(struct recq *q, size_t more)
{
    if (q->n + more <= q->cap) return 0;
    size_t cap = q->cap ? q->cap : 64;
    while (cap < q->n + more) cap *= 2;
    struct rec **v = malloc(cap * sizeof *v);
    if (!v) return -1;
    for (size_t i = 0; i < q->n; i++) v[i] = recq_at(q, i);
    free(q->v);
    q->v = v;
    q->cap = cap;
    q->head = 0;
    return 0;
}

void recq_push(struct recq *q, struct rec *r)
{
    q->v[(q->head + q->n) % q->cap] = r;
    q->n++;
    q->bytes += rec_bytes(r);
    if (r->kind == REC_KEYS) q->items += r->n;
}

struct rec *recq_pop(struct recq *q)
{
    if (!q->n) return NULL;
    struct rec *r = q->v[q->head];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    q->bytes -= rec_bytes(r);
    if (r->kind == REC_KEYS) q->items -= r->n;
    return r;
}

void recq_clear(struct recq *q)
{
    struct rec *r;
    while ((r = recq_pop(q))) rec_unref(r);
}

void recq_free(struct recq *q)
{
    recq_clear(q);
    free(q->v);
    memset(q, 0, sizeof *q);
}

void dc_count(struct dcluster *c, size_t offset, uint64_t n)
{
    pthread_mutex_lock(&c->lock);
    *(uint64_t *)((char *)&c->st + offset) += n;
    pthread_mutex_unlock(&c->lock);
}
