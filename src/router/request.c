/* request.c — request and fragment lifetimes, reply framing, and merging fragment replies
 * (see request.h). */
#include "router/request.h"

#include "router/replyframe.h"

#include <stdlib.h>
#include <string.h>

#include "router/client.h"
#include "router/replica.h"
#include "router/statsmerge.h"
#include "router/warm.h"

/* Freed requests and fragments are kept for reuse by the thread that freed them (each worker
 * creates and frees its own), with their small buffers: malloc and free were a fifth of the
 * router's CPU time at pipeline depth 16. At most POOL_MAX of each, buffers up to POOL_BUF. */
#define POOL_MAX 1024
#define POOL_BUF 4096
static __thread struct rreq *rreq_pool;
static __thread struct frag *frag_pool;
static __thread unsigned rreq_pooled, frag_pooled;

/* Keep b's storage for reuse when it is small, emptied; else free it. */
static void pool_buf(struct buf *b)
{
    if (b->cap <= POOL_BUF) b->off = b->len = 0;
    else buf_release(b);
}

struct rreq *rreq_create(struct client *cl, enum rreq_kind kind, enum proto_cmd cmd)
{
    struct rreq *rq = rreq_pool;
    if (rq) {
        rreq_pool = rq->next;
        rreq_pooled--;
        struct buf reply = rq->reply;
        memset(rq, 0, sizeof *rq);
        rq->reply = reply;
    } else {
        rq = calloc(1, sizeof *rq);
        if (rq == NULL) return NULL;
        buf_init(&rq->reply);
    }
    rq->cl = cl;
    rq->kind = kind;
    rq->cmd = cmd;
    rq->start_us = cl->w->now_us;
    buf_init(&rq->held);
    return rq;
}

void rreq_destroy(struct rreq *rq)
{
    for (uint16_t i = 0; i < rq->nfrags && rq->frags; i++) {
        struct frag *f = rq->frags[i];
        if (f == NULL) continue;
        if (f->completed) frag_destroy(f);
        else f->rq = NULL; /* still queued upstream: its reply will be read and dropped */
    }
    if (rq->frags != &rq->frag1) free(rq->frags);
    buf_release(&rq->held);
    free(rq->mgline);
    free(rq->keys);
    free(rq->keyfrag);
    if (rreq_pooled < POOL_MAX) {
        pool_buf(&rq->reply);
        rq->next = rreq_pool;
        rreq_pool = rq;
        rreq_pooled++;
        return;
    }
    buf_release(&rq->reply);
    free(rq);
}

void rreq_discard(struct rreq *rq)
{
    for (uint16_t k = 0; k < rq->nfrags; k++) frag_destroy(rq->frags[k]);
    rq->nfrags = 0;
    rreq_destroy(rq);
}

struct frag *frag_create(struct rreq *rq, uint16_t idx)
{
    struct frag *f = frag_pool;
    if (f) {
        frag_pool = f->next;
        frag_pooled--;
        struct buf out = f->out;
        memset(f, 0, sizeof *f);
        f->out = out;
    } else {
        f = calloc(1, sizeof *f);
        if (f == NULL) return NULL;
        buf_init(&f->out);
    }
    f->rq = rq;
    f->idx = idx;
    f->pool = f->ns = -1;
    buf_init(&f->reply);
    return f;
}

static bool quiet_to_node(const struct proto_req *req)
{
    return req->cmd == CMD_MA && req->meta.quiet;
}

const char *frag_quiet_drop(const struct proto_req *req, bool quiet)
{
    return quiet && !quiet_to_node(req) ? "q" : NULL;
}

int frag_quiet_mn(struct frag *f, const struct proto_req *req)
{
    if (!quiet_to_node(req)) return 0;
    f->quiet_mn = true;
    return buf_append(&f->out, "mn\r\n", 4);
}

