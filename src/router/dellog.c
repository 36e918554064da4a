/* dellog.c — recent deletes per worker, replayed after a promotion (see dellog.h). */
#include "router/dellog.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "router/repairlog.h"
#include "router/replica.h"
#include "router/route.h"
#include "router/upstream.h"
#include "router/worker.h"

#define DELLOG_HDR 11 /* u64 ms, u16 slot, u8 nkey */

void dellog_init(struct dellog *l, size_t cap)
{
    memset(l, 0, sizeof *l);
    if (cap < 4096) cap = cap ? 4096 : 0; /* room for a few keys of any size */
    if (cap && (l->buf = malloc(cap)) != NULL) l->cap = cap;
}

void dellog_free(struct dellog *l)
{
    free(l->buf);
    memset(l, 0, sizeof *l);
}

/* Copy n bytes into / out of the ring at offset `at` (wrapping). */
static void ring_write(struct dellog *l, size_t at, const void *src, size_t n)
{
    at %= l->cap;
    size_t first = n < l->cap - at ? n : l->cap - at;
    memcpy(l->buf + at, src, first);
    memcpy(l->buf, (const uint8_t *)src + first, n - first);
}

static void ring_read(const struct dellog *l, size_t at, void *dst, size_t n)
{
    at %= l->cap;
    size_t first = n < l->cap - at ? n : l->cap - at;
    memcpy(dst, l->buf + at, first);
    memcpy((uint8_t *)dst + first, l->buf, n - first);
}

void dellog_put(struct dellog *l, uint64_t ms, uint16_t slot, const char *key, size_t nkey)
{
    size_t need = DELLOG_HDR + nkey;
    if (l->cap == 0 || nkey > 255 || need > l->cap) return;
    while (l->cap - l->used < need) { /* forget the oldest */
        uint8_t hdr[DELLOG_HDR];
        ring_read(l, l->head, hdr, DELLOG_HDR);
        size_t sz = DELLOG_HDR + hdr[10];
        l->head = (l->head + sz) % l->cap;
        l->used -= sz;
    }
    uint8_t hdr[DELLOG_HDR];
    memcpy(hdr, &ms, 8);
    memcpy(hdr + 8, &slot, 2);
    hdr[10] = (uint8_t)nkey;
    size_t tail = l->head + l->used;
    ring_write(l, tail, hdr, DELLOG_HDR);
    ring_write(l, tail + DELLOG_HDR, key, nkey);
    l->used += need;
}

void dellog_each(const struct dellog *l, uint64_t since_ms,
                 void (*fn)(void *ctx, uint64_t ms, uint16_t slot, const char *key, size_t nkey),
                 void *ctx)
{
    char key[256];
    for (size_t off = 0; off < l->used;) {
        uint8_t hdr[DELLOG_HDR];
        ring_read(l, l->head + off, hdr, DELLOG_HDR);
        uint64_t ms;
        uint16_t slot;
        memcpy(&ms, hdr, 8);
        memcpy(&slot, hdr + 8, 2);
        size_t nkey = hdr[10];
        if (ms >= since_ms) {
            ring_read(l, l->head + off + DELLOG_HDR, key, nkey);
            fn(ctx, ms, slot, key, nkey);
        }
        off += DELLOG_HDR + nkey;
    }
}

void dellog_note(struct rworker *w, const char *key, size_t nkey)
{
    if (w->dellog.cap == 0 || topo_pool_of(w->topo, key, nkey)->replica == NULL) return;
    dellog_put(&w->dellog, w->now_ms, slot_of_key(key, nkey), key, nkey);
}

void dellog_promoted(struct router *r, uint64_t version, const uint16_t *slots, size_t n,
                     const uint8_t *group, const uint64_t *since, size_t ngroups)
{
    pthread_mutex_lock(&r->promo_lock);
    uint64_t seq = r->promo_seq + 1;
    struct dellog_promo *p = &r->promo[seq % DELLOG_PROMOS];
    p->seq = seq;
    p->version = version;
    memset(p->group, 0, sizeof p->group);
    memset(p->since, 0, sizeof p->since);
    if (ngroups > DELLOG_GROUPS - 1) ngroups = DELLOG_GROUPS - 1;
    if (ngroups) memcpy(p->since, since, ngroups * sizeof *since); /* the last stays 0 */
    for (size_t i = 0; i < n; i++) /* a group out of range: the whole window */
        p->group[slots[i]] =
            (uint8_t)(1 + (group && group[i] < ngroups ? group[i] : DELLOG_GROUPS - 1));
    __atomic_store_n(&r->promo_seq, seq, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&r->promo_lock);
}

