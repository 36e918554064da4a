/* test_index.c — unit tests of the sharded open-addressing hash index (src/node/index.h):
 * insert/find/remove/swap, counters, forced collisions (same home slot, same tag), backward-shift
 * deletion, growth with items present, and a full table whose doubling fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "node/index.h"

#define NCLASSES 4

/* ---- helpers ------------------------------------------------------------------------------ */

static struct index *mk(unsigned hash_power)
{
    struct index *ix = NULL;
    char err[128] = "";
    if (index_create(&ix, hash_power, err, sizeof err) != 0) fail_msg("%s", err);
    return ix;
}

static struct item *mk_item(const char *key, uint8_t clsid, uint16_t nsid, uint32_t nbytes)
{
    size_t nkey = strlen(key);
    struct item *it = calloc(1, sizeof *it + nkey + 1); /* NUL-terminated: keys are reused */
    assert_non_null(it);
    memcpy(it->data, key, nkey);
    it->nkey = (uint8_t)nkey;
    it->nsid = nsid;
    it->nbytes = nbytes; /* counted in bytes, not stored: the test item has no value */
    return it;
}

static uint64_t hv_of(const struct item *it) { return index_hash(it->data, it->nkey); }

static struct item *find(struct index *ix, const char *key)
{
    uint64_t hv = index_hash(key, strlen(key));
    return index_find(index_shard_of(ix, hv), hv, key, strlen(key));
}

static bool insert(struct index *ix, struct item *it)
{
    uint64_t hv = hv_of(it);
    return index_insert(index_shard_of(ix, hv), hv, it);
}

static bool remove_item(struct index *ix, struct item *it)
{
    uint64_t hv = hv_of(it);
    return index_remove(index_shard_of(ix, hv), hv, it);
}

