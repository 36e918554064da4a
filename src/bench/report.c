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
    char dist[64];
    if (o->dist == BENCH_DIST_ZIPF)
        snprintf(dist, sizeof(dist), "zipf %.3g", o->zipf_theta);
    else
        snprintf(dist, sizeof(dist), "uniform");

    fprintf(f,
            "shoal-bench %s:%s  threads %u  conns %u  pipeline %u  set:get %u:%u  keys %" PRIu64
            " (%s)  value %zu B  seed %" PRIu64 "\n",
            o->host, o->port, o->threads, o->conns, o->pipeline, o->ratio_set, o->ratio_get,
            o->keys, dist, o->value_size, o->seed);
    fprintf(f, "measured %.2f s after %.2f s warmup%s\n\n", r->elapsed_s, r->warmup_s,
            r->interrupted ? "  (interrupted)" : "");
    fprintf(f, "  %12s %12s %12s %10s %8s\n", "ops/s", "gets/s", "sets/s", "hit ratio", "errors");
    fprintf(f, "  %12.0f %12.0f %12.0f %9.2f%% %8" PRIu64 "\n", (double)ops / secs,
            (double)st->c.gets / secs, (double)st->c.sets / secs, hit_ratio * 100.0, errors);
    fprintf(f, "\n  %-12s %10s %10s %10s %10s %10s\n", "latency (us)", "p50", "p99", "p99.9", "max",
            "mean");
    fprintf(f, "  %-12s %10.1f %10.1f %10.1f %10.1f %10.1f\n", "", p50, p99, p999, max, mean);
    fprintf(f, "\n  client cpu %.2f s = %.2f us per op\n", r->client_cpu_s, cpu_per_op);
    if (errors) print_errors(f, "errors", st);
    if (r->warm && bench_counts_errors(&r->warm->c))
        print_errors(f, "errors during warmup (not counted above)", r->warm);

    if (!o->json) return;
    fprintf(f, "{\"server\":");
    char server[300];
    snprintf(server, sizeof(server), "%s:%s", o->host, o->port);
    json_string(f, server);
    fprintf(f, ",\"threads\":%u,\"conns\":%u,\"pipeline\":%u,\"ratio_set\":%u,\"ratio_get\":%u",
            o->threads, o->conns, o->pipeline, o->ratio_set, o->ratio_get);
    fprintf(f,
            ",\"keys\":%" PRIu64
            ",\"dist\":\"%s\",\"zipf_theta\":%g,\"value_size\":%zu,\"seed\":%" PRIu64,
            o->keys, o->dist == BENCH_DIST_ZIPF ? "zipf" : "uniform", o->zipf_theta, o->value_size,
            o->seed);
    fprintf(f, ",\"duration_s\":%.3f,\"warmup_s\":%.3f,\"interrupted\":%s", r->elapsed_s,
            r->warmup_s, r->interrupted ? "true" : "false");
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
    fprintf(f, ",\"client_cpu_s\":%.3f,\"client_cpu_us_per_op\":%.3f}\n", r->client_cpu_s,
            cpu_per_op);
}