#define DELLOG_BATCH 256 /* deletes per batch to one node, as the invalidator's default */

struct replay_ctx {
    struct rworker *w;
    const uint64_t *since; /* per slot: replay deletes logged at or after; UINT64_MAX: none */
    struct upnode *owner;  /* a catch-up (catchup.h): the failed primary, else NULL */
    uint64_t cut;          /* ...its deletes logged at or after this go to their replicas */
    uint32_t batches;
    uint64_t sent, skipped;
    struct frag **open;   /* per node of the table (w->nmap): its batch being filled */
    uint32_t *nopen;      /* ...and how many deletes it holds */
};

/* Send node i's open batch: its deletes, then the mn that ends the reply. */
static void replay_flush(struct replay_ctx *x, uint32_t i)
{
    struct frag *f = x->open[i];
    if (f == NULL) return;
    x->open[i] = NULL;
    x->nopen[i] = 0;
    if (buf_append(&f->out, "mn\r\n", 4) < 0) {
        frag_destroy(f);
        x->w->m.out_of_memory++;
        return;
    }
    f->quiet_batch = true;
    x->batches++;
    if (x->owner) { /* answered: catchup_batch_done, through replica_frag_done */
        if (replica_tag(f, x->w->map[i], REPL_CATCHUP, NULL, 0) < 0) x->w->m.out_of_memory++;
        else x->w->catchup_inflight++; /* before: a failure at once answers it */
    }
    upnode_submit(x->w->map[i], f);
}

/* One logged delete: into a batch for its owner in the worker's table when its slot was
 * promoted (`md <key> q` lines closed by `mn`, as the invalidator delivers them: the node
 * answers only NF and errors, and the batch goes in one write). */
static void replay_one(void *arg, uint64_t ms, uint16_t slot, const char *key, size_t nkey)
{
    struct replay_ctx *x = arg;
    struct rworker *w = x->w;
    uint32_t i;
    if (x->owner) { /* a catch-up: the failed primary's copies-2 keys, to their replicas */
        if (ms < x->cut) return;
        uint32_t o = topo_route(w->topo, key, nkey);
        int64_t r = topo_replica_route(w->topo, key, nkey);
        if (w->map[o] != x->owner || r < 0 || (uint32_t)r == o) return;
        i = (uint32_t)r;
    } else {
        if (ms < x->since[slot]) return; /* not promoted, or the new primary has it */
        i = topo_route(w->topo, key, nkey);
    }
    if (!upnode_up(w->map[i])) { /* its repair covers it, if it ever comes back */
        x->skipped++;
        return;
    }
    struct frag *f = x->open[i];
    if (f == NULL && (f = x->open[i] = frag_create(NULL, 0)) != NULL)
        route_tag(w->topo, f, key, nkey, false);
    size_t mark = f ? f->out.len : 0;
    if (f == NULL || repairlog_delete_line(&f->out, key, nkey) < 0 ||
        (f->out.len -= 2, buf_append(&f->out, " q\r\n", 4)) < 0) {
        if (f) f->out.len = mark; /* the batch keeps its whole lines */
        w->m.out_of_memory++;
        x->skipped++;
        return;
    }
    if (x->owner) w->m.catchup_deletes++;
    else w->m.replayed_deletes++;
    x->sent++;
    if (++x->nopen[i] >= DELLOG_BATCH) replay_flush(x, i);
}

