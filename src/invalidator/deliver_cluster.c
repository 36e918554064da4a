/* deliver_cluster.c — one cluster's delivery thread (deliver_cluster_main): it loops, spilling
 * the memory queue if it is over its bound; taking the next batch off the head of the backlog
 * (spilled records first, then memory; stopping at a commit its replica has not replayed);
 * connecting if needed; sending it; on success popping the records the batch finished and
 * moving the cluster's safe LSN. A record is popped only by that thread, so the batch may point
 * into records without holding the queue's lock. The API that feeds it is deliver.c. */
#include "invalidator/deliver_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"

#define BACKOFF_MAX_MS 1000
#define IDLE_PROBE_MS 1000
#define REFS_MAX 4096
/* A batch that is not full waits until its first delete is this old before it goes, so that at
 * thousands of commits a second one write carries many deletes: each write, reply and wakeup
 * costs more CPU than the deletes in it (issue 14's 20 µs a change), and a millisecond is
 * little beside the 100 ms commit-to-delete budget. */
#define LINGER_US 1000

static void cv_wait_ms(struct dcluster *c, uint64_t ms)
{
    struct timespec ts = clock_deadline(ms);
    pthread_mutex_lock(&c->lock);
    while (!c->wake && !__atomic_load_n(&c->d->stop, __ATOMIC_ACQUIRE))
        if (pthread_cond_timedwait(&c->cv, &c->lock, &ts) == ETIMEDOUT) break;
    c->wake = false;
    pthread_mutex_unlock(&c->lock);
}

void deliver_wake(struct dcluster *c)
{
    pthread_mutex_lock(&c->lock);
    c->wake = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
}

