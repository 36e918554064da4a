/* deliver.c — the invalidator's delivery (deliver.h): every commit's deletes go to every cluster
 * in commit order, one thread per cluster, so an unreachable or slow cluster holds up neither
 * the reader nor the other clusters; what it cannot take is kept in memory up to mem_max_bytes,
 * then spilled durably to its file, then, past spill_max_bytes, replaced by one flush of the
 * namespaces it touches (flush_ns; flush_all when they are not all known).
 *
 * A cluster's thread loops: spill the memory queue if it is over its bound; take the next batch
 * off the head of the backlog (spilled records first, then memory; stopping at a commit its
 * replica has not replayed); connect if needed; send it; on success pop the records the batch
 * finished and move the cluster's safe LSN. A record is popped only by that thread, so the
 * batch may point into records without holding the queue's lock. */
#include "invalidator/deliver_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/slot.h"

#define DEF_MEM_MAX (64ull << 20)
#define DEF_SPILL_MAX (1ull << 30)
#define DEF_BATCH_MAX 256
#define DEF_WINDOW_S 60
#define DEF_TIMEOUT_MS 1000
#define BACKOFF_MAX_MS 1000
#define IDLE_PROBE_MS 1000
#define REFS_MAX 4096
/* A batch that is not full waits until its first delete is this old before it goes, so that at
 * thousands of commits a second one write carries many deletes: each write, reply and wakeup
 * costs more CPU than the deletes in it (issue 14's 20 µs a change), and a millisecond is
 * little beside the 100 ms commit-to-delete budget. */
#define LINGER_US 1000
/* The recent-deletes log keeps at most this much memory, whatever replay_window_s says. */
#define REPLAY_MAX_BYTES (256ull << 20)

static void cv_wait_ms(struct dcluster *c, uint64_t ms)
{
    struct timespec ts = clock_deadline(ms);
    pthread_mutex_lock(&c->lock);
    while (!c->wake && !__atomic_load_n(&c->d->stop, __ATOMIC_ACQUIRE))
        if (pthread_cond_timedwait(&c->cv, &c->lock, &ts) == ETIMEDOUT) break;
    c->wake = false;
    pthread_mutex_unlock(&c->lock);
}

static void wake(struct dcluster *c)
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

static void *cluster_main(void *arg)
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

/* ---- the API ---- */

static char *spill_path(const char *dir, const char *name, const char *suffix)
{
    size_t n = strlen(dir), k = strlen(name);
    char *p = malloc(n + 1 + 3 * k + strlen(suffix) + 1);
    if (!p) return NULL;
    size_t at = (size_t)sprintf(p, "%s/", dir);
    for (size_t i = 0; i < k; i++) {
        unsigned char ch = (unsigned char)name[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '-' || ch == '_' || (ch == '.' && i > 0);
        at += (size_t)(ok ? sprintf(p + at, "%c", ch) : sprintf(p + at, "%%%02X", ch));
    }
    strcpy(p + at, suffix);
    return p;
}

/* A spill file of a cluster no longer configured holds deletes nobody will send: say so. */
static void warn_strays(struct deliver *d)
{
    DIR *dir = opendir(d->spill_dir);
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 7 || strcmp(e->d_name + n - 6, ".spill")) continue;
        char *path = malloc(strlen(d->spill_dir) + n + 2);
        if (!path) break;
        sprintf(path, "%s/%s", d->spill_dir, e->d_name);
        bool ours = false;
        for (size_t i = 0; i < d->nc && !ours; i++) ours = !strcmp(d->c[i].spill.path, path);
        struct stat st;
        if (!ours && stat(path, &st) == 0 && st.st_size > 0)
            log_warn("spill file %s belongs to no configured cluster: its %lld bytes of deletes "
                     "are not sent (configure the cluster again, or remove the file)", path,
                     (long long)st.st_size);
        free(path);
    }
    if (dir) closedir(dir);
}

static void cluster_free(struct dcluster *c)
{
    recq_free(&c->q);
    recq_free(&c->front);
    if (c->spill.path) spill_close(&c->spill);
    if (c->retry.path) spill_close(&c->retry);
    for (size_t i = 0; i < c->nrouters; i++) free(c->routers[i]);
    free(c->routers);
    free(c->name);
    free(c->replica);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cv);
}

