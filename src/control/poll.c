/* poll.c — held long polls of the topology (see poll.h). */
#include "control/poll.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "control/control.h"
#include "control/topodoc.h"

struct held_poll {
    struct admin_held *h;
    uint64_t after;
    uint64_t deadline_ms;
    bool gzip; /* the client accepts a gzip'd answer */
};

struct poller {
    struct control *c;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    struct held_poll *v;
    size_t n, max;
    uint64_t version;
    int stop;
    bool joined; /* poll_stop has joined the thread */
};

/* Answer the polls in `ready` (taken out of the list): those behind the current version get
 * the document (the same bytes for all: topodoc.h), the rest 304. */
static void answer(struct poller *p, struct held_poll *ready, size_t n)
{
    struct control *c = p->c;
    pthread_mutex_lock(&c->lock);
    struct topo_doc *d = topo_doc_ref(c->doc);
    pthread_mutex_unlock(&c->lock);
    uint64_t version = topo_doc_version(d);
    /* counted before answered: with several listener threads the client's next request (its
     * /metrics, say) may be served before this thread goes on */
    for (size_t i = 0; i < n; i++) {
        if (ready[i].after < version) {
            CTL_INC(c, polls_answered);
            topo_doc_answer(d, ready[i].h, ready[i].gzip);
        } else {
            CTL_INC(c, polls_timed_out);
            admin_answer(ready[i].h, 304, NULL, 0);
        }
    }
    topo_doc_unref(d);
}

static void *poll_main(void *arg)
{
    struct poller *p = arg;
    struct held_poll *ready = malloc(p->max * sizeof *ready);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        uint64_t now = clock_mono_ms(), next = now + 60000;
        size_t k = 0;
        for (size_t i = 0; i < p->n;) {
            struct held_poll *h = &p->v[i];
            if (p->stop || h->after < p->version || h->deadline_ms <= now) {
                if (ready) ready[k++] = *h;
                else admin_answer(h->h, 503, NULL, 0); /* no memory for the batch */
                p->v[i] = p->v[--p->n];
                continue;
            }
            if (h->deadline_ms < next) next = h->deadline_ms;
            i++;
        }
        CTL_SET(p->c, polls_held, p->n);
        if (k > 0) {
            pthread_mutex_unlock(&p->mu);
            answer(p, ready, k);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        if (p->stop) break;
        struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000};
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    free(ready);
    return NULL;
}

struct poller *poll_create(struct control *c, char *err, size_t errlen)
{
    struct poller *p = calloc(1, sizeof *p);
    if (p) p->v = calloc(c->cfg.poll_max, sizeof *p->v);
    if (p == NULL || p->v == NULL) {
        if (p) free(p);
        snprintf(err, errlen, "out of memory for --poll-max %llu held polls",
                 (unsigned long long)c->cfg.poll_max);
        return NULL;
    }
    p->c = c;
    p->max = c->cfg.poll_max;
    p->version = c->version;
    pthread_mutex_init(&p->mu, NULL);
    clock_cond_init_monotonic(&p->cv);
    if (pthread_create(&p->th, NULL, poll_main, p) != 0) {
        snprintf(err, errlen, "cannot start the long-poll thread");
        free(p->v);
        free(p);
        return NULL;
    }
    return p;
}

int poll_add(struct poller *p, struct admin_held *h, uint64_t after, bool gzip)
{
    pthread_mutex_lock(&p->mu);
    if (p->n >= p->max || p->stop) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    p->v[p->n++] = (struct held_poll){h, after, clock_mono_ms() + p->c->cfg.poll_timeout * 1000, gzip};
    CTL_SET(p->c, polls_held, p->n);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void poll_notify(struct poller *p, uint64_t v)
{
    pthread_mutex_lock(&p->mu);
    if (v > p->version) p->version = v;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void poll_stop(struct poller *p)
{
    if (p == NULL) return;
    pthread_mutex_lock(&p->mu);
    bool joined = p->joined;
    p->stop = 1;
    p->joined = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (!joined) pthread_join(p->th, NULL);
}

void poll_destroy(struct poller **pp)
{
    struct poller *p = *pp;
    if (p == NULL) return;
    poll_stop(p);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->v);
    free(p);
    *pp = NULL;
}
