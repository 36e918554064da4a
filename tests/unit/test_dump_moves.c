/* test_dump_moves.c — a dump walk with the store's moves watched (store_watch_moves, what a
 * replication full sync does) misses no item: each item present from before the walk to after it
 * is read by the walk or told to the move hook while the walk runs, although segment cleaning
 * moves items all through it. Single-threaded and so deterministic: writes between the walk's
 * steps make the cleaning. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/clock.h"
#include "node/store.h"

#define COLD 3000 /* written once before the walk */
#define HOT 1500  /* written between them, overwritten during the walk */

struct seen {
    uint8_t walked[COLD], moved[COLD];
    uint64_t moves;
};

static struct store *mk(uint64_t mb)
{
    struct store_options o;
    store_options_default(&o);
    o.memory_mb = mb;
    o.sweep_interval_ms = 60000; /* only the test's writes clean */
    char err[256] = "";
    struct store *st = NULL;
    if (store_create(&st, &o, err, sizeof err) != 0) fail_msg("store_create: %s", err);
    return st;
}

static bool put(struct store *st, const char *key, size_t nbytes, uint32_t now)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    struct item *it = store_alloc(st, 0, key, nkey, nbytes, 0);
    if (!it) return false;
    memset(item_value(it), 'v', it->nbytes);
    store_lock(st, hv);
    struct item *old = store_find(st, hv, key, nkey, now, NULL);
    if (old) store_replace(st, hv, old, it, now);
    else store_link(st, hv, it, now);
    store_unlock(st, hv);
    return true;
}

static bool present(struct store *st, const char *key, uint32_t now)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    bool hit = store_find(st, hv, key, nkey, now, NULL) != NULL;
    store_unlock(st, hv);
    return hit;
}

/* "c<i>" -> i, else -1 */
static int cold_index(const struct item *it)
{
    const char *k = it->data;
    if (it->nkey < 2 || k[0] != 'c') return -1;
    int i = 0;
    for (size_t j = 1; j < it->nkey; j++) i = i * 10 + (k[j] - '0');
    return i < COLD ? i : -1;
}

static void on_walk(void *ctx, const struct item *it, int clsid)
{
    (void)clsid;
    struct seen *s = ctx;
    int i = cold_index(it);
    if (i >= 0) s->walked[i] = 1;
}

static void on_move(void *ctx, const struct item *it)
{
    struct seen *s = ctx;
    s->moves++;
    int i = cold_index(it);
    if (i >= 0) s->moved[i] = 1;
}

static size_t size_of(unsigned i)
{
    static const size_t sizes[] = {40, 200, 700, 1500, 3000};
    return sizes[(i * 2654435761u >> 7) % 5];
}

/* Fill, then walk in small steps with writes of other sizes to the hot keys between steps;
 * returns how many cold keys present after the walk neither the walk nor the hook saw. */
static int walk_under_cleaning(bool watch, uint64_t *moves)
{
    struct store *st = mk(8);
    static struct seen s;
    memset(&s, 0, sizeof s);
    store_set_move_hook(st, on_move, &s);
    uint32_t now = clock_now();
    char key[32];
    for (unsigned i = 0; i < COLD; i++) {
        snprintf(key, sizeof key, "c%u", i);
        assert_true(put(st, key, size_of(i), now));
        snprintf(key, sizeof key, "h%u", i % HOT);
        assert_true(put(st, key, size_of(i + 7), now));
    }
    if (watch) store_watch_moves(st, true);
    struct store_cursor cur = {0};
    unsigned w = 0;
    while (store_dump_step(st, &cur, 0, 32, on_walk, &s)) {
        for (int k = 0; k < 40; k++, w++) {
            snprintf(key, sizeof key, "h%u", w % HOT);
            put(st, key, size_of(w * 3 + 1), now);
        }
        assert_true(w < 100000000u);
    }
    if (watch) store_watch_moves(st, false);
    int missed = 0;
    for (unsigned i = 0; i < COLD; i++) {
        snprintf(key, sizeof key, "c%u", i);
        if (present(st, key, now) && !s.walked[i] && !s.moved[i]) missed++;
    }
    *moves = s.moves;
    store_destroy(&st);
    return missed;
}

static void test_watched_walk_misses_no_item_cleaning_moves(void **state)
{
    (void)state;
    uint64_t moves = 0;
    int missed = walk_under_cleaning(true, &moves);
    assert_true(moves > 0); /* cleaning did move items during the walk */
    assert_int_equal(missed, 0);
}

/* The walk alone misses items (why the watch exists), and the hook hears nothing unwatched. */
static void test_unwatched_walk_misses_moved_items_and_hook_hears_nothing(void **state)
{
    (void)state;
    uint64_t moves = 1;
    int missed = walk_under_cleaning(false, &moves);
    assert_int_equal(moves, 0);
    assert_true(missed > 0);
}

int main(void)
{
    clock_setup();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_watched_walk_misses_no_item_cleaning_moves),
        cmocka_unit_test(test_unwatched_walk_misses_moved_items_and_hook_hears_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
