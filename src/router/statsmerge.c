/* statsmerge.c — stats and key dumps through the router (see statsmerge.h).
 *
 * Monitoring tools (memcstat, memcached-tool, the Prometheus exporter) and key dumpers
 * (memcdump, php-memcached's getAllKeys) talk to the router as to one memcached, so the router
 * asks every distinct node of its topology (every pool's, the gutter pool's too: it holds items
 * and memory like the others) and answers as one memcached would, in memcached's framing:
 * - figures are summed over the nodes that answered; the oldest age and the largest of a few
 *   gauges are taken instead where a sum means nothing; the process's own figures (pid, uptime,
 *   connections, ...) are the router's;
 * - a node that is down, times out or answers with an error is left out; `stats` says how many
 *   answered (nodes_answered, nodes_total); when none did, the others answer with the first
 *   node's error (plain `stats` still answers with the router's own figures);
 * - key dumps are the nodes' dumps one after another (their lines interleave as they arrive),
 *   with one END. */
#include "router/statsmerge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/options.h"
#include "router/upstream.h"
#include "router/worker.h"

/* ---- asking every node ---- */

/* Send `line` (with its \r\n) to every node of the topology as one request of `kind`;
 * `exclusive`: alone on each node's dump connection (upstream.h), as a metadump must go. */
static void sm_fanout_x(struct client *c, enum rreq_kind kind, uint8_t merge, const char *line,
                        size_t n, bool exclusive)
{
    struct rworker *w = c->w;
    struct rreq *rq = NULL;
    if (!worker_topology_ready(w) || w->nmap == 0 || w->nmap > UINT16_MAX) goto oom;
    rq = rreq_create(c, kind, CMD_STATS);
    if (rq == NULL || (rq->frags = calloc(w->nmap, sizeof *rq->frags)) == NULL) goto oom;
    rq->merge = merge;
    for (uint32_t i = 0; i < w->nmap; i++) {
        struct frag *f = frag_create(rq, (uint16_t)i);
        if (f == NULL) goto oom;
        rq->frags[rq->nfrags++] = f;
        f->exclusive = exclusive;
        if (buf_append(&f->out, line, n) < 0) goto oom;
    }
    rq->pending = rq->nfrags;
    client_enqueue(c, rq);
    /* the last submission may complete the request (every node down) and free it */
    uint32_t nmap = w->nmap;
    for (uint32_t i = 0; i < nmap; i++) {
        struct frag *f = rq->frags[i];
        upnode_submit(w->map[i], f);
    }
    return;
oom:
    if (rq) rreq_discard(rq);
    client_oom(c);
}

static void sm_fanout(struct client *c, enum rreq_kind kind, uint8_t merge, const char *line,
                      size_t n)
{
    sm_fanout_x(c, kind, merge, line, n, false);
}

/* ---- merging ---- */

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* The router's own figures that memcached's (or shoal-node's) `stats` also has, with another meaning: shown
 * with a router_ prefix, the name itself carrying the nodes' sum. */
static const char *const sm_renamed[] = {"cmd_get", "cmd_set", "bytes_read", "bytes_written",
                                          "protocol_errors"};

/* The router's counters since the last `stats reset`. */
static void sm_counters(struct router *r, struct router_metrics *out)
{
    router_metrics_sum(r, out);
    uint64_t *v = (uint64_t *)out;
    pthread_mutex_lock(&r->reset_lock);
    const uint64_t *base = (const uint64_t *)&r->reset_base;
    for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++)
        if (router_metric_descs[i].kind == METRIC_COUNTER) /* a gauge is what it is now */
            v[i] = v[i] > base[i] ? v[i] - base[i] : 0;
    pthread_mutex_unlock(&r->reset_lock);
}

/* `stats reset`: from now on `stats` counts from zero. */
static void sm_reset_counters(struct router *r)
{
    struct router_metrics now;
    router_metrics_sum(r, &now);
    pthread_mutex_lock(&r->reset_lock);
    r->reset_base = now;
    pthread_mutex_unlock(&r->reset_lock);
}

