/* bench_index.c — microbenchmark of the hash index alone (src/node/index.h): insert with growth,
 * lookup hits, lookup misses, remove + re-insert, on items laid out like slab chunks.
 *
 * Not a unit test (no test_ prefix, so `make unit` skips it). Uses only index_create, _insert,
 * _find, _remove and _destroy, so the same file builds against an older index.c to compare:
 *
 *   cc -O2 -g -Isrc -D_GNU_SOURCE tests/unit/bench_index.c src/node/index.c \
 *      -o /tmp/bench_index -lxxhash -lpthread
 *   /tmp/bench_index [items] [chunk_bytes] [rounds]  wall-clock ns per operation: the lookup
 *      phases run `rounds` times (default 5) and the best round is reported, since a shared
 *      machine's noise only ever adds time
 *   valgrind --tool=callgrind /tmp/bench_index 200000   then callgrind_annotate --inclusive=yes:
 *      instructions of bench_insert, bench_hit, bench_miss, bench_remove / items
 *
 * Hashes are computed before the timed phases, so the figures are the index's own cost (plus,
 * for remove, the rehashing it does inside). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "node/index.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct ctx {
    struct index *ix;
    size_t n;
    struct item **items; /* in shuffled order, like slab chunks handed out over time */
    uint64_t *hv;        /* hash of items[i] */
    char (*miss)[40];    /* absent keys */
    uint64_t *mhv;
};

__attribute__((noinline)) static void bench_insert(struct ctx *c)
{
    for (size_t i = 0; i < c->n; i++)
        index_insert(index_shard_of(c->ix, c->hv[i]), c->hv[i], c->items[i]);
}

__attribute__((noinline)) static size_t bench_hit(struct ctx *c)
{
    size_t found = 0;
    for (size_t i = 0; i < c->n; i++) {
        struct item *it = c->items[i];
        found += index_find(index_shard_of(c->ix, c->hv[i]), c->hv[i], it->data, it->nkey) == it;
    }
    return found;
}

__attribute__((noinline)) static size_t bench_miss(struct ctx *c)
{
    size_t found = 0;
    for (size_t i = 0; i < c->n; i++)
        found += index_find(index_shard_of(c->ix, c->mhv[i]), c->mhv[i], c->miss[i],
                            strlen(c->miss[i])) != NULL;
    return found;
}

/* Remove every other item, then put them back. */
__attribute__((noinline)) static void bench_remove(struct ctx *c)
{
    for (size_t i = 0; i < c->n; i += 2)
        index_remove(index_shard_of(c->ix, c->hv[i]), c->hv[i], c->items[i]);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 2000000;
    size_t chunk = argc > 2 ? strtoul(argv[2], NULL, 10) : 192; /* 40 + 30-byte key + 100 + slack */
    struct ctx c = {.n = n};
    char err[128];
    if (index_create(&c.ix, 16, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    char *arena = aligned_alloc(64, n * chunk);
    c.items = malloc(n * sizeof *c.items);
    c.hv = malloc(n * sizeof *c.hv);
    c.miss = malloc(n * sizeof *c.miss);
    c.mhv = malloc(n * sizeof *c.mhv);
    if (!arena || !c.items || !c.hv || !c.miss || !c.mhv) return 1;
    memset(arena, 0, n * chunk);
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        struct item *it = (struct item *)(arena + i * chunk);
        it->nkey = (uint8_t)snprintf(it->data, 40, "key:%020zu:abcd", i);
        c.items[i] = it;
        snprintf(c.miss[i], sizeof c.miss[i], "abs:%020zu:abcd", i);
        c.mhv[i] = index_hash(c.miss[i], strlen(c.miss[i]));
    }
    for (size_t i = n - 1; i > 0; i--) { /* shuffle so lookups jump around memory */
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        size_t j = r % (i + 1);
        struct item *t = c.items[i];
        c.items[i] = c.items[j];
        c.items[j] = t;
    }
    for (size_t i = 0; i < n; i++) c.hv[i] = index_hash(c.items[i]->data, c.items[i]->nkey);

    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    double t0 = now_s();
    bench_insert(&c);
    double t1 = now_s();
    double hit_s = 1e30, miss_s = 1e30;
    size_t hits = n, false_hits = 0;
    for (int r = 0; r < rounds || r < 1; r++) {
        double a = now_s();
        size_t h = bench_hit(&c);
        double b = now_s();
        size_t f = bench_miss(&c);
        double e = now_s();
        if (h != n) hits = h;
        false_hits += f;
        if (b - a < hit_s) hit_s = b - a;
        if (e - b < miss_s) miss_s = e - b;
    }
    double t3 = now_s();
    bench_remove(&c);
    double t4 = now_s();
    if (hits != n || false_hits != 0) {
        fprintf(stderr, "wrong: %zu hits, %zu false hits\n", hits, false_hits);
        return 1;
    }
    uint64_t slots = index_buckets(c.ix);
    printf("items %zu  slots/buckets %llu  load %.3f\n", n, (unsigned long long)slots,
           (double)n / (double)slots);
    printf("ns/op: insert %.1f  hit %.1f  miss %.1f  remove %.1f\n", (t1 - t0) * 1e9 / (double)n,
           hit_s * 1e9 / (double)n, miss_s * 1e9 / (double)n,
           (t4 - t3) * 1e9 / (double)(n / 2));
    index_destroy(&c.ix);
    free(arena);
    free(c.items);
    free(c.hv);
    free(c.miss);
    free(c.mhv);
    return 0;
}
