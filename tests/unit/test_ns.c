/* test_ns.c — unit tests for the namespace registry: key → namespace, TTL rules, JSON changes
 * and their validation, table replacement, start-up files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/clock.h"
#include "node/ns.h"

static uint64_t seen_word; /* one reader, always quiescent in these tests */
static uint64_t *seen[1] = {&seen_word};

static int setup(void **state)
{
    static struct ns_registry r;
    clock_setup();
    assert_int_equal(ns_registry_init(&r, seen, 1), 0);
    *state = &r;
    return 0;
}

static int teardown(void **state)
{
    ns_registry_teardown(*state);
    return 0;
}

static int put(struct ns_registry *r, const char *name, const char *json, char *msg, size_t cap)
{
    struct buf out;
    buf_init(&out);
    int st = ns_put_json(r, name, json, strlen(json), &out);
    snprintf(msg, cap, "%.*s", (int)buf_used(&out), out.data ? buf_start(&out) : "");
    buf_release(&out);
    return st;
}

static void test_keys_map_to_their_prefix_or_default(void **state)
{
    struct ns_registry *r = *state;
    char msg[512];
    assert_int_equal(put(r, "catalog", "{\"memory\": 1048576}", msg, sizeof msg), 201);
    const struct ns_table *t = ns_current(r);
    assert_string_equal(ns_of_key(t, "catalog:v7:product:1", 20)->name, "catalog");
    assert_string_equal(ns_of_key(t, "plainkey", 8)->name, "default");      /* no ':' */
    assert_string_equal(ns_of_key(t, "other:x", 7)->name, "default");       /* unknown */
    assert_string_equal(ns_of_key(t, ":x", 2)->name, "default");            /* empty prefix */
    assert_string_equal(ns_of_key(t, "catalogue:x", 11)->name, "default");  /* not a prefix match */
}

static void test_ttl_rules_default_and_clamp(void **state)
{
    struct ns_registry *r = *state;
    char msg[512];
    assert_int_equal(put(r, "t", "{\"default_ttl\": 600, \"max_ttl\": 3600}", msg, sizeof msg), 201);
    const struct ns *ns = ns_find(ns_current(r), "t", 1);
    uint32_t now = clock_now();
    assert_int_equal(ns_exptime(ns, 0, now), now + 600);       /* 0 takes the default */
    assert_int_equal(ns_exptime(ns, 100, now), now + 100);     /* shorter is kept */
    assert_int_equal(ns_exptime(ns, 99999, now), now + 3600);  /* longer is clamped */
    assert_int_equal(ns_exptime(ns, -1, now), 1);              /* already expired stays so */
    const struct ns *def = ns_find(ns_current(r), "default", 7);
    assert_int_equal(ns_exptime(def, 0, now), 0);              /* default has no rules */
    assert_int_equal(put(r, "m", "{\"max_ttl\": 60}", msg, sizeof msg), 201);
    assert_int_equal(ns_exptime(ns_find(ns_current(r), "m", 1), 0, now), now + 60); /* never → max */
}

static void test_invalid_changes_name_the_field_and_change_nothing(void **state)
{
    struct ns_registry *r = *state;
    char msg[512];
    assert_int_equal(put(r, "v", "{\"default_ttl\": 5}", msg, sizeof msg), 201);
    uint64_t version = ns_current(r)->version;
    assert_int_equal(put(r, "v", "{\"default_ttl\": -3}", msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "default_ttl"));
    assert_int_equal(put(r, "v", "{\"colour\": 1}", msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "colour"));
    assert_int_equal(put(r, "v", "{\"eviction\": \"random\"}", msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "eviction"));
    assert_int_equal(put(r, "v", "[1,2]", msg, sizeof msg), 400);
    assert_int_equal(put(r, "v", "{", msg, sizeof msg), 400);
    assert_int_equal(put(r, "bad name", "{}", msg, sizeof msg), 400);
    assert_int_equal(ns_current(r)->version, version);
    assert_int_equal(ns_find(ns_current(r), "v", 1)->cfg.default_ttl, 5);
}