bool frag_keep(struct frag *f, struct keepbudget *kb, uint64_t n)
{
    frag_unkeep(f);
    if (n > kb->max) return false;
    if (__atomic_add_fetch(&kb->used, n, __ATOMIC_RELAXED) > kb->max ||
        membudget_used(kb->mb) + n > kb->mb->max) {
        __atomic_sub_fetch(&kb->used, n, __ATOMIC_RELAXED);
        return false;
    }
    uint64_t acct = 0;
    membudget_account(kb->mb, &acct, n);
    f->kb = kb;
    f->kept = n;
    return true;
}

void frag_unkeep(struct frag *f)
{
    if (f->kept == 0) return;
    __atomic_sub_fetch(&f->kb->used, f->kept, __ATOMIC_RELAXED);
    membudget_account(f->kb->mb, &f->kept, 0); /* zeroes f->kept */
    f->kb = NULL;
}

void frag_destroy(struct frag *f)
{
    frag_unkeep(f);
    replica_write_free(f->repl);
    buf_release(&f->reply);
    if (frag_pooled < POOL_MAX) {
        pool_buf(&f->out);
        f->next = frag_pool;
        frag_pool = f;
        frag_pooled++;
        return;
    }
    buf_release(&f->out);
    free(f);
}

void request_pools_drain(void)
{
    replica_pool_drain();
    while (rreq_pool) {
        struct rreq *rq = rreq_pool;
        rreq_pool = rq->next;
        buf_release(&rq->reply);
        free(rq);
    }
    while (frag_pool) {
        struct frag *f = frag_pool;
        frag_pool = f->next;
        buf_release(&f->out);
        free(f);
    }
    rreq_pooled = frag_pooled = 0;
}

/* Is this the reply quiet mode hides? mg: a miss (EN); ms, md: success (HD). (A quiet ma's
 * node hides its own: frag_quiet_mn.) */
static bool reply_routine(enum proto_cmd cmd, const char *r, size_t n)
{
    const char *code = cmd == CMD_MG ? "EN" : "HD";
    return n >= 3 && r[0] == code[0] && r[1] == code[1] && (r[2] == ' ' || r[2] == '\r' ||
                                                            r[2] == '\n');
}

/* Does quiet mode hide rq's merged reply (RQ_ALL, RQ_CAS: fragment 0's answer unless another
 * failed)? For a quiet ma, when it is fragment 0's and its node hid it. */
static bool merged_routine(const struct rreq *rq)
{
    const struct frag *f0 = rq->frags[0];
    size_t n = buf_used(&rq->reply);
    if (!f0->quiet_mn) return reply_routine(rq->cmd, buf_start(&rq->reply), n);
    return f0->hidden && n == buf_used(&f0->reply) &&
           !memcmp(buf_start(&rq->reply), buf_start(&f0->reply), n);
}

static bool reply_starts(const struct buf *b, const char *s)
{
    size_t n = strlen(s);
    return buf_used(b) >= n && !memcmp(buf_start(b), s, n);
}

/* Length of the VALUE block at p (within n bytes) and its key; 0 when it is not one. */
static size_t value_block(const char *p, size_t n, const char **key, size_t *nkey)
{
    if (n < 6 || memcmp(p, "VALUE ", 6)) return 0;
    const char *nl = memchr(p, '\n', n);
    if (nl == NULL) return 0;
    long vlen = reply_token_num(p, nl + 1, 3);
    if (vlen < 0) return 0;
    *key = p + 6;
    const char *e = memchr(*key, ' ', (size_t)(nl - *key));
    *nkey = e ? (size_t)(e - *key) : 0;
    size_t len = (size_t)(nl - p) + 1 + (size_t)vlen + 2;
    return len <= n ? len : 0;
}

/* Walk a split multi-get's keys in the client's order, matching each to the next VALUE block of
 * its fragment's reply (replies keep the order keys were sent in, misses leave no block): calls
 * fn(ctx, i, block, len) for key i, with len 0 for a miss. Returns -1 if memory ran out (before
 * any call) or a call returned < 0, else 0. */
