/* deliver.c — the invalidator's delivery (deliver.h): every commit's deletes go to every cluster
 * in commit order, one thread per cluster, so an unreachable or slow cluster holds up neither
 * the reader nor the other clusters; what it cannot take is kept in memory up to mem_max_bytes,
 * then spilled durably to its file, then, past spill_max_bytes, replaced by one flush of the
 * namespaces it touches (flush_ns; flush_all when they are not all known).
 *
 * This file is the API: configuration, start and stop, handing commits to every cluster's
 * queue, the safe LSN, the recent-deletes log and its replay. Each cluster's thread is
 * deliver_cluster.c. */
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
/* The recent-deletes log keeps at most this much memory, whatever replay_window_s says. */
#define REPLAY_MAX_BYTES (256ull << 20)

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
        if (pthread_create(&c->thread, NULL, deliver_cluster_main, c) != 0) {
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
        deliver_wake(c);
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
