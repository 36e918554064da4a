/* warm.c — warm-pool lookups for keys a cold pool missed, and the adds that fill it (see
 * warm.h). Only text get/gets are warmed; mg answers from the cold pool alone. */
#include "router/warm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/client.h"
#include "router/replica.h"
#include "router/upstream.h"
#include "router/worker.h"

bool warm_start(struct rreq *rq)
{
    struct client *c = rq->cl;
    struct rworker *w = c->w;
    rq->warmed = true;
    if (!worker_topology_ready(w)) return false;
    for (uint16_t i = 0; i < rq->nfrags; i++)
        if (rq->frags[i]->failed) return false; /* answered with the error anyway */
    bool *miss = calloc(rq->nkeys ? rq->nkeys : 1, sizeof *miss);
    if (miss == NULL) return false;
    if (multiget_misses(rq, miss) == 0) {
        free(miss);
        return false;
    }
    const struct topo *t = w->topo;
    rq->pending = 1; /* held while lookups are submitted: one failing at once cannot finish it */
    const char *kp = rq->keys, *kend = rq->keys + rq->nkeys_bytes, *key;
    uint8_t nk;
    for (uint32_t i = 0; i < rq->nkeys && proto_next_key(&kp, kend, &key, &nk); i++) {
        if (!miss[i]) continue;
        const struct topo_pool *cold = topo_pool_of(t, key, nk);
        if (cold->warm_from < 0 || rq->nfrags >= rq->fcap) continue;
        struct frag *f = frag_create(rq, rq->nfrags);
        if (f == NULL || buf_append(&f->out, "mg ", 3) < 0 || buf_append(&f->out, key, nk) < 0 ||
            buf_append(&f->out, " v f t c k\r\n", 12) < 0) {
            if (f) frag_destroy(f);
            w->m.out_of_memory++;
            break;
        }
        f->warm = true;
        rq->frags[rq->nfrags++] = f;
        rq->keyfrag[i] = f->idx;
        rq->pending++;
        w->m.warm_lookups++;
        const struct topo_pool *warm = &t->pools[cold->warm_from];
        uint32_t node = topo_route_pool(t, (uint32_t)cold->warm_from, key, nk);
        if (warm->replicated) node = replica_read_node(w, warm, node); /* one that is up */
        upnode_submit(w->map[node], f);
    }
    free(miss);
    return --rq->pending > 0;
}

/* The value of flag `letter` in the meta reply line [p, end), or NULL. */
static const char *warm_flag(const char *p, const char *end, char letter, size_t *n)
{
    while (p < end) {
        const char *s = p;
        while (p < end && *p != ' ' && *p != '\r' && *p != '\n') p++;
        if (p > s && *s == letter) {
            *n = (size_t)(p - s - 1);
            return s + 1;
        }
        if (p < end && *p == ' ') p++;
        else break;
    }
    return NULL;
}

void warm_reply(struct frag *f, const char *reply, size_t n, bool failed)
{
    struct rreq *rq = f->rq;
    struct rworker *w = rq->cl->w;
    static const char end[] = "END\r\n";
    const char *nl = failed || n < 3 || memcmp(reply, "VA ", 3) ? NULL : memchr(reply, '\n', n);
    size_t nflags = 0, nttl = 0, ncas = 0, nkey = 0;
    const char *flags = nl ? warm_flag(reply + 3, nl, 'f', &nflags) : NULL;
    const char *ttl = nl ? warm_flag(reply + 3, nl, 't', &nttl) : NULL;
    const char *cas = nl ? warm_flag(reply + 3, nl, 'c', &ncas) : NULL;
    const char *key = nl ? warm_flag(reply + 3, nl, 'k', &nkey) : NULL;
    long vlen = nl ? strtol(reply + 3, NULL, 10) : -1;
    const char *data = nl ? nl + 1 : NULL;
    if (!nl || !flags || !ttl || !cas || !key || vlen < 0 ||
        (size_t)(data - reply) + (size_t)vlen + 2 > n) {
        buf_append(&f->reply, end, sizeof end - 1); /* a miss there too (or no answer) */
        return;
    }
    w->m.warm_hits++;
    /* what the client gets: the warm value as a get reply */
    if (buf_printf(&f->reply, "VALUE %.*s %.*s %ld", (int)nkey, key, (int)nflags, flags, vlen) < 0 ||
        (rq->cmd == CMD_GETS && buf_printf(&f->reply, " %.*s", (int)ncas, cas) < 0) ||
        buf_append(&f->reply, "\r\n", 2) < 0 || buf_append(&f->reply, data, (size_t)vlen + 2) < 0 ||
        buf_append(&f->reply, end, sizeof end - 1) < 0) {
        buf_release(&f->reply);
        buf_append(&f->reply, end, sizeof end - 1);
        return;
    }
    /* the fill: add (fails if the cold pool has the key, or a delete's hold-off is on), with
     * the warm item's remaining TTL (-1: none) and CAS; its reply is dropped */
    if (!worker_topology_ready(w)) return;
    long left = strtol(ttl, NULL, 10);
    struct frag *add = frag_create(NULL, 0);
    if (add == NULL ||
        buf_printf(&add->out, "ms %.*s %ld F%.*s T%ld ME E%.*s\r\n", (int)nkey, key, vlen,
                   (int)nflags, flags, left < 0 ? 0 : left == 0 ? 1 : left, (int)ncas, cas) < 0 ||
        buf_append(&add->out, data, (size_t)vlen + 2) < 0) {
        if (add) frag_destroy(add);
        w->m.out_of_memory++;
        return;
    }
    struct upnode *cold = w->map[topo_route(w->topo, key, nkey)];
    if (!upnode_up(cold)) {
        frag_destroy(add);
        return;
    }
    w->m.warm_fills++;
    upnode_submit(cold, add);
}