static void *fail_alloc(size_t nmemb, size_t size)
{
    (void)nmemb;
    (void)size;
    return NULL;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* The linear-probing invariant, checked on every slot of a shard: every slot from an entry's
 * home to the entry is full, its tag is its hash's, its displacement field is right, and
 * the number of full slots is curr_items, with at least one slot empty. */
static void check_shard(const struct index_shard *sh)
{
    size_t n = (size_t)1 << sh->power, mask = n - 1, full = 0;
    for (size_t p = 0; p < n; p++) {
        uint64_t s = sh->slots[p];
        if (!s) continue;
        full++;
        const struct item *it = index_slot_item(s);
        uint64_t hv = index_hash(it->data, it->nkey);
        assert_int_equal(s >> INDEX_TAG_SHIFT, (hv >> INDEX_SHARD_BITS) & 0xffff);
        size_t home = sh->power ? (size_t)(hv >> (64 - sh->power)) : 0;
        size_t d = (p - home) & mask;
        assert_int_equal((s >> INDEX_DISP_SHIFT) & INDEX_DISP_MAX, d < INDEX_DISP_MAX ? d : INDEX_DISP_MAX);
        for (size_t q = home; q != p; q = (q + 1) & mask)
            if (!sh->slots[q]) fail_msg("slot %zu empty between home %zu and entry at %zu", q, home, p);
    }
    assert_int_equal(full, sh->curr_items);
    assert_true(full < n);
}

static void check_all(struct index *ix)
{
    for (unsigned i = 0; i < INDEX_SHARDS; i++) check_shard(&ix->shards[i]);
}

/* `n` distinct keys "<prefix><number>" whose hash satisfies (hv & mask) == want. */
static char **keys_where(const char *prefix, size_t n, uint64_t mask, uint64_t want)
{
    char **keys = calloc(n, sizeof *keys);
    assert_non_null(keys);
    char buf[64];
    size_t got = 0;
    for (uint64_t i = 0; got < n; i++) {
        int len = snprintf(buf, sizeof buf, "%s%llu", prefix, (unsigned long long)i);
        if ((index_hash(buf, (size_t)len) & mask) == want) keys[got++] = strdup(buf);
    }
    return keys;
}

static void free_keys(char **keys, size_t n)
{
    for (size_t i = 0; i < n; i++) free(keys[i]);
    free(keys);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_basic(void **state)
{
    (void)state;
    struct index *ix = mk(16);
    enum { N = 20000 };
    static struct item *items[N];
    char key[32];
    uint64_t bytes = 0;
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key:%d", i);
        items[i] = mk_item(key, (uint8_t)(1 + i % NCLASSES), (uint16_t)(i % 3), (uint32_t)i % 100);
        assert_true(insert(ix, items[i]));
        bytes += index_item_bytes(items[i]);
    }
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key:%d", i);
        assert_ptr_equal(find(ix, key), items[i]);
        snprintf(key, sizeof key, "nokey:%d", i);
        assert_null(find(ix, key));
    }
    check_all(ix);

    /* counters: per shard, per class, per namespace */
    uint64_t nitems = 0, sbytes = 0;
    for (unsigned s = 0; s < INDEX_SHARDS; s++) {
        nitems += ix->shards[s].curr_items;
        sbytes += ix->shards[s].bytes;
    }
    assert_int_equal(nitems, N);
    assert_int_equal(sbytes, bytes);
    assert_int_equal(ix->ns[0].items + ix->ns[1].items + ix->ns[2].items, N);
    assert_int_equal(ix->ns[0].bytes + ix->ns[1].bytes + ix->ns[2].bytes, bytes);

    /* swap every third item for a new one with the same key */
    for (int i = 0; i < N; i += 3) {
        struct item *nit = mk_item(item_key(items[i]), 1, 7, 1000);
        uint64_t hv = hv_of(nit);
        struct index_shard *sh = index_shard_of(ix, hv);
        assert_true(index_swap(sh, hv, items[i], nit));
        assert_false(index_swap(sh, hv, items[i], nit)); /* old is gone */
        bytes += index_item_bytes(nit);
        bytes -= index_item_bytes(items[i]);
        free(items[i]);
        items[i] = nit;
    }
    /* remove every other item */
    for (int i = 0; i < N; i += 2) {
        assert_true(remove_item(ix, items[i]));
        assert_false(remove_item(ix, items[i]));
        bytes -= index_item_bytes(items[i]);
    }
    check_all(ix);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key:%d", i);
        assert_ptr_equal(find(ix, key), i % 2 ? items[i] : NULL);
    }
    uint64_t nsitems = 0, nsbytes = 0;
    for (int n = 0; n < STORE_NS_MAX; n++) {
        nsitems += ix->ns[n].items;
        nsbytes += ix->ns[n].bytes;
    }
    assert_int_equal(nsitems, N / 2);
    assert_int_equal(nsbytes, bytes);
    for (int i = 0; i < N; i++) free(items[i]);
    index_destroy(&ix);
    assert_null(ix);
}

/* Many keys with the same shard and the same home slot form one long run; removing from its
 * middle must leave every other key findable. Growth is disabled so the run stays put. */
static void test_same_home_run(void **state)
{
    (void)state;
    struct index *ix = mk(INDEX_SHARD_BITS + 6); /* 64 slots per shard */
    enum { N = 24 };
    /* shard 5, home slot 60 (top 6 bits = 60): the run wraps past the end of the table */
    uint64_t mask = (INDEX_SHARDS - 1) | (0x3full << 58);
    char **keys = keys_where("home", N, mask, 5 | (60ull << 58));
    struct index_shard *sh = &ix->shards[5];
    sh->alloc = fail_alloc;
    struct item *items[N];
    for (int i = 0; i < N; i++) {
        items[i] = mk_item(keys[i], 1, 0, 0);
        assert_ptr_equal(index_shard_of(ix, hv_of(items[i])), sh);
        assert_true(insert(ix, items[i]));
    }
    assert_int_equal(sh->power, 6);
    check_shard(sh);
    /* the run occupies 60..63 then 0..19 */
    for (int i = 0; i < N; i++) assert_true(sh->slots[(60 + i) % 64] != 0);
    assert_int_equal(sh->slots[20], 0);

    bool gone[N] = {false};
    int order[] = {N / 2, 1, N - 1, 0, 5, 17, 3};
    for (size_t r = 0; r < sizeof order / sizeof order[0]; r++) {
        int v = order[r];
        assert_true(remove_item(ix, items[v]));
        gone[v] = true;
        check_shard(sh);
        for (int i = 0; i < N; i++) assert_ptr_equal(find(ix, keys[i]), gone[i] ? NULL : items[i]);
    }
    for (int i = 0; i < N; i++) free(items[i]);
    free_keys(keys, N);
    index_destroy(&ix);
}

