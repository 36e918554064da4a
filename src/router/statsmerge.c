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
    if (rq) {
        for (uint16_t k = 0; k < rq->nfrags; k++) frag_destroy(rq->frags[k]);
        rq->nfrags = 0;
        rreq_destroy(rq);
    }
    client_oom(c);
}

static void sm_fanout(struct client *c, enum rreq_kind kind, uint8_t merge, const char *line,
                      size_t n)
{
    sm_fanout_x(c, kind, merge, line, n, false);
}

/* ---- merging ---- */

enum sm_rule { SM_SUM, SM_MAX, SM_MIN, SM_FIRST, SM_OWN };

struct sm_ent {
    const char *name, *val; /* into the fragments' replies */
    uint32_t nname, nval;
    uint64_t num[4];        /* the value as numbers (PREFIX lines: get, hit, set, del) */
    bool isnum;
    enum sm_rule rule;
    long cls;               /* slab class, for the order of items and slabs; -1: none */
    uint32_t seq;           /* first seen */
};

struct sm_map {
    struct sm_ent *e;
    uint32_t n, cap;
    uint32_t *slot; /* open addressing: 1 + index into e, 0 empty */
    uint32_t nslot;
};

static uint32_t sm_hash(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

/* The entry named [name, name+n), added when absent; NULL when memory ran out. *fresh says
 * which. */
static struct sm_ent *sm_find(struct sm_map *m, const char *name, uint32_t n, bool *fresh)
{
    if (2 * (m->n + 1) > m->nslot) {
        uint32_t ns = m->nslot ? 2 * m->nslot : 256;
        uint32_t *slot = calloc(ns, sizeof *slot);
        if (slot == NULL) return NULL;
        for (uint32_t i = 0; i < m->n; i++) {
            uint32_t h = sm_hash(m->e[i].name, m->e[i].nname) & (ns - 1);
            while (slot[h]) h = (h + 1) & (ns - 1);
            slot[h] = i + 1;
        }
        free(m->slot);
        m->slot = slot;
        m->nslot = ns;
    }
    uint32_t h = sm_hash(name, n) & (m->nslot - 1);
    for (; m->slot[h]; h = (h + 1) & (m->nslot - 1)) {
        struct sm_ent *e = &m->e[m->slot[h] - 1];
        if (e->nname == n && !memcmp(e->name, name, n)) {
            *fresh = false;
            return e;
        }
    }
    if (m->n == m->cap) {
        uint32_t nc = m->cap ? 2 * m->cap : 128;
        struct sm_ent *e = realloc(m->e, nc * sizeof *e);
        if (e == NULL) return NULL;
        m->e = e;
        m->cap = nc;
    }
    m->slot[h] = m->n + 1;
    struct sm_ent *e = &m->e[m->n];
    *e = (struct sm_ent){.name = name, .nname = n, .seq = m->n, .cls = -1};
    m->n++;
    *fresh = true;
    return e;
}

/* Whether the nodes' lists named `name` (no insert, unlike sm_find). */
static bool sm_has(const struct sm_map *m, const char *name, uint32_t n)
{
    if (m->nslot == 0) return false;
    for (uint32_t h = sm_hash(name, n) & (m->nslot - 1); m->slot[h]; h = (h + 1) & (m->nslot - 1)) {
        const struct sm_ent *e = &m->e[m->slot[h] - 1];
        if (e->nname == n && !memcmp(e->name, name, n)) return true;
    }
    return false;
}

/* [p, end) as a decimal number (at most 20 digits; saturating). */
static bool sm_num(const char *p, const char *end, uint64_t *v)
{
    if (p == end || end - p > 20) return false;
    uint64_t x = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') return false;
        uint64_t d = (uint64_t)(*p - '0');
        x = x > (UINT64_MAX - d) / 10 ? UINT64_MAX : x * 10 + d;
    }
    *v = x;
    return true;
}

static bool name_is(const struct sm_ent *e, const char *s)
{
    return strlen(s) == e->nname && !memcmp(e->name, s, e->nname);
}

static bool name_ends(const struct sm_ent *e, const char *s)
{
    size_t k = strlen(s);
    return e->nname >= k && !memcmp(e->name + e->nname - k, s, k);
}

/* `stats` fields that describe the process answering, not the cache: the router's own. A
 * node's connections are the routers' connections to it. */
static const char *const sm_own[] = {
    "pid", "uptime", "time", "version", "libevent", "pointer_size", "rusage_user",
    "rusage_system", "max_connections", "curr_connections", "total_connections",
    "rejected_connections", "connection_structures", "response_obj_oom", "response_obj_count",
    "response_obj_bytes", "read_buf_oom", "read_buf_count", "read_buf_bytes",
    "read_buf_bytes_free", "reserved_fds", "threads", "conn_yields", "listen_disabled_num",
    "time_in_listen_disabled_us", "accepting_conns",
};

/* `stats` gauges a sum means nothing for: the largest. */
static const char *const sm_max[] = {
    "hash_power_level", "hash_is_expanding", "lru_crawler_running", "slab_reassign_running",
    "malloc_fails_running",
};

