/* report.c — print shoal-bench's results as a table and, with --json, one JSON line. */
#include "bench/report.h"

#include <inttypes.h>

uint64_t bench_report_ops(const struct bench_stats *st)
{
    return st->c.gets + st->c.sets;
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static double ratio(uint64_t part, uint64_t whole)
{
    return whole ? (double)part / (double)whole : 0.0;
}

/* "100 B" or "100-2048 B (log-uniform per key, mean 645 B)" */
static void describe_values(char *buf, size_t cap, const struct bench_report *r)
{
    const struct bench_opts *o = r->o;
    if (o->value_min >= o->value_size)
        snprintf(buf, cap, "%zu B", o->value_size);
    else
        snprintf(buf, cap, "%zu-%zu B (log-uniform per key, mean %.0f B)", o->value_min,
                 o->value_size, r->value_mean);
}

/* The cache-aside part of the human report. */
static void print_aside(FILE *f, const struct bench_report *r, const char *dist, double secs)
{
    const struct bench_opts *o = r->o;
    const struct bench_counts *c = &r->st->c;
    uint64_t kg = c->gets - c->scan_gets, kh = c->hits - c->scan_hits;
    uint64_t km = c->misses - c->scan_misses;
    fprintf(f, "  %-18s %12s %12s %12s %11s\n", "cache-aside", "gets", "hits", "misses",
            "miss ratio");
    char label[80];
    snprintf(label, sizeof(label), "keys (%s)", dist);
    fprintf(f, "  %-18s %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %10.4f%%\n", label, kg, kh, km,
            100.0 * ratio(km, kg));
    if (o->scan_every)
        fprintf(f, "  %-18s %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %10.4f%%\n", "scans",
                c->scan_gets, c->scan_hits, c->scan_misses,
                100.0 * ratio(c->scan_misses, c->scan_gets));
    fprintf(f, "  %-18s %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %10.4f%%\n", "all", c->gets,
            c->hits, c->misses, 100.0 * ratio(c->misses, c->gets));
    fprintf(f,
            "  sets issued %" PRIu64 " (one per miss), stored %" PRIu64
            "; %.0f ops/s (%.0f gets/s)\n",
            c->sets_issued, c->sets, (double)(c->gets + c->sets) / secs, (double)c->gets / secs);
    fprintf(f, "  headline: miss ratio %.4f%% of key gets", 100.0 * ratio(km, kg));
    if (o->scan_every)
        fprintf(f, ", %.4f%% of all gets (scans %.1f%% of gets)", 100.0 * ratio(c->misses, c->gets),
                100.0 * ratio(c->scan_gets, c->gets));
    fprintf(f, "\n\n");
}

static void print_errors(FILE *f, const char *title, const struct bench_stats *st)
{
    fprintf(f, "  %s:", title);
    for (int i = 0; i < BENCH_ERR_COUNT; i++)
        if (st->c.err[i]) fprintf(f, " %s=%" PRIu64, bench_err_names[i], st->c.err[i]);
    fprintf(f, "\n    first: %s\n", st->err_sample[0] ? st->err_sample : "(no text)");
}

void bench_report_print(FILE *f, const struct bench_report *r)
{
    const struct bench_opts *o = r->o;
    const struct bench_stats *st = r->st;
    const struct bench_hist *h = &st->hist;
    uint64_t ops = bench_report_ops(st);
    uint64_t errors = bench_counts_errors(&st->c);
    double secs = r->elapsed_s > 0 ? r->elapsed_s : 1e-9;
    uint64_t lookups = st->c.hits + st->c.misses;
    double hit_ratio = lookups ? (double)st->c.hits / (double)lookups : 0.0;
    double p50 = bench_hist_percentile(h, 50) / 1e3, p90 = bench_hist_percentile(h, 90) / 1e3;
    double p99 = bench_hist_percentile(h, 99) / 1e3, p999 = bench_hist_percentile(h, 99.9) / 1e3;
    double max = h->count ? (double)h->max_ns / 1e3 : 0.0;
    double mean = bench_hist_mean(h) / 1e3;
    double cpu_per_op = ops ? r->client_cpu_s * 1e6 / (double)ops : 0.0;
    char dist[64], values[96], mix[32];
    const bool aside = o->mode == BENCH_MODE_CACHE_ASIDE;
    if (o->dist == BENCH_DIST_ZIPF)
        snprintf(dist, sizeof(dist), "zipf %.3g", o->zipf_theta);
    else
        snprintf(dist, sizeof(dist), "uniform");
    describe_values(values, sizeof(values), r);
    if (aside)
        snprintf(mix, sizeof(mix), "cache-aside");
    else
        snprintf(mix, sizeof(mix), "set:get %u:%u", o->ratio_set, o->ratio_get);

    fprintf(f,
            "shoal-bench %s:%s  threads %u  conns %u  pipeline %u  %s  keys %" PRIu64
            " (%s)  value %s  seed %" PRIu64 "\n",
            o->host, o->port, o->threads, o->conns, o->pipeline, mix, o->keys, dist, values,
            o->seed);
    if (o->rate)
        fprintf(f, "open loop: %" PRIu64 " requests/s offered; latency from when each was due\n",
                o->rate);
    if (o->scan_every)
        fprintf(f,
                "scans: after every %" PRIu64 " key gets a thread reads %" PRIu64
                " keys in order from a cold range of %" PRIu64 "\n",
                o->scan_every, o->scan_length, o->scan_keys);
    if (aside && o->requests)
        fprintf(f,
                "measured %" PRIu64 " gets in %.2f s after %" PRIu64
                " warm-up gets (%.2f s)%s\n\n",
                st->c.gets, r->elapsed_s, r->warm ? r->warm->c.gets : 0, r->warmup_s,
                r->interrupted ? "  (interrupted)" : "");
    else
        fprintf(f, "measured %.2f s after %.2f s warmup%s\n\n", r->elapsed_s, r->warmup_s,
                r->interrupted ? "  (interrupted)" : "");
    if (aside) print_aside(f, r, dist, secs);
    fprintf(f, "  %12s %12s %12s %10s %8s\n", "ops/s", "gets/s", "sets/s", "hit ratio", "errors");
    fprintf(f, "  %12.0f %12.0f %12.0f %9.2f%% %8" PRIu64 "\n", (double)ops / secs,
            (double)st->c.gets / secs, (double)st->c.sets / secs, hit_ratio * 100.0, errors);
    fprintf(f, "\n  %-12s %10s %10s %10s %10s %10s\n", "latency (us)", "p50", "p99", "p99.9", "max",
            "mean");
    fprintf(f, "  %-12s %10.1f %10.1f %10.1f %10.1f %10.1f\n", "", p50, p99, p999, max, mean);
    if (o->split) {
        const struct bench_hist *hs[2] = {&st->hist_server, &st->hist_client};
        const char *names[2] = {"server part", "client part"};
        for (int i = 0; i < 2; i++)
            fprintf(f, "  %-12s %10.1f %10.1f %10.1f %10.1f %10.1f\n", names[i],
                    bench_hist_percentile(hs[i], 50) / 1e3, bench_hist_percentile(hs[i], 99) / 1e3,
                    bench_hist_percentile(hs[i], 99.9) / 1e3,
                    hs[i]->count ? (double)hs[i]->max_ns / 1e3 : 0.0, bench_hist_mean(hs[i]) / 1e3);
        fprintf(f, "  (split at the reply's arrival in the client's socket; %" PRIu64
                   " of %" PRIu64 " replies stamped)\n",
                st->hist_server.count, h->count);
    }
    fprintf(f, "\n  client cpu %.2f s = %.2f us per op\n", r->client_cpu_s, cpu_per_op);
    if (errors) print_errors(f, "errors", st);
    if (r->warm && bench_counts_errors(&r->warm->c))
        print_errors(f, "errors during warmup (not counted above)", r->warm);

    if (!o->json) return;
    fprintf(f, "{\"server\":");
    char server[300];
    snprintf(server, sizeof(server), "%s:%s", o->host, o->port);
    json_string(f, server);
    fprintf(f, ",\"mode\":\"%s\"", aside ? "cache-aside" : "mixed");
    fprintf(f,
            ",\"threads\":%u,\"conns\":%u,\"pipeline\":%u,\"rate\":%" PRIu64
            ",\"ratio_set\":%u,\"ratio_get\":%u",
            o->threads, o->conns, o->pipeline, o->rate, o->ratio_set, o->ratio_get);
    fprintf(f,
            ",\"keys\":%" PRIu64
            ",\"dist\":\"%s\",\"zipf_theta\":%g,\"value_size\":%zu,\"seed\":%" PRIu64,
            o->keys, o->dist == BENCH_DIST_ZIPF ? "zipf" : "uniform", o->zipf_theta, o->value_size,
            o->seed);
    fprintf(f, ",\"value_min\":%zu,\"value_max\":%zu,\"value_mean\":%.1f,\"value_dist\":\"%s\"",
            o->value_min, o->value_size, r->value_mean,
            o->value_min < o->value_size ? "log-uniform" : "fixed");
    fprintf(f, ",\"duration_s\":%.3f,\"warmup_s\":%.3f,\"interrupted\":%s", r->elapsed_s,
            r->warmup_s, r->interrupted ? "true" : "false");
    if (aside) {
        const struct bench_counts *c = &st->c;
        uint64_t kg = c->gets - c->scan_gets, km = c->misses - c->scan_misses;
        fprintf(f,
                ",\"requests\":%" PRIu64 ",\"warmup_requests\":%" PRIu64 ",\"warmup_gets\":%" PRIu64
                ",\"scan_every\":%" PRIu64 ",\"scan_length\":%" PRIu64 ",\"scan_keys\":%" PRIu64,
                o->requests, o->warmup_requests, r->warm ? r->warm->c.gets : 0, o->scan_every,
                o->scan_length, o->scan_every ? o->scan_keys : 0);
        fprintf(f,
                ",\"key_gets\":%" PRIu64 ",\"key_misses\":%" PRIu64 ",\"scan_gets\":%" PRIu64
                ",\"scan_hits\":%" PRIu64 ",\"scan_misses\":%" PRIu64 ",\"sets_issued\":%" PRIu64,
                kg, km, c->scan_gets, c->scan_hits, c->scan_misses, c->sets_issued);
        fprintf(f, ",\"miss_ratio\":%.6f,\"miss_ratio_all\":%.6f,\"miss_ratio_scan\":%.6f",
                ratio(km, kg), ratio(c->misses, c->gets), ratio(c->scan_misses, c->scan_gets));
    }
    fprintf(f,
            ",\"ops\":%" PRIu64 ",\"gets\":%" PRIu64 ",\"sets\":%" PRIu64 ",\"hits\":%" PRIu64
            ",\"misses\":%" PRIu64,
            ops, st->c.gets, st->c.sets, st->c.hits, st->c.misses);
    fprintf(f,
            ",\"ops_per_sec\":%.1f,\"gets_per_sec\":%.1f,\"sets_per_sec\":%.1f,\"hit_ratio\":%.6f",
            (double)ops / secs, (double)st->c.gets / secs, (double)st->c.sets / secs, hit_ratio);
    fprintf(f, ",\"errors\":%" PRIu64, errors);
    for (int i = 0; i < BENCH_ERR_COUNT; i++)
        fprintf(f, ",\"errors_%s\":%" PRIu64, bench_err_names[i], st->c.err[i]);
    fprintf(f,
            ",\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,"
            "\"mean_us\":%.1f",
            p50, p90, p99, p999, max, mean);
    if (o->split) {
        const struct bench_hist *hs[2] = {&st->hist_server, &st->hist_client};
        const char *names[2] = {"server", "client"};
        for (int i = 0; i < 2; i++)
            fprintf(f,
                    ",\"%s_p50_us\":%.1f,\"%s_p99_us\":%.1f,\"%s_p999_us\":%.1f,"
                    "\"%s_max_us\":%.1f,\"%s_stamped\":%" PRIu64,
                    names[i], bench_hist_percentile(hs[i], 50) / 1e3, names[i],
                    bench_hist_percentile(hs[i], 99) / 1e3, names[i],
                    bench_hist_percentile(hs[i], 99.9) / 1e3, names[i],
                    hs[i]->count ? (double)hs[i]->max_ns / 1e3 : 0.0, names[i], hs[i]->count);
    }
    fprintf(f, ",\"client_cpu_s\":%.3f,\"client_cpu_us_per_op\":%.3f}\n", r->client_cpu_s,
            cpu_per_op);
}
