/* stats.c — per-thread counters of shoal-bench, see stats.h. */
#include "bench/stats.h"

#include <string.h>

const char *const bench_err_names[BENCH_ERR_COUNT] = {
    [BENCH_ERR_NOT_STORED] = "not_stored",
    [BENCH_ERR_SERVER] = "server_error",
    [BENCH_ERR_CLIENT] = "client_error",
    [BENCH_ERR_ERROR] = "error",
    [BENCH_ERR_PROTOCOL] = "protocol",
    [BENCH_ERR_CONN] = "conn",
    [BENCH_ERR_LOST] = "lost",
};

void bench_stats_init(struct bench_stats *s)
{
    memset(&s->c, 0, sizeof(s->c));
    s->err_sample[0] = '\0';
    bench_hist_init(&s->hist);
    bench_hist_init(&s->hist_server);
    bench_hist_init(&s->hist_client);
}

void bench_stats_error(struct bench_stats *s, enum bench_err e, const char *text, size_t len)
{
    s->c.err[e]++;
    if (s->err_sample[0] || !text) return;
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < sizeof(s->err_sample); i++) {
        unsigned char ch = (unsigned char)text[i];
        s->err_sample[n++] =
            (ch >= ' ' && ch < 0x7f) ? (char)ch : '?'; /* server text is untrusted */
    }
    s->err_sample[n] = '\0';
}

uint64_t bench_counts_errors(const struct bench_counts *c)
{
    uint64_t t = 0;
    for (int i = 0; i < BENCH_ERR_COUNT; i++) t += c->err[i];
    return t;
}

void bench_stats_merge(struct bench_stats *dst, const struct bench_stats *src)
{
    dst->c.gets += src->c.gets;
    dst->c.sets += src->c.sets;
    dst->c.hits += src->c.hits;
    dst->c.misses += src->c.misses;
    dst->c.scan_gets += src->c.scan_gets;
    dst->c.scan_hits += src->c.scan_hits;
    dst->c.scan_misses += src->c.scan_misses;
    dst->c.sets_issued += src->c.sets_issued;
    for (int i = 0; i < BENCH_ERR_COUNT; i++) dst->c.err[i] += src->c.err[i];
    if (!dst->err_sample[0]) memcpy(dst->err_sample, src->err_sample, sizeof(dst->err_sample));
    bench_hist_merge(&dst->hist, &src->hist);
    bench_hist_merge(&dst->hist_server, &src->hist_server);
    bench_hist_merge(&dst->hist_client, &src->hist_client);
}