/* The router's own figures that memcached's (or shoal-node's) `stats` also has, with another meaning: shown
 * with a router_ prefix, the name itself carrying the nodes' sum. */
static const char *const sm_renamed[] = {"cmd_get", "cmd_set", "bytes_read", "bytes_written",
                                          "protocol_errors"};

/* `stats settings` names that describe the process answering: the router's values replace the
 * nodes' (sm_settings_head), as do the router's own options of the same name (line_max, ...). */
static const char *const sm_settings_own[] = {"maxconns", "tcpport", "udpport", "inter",
                                              "verbosity", "num_threads", "tcp_backlog"};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static bool in_list(const struct sm_ent *e, const char *const *l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (name_is(e, l[i])) return true;
    return false;
}

/* Decide how a fresh entry merges, and its class (items:<cls>:... / <cls>:...). */
static void sm_classify(struct sm_ent *e, uint8_t merge)
{
    const char *p = e->name, *end = e->name + e->nname;
    switch (merge) {
    case STATSMERGE_GENERAL:
        e->rule = in_list(e, sm_own, NELEM(sm_own)) ? SM_OWN
                : in_list(e, sm_max, NELEM(sm_max)) ? SM_MAX : SM_SUM;
        break;
    case STATSMERGE_ITEMS:
        if (e->nname > 6 && !memcmp(p, "items:", 6)) p += 6;
        e->rule = name_ends(e, ":age") || name_ends(e, ":age_hot") ||
                          name_ends(e, ":age_warm") || name_ends(e, ":evicted_time")
                      ? SM_MAX : SM_SUM;
        break;
    case STATSMERGE_SETTINGS: /* the cache behind the router: all the nodes' memory, the
                               * largest item every node takes; the rest as the first node says */
        e->rule = name_is(e, "maxbytes") ? SM_SUM
                : name_is(e, "item_size_max") ? SM_MIN
                : in_list(e, sm_settings_own, NELEM(sm_settings_own)) ? SM_OWN : SM_FIRST;
        break;
    case STATSMERGE_SLABS:
        e->rule = name_ends(e, ":chunk_size") || name_ends(e, ":chunks_per_page") ? SM_FIRST
                : name_is(e, "active_slabs") ? SM_MAX : SM_SUM;
        break;
    default:
        e->rule = SM_SUM;
        break;
    }
    if (merge == STATSMERGE_ITEMS || merge == STATSMERGE_SLABS) {
        const char *colon = memchr(p, ':', (size_t)(end - p));
        uint64_t v;
        if (colon && sm_num(p, colon, &v) && v < 1000000) e->cls = (long)v;
    }
}

/* The value of a PREFIX line after its prefix: "get N hit N set N del N". */
static bool sm_prefix_nums(const char *p, const char *end, uint64_t num[4])
{
    static const char *const words[] = {"get", "hit", "set", "del"};
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(words[i]);
        if ((size_t)(end - p) < k + 2 || memcmp(p, words[i], k) || p[k] != ' ') return false;
        p += k + 1;
        const char *e = memchr(p, ' ', (size_t)(end - p));
        if (e == NULL) e = end;
        if (!sm_num(p, e, &num[i])) return false;
        p = e < end ? e + 1 : end;
    }
    return p == end;
}

/* Add one node's list (STAT or PREFIX lines, each with \r\n) into m. -1: out of memory. */
static int sm_add(struct sm_map *m, uint8_t merge, const char *p, size_t n)
{
    const char *end = p + n;
    size_t skip = merge == STATSMERGE_PREFIX ? 7 : 5; /* "PREFIX " / "STAT " */
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) break;
        const char *le = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
        const char *name = p + skip;
        p = nl + 1;
        if (name >= le) continue;
        const char *sp = memchr(name, ' ', (size_t)(le - name));
        const char *nend = sp ? sp : le, *val = sp ? sp + 1 : le;
        bool fresh;
        struct sm_ent *e = sm_find(m, name, (uint32_t)(nend - name), &fresh);
        if (e == NULL) return -1;
        uint64_t num[4] = {0};
        bool isnum = merge == STATSMERGE_PREFIX ? sm_prefix_nums(val, le, num)
                                                : sm_num(val, le, &num[0]);
        if (fresh) {
            sm_classify(e, merge);
            e->val = val;
            e->nval = (uint32_t)(le - val);
            e->isnum = isnum;
            memcpy(e->num, num, sizeof num);
            continue;
        }
        if (!e->isnum || !isnum || e->rule == SM_FIRST || e->rule == SM_OWN) continue;
        for (int i = 0; i < 4; i++) {
            if (e->rule == SM_MAX) {
                if (num[i] > e->num[i]) e->num[i] = num[i];
            } else if (e->rule == SM_MIN) {
                if (num[i] < e->num[i]) e->num[i] = num[i];
            } else {
                e->num[i] = num[i] > UINT64_MAX - e->num[i] ? UINT64_MAX : e->num[i] + num[i];
            }
        }
    }
    return 0;
}