void dellog_sync(struct rworker *w)
{
    struct router *r = w->r;
    uint64_t seq = __atomic_load_n(&r->promo_seq, __ATOMIC_ACQUIRE);
    if (seq == w->promo_seen || !worker_topology_ready(w)) return;
    uint64_t *since = malloc(SLOT_COUNT * sizeof *since);
    if (since == NULL) { /* the next batch tries again */
        w->m.out_of_memory++;
        return;
    }
    for (size_t s = 0; s < SLOT_COUNT; s++) since[s] = UINT64_MAX;
    uint64_t window = r->cfg.replay_window_s * 1000;
    uint64_t floor = w->now_ms > window ? w->now_ms - window : 0; /* the outer bound */
    uint64_t version = 0, nslots = 0, oldest = UINT64_MAX, newest = 0;
    bool any = false;
    pthread_mutex_lock(&r->promo_lock);
    for (uint64_t s = w->promo_seen + 1; s <= seq; s++) {
        const struct dellog_promo *p = &r->promo[s % DELLOG_PROMOS];
        if (p->seq != s) continue; /* overwritten: over DELLOG_PROMOS versions behind */
        if (p->version > w->topo->version) { /* published, not adopted yet: next batch */
            seq = s - 1;
            break;
        }
        for (size_t i = 0; i < SLOT_COUNT; i++) {
            if (p->group[i] == 0) continue;
            uint64_t from = dellog_cutoff(floor, p->since[p->group[i] - 1]);
            if (from < since[i]) since[i] = from; /* promoted twice: the older need */
        }
        version = p->version;
        any = true;
    }
    pthread_mutex_unlock(&r->promo_lock);
    w->promo_seen = seq;
    if (!any) {
        free(since);
        return;
    }
    for (size_t i = 0; i < SLOT_COUNT; i++) {
        if (since[i] == UINT64_MAX) continue;
        nslots++;
        if (since[i] < oldest) oldest = since[i];
        if (since[i] > newest) newest = since[i];
    }
    struct replay_ctx x = {w, since, NULL, 0, 0, 0, 0, calloc(w->nmap, sizeof *x.open),
                           calloc(w->nmap, sizeof *x.nopen)};
    if (x.open == NULL || x.nopen == NULL) {
        w->m.out_of_memory++;
        log_error("worker %d: out of memory replaying recent deletes after a promotion", w->id);
    } else if (window) {
        dellog_each(&w->dellog, oldest, replay_one, &x);
        for (uint32_t i = 0; i < w->nmap; i++) replay_flush(&x, i);
    }
    free(x.open);
    free(x.nopen);
    free(since);
    /* the cutoff: how far back the replay went, oldest and newest start over the slots (the
     * window's start when the new primary's stamp was unknown) */
    log_notice("worker %d: topology version %llu promoted %llu slots: %llu recent deletes sent "
               "again to their new primaries (cutoff %llu..%llu ms ago; window %llu s)%s",
               w->id, (unsigned long long)version, (unsigned long long)nslots,
               (unsigned long long)x.sent,
               (unsigned long long)(w->now_ms > newest ? w->now_ms - newest : 0),
               (unsigned long long)(w->now_ms > oldest ? w->now_ms - oldest : 0),
               (unsigned long long)r->cfg.replay_window_s,
               x.skipped ? " (some skipped: primary down or no memory)" : "");
}

uint64_t dellog_catchup(struct rworker *w, struct upnode *owner, uint64_t since,
                        uint32_t *batches)
{
    uint64_t window = w->r->cfg.replay_window_s * 1000;
    uint64_t floor = w->now_ms > window ? w->now_ms - window : 0;
    struct replay_ctx x = {w, NULL, owner, dellog_cutoff(floor, since), 0, 0, 0,
                           calloc(w->nmap, sizeof *x.open), calloc(w->nmap, sizeof *x.nopen)};
    *batches = 0;
    if (x.open == NULL || x.nopen == NULL) {
        w->m.out_of_memory++;
        log_error("worker %d: out of memory sending recent deletes to a failed primary's "
                  "replicas", w->id);
    } else if (window && w->dellog.used) {
        dellog_each(&w->dellog, x.cut, replay_one, &x);
        for (uint32_t i = 0; i < w->nmap; i++) replay_flush(&x, i);
    }
    free(x.open);
    free(x.nopen);
    *batches = x.batches;
    return x.sent;
}

uint64_t dellog_cutoff(uint64_t floor, uint64_t since)
{
    return since > floor ? since : floor;
}
