/* test_slotdrop.c — unit tests of what shoal-node --control relies on in the engine and the
 * namespace registry: store_drop_slots (items of a dropped slot stored before the drop miss at
 * once, later ones and other slots' are served, the sweeper reclaims them and the drop stops
 * being pending) and ns_replace_all (one publish, ids kept, refusals keep the old settings). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/slot.h"
#include "node/ns.h"
#include "node/store.h"

static struct store *mk(uint64_t sweep_ms)
{
    struct store_options o;
    store_options_default(&o);
    o.memory_mb = 8;
    o.sweep_interval_ms = sweep_ms;
    char err[256] = "";
    struct store *st = NULL;
    if (store_create(&st, &o, err, sizeof err) != 0) fail_msg("store_create: %s", err);
    return st;
}

static void put(struct store *st, const char *key, uint32_t now)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    struct item *it = store_alloc(st, 0, key, nkey, 8, 0);
    assert_non_null(it);
    memset(item_value(it), 'v', 8);
    store_lock(st, hv);
    struct item *old = store_find(st, hv, key, nkey, now, NULL);
    if (old) store_replace(st, hv, old, it, now);
    else assert_true(store_link(st, hv, it, now));
    store_unlock(st, hv);
}

static bool has(struct store *st, const char *key, uint32_t now, enum store_miss *why)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, key, nkey, now, why);
    store_unlock(st, hv);
    return it != NULL;
}

static uint64_t items(struct store *st)
{
    struct store_stats s;
    store_stats(st, &s);
    return s.curr_items;
}

/* Two keys in different slots (the {tag} picks the slot). */
#define K_DROP "{a}:1"
#define K_KEEP "{b}:1"

static void test_dropped_slot_misses_at_once_others_stay(void **state)
{
    (void)state;
    clock_setup();
    struct store *st = mk(60000); /* no sweep during the test */
    uint32_t now = clock_now();
    put(st, K_DROP, now);
    put(st, K_KEEP, now);
    uint16_t s = slot_of_key(K_DROP, strlen(K_DROP));
    assert_int_not_equal(s, slot_of_key(K_KEEP, strlen(K_KEEP)));
    assert_false(store_drop_pending(st));
    assert_int_equal(store_drop_slots(st, &s, 1, now), 0);
    assert_true(store_drop_pending(st));
    enum store_miss why;
    assert_false(has(st, K_DROP, now, &why));
    assert_int_equal(why, STORE_MISS_DROPPED);
    assert_true(has(st, K_KEEP, now, NULL));
    assert_int_equal(store_dropped_items(st), 1);
    /* stored again after the drop, in the same second and later: served */
    put(st, K_DROP, now);
    assert_true(has(st, K_DROP, now, NULL));
    put(st, "{a}:2", now + 1);
    assert_true(has(st, "{a}:2", now + 1, NULL));
    store_destroy(&st);
}

static void test_sweeper_reclaims_and_ends_the_pending_drop(void **state)
{
    (void)state;
    clock_setup();
    struct store *st = mk(10);
    uint32_t now = clock_now();
    char key[32];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "{a}:%d", i);
        put(st, key, now);
    }
    put(st, K_KEEP, now);
    uint16_t s = slot_of_key(K_DROP, strlen(K_DROP));
    assert_int_equal(store_drop_slots(st, &s, 1, now), 0);
    struct timespec nap = {0, 10 * 1000000L};
    for (int i = 0; i < 500 && (items(st) != 1 || store_drop_pending(st)); i++)
        nanosleep(&nap, NULL);
    assert_int_equal(items(st), 1);
    assert_int_equal(store_dropped_items(st), 200);
    assert_false(store_drop_pending(st));
    assert_true(has(st, K_KEEP, clock_now(), NULL));
    store_destroy(&st);
}

/* The sweeper skips an item whose shard lock is taken (it never blocks on one): passes that
 * skipped a dropped item must not end the drop, or the item would be served again. */