static int multiget_walk(const struct rreq *rq,
                         int (*fn)(void *ctx, uint32_t i, const char *block, size_t len), void *ctx)
{
    size_t curstack[64], *cur = rq->nfrags <= 64 ? curstack : calloc(rq->nfrags, sizeof *cur);
    if (cur == NULL) return -1;
    if (cur == curstack) memset(cur, 0, sizeof curstack);
    const char *kp = rq->keys, *kend = rq->keys + rq->nkeys_bytes, *key;
    uint8_t nk;
    int rc = 0;
    for (uint32_t i = 0; i < rq->nkeys && proto_next_key(&kp, kend, &key, &nk); i++) {
        struct frag *f = rq->frags[rq->keyfrag[i]];
        size_t *c = &cur[rq->keyfrag[i]];
        const char *block = buf_start(&f->reply) + *c, *bk;
        size_t nbk;
        size_t blen = value_block(block, buf_used(&f->reply) - *c, &bk, &nbk);
        if (blen == 0 || nbk != nk || memcmp(bk, key, nk)) blen = 0; /* a miss */
        *c += blen;
        if (fn(ctx, i, block, blen) < 0) rc = -1;
    }
    if (cur != curstack) free(cur);
    return rc;
}

struct misses_ctx {
    bool *miss;
    uint32_t n;
};

static int note_miss(void *ctx, uint32_t i, const char *block, size_t len)
{
    struct misses_ctx *m = ctx;
    (void)block;
    m->miss[i] = len == 0;
    m->n += len == 0;
    return 0;
}

uint32_t multiget_misses(const struct rreq *rq, bool *miss)
{
    struct misses_ctx m = {.miss = miss};
    return multiget_walk(rq, note_miss, &m) == 0 ? m.n : 0;
}

static int append_hit(void *ctx, uint32_t i, const char *block, size_t len)
{
    (void)i;
    return len ? buf_append(ctx, block, len) : 0;
}

/* Put the merged reply of a split multi-get into rq->reply: VALUE blocks in the client's key
 * order, or the first fragment's error when any failed (a partial answer would read as
 * misses). Returns -1 when memory runs out. */
static int merge_multiget(struct rreq *rq)
{
    for (uint16_t i = 0; i < rq->nfrags; i++) {
        struct frag *f = rq->frags[i];
        if (f->failed) return buf_append(&rq->reply, buf_start(&f->reply), buf_used(&f->reply));
    }
    int rc = multiget_walk(rq, append_hit, &rq->reply);
    if (buf_append(&rq->reply, "END\r\n", 5) < 0) rc = -1;
    return rc;
}

static bool reply_is_error(const struct buf *b)
{
    return reply_starts(b, "SERVER_ERROR") || reply_starts(b, "CLIENT_ERROR") ||
           reply_starts(b, "ERROR");
}

/* One command sent to several nodes (flush_all to all, writes to a replicated pool): when
 * every node answered the same, that answer; else the first error; else the first node's
 * answer (e.g. DELETED from one replica, NOT_FOUND from another). */
static int merge_all(struct rreq *rq)
{
    const struct buf *first = &rq->frags[0]->reply, *pick = first;
    bool same = true;
    for (uint16_t i = 0; i < rq->nfrags; i++) {
        const struct frag *f = rq->frags[i];
        if (buf_used(&f->reply) != buf_used(first) ||
            memcmp(buf_start(&f->reply), buf_start(first), buf_used(first)))
            same = false;
        if ((f->failed || reply_is_error(&f->reply)) && pick == first && !rq->frags[0]->failed &&
            !reply_is_error(first))
            pick = &f->reply;
    }
    if (same) pick = first;
    return buf_append(&rq->reply, buf_start(pick), buf_used(pick));
}

static const char oom_reply[] = "SERVER_ERROR out of memory\r\n";

/* rq's reply is complete: record its latency for namespace `ns` (index in the routing table,
 * -1: none, as for flush_all). A request counts once, under its first key's namespace, which
 * tags its fragment 0 (route.c). */