static void safe_to(struct dcluster *c, uint64_t lsn)
{
    uint64_t cur = __atomic_load_n(&c->safe, __ATOMIC_ACQUIRE);
    while (lsn > cur &&
           !__atomic_compare_exchange_n(&c->safe, &cur, lsn, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
    }
}

/* ---- the backlog: front (loaded from the spill file), the rest of the file, memory ---- */

/* The i-th record of the backlog, loading spilled records as needed; NULL past the end. */
static struct rec *backlog_at(struct dcluster *c, size_t i)
{
    while (i >= c->front.n && spill_pending(&c->spill)) {
        if (recq_reserve(&c->front, 1) < 0) return NULL;
        bool bad;
        struct rec *r = spill_load(&c->spill, &bad);
        if (!r) break;
        recq_push(&c->front, r);
    }
    if (i < c->front.n) return recq_at(&c->front, i);
    if (spill_pending(&c->spill)) return NULL;
    size_t j = i - c->front.n;
    pthread_mutex_lock(&c->lock);
    struct rec *r = j < c->q.n ? recq_at(&c->q, j) : NULL;
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* Pop the backlog's first record, which is `expect` or a copy of it read back from the spill
 * file; the caller unrefs it. A batch's records are in memory (front, or the memory queue) unless
 * the batch was kept over a failure while they were spilled: so the file is read only when the
 * memory queue's head is not the record expected (a record the batch put back behind them in the
 * file, after an error, must not be read in their place). */
static struct rec *backlog_pop(struct dcluster *c, const struct rec *expect)
{
    if (!c->front.n) {
        pthread_mutex_lock(&c->lock);
        bool in_q = c->q.n && recq_at(&c->q, 0) == expect;
        pthread_mutex_unlock(&c->lock);
        if (!in_q) backlog_at(c, 0);
    }
    if (c->front.n) {
        struct rec *r = recq_pop(&c->front);
        c->spill.records--;
        if (r->kind == REC_KEYS) c->spill.keys -= r->n;
        return r;
    }
    pthread_mutex_lock(&c->lock);
    struct rec *r = recq_pop(&c->q);
    pthread_mutex_unlock(&c->lock);
    return r;
}

static bool spill_empty(const struct dcluster *c) { return !c->front.n && !spill_pending(&c->spill); }

/* The cluster answered on its connection (up), or the connection failed (down): logged when
 * that changes, not at every reconnection of a cluster that accepts and then does not answer. */
static void set_answering(struct dcluster *c, bool up)
{
    if (up && !c->answering)
        log_notice("cluster %s: answering on %s%s", c->name, c->routers[c->router_at],
                   c->router_at ? " (failed over: the routers before it do not answer)" : "");
    else if (!up && c->answering)
        log_warn("cluster %s: down (%s); its deletes are kept until it answers", c->name,
                 c->routers[c->router_at]);
    c->answering = up;
}

/* Publish the thread's own state for metrics. */
static void publish(struct dcluster *c)
{
    pthread_mutex_lock(&c->lock);
    c->st.up = c->answering && c->fd >= 0;
    c->st.buffered_deletes = c->q.items;
    c->st.buffered_bytes = c->q.bytes;
    c->st.spilled_deletes = c->spill.keys;
    c->st.retry_deletes = c->retry.keys;
    c->st.spill_bytes = c->spill.end;
    c->st.router_index = c->router_at;
    pthread_mutex_unlock(&c->lock);
}

/* Past spill_max_bytes: everything spilled (and waiting to be retried) becomes one flush of the
 * namespaces it touches (a flush_all when they are not all known), logged loudly. */
static void replace_by_flush(struct dcluster *c, const struct rec *lastrec)
{
    struct spill *s = &c->spill;
    /* the namespaces of both files, once each */
    const char *names[64];
    size_t nnames = 0;
    bool all = s->ns_overflow || c->retry.ns_overflow;
    const struct spill *files[2] = {s, &c->retry};
    for (int k = 0; k < 2 && !all; k++)
        for (size_t i = 0; i < files[k]->nns; i++) {
            size_t j = 0;
            while (j < nnames && strcmp(names[j], files[k]->ns[i])) j++;
            if (j == nnames) names[nnames++] = files[k]->ns[i];
        }
    if (!all && nnames == 0 && (s->keys || c->retry.keys)) all = true; /* cannot happen: safe */
    size_t ndata = 0;
    for (size_t i = 0; !all && i < nnames; i++) ndata += rec_item_size(0, strlen(names[i]));
    struct rec *f = rec_new(REC_FLUSH, all ? 0 : (uint32_t)nnames, (uint32_t)ndata);
    if (!f) return; /* tried again at the next spill */
    size_t at = 0;
    char nslist[512];
    size_t nl = 0;
    nslist[0] = 0;
    for (size_t i = 0; !all && i < nnames; i++) {
        at += rec_pack(f->data + at, NULL, 0, names[i], strlen(names[i]));
        if (nl < sizeof nslist)
            nl += (size_t)snprintf(nslist + nl, sizeof nslist - nl, "%s%s", i ? ", " : "", names[i]);
    }
    f->last = 1;
    /* held for a replica until it has replayed the newest commit the flush stands for */
    f->lsn = s->max_lsn > lastrec->lsn ? s->max_lsn : lastrec->lsn;
    f->safe_after = __atomic_load_n(&c->safe, __ATOMIC_ACQUIRE);
    f->commit_us = lastrec->commit_us;
    uint64_t keys = s->keys, bytes = s->end;
    if (spill_replace(s, &f, 1) == 0) {
        /* the flush covers the keys waiting to be retried too */
        uint64_t rkeys = c->retry.keys;
        if (c->retry.end) spill_reset(&c->retry);
        keys += rkeys;
        recq_clear(&c->front);
        c->head_done = c->head_off = 0;
        c->gen++;
        DC_COUNT(c, flush_replacements, 1);
        if (all)
            log_error("cluster %s: FLUSH: %llu undelivered deletes (%llu bytes spilled, over "
                      "spill_max_bytes %llu) are replaced by flush_all of the whole cluster (they "
                      "touch more than 32 namespaces, or keys of no known namespace); the "
                      "cluster loses all its cached items when it takes it",
                      c->name, (unsigned long long)keys, (unsigned long long)bytes,
                      (unsigned long long)c->d->cfg.spill_max_bytes);
        else
            log_error("cluster %s: FLUSH: %llu undelivered deletes (%llu bytes spilled, over "
                      "spill_max_bytes %llu) are replaced by a flush of the namespaces they "
                      "touch: %s; those namespaces lose their cached items when it takes it",
                      c->name, (unsigned long long)keys, (unsigned long long)bytes,
                      (unsigned long long)c->d->cfg.spill_max_bytes, nslist);
    }
    rec_unref(f);
}

/* Spill the memory queue when it is over mem_max_bytes: append it all (fsync) and count it
 * safe; then, over spill_max_bytes, replace the file by a flush. */
static void maybe_spill(struct dcluster *c)
{
    pthread_mutex_lock(&c->lock);
    size_t n = c->q.bytes > c->d->cfg.mem_max_bytes ? c->q.n : 0;
    struct rec **v = n ? malloc(n * sizeof *v) : NULL;
    for (size_t i = 0; v && i < n; i++) rec_ref(v[i] = recq_at(&c->q, i));
    pthread_mutex_unlock(&c->lock);
    if (!v) return;
    bool head_in_memory = spill_empty(c);
    int rc = spill_append(&c->spill, v, n);
    if (rc == 0) {
        /* a partly applied head goes whole to the file: its first keys are sent again */
        if (head_in_memory) c->head_done = c->head_off = 0;
        pthread_mutex_lock(&c->lock);
        for (size_t i = 0; i < n; i++) rec_unref(recq_pop(&c->q));
        c->st.spilled_records += n;
        pthread_mutex_unlock(&c->lock);
        safe_to(c, v[n - 1]->safe_after);
        if (c->spill.end + c->retry.end > c->d->cfg.spill_max_bytes) replace_by_flush(c, v[n - 1]);
        publish(c);
    } else {
        DC_COUNT(c, spill_errors, 1);
    }
    for (size_t i = 0; i < n; i++) rec_unref(v[i]);
    free(v);
}

/* ---- batches ---- */

struct batch {
    struct bkey *keys;
    size_t nkeys, cap;
    size_t nfull;          /* records the batch finishes */
    uint32_t end_done, end_off; /* where the record after them stands after the batch */
    struct rec *flush;     /* a REC_FLUSH record alone */
    uint64_t gated;        /* the LSN the batch stopped at, waiting for the replica */
    /* A batch that failed is sent again as it is, so a key already refused is not counted
     * twice: it holds its records (they may meanwhile move to the spill file, as the same
     * bytes), unless a flush replaced the backlog (gen changed). */
    struct rec **refs;
    size_t nrefs;
    bool valid;
    uint64_t gen;
};

static void batch_release(struct batch *b)
{
    for (size_t i = 0; i < b->nrefs; i++) rec_unref(b->refs[i]);
    b->nrefs = 0;
    b->valid = false;
}

static void batch_hold(struct batch *b, struct rec *r)
{
    rec_ref(r);
    b->refs[b->nrefs++] = r;
}

static void batch_build(struct dcluster *c, struct batch *b)
{
    size_t max = c->d->cfg.batch_max;
    b->nkeys = b->nfull = 0;
    b->flush = NULL;
    b->gated = 0;
    b->end_done = c->head_done;
    b->end_off = c->head_off;
    b->gen = c->gen;
    b->valid = true;
    bool gate = c->replica && !__atomic_load_n(&c->replica_passthrough, __ATOMIC_ACQUIRE);
    uint64_t replayed = __atomic_load_n(&c->replica_lsn, __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < REFS_MAX; i++) {
        struct rec *r = backlog_at(c, i);
        if (!r) break;
        if (gate && r->lsn > replayed) {
            b->gated = r->lsn;
            break;
        }
        if (r->kind == REC_FLUSH) {
            if (i == 0) {
                b->flush = r;
                b->nfull = 1;
                batch_hold(b, r);
            }
            break;
        }
        batch_hold(b, r);
        uint32_t off = i ? 0 : c->head_off, done = i ? 0 : c->head_done;
        struct ritem it;
        while (b->nkeys < max) {
            uint32_t at = off;
            if (!rec_next(r, &at, &it)) break;
            off = at;
            done++;
            b->keys[b->nkeys++] = (struct bkey){it.key, (uint32_t)it.nkey, 0};
        }
        struct ritem more;
        uint32_t probe = off;
        if (!rec_next(r, &probe, &more)) {
            b->nfull++;
            b->end_done = b->end_off = 0;
            if (b->nkeys >= max) break;
        } else {
            b->end_done = done;
            b->end_off = off;
            break;
        }
    }
}

/* The batch went: pop what it finished, count, move the safe LSN. */
static void batch_done(struct dcluster *c, struct batch *b)
{
    int64_t now = clock_wall_us();
    uint64_t commits = 0, flushes = 0, safe = 0;
    for (size_t i = 0; i < b->nfull; i++) {
        struct rec *r = backlog_pop(c, b->refs[i]);
        if (!r) break;
        if (r->safe_after > safe) safe = r->safe_after;
        if (r->kind == REC_FLUSH) flushes++;
        if (r->last && r->lsn) {
            commits++;
            if (r->commit_us) {
                int64_t lat = now - r->commit_us;
                pthread_mutex_lock(&c->lock);
                dhist_record(&c->lat, lat > 0 ? (uint64_t)lat : 0);
                pthread_mutex_unlock(&c->lock);
            }
        }
        rec_unref(r);
    }
    c->head_done = b->end_done;
    c->head_off = b->end_off;
    if (safe) safe_to(c, safe);
    if (spill_empty(c) && c->spill.end) spill_reset(&c->spill);
    pthread_mutex_lock(&c->lock);
    c->st.commits += commits;
    c->st.flushes += flushes;
    uint64_t went = 0;
    for (size_t i = 0; i < b->nkeys; i++) went += b->keys[i].done;
    c->st.deletes += went;
    if (b->nkeys) {
        c->st.batches++;
        drate_add(&c->rate, now / 1000000, went, 1);
    }
    pthread_mutex_unlock(&c->lock);
}

static void backoff(struct dcluster *c)
{
    c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : 20;
    uint64_t cap = c->d->cfg.timeout_ms < BACKOFF_MAX_MS ? c->d->cfg.timeout_ms : BACKOFF_MAX_MS;
    if (c->backoff_ms > cap) c->backoff_ms = cap;
    c->retry_at_ms = clock_mono_ms() + c->backoff_ms;
}

/* Keys a cluster answered with an error other than CLIENT_ERROR (a router's node down or timed
 * out) must not hold up the cluster's later deletes (the keys of its other nodes would go stale
 * for the whole outage), yet must not be lost. They are appended to the cluster's retry file
 * (fsync'ed: safe, as any spilled delete), and the batch counts as done; retry_round sends them
 * again apart from the backlog. Deletes commute: a key deleted after a newer delete of another key
 * is still deleted. 0 when the batch may be counted done; -1 (no memory, the file cannot be
 * written) to keep the batch and send it again as it is. */
static int retry_later(struct dcluster *c, struct batch *b, size_t failed)
{
    size_t ndata = 0;
    for (size_t i = 0; i < b->nkeys; i++)
        if (!b->keys[i].done) ndata += rec_item_size(b->keys[i].nkey, 0);
    struct rec *r = rec_new(REC_KEYS, (uint32_t)failed, (uint32_t)ndata);
    if (!r) return -1;
    size_t at = 0;
    for (size_t i = 0; i < b->nkeys; i++)
        if (!b->keys[i].done) at += rec_pack(r->data + at, b->keys[i].key, b->keys[i].nkey, NULL, 0);
    int rc = spill_append(&c->retry, &r, 1);
    if (rc == 0) {
        DC_COUNT(c, retried_keys, failed);
        if (!c->retry_next_ms) c->retry_next_ms = clock_mono_ms() + 20;
        if (c->spill.end + c->retry.end > c->d->cfg.spill_max_bytes) replace_by_flush(c, r);
    } else {
        DC_COUNT(c, spill_errors, 1);
    }
    rec_unref(r);
    return rc;
}

/* Send the retry file's keys again, batch_max at a time; those that fail again are written to a
 * new retry file that replaces the old one (atomically, so a crash keeps one or the other). The
 * next round comes 20 ms later when some key went, else after a backoff doubling up to 1 s, so a
 * node down for long costs one pass over its keys a second. */
static void retry_round(struct dcluster *c)
{
    struct spill *r = &c->retry;
    if (!r->end || clock_mono_ms() < c->retry_next_ms || c->fd < 0) return;
    size_t max = c->d->cfg.batch_max, nsurv = 0, capsurv = 0;
    struct bkey *keys = calloc(max, sizeof *keys);
    struct rec **surv = NULL;
    bool progress = false, down = false, bad = false;
    r->rd = 0;
    struct rec *rec;
    while (keys && !down && (rec = spill_load(r, &bad))) {
        uint32_t off = 0;
        for (;;) {
            size_t n = 0;
            struct ritem it;
            while (n < max && rec_next(rec, &off, &it))
                keys[n++] = (struct bkey){it.key, (uint32_t)it.nkey, 0};
            if (!n) break;
            enum batch_res res = wire_delete(c, keys, n);
            if (res == BATCH_DOWN) {
                down = true;
                break;
            }
            size_t failed = 0, ndata = 0;
            for (size_t i = 0; i < n; i++)
                if (!keys[i].done) failed++, ndata += rec_item_size(keys[i].nkey, 0);
            progress |= failed < n;
            if (!failed) continue;
            struct rec *sr = rec_new(REC_KEYS, (uint32_t)failed, (uint32_t)ndata);
            if (nsurv == capsurv) {
                size_t cap = capsurv ? capsurv * 2 : 16;
                struct rec **v = realloc(surv, cap * sizeof *v);
                if (v) surv = v, capsurv = cap;
            }
            if (!sr || nsurv == capsurv) { /* keep the old file: it still has them */
                rec_unref(sr);
                down = true;
                break;
            }
            size_t at = 0;
            for (size_t i = 0; i < n; i++)
                if (!keys[i].done) at += rec_pack(sr->data + at, keys[i].key, keys[i].nkey, NULL, 0);
            surv[nsurv++] = sr;
        }
        rec_unref(rec);
    }
    if (!keys || down) {
        r->rd = r->end; /* read from the start again next round */
    } else if (nsurv == 0 && !bad) {
        spill_reset(r);
    } else if (spill_replace(r, surv, nsurv) < 0) {
        r->rd = r->end;
    }
    for (size_t i = 0; i < nsurv; i++) rec_unref(surv[i]);
    free(surv);
    free(keys);
    if (down) set_answering(c, c->fd >= 0);
    if (progress) c->retry_backoff_ms = 0;
    else c->retry_backoff_ms = c->retry_backoff_ms ? c->retry_backoff_ms * 2 : 20;
    if (c->retry_backoff_ms > BACKOFF_MAX_MS) c->retry_backoff_ms = BACKOFF_MAX_MS;
    c->retry_next_ms = r->end ? clock_mono_ms() + (c->retry_backoff_ms ? c->retry_backoff_ms : 20) : 0;
    publish(c);
}

/* Connected, or a reason to wait: 0 when c->fd is usable. */
static int ensure_conn(struct dcluster *c)
{
    if (c->fd >= 0) return 0;
    if (clock_mono_ms() < c->retry_at_ms) return -1;
    if (wire_connect(c) == 0) {
        c->backoff_ms = 0;
        return 0;
    }
    set_answering(c, false);
    backoff(c);
    return -1;
}

/* True, after sleeping, when the batch just built should wait for more deletes (LINGER_US):
 * the caller releases it and builds it again. */
static bool batch_linger(const struct dcluster *c, const struct batch *b)
{
    if (b->flush || b->gated || b->nkeys == 0 || b->nkeys >= c->d->cfg.batch_max || !b->nrefs)
        return false;
    int64_t age = clock_wall_us() - b->refs[0]->queued_us;
    if (age < 0 || age >= LINGER_US) return false;
    struct timespec ts = {0, (long)(LINGER_US - age) * 1000};
    nanosleep(&ts, NULL);
    return true;
}

void *deliver_cluster_main(void *arg)
{
    struct dcluster *c = arg;
    struct deliver *d = c->d;
    struct batch b = {.cap = d->cfg.batch_max};
    b.keys = calloc(b.cap, sizeof *b.keys);
    /* a batch spans at most one record per key, plus records without keys: bounded by the
     * loop in batch_build, which stops at batch_max keys or REFS_MAX records */
    b.refs = calloc(REFS_MAX, sizeof *b.refs);
    uint64_t last_io = clock_mono_ms();
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        publish(c);
        maybe_spill(c);
        retry_round(c);
        if (!b.keys || !b.refs) { /* no memory for a batch: wait and try again */
            if (!b.keys) b.keys = calloc(b.cap, sizeof *b.keys);
            if (!b.refs) b.refs = calloc(REFS_MAX, sizeof *b.refs);
            cv_wait_ms(c, 100);
            continue;
        }
        if (b.valid && b.gen != c->gen) batch_release(&b);
        if (!b.valid) {
            batch_build(c, &b);
            if (batch_linger(c, &b)) {
                batch_release(&b);
                continue;
            }
        }
        if (b.gated) __atomic_store_n(&c->gate_want, b.gated, __ATOMIC_RELEASE);
        pthread_mutex_lock(&c->lock);
        c->st.gated_deletes = b.gated != 0;
        if (b.gated) pthread_cond_broadcast(&c->cv); /* the replica's poller */
        pthread_mutex_unlock(&c->lock);
        if (!b.nfull && !b.nkeys) {
            /* nothing to send: keep the connection known to work, so up/healthy say the truth */
            uint64_t now = clock_mono_ms();
            if (c->fd < 0) {
                if (ensure_conn(c) == 0) { /* a cluster with nothing to send is known up too */
                    set_answering(c, wire_probe(c) == BATCH_OK);
                    last_io = now;
                }
            } else if (now - last_io >= IDLE_PROBE_MS) {
                bool ok = wire_probe(c) == BATCH_OK;
                set_answering(c, ok);
                if (!ok) c->retry_at_ms = 0;
                last_io = now;
            }
            batch_release(&b);
            publish(c);
            uint64_t wait = c->fd < 0 ? (c->retry_at_ms > now ? c->retry_at_ms - now : 10)
                                      : IDLE_PROBE_MS;
            if (c->retry_next_ms && c->fd >= 0)
                wait = c->retry_next_ms > now ? (c->retry_next_ms - now < wait ? c->retry_next_ms - now : wait) : 1;
            cv_wait_ms(c, wait);
            continue;
        }
        if (!b.nkeys && !b.flush) { /* commits without keys */
            batch_done(c, &b);
            batch_release(&b);
            continue;
        }
        if (ensure_conn(c) < 0) {
            publish(c);
            uint64_t now = clock_mono_ms();
            cv_wait_ms(c, c->retry_at_ms > now ? c->retry_at_ms - now : 1);
            continue;
        }
        enum batch_res res = b.flush ? wire_flush(c, b.flush) : wire_delete(c, b.keys, b.nkeys);
        last_io = clock_mono_ms();
        set_answering(c, res != BATCH_DOWN);
        if (res == BATCH_OK) {
            if (b.flush) log_notice("cluster %s: flush applied", c->name);
            batch_done(c, &b);
            batch_release(&b);
        } else if (res == BATCH_DOWN) {
            backoff(c);
        } else if (b.flush) {
            /* a flush not taken (a router with a node down answers an error) is sent again,
             * holding what follows: nothing can replace it */
            backoff(c);
            publish(c);
            cv_wait_ms(c, c->backoff_ms);
        } else {
            size_t failed = 0;
            for (size_t i = 0; i < b.nkeys; i++) failed += !b.keys[i].done;
            bool stuck = failed == b.nkeys;
            uint64_t gen = c->gen;
            if (retry_later(c, &b, failed) == 0) {
                /* unless a flush replaced what the batch came from (then nothing is popped) */
                if (gen == c->gen) batch_done(c, &b);
                batch_release(&b);
            } else {
                stuck = true;
            }
            /* no key of it went: wait before sending them again (new commits wake it, and go
             * with them) */
            if (stuck) {
                backoff(c);
                publish(c);
                cv_wait_ms(c, c->backoff_ms);
            } else {
                c->backoff_ms = 0;
            }
        }
    }
    batch_release(&b);
    free(b.keys);
    free(b.refs);
    wire_close(c);
    publish(c);
    return NULL;
}