/* Two keys of one shard with the same 16-bit tag: a lookup must compare the keys too. */
static void test_same_tag(void **state)
{
    (void)state;
    struct index *ix = mk(INDEX_SHARD_BITS + 4);
    enum { M = 3000 };
    char **keys = keys_where("tag", M, INDEX_SHARDS - 1, 9); /* all in shard 9 */
    static uint64_t tag[M];
    for (int i = 0; i < M; i++) tag[i] = index_hash(keys[i], strlen(keys[i])) >> INDEX_SHARD_BITS & 0xffff;
    int a = -1, b = -1;
    for (int i = 0; i < M && a < 0; i++)
        for (int j = i + 1; j < M; j++) {
            if (tag[i] == tag[j]) {
                a = i;
                b = j;
                break;
            }
        }
    if (a < 0) fail_msg("no tag collision among %d keys", M); /* p ~ 1e-30 */
    struct item *ia = mk_item(keys[a], 1, 0, 0), *ib = mk_item(keys[b], 1, 0, 0);
    assert_true(insert(ix, ia));
    assert_null(find(ix, keys[b])); /* tag matches, key does not */
    assert_true(insert(ix, ib));
    assert_ptr_equal(find(ix, keys[a]), ia);
    assert_ptr_equal(find(ix, keys[b]), ib);
    assert_true(remove_item(ix, ia));
    assert_null(find(ix, keys[a]));
    assert_ptr_equal(find(ix, keys[b]), ib);
    free(ia);
    free(ib);
    free_keys(keys, M);
    index_destroy(&ix);
}

/* Fill one shard until no slot is left with growth failing, then remove in random order,
 * checking the probing invariant and every key after each removal. */
