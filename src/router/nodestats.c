/* nodestats.c — per-node figures (see nodestats.h). */
#include "router/nodestats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"

void nodestats_init(struct nodestats *s, size_t nworkers)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    s->nworkers = nworkers;
}

void nodestats_teardown(struct nodestats *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i]->slots);
        free(s->v[i]);
    }
    free(s->v);
    pthread_mutex_destroy(&s->lock);
}

struct nodestat *nodestats_get(struct nodestats *s, const char *addr)
{
    pthread_mutex_lock(&s->lock);
    struct nodestat *e = NULL;
    for (size_t i = 0; i < s->n && e == NULL; i++)
        if (!strcmp(s->v[i]->addr, addr)) e = s->v[i];
    if (e == NULL) {
        if (s->n == s->cap) {
            size_t nc = s->cap ? s->cap * 2 : 16;
            struct nodestat **nv = realloc(s->v, nc * sizeof *nv);
            if (nv == NULL) goto out;
            s->v = nv;
            s->cap = nc;
        }
        e = calloc(1, sizeof *e);
        size_t bytes = s->nworkers * sizeof *e->slots;
        if (e) e->slots = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (e == NULL || e->slots == NULL) {
            if (e) free(e);
            e = NULL;
            goto out;
        }
        memset(e->slots, 0, s->nworkers * sizeof *e->slots);
        snprintf(e->addr, sizeof e->addr, "%s", addr);
        s->v[s->n++] = e;
    }
out:
    pthread_mutex_unlock(&s->lock);
    return e;
}

bool nodestats_is_down(struct nodestats *s, const char *addr)
{
    bool down = false;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->v[i]->addr, addr)) continue;
        for (size_t wi = 0; wi < s->nworkers; wi++)
            if (__atomic_load_n(&s->v[i]->slots[wi].down, __ATOMIC_RELAXED)) down = true;
        break;
    }
    pthread_mutex_unlock(&s->lock);
    return down;
}

int nodestats_state(struct nodestats *s, const char *addr)
{
    int state = -1;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i]->addr, addr)) {
            state = (int)(__atomic_load_n(&s->v[i]->health, __ATOMIC_ACQUIRE) & 1);
            uint64_t sent = 0; /* a node no request went to: this router knows nothing of it */
            for (size_t wi = 0; wi < s->nworkers; wi++)
                sent += __atomic_load_n(&s->v[i]->slots[wi].requests, __ATOMIC_RELAXED);
            if (state == 0 && sent == 0) state = -1;
            break;
        }
    pthread_mutex_unlock(&s->lock);
    return state;
}

void nodestats_render(struct nodestats *s, struct buf *out)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } series[] = {
        {"requests", "counter", "requests sent to the node",
         offsetof(struct nodestat_slot, requests)},
        {"errors", "counter", "requests answered SERVER_ERROR for the node (timeouts included)",
         offsetof(struct nodestat_slot, errors)},
        {"timeouts", "counter", "requests that timed out on the node",
         offsetof(struct nodestat_slot, timeouts)},
        {"down", "gauge", "worker threads that have the node marked down",
         offsetof(struct nodestat_slot, down)},
    };
    pthread_mutex_lock(&s->lock);
    for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
        buf_printf(out, "# HELP shoal_router_node_%s %s\n# TYPE shoal_router_node_%s %s\n",
                   series[k].name, series[k].help, series[k].name, series[k].type);
        for (size_t i = 0; i < s->n; i++) {
            uint64_t sum = 0;
            for (size_t wi = 0; wi < s->nworkers; wi++)
                sum += __atomic_load_n((uint64_t *)((char *)&s->v[i]->slots[wi] + series[k].off),
                                       __ATOMIC_RELAXED);
            buf_printf(out, "shoal_router_node_%s{node=\"%s\"} %llu\n", series[k].name,
                       s->v[i]->addr, (unsigned long long)sum);
        }
    }
    lathist_render_head(out, "shoal_router_node_latency_us",
                        "reply time of the node's requests, measured per event-loop batch "
                        "(quantiles: upper bound of a power-of-two bucket)");
    for (size_t i = 0; i < s->n; i++) {
        struct lathist lat = {0};
        for (size_t wi = 0; wi < s->nworkers; wi++) lathist_add(&lat, &s->v[i]->slots[wi].lat);
        lathist_render(out, "shoal_router_node_latency_us", "node", s->v[i]->addr, &lat);
    }
    pthread_mutex_unlock(&s->lock);
}
