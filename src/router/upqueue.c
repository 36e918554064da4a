/* upqueue.c — a node's wait queue, fair between clients: a flow per client, fresh flows first,
 * then round-robin (see upqueue.h). */
#include "router/upqueue.h"

#include <stdlib.h>
#include <string.h>

#include "router/request.h"

#define UPQUEUE_BUCKETS_MIN 16
#define UPQUEUE_SPARE_MAX 64 /* flows kept for reuse: one comes and goes per burst of a client */

void upqueue_init(struct upqueue *q)
{
    memset(q, 0, sizeof *q);
}

void upqueue_free(struct upqueue *q)
{
    while (q->spare) {
        struct upflow *fl = q->spare;
        q->spare = fl->next;
        free(fl);
    }
    free(q->buckets); /* empty: no flow is left in it */
    memset(q, 0, sizeof *q);
}

static uint32_t upqueue_hash(const struct upqueue *q, unsigned pin)
{
    return (uint32_t)(pin * 2654435761u) & (q->nbuckets - 1);
}

static struct upflow *upqueue_find(const struct upqueue *q, unsigned pin)
{
    if (q->nbuckets == 0) return NULL;
    for (struct upflow *fl = q->buckets[upqueue_hash(q, pin)]; fl; fl = fl->hnext)
        if (fl->pin == pin) return fl;
    return NULL;
}

/* Room for one more flow in the hash: doubled when the flows outnumber the buckets. A failed
 * growth keeps the table as it is (longer chains), unless there is none yet. */
static int upqueue_grow(struct upqueue *q)
{
    if (q->nbuckets && q->nflows < q->nbuckets) return 0;
    uint32_t n = q->nbuckets ? q->nbuckets * 2 : UPQUEUE_BUCKETS_MIN;
    struct upflow **b = calloc(n, sizeof *b);
    if (b == NULL) return q->nbuckets ? 0 : -1;
    struct upqueue old = *q;
    q->buckets = b;
    q->nbuckets = n;
    for (uint32_t i = 0; i < old.nbuckets; i++)
        for (struct upflow *fl = old.buckets[i], *next; fl; fl = next) {
            next = fl->hnext;
            uint32_t h = upqueue_hash(q, fl->pin);
            fl->hnext = b[h];
            b[h] = fl;
        }
    free(old.buckets);
    return 0;
}

/* A flow whose last request was taken: out of the hash, kept as a spare or freed. It is no
 * longer in the fresh list or the round (the caller unlinked it). */
static void upqueue_drop(struct upqueue *q, struct upflow *fl)
{
    for (struct upflow **pp = &q->buckets[upqueue_hash(q, fl->pin)]; *pp; pp = &(*pp)->hnext)
        if (*pp == fl) {
            *pp = fl->hnext;
            break;
        }
    q->nflows--;
    if (q->nspare < UPQUEUE_SPARE_MAX) {
        fl->next = q->spare;
        q->spare = fl;
        q->nspare++;
    } else {
        free(fl);
    }
}

static void upqueue_append(struct upflow **head, struct upflow **tail, struct upflow *fl)
{
    fl->next = NULL;
    if (*tail) (*tail)->next = fl;
    else *head = fl;
    *tail = fl;
}

int upqueue_push(struct upqueue *q, struct frag *f, unsigned pin)
{
    f->next = NULL;
    struct upflow *fl = upqueue_find(q, pin);
    if (fl == NULL) {
        if (upqueue_grow(q) < 0) return -1;
        if (q->spare) {
            fl = q->spare;
            q->spare = fl->next;
            q->nspare--;
        } else if ((fl = malloc(sizeof *fl)) == NULL) {
            return -1;
        }
        fl->pin = pin;
        fl->turn = 0;
        fl->head = fl->tail = NULL;
        uint32_t h = upqueue_hash(q, pin);
        fl->hnext = q->buckets[h];
        q->buckets[h] = fl;
        q->nflows++;
        upqueue_append(&q->fresh, &q->fresh_tail, fl);
    }
    if (fl->tail) fl->tail->next = f;
    else fl->head = f;
    fl->tail = f;
    q->nwait++;
    return 0;
}

/* Take the head request of fl (it has one). */
static struct frag *upflow_take(struct upflow *fl)
{
    struct frag *f = fl->head;
    fl->head = f->next;
    if (fl->head == NULL) fl->tail = NULL;
    f->next = NULL;
    return f;
}

struct frag *upqueue_pop(struct upqueue *q, uint32_t quantum, unsigned *pin)
{
    bool fresh = q->fresh != NULL;
    struct upflow *fl = fresh ? q->fresh : q->round;
    if (fl == NULL) return NULL;
    struct frag *f = upflow_take(fl);
    q->nwait--;
    *pin = fl->pin;
    if (fl->head && ++fl->turn < quantum) return f; /* its turn goes on */
    if (fresh) {
        q->fresh = fl->next;
        if (q->fresh == NULL) q->fresh_tail = NULL;
    } else {
        q->round = fl->next;
        if (q->round == NULL) q->round_tail = NULL;
    }
    fl->turn = 0;
    if (fl->head) upqueue_append(&q->round, &q->round_tail, fl); /* its turn comes again */
    else upqueue_drop(q, fl);
    return f;
}

/* Take fl's requests while `all` or their deadline has passed, onto the list *tail points to
 * the end of. True when fl is then empty (dropped: the caller unlinks it first). */
static bool upflow_take_due(struct upqueue *q, struct upflow *fl, bool all, uint64_t now_ms,
                            struct frag ***tail)
{
    while (fl->head && (all || fl->head->deadline_ms <= now_ms)) {
        struct frag *f = upflow_take(fl);
        q->nwait--;
        **tail = f;
        *tail = &f->next;
    }
    return fl->head == NULL;
}

/* upflow_take_due over the flows of one list (the fresh list or the round). */
static void upqueue_take_list(struct upqueue *q, struct upflow **head, struct upflow **tail,
                              bool all, uint64_t now_ms, struct frag ***out)
{
    struct upflow *prev = NULL;
    for (struct upflow *fl = *head, *next; fl; fl = next) {
        next = fl->next;
        if (!upflow_take_due(q, fl, all, now_ms, out)) {
            prev = fl;
            continue;
        }
        if (prev) prev->next = next;
        else *head = next;
        if (*tail == fl) *tail = prev;
        upqueue_drop(q, fl);
    }
}

static struct frag *upqueue_take(struct upqueue *q, bool all, uint64_t now_ms)
{
    struct frag *list = NULL, **out = &list;
    upqueue_take_list(q, &q->fresh, &q->fresh_tail, all, now_ms, &out);
    upqueue_take_list(q, &q->round, &q->round_tail, all, now_ms, &out);
    return list;
}

struct frag *upqueue_take_expired(struct upqueue *q, uint64_t now_ms)
{
    return upqueue_take(q, false, now_ms);
}

struct frag *upqueue_take_all(struct upqueue *q)
{
    return upqueue_take(q, true, 0);
}