static void test_full_table_and_shift(void **state)
{
    (void)state;
    struct index *ix = mk(INDEX_SHARD_BITS + 6); /* 64 slots per shard */
    enum { M = 64 };
    char **keys = keys_where("full", M, INDEX_SHARDS - 1, 3);
    struct index_shard *sh = &ix->shards[3];
    sh->alloc = fail_alloc;
    struct item *items[M];
    int in = 0;
    for (int i = 0; i < M; i++) {
        items[i] = mk_item(keys[i], 2, 1, 10);
        if (insert(ix, items[i])) in++;
    }
    /* 63 fit (one slot stays empty), the 64th is refused and changes nothing */
    assert_int_equal(in, 63);
    assert_int_equal(sh->curr_items, 63);
    assert_int_equal(ix->ns[1].items, 63);
    assert_int_equal(sh->power, 6);
    assert_int_equal(sh->expansions, 0);
    check_shard(sh);
    assert_null(find(ix, keys[63])); /* a miss in an almost full table still ends */
    for (int i = 0; i < 63; i++) assert_ptr_equal(find(ix, keys[i]), items[i]);
    /* the table is full, but a swap needs no slot */
    struct item *nit = mk_item(keys[10], 2, 1, 20);
    uint64_t hv = hv_of(nit);
    assert_true(index_swap(sh, hv, items[10], nit));
    free(items[10]);
    items[10] = nit;
    assert_ptr_equal(find(ix, keys[10]), nit);

    /* remove all in a random order */
    int order[63];
    bool gone[63] = {false};
    for (int i = 0; i < 63; i++) order[i] = i;
    for (int i = 62; i > 0; i--) {
        int j = (int)(rng() % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int r = 0; r < 63; r++) {
        assert_true(remove_item(ix, items[order[r]]));
        gone[order[r]] = true;
        check_shard(sh);
        for (int i = 0; i < 63; i++) assert_ptr_equal(find(ix, keys[i]), gone[i] ? NULL : items[i]);
    }
    assert_int_equal(sh->curr_items, 0);
    assert_int_equal(sh->bytes, 0);
    assert_int_equal(ix->ns[1].items, 0);
    assert_int_equal(ix->ns[1].bytes, 0);

    /* with memory back, the shard grows past where it stopped */
    sh->alloc = calloc;
    for (int i = 0; i < 63; i++) assert_true(insert(ix, items[i]));
    assert_true(insert(ix, items[63]));
    assert_int_equal(sh->power, 7);
    assert_int_equal(sh->expansions, 1);
    check_shard(sh);
    for (int i = 0; i < 64; i++) assert_ptr_equal(find(ix, keys[i]), items[i]);
    for (int i = 0; i < M; i++) free(items[i]);
    free_keys(keys, M);
    index_destroy(&ix);
}

/* Start with one slot per shard and grow every shard many times with items present. */
static void test_growth(void **state)
{
    (void)state;
    struct index *ix = mk(8); /* below INDEX_SHARD_BITS: one slot per shard */
    assert_int_equal(index_buckets(ix), INDEX_SHARDS);
    enum { N = 150000 };
    struct item **items = calloc(N, sizeof *items);
    assert_non_null(items);
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "grow:%d", i);
        items[i] = mk_item(key, 3, 2, 5);
        assert_true(insert(ix, items[i]));
        if (i % 10007 == 0) { /* earlier keys stay reachable across doublings */
            for (int j = 0; j <= i; j += 97) {
                snprintf(key, sizeof key, "grow:%d", j);
                assert_ptr_equal(find(ix, key), items[j]);
            }
        }
    }
    check_all(ix);
    uint64_t exp = 0, slots = index_buckets(ix);
    for (unsigned s = 0; s < INDEX_SHARDS; s++) {
        const struct index_shard *sh = &ix->shards[s];
        assert_true(sh->curr_items * 4 <= ((uint64_t)1 << sh->power) * 3); /* load <= 3/4 */
        exp += sh->expansions;
    }
    assert_true(exp > INDEX_SHARDS * 6);
    assert_true(slots * 3 / 4 >= N);
    assert_true(slots <= (uint64_t)N * 4); /* no shard more than needed: load >= 3/8 on average */
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "grow:%d", i);
        assert_ptr_equal(find(ix, key), items[i]);
    }
    for (int i = 0; i < N; i++) assert_true(remove_item(ix, items[i]));
    check_all(ix);
    assert_int_equal(ix->ns[2].items, 0);
    for (int i = 0; i < N; i++) free(items[i]);
    free(items);
    index_destroy(&ix);
}

/* Random mix of inserts, removes, swaps and lookups in a few small shards, against a model. */
static void test_random_ops(void **state)
{
    (void)state;
    struct index *ix = mk(INDEX_SHARD_BITS); /* one slot per shard, so lots of growth */
    enum { K = 4000, OPS = 200000 };
    char **keys = keys_where("rnd", K, INDEX_SHARDS - 4, 0); /* four shards: 0..3 */
    struct item *model[K] = {0};
    for (int op = 0; op < OPS; op++) {
        int k = (int)(rng() % K);
        uint64_t hv = index_hash(keys[k], strlen(keys[k]));
        struct index_shard *sh = index_shard_of(ix, hv);
        switch (rng() % 4) {
        case 0:
            if (!model[k]) {
                model[k] = mk_item(keys[k], 1, 0, 0);
                assert_true(index_insert(sh, hv, model[k]));
            }
            break;
        case 1:
            if (model[k]) {
                assert_true(index_remove(sh, hv, model[k]));
                free(model[k]);
                model[k] = NULL;
            }
            break;
        case 2:
            if (model[k]) {
                struct item *nit = mk_item(keys[k], 1, 0, 0);
                assert_true(index_swap(sh, hv, model[k], nit));
                free(model[k]);
                model[k] = nit;
            }
            break;
        default: assert_ptr_equal(index_find(sh, hv, keys[k], strlen(keys[k])), model[k]);
        }
        if (op % 20000 == 0) check_all(ix);
    }
    check_all(ix);
    for (int k = 0; k < K; k++) {
        assert_ptr_equal(find(ix, keys[k]), model[k]);
        free(model[k]);
    }
    free_keys(keys, K);
    index_destroy(&ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_same_home_run),
        cmocka_unit_test(test_same_tag),
        cmocka_unit_test(test_full_table_and_shift),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_random_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
