/* deliver_metrics.c — delivery's figures: the commit-to-delete latency histogram, deletes per
 * second and per batch over the last seconds, and the Prometheus text of every cluster's
 * counters and gauges (deliver_metrics, for the invalidator's /metrics). Series are named
 * shoal_invalidator_cluster_<name>{cluster="<cluster>"}, one family per metric. */
#include "invalidator/deliver_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/metrics.h"

static int dhist_index(uint64_t us)
{
    if (us < DHIST_SUB) return (int)us;
    int p = 63 - __builtin_clzll(us); /* >= 3 */
    int i = (p - 2) * DHIST_SUB + (int)((us >> (p - 3)) & (DHIST_SUB - 1));
    return i < DHIST_BUCKETS ? i : DHIST_BUCKETS - 1;
}

/* The largest latency bucket i holds. */
static uint64_t dhist_upper(int i)
{
    if (i < DHIST_SUB) return (uint64_t)i;
    int p = i / DHIST_SUB + 2, sub = i % DHIST_SUB;
    return ((uint64_t)(DHIST_SUB + sub + 1) << (p - 3)) - 1;
}

void dhist_record(struct dhist *h, uint64_t us)
{
    h->b[dhist_index(us)]++;
    h->count++;
    h->sum_us += us;
}

uint64_t dhist_quantile(const struct dhist *h, double q)
{
    if (!h->count) return 0;
    uint64_t want = (uint64_t)((double)h->count * q), seen = 0;
    if (want >= h->count) want = h->count - 1;
    for (int i = 0; i < DHIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen > want) return dhist_upper(i);
    }
    return dhist_upper(DHIST_BUCKETS - 1);
}

void drate_add(struct drate *r, int64_t now_s, uint64_t keys, uint64_t batches)
{
    int i = (int)(now_s % DRATE_SECS);
    if (r->sec[i] != now_s) {
        r->sec[i] = now_s;
        r->keys[i] = r->batches[i] = 0;
    }
    r->keys[i] += keys;
    r->batches[i] += batches;
}

void drate_sum(const struct drate *r, int64_t now_s, int window, uint64_t *keys, uint64_t *batches)
{
    *keys = *batches = 0;
    for (int k = 1; k <= window && k < DRATE_SECS; k++) {
        int64_t s = now_s - k;
        int i = (int)(s % DRATE_SECS);
        if (r->sec[i] != s) continue;
        *keys += r->keys[i];
        *batches += r->batches[i];
    }
}

static const struct metric_desc counters[] = {
#define X(name, kind, help) METRIC_DESC(struct deliver_cstats, name, kind, help),
    DELIVER_CLUSTER_METRICS(X) DELIVER_CLUSTER_GAUGES(X)
#undef X
};

/* Write `s` with \ and " escaped, as a Prometheus label value. */
static void label_value(struct buf *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') buf_append(out, "\\", 1);
        if (*s == '\n') buf_append(out, "\\n", 2);
        else buf_append(out, s, 1);
    }
}

/* Start a series' line: shoal_invalidator_cluster_<name><suffix>{cluster="<cluster>, the
 * caller closing the label (and adding any other) and writing the value. */
static void series(struct buf *out, const char *name, const char *suffix, const char *cluster)
{
    buf_printf(out, "shoal_invalidator_cluster_%s%s{cluster=\"", name, suffix);
    label_value(out, cluster);
}

#define RATE_WINDOW 10

void deliver_metrics(struct deliver *d, struct buf *out)
{
    size_t n = d->nc;
    struct deliver_cstats *st = calloc(n ? n : 1, sizeof *st);
    struct dhist *lat = calloc(n ? n : 1, sizeof *lat);
    struct drate *rate = calloc(n ? n : 1, sizeof *rate);
    if (!st || !lat || !rate) {
        free(st);
        free(lat);
        free(rate);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct dcluster *c = &d->c[i];
        pthread_mutex_lock(&c->lock);
        st[i] = c->st;
        lat[i] = c->lat;
        rate[i] = c->rate;
        pthread_mutex_unlock(&c->lock);
        st[i].safe_lsn = __atomic_load_n(&c->safe, __ATOMIC_ACQUIRE);
        st[i].replica_lsn = __atomic_load_n(&c->replica_lsn, __ATOMIC_ACQUIRE);
    }
    const char *pre = "shoal_invalidator_cluster_";
    for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++) {
        const struct metric_desc *m = &counters[k];
        bool ctr = m->kind == METRIC_COUNTER;
        bool replica_only = !strncmp(m->name, "replica_", 8) || !strcmp(m->name, "gated_deletes");
        const char *suffix = ctr ? "_total" : "";
        buf_printf(out, "# HELP %s%s%s %s\n# TYPE %s%s%s %s\n", pre, m->name, suffix, m->help, pre,
                   m->name, suffix, ctr ? "counter" : "gauge");
        for (size_t i = 0; i < n; i++) {
            if (replica_only && !d->c[i].replica) continue;
            series(out, m->name, suffix, d->c[i].name);
            buf_printf(out, "\"} %llu\n",
                       (unsigned long long)*(const uint64_t *)((const char *)&st[i] + m->offset));
        }
    }
    /* two gauges from the last RATE_WINDOW seconds' sums: per second, and per batch */
    static const char *const rate_name[] = {"deletes_per_second", "deletes_per_batch"};
    static const char *const rate_help[] = {"deletes applied per second", "mean deletes per batch"};
    int64_t now_s = clock_wall_us() / 1000000;
    for (int r = 0; r < 2; r++) {
        buf_printf(out, "# HELP %s%s %s over the last %d seconds\n# TYPE %s%s gauge\n", pre,
                   rate_name[r], rate_help[r], RATE_WINDOW, pre, rate_name[r]);
        for (size_t i = 0; i < n; i++) {
            uint64_t keys, batches;
            drate_sum(&rate[i], now_s, RATE_WINDOW, &keys, &batches);
            series(out, rate_name[r], "", d->c[i].name);
            buf_printf(out, "\"} %.1f\n",
                       r == 0    ? (double)keys / RATE_WINDOW
                       : batches ? (double)keys / (double)batches
                                 : 0.0);
        }
    }
    buf_printf(out, "# HELP %scommit_to_delete_us time from a commit (its timestamp in the "
                    "database) to its last delete applied in the cluster, since start "
                    "(quantiles: upper bound of a bucket 1/8 of a power of two wide)\n"
                    "# TYPE %scommit_to_delete_us summary\n", pre, pre);
    for (size_t i = 0; i < n; i++) {
        static const double qs[] = {0.5, 0.99};
        for (size_t k = 0; k < 2; k++) {
            series(out, "commit_to_delete_us", "", d->c[i].name);
            buf_printf(out, "\",quantile=\"%g\"} %llu\n", qs[k],
                       (unsigned long long)dhist_quantile(&lat[i], qs[k]));
        }
        series(out, "commit_to_delete_us", "_sum", d->c[i].name);
        buf_printf(out, "\"} %llu\n", (unsigned long long)lat[i].sum_us);
        series(out, "commit_to_delete_us", "_count", d->c[i].name);
        buf_printf(out, "\"} %llu\n", (unsigned long long)lat[i].count);
    }
    free(st);
    free(lat);
    free(rate);
}