static void test_drop_outlives_passes_that_skipped_a_dropped_item(void **state)
{
    (void)state;
    clock_setup();
    struct store *st = mk(10);
    uint32_t now = clock_now();
    put(st, K_DROP, now);
    uint16_t s = slot_of_key(K_DROP, strlen(K_DROP));
    assert_int_equal(store_drop_slots(st, &s, 1, now), 0);
    uint64_t hv = store_hash(K_DROP, strlen(K_DROP));
    store_lock(st, hv); /* the sweeper's trylock on this shard now fails */
    struct timespec nap = {0, 10 * 1000000L};
    /* a 10 ms sweep ends an unhindered drop within a few ticks (the test above); give it 50 */
    for (int i = 0; i < 50 && store_drop_pending(st); i++) nanosleep(&nap, NULL);
    bool pending = store_drop_pending(st);
    store_unlock(st, hv);
    assert_true(pending);
    assert_false(has(st, K_DROP, clock_now(), NULL));
    /* with the shard free the sweeper (or that lookup) takes it and the drop ends */
    for (int i = 0; i < 500 && store_drop_pending(st); i++) nanosleep(&nap, NULL);
    assert_false(store_drop_pending(st));
    assert_int_equal(items(st), 0);
    store_destroy(&st);
}

static uint64_t seen_word;
static uint64_t *seen[1] = {&seen_word};

static int refuse_big(void *ctx, uint16_t id, const struct ns_config *cfg, char *err, size_t n)
{
    (void)ctx;
    (void)id;
    if (cfg && cfg->memory > 1000) {
        snprintf(err, n, "memory too big");
        return 400;
    }
    return 0;
}

static void test_replace_all_is_one_publish_and_keeps_ids(void **state)
{
    (void)state;
    struct ns_registry r;
    assert_int_equal(ns_registry_init(&r, seen, 1), 0);
    char err[256];
    bool changed;
    assert_int_equal(ns_registry_set_apply(&r, refuse_big, NULL, err, sizeof err), 0);
    struct ns_want w[3] = {{"a", {.max_ttl = 10}}, {"b", {.memory = 500}}, {"default", {.default_ttl = 5}}};
    uint64_t v0 = ns_current(&r)->version;
    assert_int_equal(ns_replace_all(&r, w, 3, &changed, err, sizeof err), 0);
    assert_true(changed);
    const struct ns_table *t = ns_current(&r);
    assert_int_equal(t->version, v0 + 1);
    assert_int_equal(t->count, 3);
    uint16_t ida = ns_find(t, "a", 1)->id;
    assert_int_equal(t->byid[NS_DEFAULT_ID]->cfg.default_ttl, 5);
    /* b removed, a changed, c refused (kept out), default reset: one publish */
    struct ns_want w2[2] = {{"a", {.max_ttl = 20}}, {"c", {.memory = 5000}}};
    assert_int_equal(ns_replace_all(&r, w2, 2, &changed, err, sizeof err), 1);
    assert_non_null(strstr(err, "'c'"));
    t = ns_current(&r);
    assert_int_equal(t->version, v0 + 2);
    assert_int_equal(t->count, 2);
    assert_int_equal(ns_find(t, "a", 1)->id, ida);
    assert_int_equal(ns_find(t, "a", 1)->cfg.max_ttl, 20);
    assert_null(ns_find(t, "b", 1));
    assert_null(ns_find(t, "c", 1));
    assert_int_equal(t->byid[NS_DEFAULT_ID]->cfg.default_ttl, 0);
    /* the same again: nothing published */
    assert_int_equal(ns_replace_all(&r, w2, 1, &changed, err, sizeof err), 0);
    assert_false(changed);
    assert_int_equal(ns_current(&r)->version, v0 + 2);
    ns_registry_teardown(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropped_slot_misses_at_once_others_stay),
        cmocka_unit_test(test_sweeper_reclaims_and_ends_the_pending_drop),
        cmocka_unit_test(test_drop_outlives_passes_that_skipped_a_dropped_item),
        cmocka_unit_test(test_replace_all_is_one_publish_and_keeps_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
