/* report.c — the router's node reports to the control plane (see report.h). */
#include "router/report.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/follow.h"
#include "common/httpc.h"
#include "common/log.h"

#define REPORT_WATCH_MS 10
#define REPORT_TIMEOUT_MS 1000
#define REPORT_ABSENT_RETRY_MS 60000 /* a control plane without /v1/reports (404) */

struct reporter {
    struct router *r;
    pthread_t th;
    int stop; /* atomics */
    struct httpc *h;
    char *bases[FOLLOW_URLS_MAX];
    size_t nbases, cur;
    char id[256];
};

/* The report body: every node of the table's non-gutter pools with a state (malloc'd JSON;
 * NULL when memory ran out). */
static char *report_body(struct reporter *rp)
{
    struct router *r = rp->r;
    json_t *nodes = json_object(), *doc = NULL;
    char *out = NULL;
    if (nodes == NULL) return NULL;
    /* the table may be freed by a publish on another thread unless the lock is held; the
     * addresses are copied out under it */
    pthread_mutex_lock(&r->topo.lock);
    const struct topo *t = topo_current(&r->topo);
    size_t n = 0;
    char (*addrs)[TOPO_ADDR_MAX] = malloc((t->nnodes ? t->nnodes : 1) * sizeof *addrs);
    bool *seen = calloc(t->nnodes ? t->nnodes : 1, sizeof *seen);
    for (uint32_t p = 0; addrs && seen && p < t->npools; p++) {
        if ((int32_t)p == t->gutter_pool) continue;
        for (uint32_t i = 0; i < t->pools[p].nnodes; i++) {
            uint32_t k = t->pools[p].nodes[i];
            if (seen[k]) continue;
            seen[k] = true;
            memcpy(addrs[n++], t->nodes[k].addr, TOPO_ADDR_MAX);
        }
    }
    pthread_mutex_unlock(&r->topo.lock);
    free(seen);
    for (size_t i = 0; addrs && i < n; i++) {
        int st = nodestats_state(&r->nodes, addrs[i]);
        if (st >= 0) json_object_set_new(nodes, addrs[i], json_string(st ? "down" : "up"));
    }
    free(addrs);
    doc = json_pack("{s:s, s:o}", "router", rp->id, "nodes", nodes);
    if (doc) out = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(doc);
    return out;
}

static bool report_stopping(struct reporter *rp)
{
    return __atomic_load_n(&rp->stop, __ATOMIC_ACQUIRE) != 0;
}

static void *report_main(void *arg)
{
    struct reporter *rp = arg;
    struct router *r = rp->r;
    struct httpc_reply rep;
    httpc_reply_init(&rep);
    uint64_t next = 0, last_gen = UINT64_MAX, absent_until = 0;
    bool told_absent = false, told_down = false;
    char url[1100], msg[512];
    while (!report_stopping(rp)) {
        uint64_t gen = __atomic_load_n(&r->health_gen, __ATOMIC_ACQUIRE);
        uint64_t now = follow_mono_ms();
        if ((gen == last_gen && now < next) || now < absent_until) {
            usleep(REPORT_WATCH_MS * 1000);
            continue;
        }
        last_gen = gen;
        next = now + r->cfg.report_ms;
        char *body = report_body(rp);
        if (body == NULL) {
            log_warn_limited("node report: out of memory");
            continue;
        }
        snprintf(url, sizeof url, "%.1000s/v1/reports", rp->bases[rp->cur]);
        int rc = httpc_request(rp->h, "POST", url, body, strlen(body), REPORT_TIMEOUT_MS, &rep,
                               msg, sizeof msg);
        free(body);
        if (rc < 0 || rep.status >= 500) {
            if (report_stopping(rp)) break;
            if (!told_down)
                log_notice("node report to %s failed: %s", url,
                           rc < 0 ? msg : "server error");
            told_down = true;
            rp->cur = (rp->cur + 1) % rp->nbases;
            last_gen = UINT64_MAX; /* tell the next one at once */
            if (rp->cur == 0) next = now + r->cfg.report_ms, last_gen = gen;
            continue;
        }
        told_down = false;
        if (rep.status == 404) {
            if (!told_absent)
                log_notice("the control plane at %s has no /v1/reports (404): node reports "
                           "are sent again once a minute", rp->bases[rp->cur]);
            told_absent = true;
            absent_until = now + REPORT_ABSENT_RETRY_MS;
            continue;
        }
        if (rep.status != 200)
            log_warn_limited("node report to %s answered HTTP %ld", url, rep.status);
    }
    httpc_reply_release(&rep);
    return NULL;
}

int reporter_start(struct router *r, char *err, size_t errlen)
{
    struct reporter *rp = calloc(1, sizeof *rp);
    if (rp == NULL) {
        snprintf(err, errlen, "node reports: out of memory");
        return -1;
    }
    rp->r = r;
    if (r->cfg.client_id) snprintf(rp->id, sizeof rp->id, "%s", r->cfg.client_id);
    else gethostname(rp->id, sizeof rp->id - 1);
    rp->nbases = follow_bases(r->cfg.control, rp->bases, FOLLOW_URLS_MAX);
    rp->h = httpc_create(64 * 1024);
    if (rp->nbases == 0 || rp->h == NULL) {
        snprintf(err, errlen, "node reports: out of memory");
        goto fail;
    }
    if (follow_auth(rp->h, r->cfg.token_file, err, errlen) < 0) goto fail;
    httpc_set_connect_timeout(rp->h, REPORT_TIMEOUT_MS);
    r->reporter = rp;
    if (pthread_create(&rp->th, NULL, report_main, rp) != 0) {
        r->reporter = NULL;
        snprintf(err, errlen, "node reports: cannot start the thread");
        goto fail;
    }
    return 0;
fail:
    while (rp->nbases > 0) free(rp->bases[--rp->nbases]);
    httpc_destroy(&rp->h);
    free(rp);
    return -1;
}

void reporter_stop(struct router *r)
{
    struct reporter *rp = r->reporter;
    if (rp == NULL) return;
    __atomic_store_n(&rp->stop, 1, __ATOMIC_RELEASE);
    httpc_cancel(rp->h);
    pthread_join(rp->th, NULL);
    while (rp->nbases > 0) free(rp->bases[--rp->nbases]);
    httpc_destroy(&rp->h);
    free(rp);
    r->reporter = NULL;
}
