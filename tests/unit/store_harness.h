/* store_harness.h — what test_store.c and test_store_threads.c share: a store made small and
 * quiet, and items put, got and deleted by key. Included by one test file each. */
#ifndef SHOAL_TESTS_STORE_HARNESS_H
#define SHOAL_TESTS_STORE_HARNESS_H

#include <pthread.h>
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
#include "node/index.h"
#include "node/store.h"

/* ---- helpers ------------------------------------------------------------------------------ */

__attribute__((unused)) static struct store *mk(uint64_t mb, uint64_t item_max, uint64_t hash_power, uint64_t sweep_ms)
{
    struct store_options o;
    store_options_default(&o);
    o.memory_mb = mb;
    o.item_max = item_max;
    o.hash_power = hash_power;
    o.sweep_interval_ms = sweep_ms;
    char err[256] = "";
    struct store *st = NULL;
    if (store_create(&st, &o, err, sizeof err) != 0) fail_msg("store_create: %s", err);
    return st;
}

/* A store that never sweeps during a test, so only the test's own `now` values matter. */
__attribute__((unused)) static struct store *mk_quiet(uint64_t mb) { return mk(mb, 1 << 20, 16, 60000); }

__attribute__((unused)) static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

__attribute__((unused)) static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

__attribute__((unused)) static void fill_value(struct item *it, char fill) { memset(item_value(it), fill, it->nbytes); }

/* Store key -> nbytes bytes of `fill`, set semantics. With `locked`, the allocation happens
 * while holding the key's shard lock (as append/incr do). Returns false if allocation failed. */
__attribute__((unused)) static bool put_ex(struct store *st, const char *key, size_t nbytes, char fill, uint32_t exptime,
                   uint32_t now, bool locked)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    struct item *it = NULL;
    if (!locked) {
        it = store_alloc(st, 0, key, nkey, nbytes, 0);
        if (!it) return false;
        fill_value(it, fill);
        it->exptime = exptime;
    }
    store_lock(st, hv);
    struct item *old = store_find(st, hv, key, nkey, now, NULL);
    if (locked) {
        it = store_alloc(st, 0, key, nkey, nbytes, 0);
        if (!it) {
            store_unlock(st, hv);
            return false;
        }
        fill_value(it, fill);
        it->exptime = exptime;
    }
    if (old) store_replace(st, hv, old, it, now);
    else store_link(st, hv, it, now);
    store_unlock(st, hv);
    return true;
}

__attribute__((unused)) static bool put(struct store *st, const char *key, size_t nbytes, char fill, uint32_t exptime,
                uint32_t now)
{
    return put_ex(st, key, nbytes, fill, exptime, now, false);
}

/* Look key up; on a hit report its length, first value byte and cas. */
__attribute__((unused)) static bool get(struct store *st, const char *key, uint32_t now, enum store_miss *why,
                uint32_t *nbytes, char *first, uint64_t *cas)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    enum store_miss w;
    store_lock(st, hv);
    struct item *it = store_find(st, hv, key, nkey, now, &w);
    if (it) {
        if (nbytes) *nbytes = it->nbytes;
        if (first && it->nbytes) *first = item_value(it)[0];
        if (cas) *cas = item_cas(it);
        store_bump(st, it, now);
    }
    store_unlock(st, hv);
    if (why) *why = w;
    return it != NULL;
}

__attribute__((unused)) static bool del(struct store *st, const char *key, uint32_t now)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, key, nkey, now, NULL);
    if (it) store_unlink(st, hv, it);
    store_unlock(st, hv);
    return it != NULL;
}

/* Store key with namespace id `nsid` and iflags `iflags` (unlinked bits only). */
__attribute__((unused)) static void put_ns(struct store *st, const char *key, size_t nbytes, uint32_t exptime,
                   uint32_t now, uint16_t nsid, uint8_t iflags)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    struct item *it = store_alloc(st, nsid, key, nkey, nbytes, 0);
    assert_non_null(it);
    fill_value(it, 'g');
    it->exptime = exptime;
    it->iflags |= iflags;
    store_lock(st, hv);
    assert_null(store_find_raw(st, hv, key, nkey, now, NULL));
    store_link(st, hv, it, now);
    store_unlock(st, hv);
}

/* store_find_ex with STORE_FIND_GRACE: is the key there (live or in grace), and why. */
__attribute__((unused)) static bool get_grace(struct store *st, const char *key, uint32_t now, enum store_miss *why)
{
    size_t nkey = strlen(key);
    uint64_t hv = store_hash(key, nkey);
    store_lock(st, hv);
    struct item *it = store_find_ex(st, hv, key, nkey, now, why, STORE_FIND_GRACE);
    store_unlock(st, hv);
    return it != NULL;
}

__attribute__((unused)) static struct store_stats stats(struct store *st)
{
    struct store_stats s;
    store_stats(st, &s);
    return s;
}

#endif