struct deliver *deliver_create(const struct deliver_cfg *cfg, char *err, size_t errlen)
{
    if (!cfg || !cfg->nclusters) {
        snprintf(err, errlen, "no clusters configured");
        return NULL;
    }
    if (!cfg->spill_dir || !*cfg->spill_dir) {
        snprintf(err, errlen, "no spill directory configured");
        return NULL;
    }
    for (size_t i = 0; i < cfg->nclusters; i++) {
        const struct deliver_cluster_cfg *cc = &cfg->clusters[i];
        if (!cc->name || !*cc->name) {
            snprintf(err, errlen, "cluster %zu has no name", i + 1);
            return NULL;
        }
        if (!cc->nrouters) {
            snprintf(err, errlen, "cluster %s: no routers", cc->name);
            return NULL;
        }
        for (size_t j = 0; j < cc->nrouters; j++) {
            const char *a = cc->routers[j], *colon = a ? strrchr(a, ':') : NULL;
            if (!colon || colon == a || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
                snprintf(err, errlen, "cluster %s: router \"%s\" is not host:port", cc->name,
                         a ? a : "");
                return NULL;
            }
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(cfg->clusters[j].name, cc->name)) {
                snprintf(err, errlen, "cluster %s is configured twice", cc->name);
                return NULL;
            }
    }
    if (mkdir(cfg->spill_dir, 0700) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "spill directory %s: %s", cfg->spill_dir, strerror(errno));
        return NULL;
    }
    struct deliver *d = calloc(1, sizeof *d);
    if (!d || !(d->c = calloc(cfg->nclusters, sizeof *d->c)) ||
        !(d->spill_dir = strdup(cfg->spill_dir))) {
        if (d) free(d->c);
        free(d);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    d->cfg = *cfg;
    d->cfg.clusters = NULL;
    d->cfg.spill_dir = d->spill_dir;
    if (!d->cfg.mem_max_bytes) d->cfg.mem_max_bytes = DEF_MEM_MAX;
    if (!d->cfg.spill_max_bytes) d->cfg.spill_max_bytes = DEF_SPILL_MAX;
    if (!d->cfg.batch_max) d->cfg.batch_max = DEF_BATCH_MAX;
    if (d->cfg.batch_max > 65536) d->cfg.batch_max = 65536;
    if (!d->cfg.replay_window_s) d->cfg.replay_window_s = DEF_WINDOW_S;
    if (!d->cfg.timeout_ms) d->cfg.timeout_ms = DEF_TIMEOUT_MS;
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->enq, NULL);
    d->nc = cfg->nclusters;
    int failed = 0;
    for (size_t i = 0; i < d->nc && !failed; i++) {
        const struct deliver_cluster_cfg *cc = &cfg->clusters[i];
        struct dcluster *c = &d->c[i];
        c->d = d;
        c->idx = i;
        c->fd = -1;
        c->spill.fd = -1;
        c->retry.fd = -1;
        pthread_mutex_init(&c->lock, NULL);
        clock_cond_init_monotonic(&c->cv);
        c->name = strdup(cc->name);
        c->routers = calloc(cc->nrouters, sizeof *c->routers);
        c->replica = cc->replica && *cc->replica ? strdup(cc->replica) : NULL;
        failed = !c->name || !c->routers || (cc->replica && *cc->replica && !c->replica);
        for (size_t j = 0; !failed && j < cc->nrouters; j++)
            failed = !(c->routers[c->nrouters++] = strdup(cc->routers[j]));
        if (failed) {
            snprintf(err, errlen, "out of memory");
            break;
        }
        char *path = spill_path(d->spill_dir, c->name, ".spill");
        char *rpath = spill_path(d->spill_dir, c->name, ".retry");
        uint64_t left = 0, unused;
        if (!path || !rpath) {
            snprintf(err, errlen, "out of memory");
            failed = 1;
        } else if (spill_open(&c->spill, path, &left, err, errlen) < 0 ||
                   spill_open(&c->retry, rpath, &unused, err, errlen) < 0) {
            failed = 1;
        }
        free(path);
        free(rpath);
        if (c->retry.end) c->retry_next_ms = 1; /* a round first thing */
        /* what an earlier run spilled is safe already; the reader, restarting from PostgreSQL's
         * confirmed LSN, may hand those commits over again: they are not queued twice */
        c->skip_upto = left;
        c->safe = left;
    }
    if (!failed) warn_strays(d);
    for (size_t i = 0; i < d->nc && !failed; i++) {
        struct dcluster *c = &d->c[i];
        if (pthread_create(&c->thread, NULL, cluster_main, c) != 0) {
            snprintf(err, errlen, "cluster %s: cannot start its thread", c->name);
            failed = 1;
            break;
        }
        c->started = true;
        if (c->replica) {
            if (replica_start(c) < 0) {
                snprintf(err, errlen, "cluster %s: cannot start its replica poller", c->name);
                failed = 1;
                break;
            }
            c->rstarted = true;
        }
    }
    if (failed) {
        deliver_destroy(d);
        return NULL;
    }
    return d;
}