/* The router's own figures that open `stats`: what memcached says about its process. */
static void sm_own_head(struct buf *b, struct rworker *w, const struct router_metrics *m)
{
    struct router *r = w->r;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    getrusage(RUSAGE_SELF, &ru);
    time_t now = time(NULL);
    buf_printf(b, "STAT pid %d\r\nSTAT uptime %lld\r\nSTAT time %lld\r\nSTAT version %s\r\n",
               (int)getpid(), (long long)(now - r->started), (long long)now, ROUTER_WIRE_VERSION);
    buf_printf(b, "STAT pointer_size %d\r\nSTAT rusage_user %ld.%06ld\r\n"
                  "STAT rusage_system %ld.%06ld\r\nSTAT max_connections %llu\r\n",
               (int)(8 * sizeof(void *)), (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec,
               (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec,
               (unsigned long long)r->cfg.conn_limit);
    /* connection_structures: memcached's count of connection objects in use; the router's are
     * its client connections (the ones to nodes are counted per node in /metrics) */
    uint64_t curr = __atomic_load_n(&r->curr_conns, __ATOMIC_RELAXED);
    buf_printf(b, "STAT curr_connections %llu\r\nSTAT total_connections %llu\r\n"
                  "STAT rejected_connections %llu\r\nSTAT connection_structures %llu\r\n"
                  "STAT threads %llu\r\nSTAT accepting_conns 1\r\n",
               (unsigned long long)curr, (unsigned long long)m->conns_total,
               (unsigned long long)__atomic_load_n(&r->rejected_conns, __ATOMIC_RELAXED),
               (unsigned long long)curr, (unsigned long long)r->cfg.threads);
    /* the router never yields a connection nor pauses its listener (over -c it refuses) */
    buf_append_str(b, "STAT conn_yields 0\r\nSTAT listen_disabled_num 0\r\n"
                      "STAT time_in_listen_disabled_us 0\r\n");
}

/* The router's counters (ROUTER_METRICS). Those memcached also names, and any a node answered
 * with (shoal-node shares some counter names), are renamed router_*: a name means one thing. */
static void sm_own_tail(struct buf *b, struct rworker *w, const struct router_metrics *m,
                        const struct statslist *nodes, uint32_t answered, uint32_t total)
{
    buf_printf(b, "STAT topology_version %llu\r\nSTAT nodes_answered %u\r\nSTAT nodes_total %u\r\n",
               (unsigned long long)(w->topo ? w->topo->version : 0), answered, total);
    for (size_t i = 0; i < ROUTER_NMETRICS; i++) {
        const struct metric_desc *d = &router_metric_descs[i];
        bool renamed = false;
        for (size_t k = 0; k < NELEM(sm_renamed); k++) renamed |= !strcmp(d->name, sm_renamed[k]);
        renamed |= statslist_get(nodes, d->name, strlen(d->name)) != NULL;
        uint64_t v;
        memcpy(&v, (const char *)m + d->offset, sizeof v);
        buf_printf(b, "STAT %s%s %llu\r\n", renamed ? "router_" : "", d->name,
                   (unsigned long long)v);
    }
}

/* `stats settings`: memcached's names for the router's own process settings, the nodes' cache
 * settings merged (maxbytes: their sum; item_size_max: the smallest, and no more than the
 * router's --item-max), then the router's options under their own names. */
static void sm_settings(struct buf *b, struct rworker *w, struct statslist *m)
{
    struct router *r = w->r;
    buf_printf(b, "STAT maxconns %llu\r\nSTAT tcpport %u\r\nSTAT udpport 0\r\nSTAT inter %s\r\n"
                  "STAT verbosity %d\r\nSTAT num_threads %llu\r\nSTAT tcp_backlog %llu\r\n",
               (unsigned long long)r->cfg.conn_limit, r->bound_port,
               r->cfg.listen && *r->cfg.listen ? r->cfg.listen : "NULL", log_get_level(),
               (unsigned long long)r->cfg.threads, (unsigned long long)r->cfg.backlog);
    for (size_t k = 0; k < r->nopts; k++) { /* the router's option wins over a node setting */
        struct statslist_ent *e = statslist_get(m, r->opts[k].name, strlen(r->opts[k].name));
        if (e) e->rule = SM_OWN;
    }
    struct statslist_ent *isz = statslist_get(m, "item_size_max", 13);
    if (isz && isz->isnum && isz->rule != SM_OWN) {
        if (isz->num[0] > r->cfg.item_max) isz->num[0] = r->cfg.item_max;
    } else {
        buf_printf(b, "STAT item_size_max %llu\r\n", (unsigned long long)r->cfg.item_max);
    }
    statslist_write(b, m);
    options_write_stats(b, r->opts, r->nopts);
}

int statsmerge_reply(struct rreq *rq)
{
    struct rworker *w = rq->cl->w;
    struct statslist m = {.merge = rq->merge};
    uint32_t answered = 0;
    const struct frag *first_err = NULL;
    int rc = 0;
    for (uint16_t i = 0; i < rq->nfrags; i++) {
        const struct frag *f = rq->frags[i];
        if (f->failed) {
            if (first_err == NULL) first_err = f;
            continue;
        }
        answered++;
        if (rq->merge == STATSMERGE_FIRST) {
            if (answered == 1) rc = buf_append(&rq->reply, buf_start(&f->reply), buf_used(&f->reply));
            continue;
        }
        if (statslist_add(&m, buf_start(&f->reply), buf_used(&f->reply)) < 0) rc = -1;
    }
    if (answered == 0 && rq->merge != STATSMERGE_GENERAL && rq->merge != STATSMERGE_SETTINGS) {
        rc = first_err ? buf_append(&rq->reply, buf_start(&first_err->reply),
                                    buf_used(&first_err->reply))
                       : -1;
    } else if (rq->merge != STATSMERGE_FIRST && rc == 0) {
        struct buf *b = &rq->reply;
        struct router_metrics rm;
        if (rq->merge == STATSMERGE_GENERAL) {
            sm_counters(w->r, &rm);
            sm_own_head(b, w, &rm);
        }
        if (rq->merge == STATSMERGE_SETTINGS) sm_settings(b, w, &m);
        else statslist_write(b, &m);
        if (rq->merge == STATSMERGE_GENERAL) sm_own_tail(b, w, &rm, &m, answered, rq->nfrags);
        buf_append_str(b, "END\r\n");
        if (b->data == NULL) rc = -1;
    }
    statslist_free(&m);
    return rc;
}

int statsmerge_dump_end(struct rreq *rq)
{
    static const char over[] =
        "SERVER_ERROR shoal-router: reply dropped: over --out-max bytes of replies are waiting "
        "for this client to read them\r\n";
    const struct frag *first_err = NULL;
    uint32_t answered = 0;
    for (uint16_t i = 0; i < rq->nfrags; i++) {
        if (!rq->frags[i]->failed) answered++;
        else if (first_err == NULL) first_err = rq->frags[i];
    }
    if (rq->over) /* counted in replies_dropped when the first line was dropped */
        return buf_append(&rq->reply, over, sizeof over - 1);
    if (answered == 0 && first_err)
        return buf_append(&rq->reply, buf_start(&first_err->reply), buf_used(&first_err->reply));
    return buf_append(&rq->reply, "END\r\n", 5);
}

/* ---- what the client asked ---- */

/* Split [p, end) on spaces into at most `max` tokens; returns how many there were (may be
 * more than max: the rest are not stored). */
static int sm_tokens(const char *p, const char *end, const char **tok, size_t *ntok, int max)
{
    int n = 0;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\r')) p++;
        if (p == end) break;
        const char *s = p;
        while (p < end && *p != ' ' && *p != '\r') p++;
        if (n < max) {
            tok[n] = s;
            ntok[n] = (size_t)(p - s);
        }
        n++;
    }
    return n;
}

static bool tok_is(const char *t, size_t n, const char *w)
{
    return strlen(w) == n && !memcmp(t, w, n);
}

/* 1 to 20 decimal digits (a larger number than fits is still a number here) */
static bool tok_num(const char *t, size_t n)
{
    if (n == 0 || n > 20) return false;
    for (size_t i = 0; i < n; i++)
        if (t[i] < '0' || t[i] > '9') return false;
    return true;
}

/* `stats <arg>` subcommands about a node's own settings or figures that the router does not
 * forward. */
static const char *const sm_not_forwarded[] = {"sizes_enable", "sizes_disable", "namespaces"};

void statsmerge_stats(struct client *c, const struct proto_req *req)
{
    const char *tok[4];
    size_t ntok[4];
    const char *a = req->arg ? req->arg : "";
    int n = sm_tokens(a, a + (req->arg ? req->narg : 0), tok, ntok, 4);
    char line[128];
    if (n == 0) {
        sm_fanout(c, RQ_STATS, STATSMERGE_GENERAL, "stats\r\n", 7);
        return;
    }
    const char *t = tok[0];
    size_t k = ntok[0];
    if (tok_is(t, k, "settings")) {
        sm_fanout(c, RQ_STATS, STATSMERGE_SETTINGS, "stats settings\r\n", 16);
        return;
    }
    if (tok_is(t, k, "items")) {
        sm_fanout(c, RQ_STATS, STATSMERGE_ITEMS, "stats items\r\n", 13);
        return;
    }
    if (tok_is(t, k, "slabs")) {
        sm_fanout(c, RQ_STATS, STATSMERGE_SLABS, "stats slabs\r\n", 13);
        return;
    }
    if (tok_is(t, k, "sizes")) {
        sm_fanout(c, RQ_STATS, STATSMERGE_SUM, "stats sizes\r\n", 13);
        return;
    }
    if (tok_is(t, k, "conns")) { /* the router's clients: the nodes' are routers */
        struct router *r = c->w->r;
        struct buf b;
        buf_init(&b);
        if (connlist_write(&r->conns, &b, r->listen_fd, (uint32_t)(time(NULL) - r->started),
                           &c->listed, (uint32_t)(c->w->now_ms / 1000)) < 0 ||
            buf_append_str(&b, "END\r\n") < 0)
            client_oom(c);
        else
            client_local(c, buf_start(&b), buf_used(&b));
        buf_release(&b);
        return;
    }
    if (tok_is(t, k, "extstore")) { /* no extstore: as memcached without it */
        client_local_str(c, "END\r\n");
        return;
    }
    if (tok_is(t, k, "detail")) {
        if (n == 2 && tok_is(tok[1], ntok[1], "dump"))
            sm_fanout(c, RQ_STATS, STATSMERGE_PREFIX, "stats detail dump\r\n", 19);
        else if (n == 2 && tok_is(tok[1], ntok[1], "on"))
            sm_fanout(c, RQ_STATS, STATSMERGE_FIRST, "stats detail on\r\n", 17);
        else if (n == 2 && tok_is(tok[1], ntok[1], "off"))
            sm_fanout(c, RQ_STATS, STATSMERGE_FIRST, "stats detail off\r\n", 18);
        else
            client_local_str(c, "CLIENT_ERROR usage: stats detail on|off|dump\r\n");
        return;
    }
    if (tok_is(t, k, "reset")) { /* every node's counters and the router's: one RESET */
        sm_reset_counters(c->w->r);
        sm_fanout(c, RQ_STATS, STATSMERGE_FIRST, "stats reset\r\n", 13);
        return;
    }
    if (tok_is(t, k, "cachedump")) { /* memcached 1.6.18's answers to bad arguments */
        if (n < 3) {
            client_local_str(c, "CLIENT_ERROR bad command line\r\n");
        } else if (!tok_num(tok[1], ntok[1]) || !tok_num(tok[2], ntok[2])) {
            client_local_str(c, "CLIENT_ERROR bad command line format\r\n");
        } else {
            int m = snprintf(line, sizeof line, "stats cachedump %.*s %.*s\r\n", (int)ntok[1],
                             tok[1], (int)ntok[2], tok[2]);
            sm_fanout(c, RQ_DUMP, 0, line, (size_t)m);
        }
        return;
    }
    for (size_t i = 0; i < NELEM(sm_not_forwarded); i++) {
        if (!tok_is(t, k, sm_not_forwarded[i])) continue;
        int m = snprintf(line, sizeof line,
                         "CLIENT_ERROR shoal-router does not forward stats %s; "
                         "ask a node directly\r\n", sm_not_forwarded[i]);
        client_local(c, line, (size_t)m);
        return;
    }
    client_local_str(c, "ERROR\r\n");
}

void statsmerge_lru_crawler(struct client *c, const char *line, size_t len)
{
    const char *tok[4];
    size_t ntok[4];
    int n = sm_tokens(line, line + len, tok, ntok, 4);
    if (n < 2 || (tok_is(tok[1], ntok[1], "metadump") && n < 3)) {
        client_local_str(c, "ERROR\r\n"); /* as memcached */
        return;
    }
    if (!tok_is(tok[1], ntok[1], "metadump") || n > 3 || ntok[2] > 32) {
        client_local_str(c, "CLIENT_ERROR shoal-router forwards only lru_crawler metadump; "
                            "ask a node directly\r\n");
        return;
    }
    char out[64];
    int m = snprintf(out, sizeof out, "lru_crawler metadump %.*s\r\n", (int)ntok[2], tok[2]);
    sm_fanout_x(c, RQ_DUMP, 0, out, (size_t)m, true);
}
