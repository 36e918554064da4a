/* cmd_stats.c — the `stats` family on the data port: general, settings, items, slabs, sizes,
 * conns, extstore, detail, reset (cachedump is cmd_dump.c's). Field names are memcached's wherever the concept exists, so dashboards and tools
 * written for memcached read shoal unchanged; shoal's own counters follow them. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/repl.h"
#include "node/cmd.h"
#include "node/cmd_dump.h"
#include "node/node_admin.h"

static const struct metric_desc node_metric_descs[] = {
#define X(name, kind, help) METRIC_DESC(struct node_metrics, name, kind, help),
    NODE_METRICS(X)
#undef X
};

static const struct metric_desc store_metric_descs[] = {
#define X(name, kind, help) METRIC_DESC(struct store_stats, name, kind, help),
    STORE_METRICS(X)
#undef X
};

const struct metric_desc *node_metric_table(size_t *n)
{
    *n = sizeof node_metric_descs / sizeof node_metric_descs[0];
    return node_metric_descs;
}

const struct metric_desc *store_metric_table(size_t *n)
{
    *n = sizeof store_metric_descs / sizeof store_metric_descs[0];
    return store_metric_descs;
}

/* Sum every worker's counters of size class `cls`. */
static void class_metrics_sum(struct node *n, int cls, struct class_metrics *out)
{
    memset(out, 0, sizeof *out);
    for (uint64_t i = 0; i < n->cfg.threads; i++)
        metrics_sum((uint64_t *)out, (const uint64_t *)&n->workers[i].cls[cls],
                    sizeof *out / sizeof(uint64_t));
}