void deliver_destroy(struct deliver *d)
{
    if (!d) return;
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
    for (size_t i = 0; i < d->nc; i++) {
        struct dcluster *c = &d->c[i];
        if (!c->d) continue;
        wake(c);
        if (c->started) pthread_join(c->thread, NULL);
        if (c->rstarted) replica_stop(c);
    }
    for (size_t i = 0; i < d->nc; i++)
        if (d->c[i].d) cluster_free(&d->c[i]);
    recq_free(&d->replay);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->enq);
    free(d->c);
    free(d->spill_dir);
    free(d);
}

/* Forget records older than the window, or past the memory cap. Under d->lock. */
static void replay_expire(struct deliver *d, int64_t now)
{
    int64_t cutoff = now - (int64_t)d->cfg.replay_window_s * 1000000;
    while (d->replay.n && (recq_at(&d->replay, 0)->queued_us < cutoff ||
                           d->replay.bytes > REPLAY_MAX_BYTES))
        rec_unref(recq_pop(&d->replay));
}

/* Queue `r` to the clusters (all, or only `only`); `commit` when it is a commit, which a
 * cluster whose spill file already holds it skips. -1 when a queue cannot grow (nothing queued). */
static int enqueue(struct deliver *d, struct rec *r, const struct dcluster *only, bool commit)
{
    /* the reader and a replay may queue at once: room reserved by one is not taken by the other */
    pthread_mutex_lock(&d->enq);
    for (size_t i = 0; i < d->nc; i++) {
        struct dcluster *c = &d->c[i];
        pthread_mutex_lock(&c->lock);
        int rc = recq_reserve(&c->q, 1);
        pthread_mutex_unlock(&c->lock);
        if (rc < 0) {
            pthread_mutex_unlock(&d->enq);
            return -1;
        }
    }
    for (size_t i = 0; i < d->nc; i++) {
        struct dcluster *c = &d->c[i];
        if (only && c != only) continue;
        pthread_mutex_lock(&c->lock);
        if (commit && r->lsn <= c->skip_upto) {
            c->st.skipped += r->last;
        } else {
            rec_ref(r);
            recq_push(&c->q, r);
            c->wake = true;
            pthread_cond_broadcast(&c->cv);
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&d->enq);
    return 0;
}

/* Make the record of one commit (or part): items packed, LSNs set. NULL without memory. */
static struct rec *commit_rec(struct deliver *d, uint8_t kind, uint64_t end_lsn,
                              int64_t commit_us, const struct deliver_key *keys,
                              const char *const *nss, size_t n, int more)
{
    size_t ndata = 0, kept = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nk = kind == REC_KEYS ? keys[i].nkey : 0;
        const char *ns = kind == REC_KEYS ? keys[i].ns : nss[i];
        size_t nn = ns ? strlen(ns) : 0;
        if (nk > 0xffff) continue; /* no cache holds such a key */
        ndata += rec_item_size(nk, nn > 255 ? 0 : nn);
        kept++;
    }
    if (ndata > UINT32_MAX) return NULL;
    struct rec *r = rec_new(kind, (uint32_t)kept, (uint32_t)ndata);
    if (!r) return NULL;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nk = kind == REC_KEYS ? keys[i].nkey : 0;
        const char *ns = kind == REC_KEYS ? keys[i].ns : nss[i];
        size_t nn = ns ? strlen(ns) : 0;
        if (nk > 0xffff) continue;
        if (nn > 255) nn = 0;
        at += rec_pack(r->data + at, kind == REC_KEYS ? keys[i].key : NULL, nk, ns, nn);
    }
    r->lsn = end_lsn;
    r->last = !more;
    r->commit_us = commit_us;
    r->queued_us = clock_wall_us();
    pthread_mutex_lock(&d->lock);
    if (!more && end_lsn > d->last_complete) d->last_complete = end_lsn;
    r->safe_after = d->last_complete;
    pthread_mutex_unlock(&d->lock);
    return r;
}