static void rreq_latency(const struct rreq *rq, int32_t ns)
{
    struct rworker *w = rq->cl->w;
    scopestat_latency(&w->r->scopes, w->id, -1, ns, w->now_us - rq->start_us);
}

static const char over_reply[] =
    "SERVER_ERROR shoal-router: reply dropped: over --out-max bytes of replies are waiting for "
    "this client to read them\r\n";

/* May `n` more reply bytes be kept for client c? Its unsent output and the replies held for
 * its requests stay within --out-max; a reply that would pass it is replaced by an error, so
 * a client that sends without reading cannot make the router hold more (its input is paused
 * at a quarter of it, but the requests already in flight still answer). */
static bool client_reply_room(struct rworker *w, const struct client *c, size_t n)
{
    if (buf_used(&c->wbuf) + c->held + n <= w->r->cfg.out_max) return true;
    w->m.replies_dropped++;
    return false;
}

void frag_part(struct frag *f, const char *line, size_t n)
{
    struct rreq *rq = f->rq;
    if (rq == NULL || f->overflow) return; /* the client has gone: read and dropped */
    struct client *c = rq->cl;
    if (rq->kind == RQ_DUMP) {
        if (rq->over) return;
        if (!client_reply_room(c->w, c, n)) {
            rq->over = true; /* the rest is read and dropped; the reply ends in an error */
            return;
        }
        struct buf *to = &rq->reply;
        if (c->head == rq) { /* its turn: what was held goes out first, then the lines */
            if (buf_used(&rq->reply) &&
                buf_append(&c->wbuf, buf_start(&rq->reply), buf_used(&rq->reply)) < 0)
                goto oom;
            c->held -= rq->held_bytes;
            rq->held_bytes = 0;
            buf_consume(&rq->reply, buf_used(&rq->reply));
            to = &c->wbuf;
        } else {
            c->held += n;
            rq->held_bytes += n;
        }
        if (buf_append(to, line, n) < 0) goto oom;
        client_mark_dirty(c);
        return;
    oom:
        c->w->m.out_of_memory++;
        rq->over = true;
        return;
    }
    /* RQ_STATS: kept until every node answered */
    if (buf_used(&f->reply) + n > STATSMERGE_REPLY_MAX || !client_reply_room(c->w, c, n) ||
        buf_append(&f->reply, line, n) < 0) {
        f->overflow = true;
        return;
    }
    c->held += n;
    rq->held_bytes += n;
}

/* The last line of a stats or dump fragment's reply (`failed`: the router's error). The
 * request completes with the merge (stats) or the closing END (dumps) when it was the last. */
static void frag_list_done(struct rreq *rq, struct frag *f, const char *reply, size_t n,
                           bool failed)
{
    struct client *c = rq->cl;
    bool end = !failed && n == 5 && !memcmp(reply, "END\r\n", 5);
    bool one_ok = !failed && rq->kind == RQ_STATS && rq->merge == STATSMERGE_FIRST &&
                  !(n >= 5 && (!memcmp(reply, "ERROR", 5) || !memcmp(reply, "CLIENT_", 7) ||
                               !memcmp(reply, "SERVER_", 7)));
    f->failed = f->overflow || !(end || one_ok);
    if (f->failed) { /* its error, for when no node answers */
        c->held -= buf_used(&f->reply);
        rq->held_bytes -= buf_used(&f->reply);
        buf_release(&f->reply);
        if (f->overflow) {
            static const char big[] = "SERVER_ERROR shoal-router: a node's stats reply is too "
                                      "large\r\n";
            reply = big;
            n = sizeof big - 1;
        }
    } else if (!one_ok) {
        n = 0; /* the lines are in f->reply (stats) or gone on (dumps); END is the router's */
    }
    if (n && buf_append(&f->reply, reply, n) < 0) {
        c->w->m.out_of_memory++;
        f->failed = true;
    }
    if (rq->pending > 0) return;
    rreq_latency(rq, -1);
    int rc = rq->kind == RQ_STATS ? statsmerge_reply(rq) : statsmerge_dump_end(rq);
    if (rc < 0) {
        c->w->m.out_of_memory++;
        buf_release(&rq->reply);
        buf_append(&rq->reply, oom_reply, sizeof oom_reply - 1);
    }
    rq->done = true;
}