static void stats_general(struct conn *c)
{
    struct node *n = c->node;
    struct buf *b = &c->wbuf;
    struct node_metrics m;
    struct store_stats ss;
    node_metrics_sum(n, &m);
    store_stats(n->store, &ss);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint32_t now = clock_now();
    buf_printf(b,
               "STAT pid %d\r\nSTAT uptime %u\r\nSTAT time %lld\r\nSTAT version %s\r\n"
               "STAT pointer_size %d\r\nSTAT rusage_user %ld.%06ld\r\n"
               "STAT rusage_system %ld.%06ld\r\nSTAT max_connections %llu\r\n"
               "STAT curr_connections %llu\r\nSTAT total_connections %llu\r\n"
               "STAT rejected_connections %llu\r\nSTAT connection_structures %llu\r\n",
               (int)getpid(), now - 2, (long long)(clock_epoch() + now), SHOAL_WIRE_VERSION,
               (int)(8 * sizeof(void *)), (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec,
               (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec,
               (unsigned long long)n->cfg.conn_limit,
               (unsigned long long)__atomic_load_n(&n->curr_conns, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&n->total_conns, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&n->rejected_conns, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&n->curr_conns, __ATOMIC_RELAXED));
    metrics_write_stats(b, node_metric_descs, sizeof node_metric_descs / sizeof node_metric_descs[0],
                        &m);
    metrics_write_stats(b, store_metric_descs,
                        sizeof store_metric_descs / sizeof store_metric_descs[0], &ss);
    buf_printf(b,
               "STAT limit_maxbytes %llu\r\nSTAT accepting_conns 1\r\nSTAT threads %llu\r\n"
               "STAT hash_is_expanding 0\r\nSTAT slab_page_size %u\r\nSTAT total_pages %u\r\n"
               "STAT used_pages %u\r\n",
               (unsigned long long)ss.limit_maxbytes, (unsigned long long)n->cfg.threads,
               ss.page_size, ss.pages_total, ss.pages_used);
    /* memcached's remaining fields (docs/exporter.md): shoal's equivalent where it has one,
     * 0 where the mechanism does not exist here (no auth, no listener pausing, no segmented
     * LRU, no crawler item count) */
    buf_printf(b,
               "STAT auth_cmds 0\r\nSTAT auth_errors 0\r\nSTAT listen_disabled_num 0\r\n"
               "STAT time_in_listen_disabled_us 0\r\nSTAT conn_yields 0\r\n"
               "STAT slabs_moved %llu\r\nSTAT lru_crawler_running 0\r\n"
               "STAT lru_crawler_starts 0\r\nSTAT malloc_fails %llu\r\n"
               "STAT slab_global_page_pool %u\r\nSTAT evicted_active 0\r\n"
               "STAT crawler_reclaimed %llu\r\nSTAT crawler_items_checked 0\r\n"
               "STAT lrutail_reflocked 0\r\nSTAT moves_to_cold 0\r\nSTAT moves_to_warm 0\r\n"
               "STAT moves_within_lru 0\r\nSTAT direct_reclaims %llu\r\n"
               "STAT lru_bumps_dropped 0\r\n",
               (unsigned long long)ss.slab_pages_moved, (unsigned long long)m.conn_oom,
               ss.pages_total - ss.pages_used,
               (unsigned long long)(ss.sweeper_reclaimed + ss.transient_reclaimed),
               (unsigned long long)(ss.evictions + ss.reclaimed));
}

static void stats_settings(struct conn *c)
{
    const struct node_config *cfg = &c->node->cfg;
    buf_printf(&c->wbuf,
               "STAT maxbytes %llu\r\nSTAT maxconns %llu\r\nSTAT tcpport %u\r\n"
               "STAT udpport 0\r\nSTAT inter %s\r\nSTAT verbosity %d\r\nSTAT evictions on\r\n"
               "STAT num_threads %llu\r\nSTAT cas_enabled yes\r\nSTAT tcp_backlog %llu\r\n"
               "STAT item_size_max %llu\r\nSTAT hashpower_init %llu\r\n"
               "STAT line_max %llu\r\nSTAT out_max %llu\r\nSTAT eviction_policy clock\r\n",
               (unsigned long long)cfg->store.memory_mb << 20, (unsigned long long)cfg->conn_limit,
               c->node->bound_port, cfg->listen && *cfg->listen ? cfg->listen : "NULL",
               log_get_level(), (unsigned long long)cfg->threads,
               (unsigned long long)cfg->backlog, (unsigned long long)cfg->store.item_max,
               (unsigned long long)cfg->store.hash_power, (unsigned long long)cfg->line_max,
               (unsigned long long)cfg->out_max);
    buf_printf(&c->wbuf, "STAT inflight_max %llu\r\nSTAT inflight_stall_ms %llu\r\n"
                         "STAT buffers_max %llu\r\nSTAT partial_timeout_ms %llu\r\n",
               (unsigned long long)cfg->inflight_max, (unsigned long long)cfg->inflight_stall_ms,
               (unsigned long long)cfg->buffers_max, (unsigned long long)cfg->partial_timeout_ms);
    /* memcached's other settings, as shoal has them (docs/exporter.md); every value is one
     * token, which the exporter's settings parser requires */
    buf_printf(&c->wbuf,
               "STAT oldest 0\r\nSTAT domain_socket NULL\r\nSTAT umask 700\r\n"
               "STAT shutdown_command no\r\nSTAT growth_factor 1.08\r\nSTAT chunk_size %u\r\n"
               "STAT stat_key_prefix :\r\nSTAT detail_enabled %s\r\n"
               "STAT binding_protocol ascii\r\nSTAT auth_enabled_sasl no\r\n"
               "STAT auth_enabled_ascii no\r\nSTAT maxconns_fast yes\r\n"
               "STAT slab_reassign yes\r\nSTAT slab_chunk_max %u\r\nSTAT lru_crawler %s\r\n"
               "STAT lru_crawler_sleep 0\r\nSTAT lru_crawler_tocrawl 0\r\n"
               "STAT tail_repair_time 0\r\nSTAT flush_enabled yes\r\nSTAT dump_enabled yes\r\n"
               "STAT hash_algorithm xxh3\r\nSTAT lru_maintainer_thread no\r\n"
               "STAT lru_segmented no\r\nSTAT hot_lru_pct 0\r\nSTAT warm_lru_pct 0\r\n"
               "STAT hot_max_factor 0.00\r\nSTAT warm_max_factor 0.00\r\nSTAT temp_lru no\r\n"
               "STAT temporary_ttl 0\r\nSTAT idle_timeout 0\r\nSTAT track_sizes no\r\n"
               "STAT inline_ascii_response no\r\n",
               store_class_chunk_min(c->node->store),
               detail_enabled(&c->node->detail) ? "yes" : "no",
               store_page_size(c->node->store),
               __atomic_load_n(&c->node->crawler_off, __ATOMIC_RELAXED) ? "no" : "yes");
}

/* Classes are shown as memcached shows them: `stats items` those holding items, `stats slabs`
 * those owning pages. shoal's classes are the same for every namespace (each namespace has its
 * own pages of each class), so a class's figures are summed over namespaces. */
static void stats_items(struct conn *c)
{
    struct store *st = c->node->store;
    int n = store_class_count(st);
    for (int i = 1; i <= n; i++) {
        struct store_class_stats cs;
        if (!store_class_stats(st, i, &cs) || cs.curr_items == 0) continue;
        struct class_metrics cm;
        class_metrics_sum(c->node, i, &cm);
        unsigned long long num = cs.curr_items;
        /* one CLOCK/S3-FIFO queue per class, no hot/warm segments: all of it counts as cold */
        buf_printf(&c->wbuf,
                   "STAT items:%d:number %llu\r\nSTAT items:%d:number_hot 0\r\n"
                   "STAT items:%d:number_warm 0\r\nSTAT items:%d:number_cold %llu\r\n"
                   "STAT items:%d:age_hot 0\r\nSTAT items:%d:age_warm 0\r\n"
                   "STAT items:%d:age %u\r\nSTAT items:%d:mem_requested %llu\r\n",
                   i, num, i, i, i, num, i, i, i, cs.oldest_age, i,
                   (unsigned long long)cs.mem_requested);
        buf_printf(&c->wbuf,
                   "STAT items:%d:evicted %llu\r\nSTAT items:%d:evicted_nonzero 0\r\n"
                   "STAT items:%d:evicted_time 0\r\nSTAT items:%d:outofmemory %llu\r\n"
                   "STAT items:%d:tailrepairs 0\r\nSTAT items:%d:reclaimed %llu\r\n"
                   "STAT items:%d:expired_unfetched %llu\r\n"
                   "STAT items:%d:evicted_unfetched %llu\r\nSTAT items:%d:evicted_active 0\r\n"
                   "STAT items:%d:crawler_reclaimed %llu\r\n"
                   "STAT items:%d:crawler_items_checked 0\r\n"
                   "STAT items:%d:lrutail_reflocked 0\r\n",
                   i, (unsigned long long)cs.evictions, i, i, i,
                   (unsigned long long)cs.alloc_failures, i, i, (unsigned long long)cs.reclaimed,
                   i, (unsigned long long)cs.expired_unfetched, i,
                   (unsigned long long)cs.evicted_unfetched, i, i,
                   (unsigned long long)cs.sweeper_reclaimed, i, i);
        buf_printf(&c->wbuf,
                   "STAT items:%d:moves_to_cold 0\r\nSTAT items:%d:moves_to_warm 0\r\n"
                   "STAT items:%d:moves_within_lru 0\r\nSTAT items:%d:direct_reclaims %llu\r\n"
                   "STAT items:%d:hits_to_hot 0\r\nSTAT items:%d:hits_to_warm 0\r\n"
                   "STAT items:%d:hits_to_cold %llu\r\nSTAT items:%d:hits_to_temp 0\r\n",
                   i, i, i, i, (unsigned long long)(cs.evictions + cs.reclaimed), i, i, i,
                   (unsigned long long)(cm.get_hits + cm.touch_hits), i);
    }
}

static void stats_slabs(struct conn *c)
{
    struct store *st = c->node->store;
    int n = store_class_count(st), active = 0;
    uint64_t malloced = 0;
    for (int i = 1; i <= n; i++) {
        struct store_class_stats cs;
        if (!store_class_stats(st, i, &cs) || cs.total_pages == 0) continue;
        active++;
        malloced += (uint64_t)cs.total_pages * cs.chunk_size * cs.chunks_per_page;
        buf_printf(&c->wbuf,
                   "STAT %d:chunk_size %u\r\nSTAT %d:chunks_per_page %u\r\n"
                   "STAT %d:total_pages %u\r\nSTAT %d:total_chunks %llu\r\n"
                   "STAT %d:used_chunks %llu\r\nSTAT %d:free_chunks %llu\r\n"
                   "STAT %d:free_chunks_end 0\r\n",
                   i, cs.chunk_size, i, cs.chunks_per_page, i, cs.total_pages, i,
                   (unsigned long long)cs.total_chunks, i, (unsigned long long)cs.used_chunks, i,
                   (unsigned long long)cs.free_chunks, i);
        struct class_metrics cm;
        class_metrics_sum(c->node, i, &cm);
#define X(name) buf_printf(&c->wbuf, "STAT %d:" #name " %llu\r\n", i, (unsigned long long)cm.name);
        CLASS_METRICS(X)
#undef X
    }
    /* The buckets' pages are rounded up per bucket (a bucket that has held an item shows one),
     * so their sum can pass -m; what item memory really holds is the segments pools own, which
     * never does (memcached's total_malloced stays <= limit_maxbytes too). */
    uint64_t owned = (uint64_t)store_pages_used(st) * store_page_size(st);
    if (malloced > owned) malloced = owned;
    buf_printf(&c->wbuf, "STAT active_slabs %d\r\nSTAT total_malloced %llu\r\n", active,
               (unsigned long long)malloced);
}

/* STAT ns:<name>:<field> lines: settings, then request figures since the namespace was made. */
static void stats_namespaces(struct conn *c)
{
    const struct ns_table *t = ns_current(&c->node->ns);
    for (int id = 0; id < NS_MAX; id++) {
        const struct ns *ns = t->byid[id];
        if (ns == NULL) continue;
        struct ns_metrics m;
        node_ns_figures(c->node, ns, &m);
        const char *nm = ns->name;
        buf_printf(&c->wbuf, "STAT ns:%s:quota %llu\r\n", nm, (unsigned long long)ns->cfg.memory);
#define X(name, lo, hi, def, help)                                                               \
    if (strcmp(#name, "memory") != 0)                                                            \
        buf_printf(&c->wbuf, "STAT ns:%s:%s %llu\r\n", nm, #name,                                 \
                   (unsigned long long)ns->cfg.name);
        NS_SETTINGS(X)
#undef X
#define X(name, kind, help)                                                                      \
    buf_printf(&c->wbuf, "STAT ns:%s:%s %llu\r\n", nm, #name, (unsigned long long)m.name);
        NS_METRICS(X)
#undef X
        struct store_ns_stats es;
        store_ns_stats(c->node->store, ns->id, &es);
        buf_printf(&c->wbuf,
                   "STAT ns:%s:items %llu\r\nSTAT ns:%s:bytes %llu\r\nSTAT ns:%s:memory %llu\r\n"
                   "STAT ns:%s:evictions %llu\r\nSTAT ns:%s:expired %llu\r\n",
                   nm, (unsigned long long)es.items, nm, (unsigned long long)es.bytes, nm,
                   (unsigned long long)es.memory, nm,
                   (unsigned long long)es.evictions, nm, (unsigned long long)es.expired);
        uint64_t reads = m.get_hits + m.get_misses;
        buf_printf(&c->wbuf, "STAT ns:%s:hit_ratio %.4f\r\n", nm,
                   reads ? (double)m.get_hits / (double)reads : 0.0);
    }
}

/* `stats detail on|off|dump`: memcached looks at the first word after "detail" only. */
static void stats_detail(struct conn *c, const char *arg, size_t n)
{
    while (n && *arg == ' ') arg++, n--;
    size_t w = 0;
    while (w < n && arg[w] != ' ') w++;
    struct detail *d = &c->node->detail;
    if (w == 2 && !memcmp(arg, "on", 2)) {
        detail_set(d, true);
        conn_reply_str(c, "OK\r\n");
    } else if (w == 3 && !memcmp(arg, "off", 3)) {
        detail_set(d, false);
        conn_reply_str(c, "OK\r\n");
    } else if (w == 4 && !memcmp(arg, "dump", 4)) {
        cmd_detail_dump(c); /* in slices, END at the end */
    } else {
        conn_reply_str(c, "CLIENT_ERROR usage: stats detail on|off|dump\r\n");
    }
}

void cmd_stats(struct conn *c, struct proto_req *req)
{
    const char *arg = req->arg;
    size_t len = arg ? req->narg : 0;
    /* the subcommand is the first word; memcached ignores words after most of them */
    size_t n = 0;
    while (n < len && arg[n] != ' ') n++;
    const char *rest = arg ? arg + n : NULL;
    size_t nrest = len - n;
#define IS(s) (n == sizeof(s) - 1 && !memcmp(arg, s, n))
    if (n == 0) stats_general(c);
    else if (IS("settings")) stats_settings(c);
    else if (IS("items")) stats_items(c);
    else if (IS("slabs")) stats_slabs(c);
    else if (IS("namespaces")) stats_namespaces(c);
    else if (IS("repl")) repl_stats_text(c->node->repl, &c->wbuf); /* repl.c */
    else if (IS("sizes") || IS("sizes_enable") || IS("sizes_disable"))
        /* shoal keeps no size histogram; memcached 1.6.18 answers sizes_enable/_disable
         * without END, which leaves a client waiting: we end them */
        buf_printf(&c->wbuf, "STAT sizes_status disabled\r\n");
    else if (IS("conns")) {
        uint32_t now = clock_now();
        uint32_t up = (uint32_t)(time(NULL) - c->node->started);
        struct node *nd = c->node;
        if (connlist_write(&nd->conns, &c->wbuf, nd->listen_fd, up, &c->listed, now) < 0) {
            c->w->m.conn_oom++;
            conn_reply_str(c, "SERVER_ERROR out of memory writing stats\r\n");
            return;
        }
    } else if (IS("extstore"))
        ; /* no extstore: an empty list, as memcached without it */
    else if (IS("cachedump")) {
        cmd_cachedump(c, rest, nrest);
        return;
    } else if (IS("detail")) {
        stats_detail(c, rest, nrest);
        return;
    } else if (IS("reset")) {
        for (uint64_t i = 0; i < c->node->cfg.threads; i++) {
            memset(&c->node->workers[i].m, 0, sizeof c->node->workers[i].m);
            memset(c->node->workers[i].cls, 0, sizeof c->node->workers[i].cls);
        }
        detail_clear(&c->node->detail);
        conn_reply_str(c, "RESET\r\n");
        return;
    } else {
        conn_reply_str(c, "ERROR\r\n");
        return;
    }
#undef IS
    conn_reply(c, "END\r\n", 5);
}