int deliver_commit(struct deliver *d, uint64_t end_lsn, int64_t commit_time_us,
                   const struct deliver_key *keys, size_t nkeys, int more)
{
    struct rec *r = commit_rec(d, REC_KEYS, end_lsn, commit_time_us, keys, NULL, nkeys, more);
    if (!r) return -1;
    int rc = enqueue(d, r, NULL, true);
    if (rc == 0 && r->n) {
        pthread_mutex_lock(&d->lock);
        replay_expire(d, r->queued_us);
        if (recq_reserve(&d->replay, 1) == 0) {
            rec_ref(r);
            recq_push(&d->replay, r);
        }
        pthread_mutex_unlock(&d->lock);
    }
    rec_unref(r);
    return rc;
}

int deliver_flush(struct deliver *d, uint64_t end_lsn, int64_t commit_time_us,
                  const char *const *namespaces, size_t nns)
{
    struct rec *r = commit_rec(d, REC_FLUSH, end_lsn, commit_time_us, NULL, namespaces, nns, 0);
    if (!r) return -1;
    int rc = enqueue(d, r, NULL, true);
    rec_unref(r);
    return rc;
}

uint64_t deliver_safe_lsn(struct deliver *d)
{
    uint64_t lo = UINT64_MAX;
    for (size_t i = 0; i < d->nc; i++) {
        uint64_t s = __atomic_load_n(&d->c[i].safe, __ATOMIC_ACQUIRE);
        if (s < lo) lo = s;
    }
    return lo == UINT64_MAX ? 0 : lo;
}

long deliver_replay(struct deliver *d, const char *cluster, const uint16_t *slots, size_t nslots,
                    uint64_t since_s, char *err, size_t errlen)
{
    struct dcluster *only = NULL;
    if (cluster && *cluster) {
        for (size_t i = 0; i < d->nc; i++)
            if (!strcmp(d->c[i].name, cluster)) only = &d->c[i];
        if (!only) {
            snprintf(err, errlen, "no cluster named %s", cluster);
            return -1;
        }
    }
    uint8_t *want = calloc(SLOT_COUNT / 8, 1);
    if (!want) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < nslots; i++) {
        if (slots[i] >= SLOT_COUNT) {
            snprintf(err, errlen, "slot %u is not in 0..%d", slots[i], SLOT_COUNT - 1);
            free(want);
            return -1;
        }
        want[slots[i] / 8] |= (uint8_t)(1u << (slots[i] % 8));
    }
    if (!since_s || since_s > d->cfg.replay_window_s) since_s = d->cfg.replay_window_s;
    int64_t now = clock_wall_us(), cutoff = now - (int64_t)since_s * 1000000;
    pthread_mutex_lock(&d->lock);
    replay_expire(d, now);
    size_t first = d->replay.n, nkeys = 0, ndata = 0;
    while (first > 0 && recq_at(&d->replay, first - 1)->queued_us >= cutoff) first--;
    for (int pass = 0; pass < 2; pass++) {
        struct rec *out = NULL;
        size_t at = 0;
        if (pass == 1) {
            if (!nkeys || !(out = rec_new(REC_KEYS, (uint32_t)nkeys, (uint32_t)ndata))) break;
        }
        for (size_t i = first; i < d->replay.n; i++) {
            struct rec *r = recq_at(&d->replay, i);
            uint32_t off = 0;
            struct ritem it;
            while (rec_next(r, &off, &it)) {
                uint16_t s = slot_of_key(it.key, it.nkey);
                if (!(want[s / 8] & (1u << (s % 8)))) continue;
                if (pass == 0) {
                    nkeys++;
                    ndata += rec_item_size(it.nkey, it.nns);
                } else {
                    at += rec_pack(out->data + at, it.key, it.nkey, it.ns, it.nns);
                }
            }
        }
        if (pass == 1) {
            pthread_mutex_unlock(&d->lock);
            /* not a commit: no gate, no latency, the safe LSN stays where it is */
            out->last = 1;
            out->queued_us = now;
            int rc = enqueue(d, out, only, false);
            rec_unref(out);
            free(want);
            if (rc < 0) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            for (size_t i = 0; i < d->nc; i++)
                if (!only || only == &d->c[i]) DC_COUNT(&d->c[i], replays, nkeys);
            log_notice("replay: %zu deletes of the last %llu s in %zu slots queued again to %s",
                       nkeys, (unsigned long long)since_s, nslots, only ? only->name : "every cluster");
            return (long)nkeys;
        }
    }
    pthread_mutex_unlock(&d->lock);
    free(want);
    if (nkeys) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

int deliver_healthy(struct deliver *d)
{
    for (size_t i = 0; i < d->nc; i++) {
        pthread_mutex_lock(&d->c[i].lock);
        int up = (int)d->c[i].st.up;
        pthread_mutex_unlock(&d->c[i].lock);
        if (!up) return 0;
    }
    return 1;
}