static int sm_cmp(const void *a, const void *b)
{
    const struct sm_ent *x = a, *y = b;
    unsigned long cx = (unsigned long)x->cls, cy = (unsigned long)y->cls; /* -1: last */
    if (cx != cy) return cx < cy ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Append the merged entries of m as `merge` lists them. */
static void sm_write(struct buf *b, struct sm_map *m, uint8_t merge)
{
    if (merge == STATSMERGE_ITEMS || merge == STATSMERGE_SLABS)
        qsort(m->e, m->n, sizeof *m->e, sm_cmp); /* m->slot is stale from here */
    for (uint32_t i = 0; i < m->n; i++) {
        const struct sm_ent *e = &m->e[i];
        if (e->rule == SM_OWN) continue;
        if (merge == STATSMERGE_PREFIX && e->isnum)
            buf_printf(b, "PREFIX %.*s get %llu hit %llu set %llu del %llu\r\n", (int)e->nname,
                       e->name, (unsigned long long)e->num[0], (unsigned long long)e->num[1],
                       (unsigned long long)e->num[2], (unsigned long long)e->num[3]);
        else if (merge == STATSMERGE_PREFIX)
            buf_printf(b, "PREFIX %.*s %.*s\r\n", (int)e->nname, e->name, (int)e->nval, e->val);
        else if (e->isnum)
            buf_printf(b, "STAT %.*s %llu\r\n", (int)e->nname, e->name,
                       (unsigned long long)e->num[0]);
        else
            buf_printf(b, "STAT %.*s %.*s\r\n", (int)e->nname, e->name, (int)e->nval, e->val);
    }
}

/* The router's counters since the last `stats reset`. */
static void sm_counters(struct router *r, struct router_metrics *out)
{
    router_metrics_sum(r, out);
    uint64_t *v = (uint64_t *)out;
    pthread_mutex_lock(&r->reset_lock);
    const uint64_t *base = (const uint64_t *)&r->reset_base;
    for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++)
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
                        const struct sm_map *nodes, uint32_t answered, uint32_t total)
{
    buf_printf(b, "STAT topology_version %llu\r\nSTAT nodes_answered %u\r\nSTAT nodes_total %u\r\n",
               (unsigned long long)(w->topo ? w->topo->version : 0), answered, total);
    for (size_t i = 0; i < ROUTER_NMETRICS; i++) {
        const struct metric_desc *d = &router_metric_descs[i];
        bool renamed = false;
        for (size_t k = 0; k < NELEM(sm_renamed); k++) renamed |= !strcmp(d->name, sm_renamed[k]);
        renamed |= sm_has(nodes, d->name, (uint32_t)strlen(d->name));
        uint64_t v;
        memcpy(&v, (const char *)m + d->offset, sizeof v);
        buf_printf(b, "STAT %s%s %llu\r\n", renamed ? "router_" : "", d->name,
                   (unsigned long long)v);
    }
}

/* `stats settings`: memcached's names for the router's own process settings, the nodes' cache
 * settings merged (maxbytes: their sum; item_size_max: the smallest, and no more than the
 * router's --item-max), then the router's options under their own names. */
static void sm_settings(struct buf *b, struct rworker *w, struct sm_map *m)
{
    struct router *r = w->r;
    buf_printf(b, "STAT maxconns %llu\r\nSTAT tcpport %u\r\nSTAT udpport 0\r\nSTAT inter %s\r\n"
                  "STAT verbosity %d\r\nSTAT num_threads %llu\r\nSTAT tcp_backlog %llu\r\n",
               (unsigned long long)r->cfg.conn_limit, r->bound_port,
               r->cfg.listen && *r->cfg.listen ? r->cfg.listen : "NULL", log_get_level(),
               (unsigned long long)r->cfg.threads, (unsigned long long)r->cfg.backlog);
    bool have_isz = false;
    for (uint32_t i = 0; i < m->n; i++) {
        struct sm_ent *e = &m->e[i];
        for (size_t k = 0; k < r->nopts; k++)
            if (name_is(e, r->opts[k].name)) e->rule = SM_OWN;
        if (name_is(e, "item_size_max") && e->isnum) {
            have_isz = true;
            if (e->num[0] > r->cfg.item_max) e->num[0] = r->cfg.item_max;
        }
    }
    if (!have_isz)
        buf_printf(b, "STAT item_size_max %llu\r\n", (unsigned long long)r->cfg.item_max);
    sm_write(b, m, STATSMERGE_SETTINGS);
    options_write_stats(b, r->opts, r->nopts);
}

int statsmerge_reply(struct rreq *rq)
{
    struct rworker *w = rq->cl->w;
    struct sm_map m = {0};
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
        if (sm_add(&m, rq->merge, buf_start(&f->reply), buf_used(&f->reply)) < 0) rc = -1;
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
        else sm_write(b, &m, rq->merge);
        if (rq->merge == STATSMERGE_GENERAL) sm_own_tail(b, w, &rm, &m, answered, rq->nfrags);
        buf_append_str(b, "END\r\n");
        if (b->data == NULL) rc = -1;
    }
    free(m.e);
    free(m.slot);
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

static bool tok_num(const char *t, size_t n)
{
    uint64_t v;
    return sm_num(t, t + n, &v);
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