static void test_change_keeps_unsent_fields_and_delete_falls_back(void **state)
{
    struct ns_registry *r = *state;
    char msg[512];
    assert_int_equal(put(r, "k", "{\"default_ttl\": 5, \"stale_ttl\": 9}", msg, sizeof msg), 201);
    assert_int_equal(put(r, "k", "{\"default_ttl\": 7}", msg, sizeof msg), 200);
    const struct ns *ns = ns_find(ns_current(r), "k", 1);
    assert_int_equal(ns->cfg.default_ttl, 7);
    assert_int_equal(ns->cfg.stale_ttl, 9);
    struct buf out;
    buf_init(&out);
    assert_int_equal(ns_delete(r, "k", &out), 200);
    assert_int_equal(ns_delete(r, "k", &out), 404);
    assert_int_equal(ns_delete(r, "default", &out), 400);
    buf_release(&out);
    assert_string_equal(ns_of_key(ns_current(r), "k:1", 3)->name, "default");
}

static void test_load_file_creates_namespaces_or_reports_the_field(void **state)
{
    struct ns_registry *r = *state;
    char path[] = "/tmp/shoal-ns-XXXXXX";
    int fd = mkstemp(path);
    const char *good = "{\"namespaces\": {\"a\": {\"memory\": 1000}, \"b\": {\"stale_ttl\": 5}}}";
    assert_int_equal(write(fd, good, strlen(good)), (ssize_t)strlen(good));
    close(fd);
    char err[256];
    assert_int_equal(ns_load_file(r, path, err, sizeof err), 0);
    assert_non_null(ns_find(ns_current(r), "a", 1));
    assert_int_equal(ns_find(ns_current(r), "b", 1)->cfg.stale_ttl, 5);
    FILE *f = fopen(path, "w");
    fputs("{\"c\": {\"max_ttl\": \"long\"}}", f);
    fclose(f);
    assert_int_equal(ns_load_file(r, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_ttl"));
    assert_null(ns_find(ns_current(r), "c", 1));
    unlink(path);
}

static void test_namespace_count_is_bounded(void **state)
{
    struct ns_registry *r = *state;
    char msg[512], name[16];
    int created = 0, st = 0;
    for (int i = 0; i < NS_MAX + 5; i++) {
        snprintf(name, sizeof name, "n%d", i);
        st = put(r, name, "{}", msg, sizeof msg);
        if (st == 201) created++;
        else break;
    }
    assert_int_equal(st, 507);
    assert_int_equal(created, NS_MAX - 1); /* default takes one id */
    assert_non_null(strstr(msg, "at most"));
}

/* The `published` hook sees every new table, including removals (how the node hands stale_ttl
 * to the store's grace). */
struct seen_tables {
    int calls;
    uint64_t stale_of_id[NS_MAX];
};

static void on_published(void *ctx, const struct ns_table *t)
{
    struct seen_tables *s = ctx;
    s->calls++;
    for (int id = 0; id < NS_MAX; id++)
        s->stale_of_id[id] = t->byid[id] ? t->byid[id]->cfg.stale_ttl : 0;
}

static void test_published_hook_sees_each_table(void **state)
{
    struct ns_registry *r = *state;
    struct seen_tables s = {0};
    r->published = on_published;
    r->published_ctx = &s;
    char msg[512];
    assert_int_equal(put(r, "st", "{\"stale_ttl\": 30}", msg, sizeof msg), 201);
    int id = ns_find(ns_current(r), "st", 2)->id;
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.stale_of_id[id], 30);
    assert_int_equal(put(r, "st", "{\"stale_ttl\": 5}", msg, sizeof msg), 200);
    assert_int_equal(s.stale_of_id[id], 5);
    struct buf out;
    buf_init(&out);
    assert_int_equal(ns_delete(r, "st", &out), 200);
    buf_release(&out);
    assert_int_equal(s.calls, 3);
    assert_int_equal(s.stale_of_id[id], 0);
    r->published = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_keys_map_to_their_prefix_or_default, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ttl_rules_default_and_clamp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_changes_name_the_field_and_change_nothing,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_change_keeps_unsent_fields_and_delete_falls_back,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_file_creates_namespaces_or_reports_the_field,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_namespace_count_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_published_hook_sees_each_table, setup, teardown),
    };
    return cmocka_run_group_tests_name("ns", tests, NULL, NULL);
}