void frag_complete(struct frag *f, const char *reply, size_t n, bool failed)
{
    if (f->repl) replica_frag_done(f, reply, n, failed); /* even when the client has gone */
    struct rreq *rq = f->rq;
    if (rq == NULL) {
        frag_destroy(f);
        return;
    }
    struct client *c = rq->cl;
    f->completed = true;
    rq->pending--;
    if (rq->kind == RQ_STATS || rq->kind == RQ_DUMP) {
        frag_list_done(rq, f, reply, n, failed);
    } else if (rq->kind == RQ_FORWARD) {
        rreq_latency(rq, f->ns);
        rq->frags[f->idx] = NULL;
        /* an mg's miss in a cold pool is looked up in its warm pool; that answer ends it */
        bool later = rq->warm_mg && warm_mg_step(rq, f, &reply, &n, &failed);
        bool node_quiet = f->quiet_mn, hidden = f->hidden;
        frag_destroy(f);
        if (later) { /* rq may be gone already: the lookup can fail at once */
            client_mark_dirty(c);
            return;
        }
        bool drop = rq->noreply ||
                    (rq->quiet && !failed &&
                     (node_quiet ? hidden : reply_routine(rq->cmd, reply, n)));
        if (!drop) {
            struct buf *to = c->head == rq && !rq->lget_part ? &c->wbuf : &rq->reply;
            if (!client_reply_room(c->w, c, n)) {
                reply = over_reply;
                n = sizeof over_reply - 1;
            }
            if (to == &rq->reply) {
                c->held += n;
                rq->held_bytes += n;
            }
            if (buf_append(to, reply, n) < 0) {
                c->w->m.out_of_memory++;
                buf_append(to, oom_reply, sizeof oom_reply - 1);
            }
            rq->direct = to == &c->wbuf;
        }
        rq->done = true;
    } else {
        if (f->warm) { /* a meta reply from the warm pool, turned into a get reply */
            warm_reply(f, reply, n, failed);
            reply = NULL;
            n = 0;
            failed = false;
        }
        /* a get fragment's reply is whole only when it ends with END */
        bool ok = f->warm || (!failed && (rq->kind != RQ_MULTIGET ||
                                          (n >= 5 && !memcmp(reply + n - 5, "END\r\n", 5))));
        f->failed = !ok;
        if (n && !client_reply_room(c->w, c, n)) {
            reply = over_reply;
            n = sizeof over_reply - 1;
            f->failed = true;
        }
        c->held += n;
        rq->held_bytes += n;
        if (n && buf_append(&f->reply, reply, n) < 0) {
            c->w->m.out_of_memory++;
            f->failed = true;
            buf_release(&f->reply);
            buf_append(&f->reply, oom_reply, sizeof oom_reply - 1);
        }
        if (rq->pending == 0 && rq->warmable && !rq->warmed && warm_start(rq)) {
            client_mark_dirty(c); /* the warm pool's answers complete it */
            return;
        }
        if (rq->pending == 0) {
            rreq_latency(rq, rq->frags[0]->ns);
            int rc = rq->kind == RQ_MULTIGET ? merge_multiget(rq)
                   : rq->kind == RQ_CAS ? buf_append(&rq->reply, buf_start(&rq->frags[0]->reply),
                                                     buf_used(&rq->frags[0]->reply))
                   : merge_all(rq);
            if (rc < 0) {
                c->w->m.out_of_memory++;
                buf_release(&rq->reply);
                buf_append(&rq->reply, oom_reply, sizeof oom_reply - 1);
            }
            if (rq->noreply || (rq->quiet && merged_routine(rq)))
                buf_release(&rq->reply);
            rq->done = true;
        }
    }
    if (rq->done) client_drain(c);
    client_mark_dirty(c);
}
