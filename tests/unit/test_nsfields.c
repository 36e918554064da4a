/* test_nsfields.c — unit tests of the namespace settings table (common/nsfields.h) and of its
 * three users agreeing: every integer setting's bounds, the eviction names and the TTL rule are
 * accepted or refused alike by shoal-control's model, shoal-router's topology parser and
 * shoal-node's settings parser; plus the per-node quota split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/nsfields.h"
#include "control/model.h"
#include "node/ns.h"
#include "router/topo.h"

/* shoal-control: create namespace "c" with `fields` (a JSON object's inside) in a pool of
 * three nodes. true when accepted. */
static bool control_accepts(const char *fields)
{
    json_t *m = model_new();
    struct model_err e;
    const char *name;
    json_t *p = json_loads("{\"name\": \"main\", \"nodes\": [\"10.0.0.1:1\", \"10.0.0.2:1\", "
                           "\"10.0.0.3:1\"]}", 0, NULL);
    assert_int_equal(model_pool_create(m, p, &name, &e), 0);
    char text[512];
    snprintf(text, sizeof text, "{\"name\": \"c\", \"pool\": \"main\"%s%s}", *fields ? ", " : "",
             fields);
    json_t *b = json_loads(text, 0, NULL);
    assert_non_null(b);
    bool ok = model_ns_create(m, b, &name, &e) == 0 && model_check(m, &e) == 0;
    json_decref(b);
    json_decref(p);
    json_decref(m);
    return ok;
}

/* shoal-router: a document whose namespace "c" has `fields`. */
static bool router_accepts(const char *fields)
{
    char doc[768], err[512];
    snprintf(doc, sizeof doc,
             "{\"version\": 1, \"pools\": {\"main\": {\"nodes\": [\"127.0.0.1:1\", "
             "\"127.0.0.1:2\"]}}, \"namespaces\": {\"default\": {\"pool\": \"main\"}, "
             "\"c\": {\"pool\": \"main\"%s%s}}}",
             *fields ? ", " : "", fields);
    struct topo *t = NULL;
    int rc = topo_parse(doc, strlen(doc), TOPO_NUMERIC_HOSTS, &t, err, sizeof err);
    topo_destroy(&t);
    return rc == 0;
}

/* shoal-node: the same namespace as a topology document's (NS_JSON_DOC). */
static bool node_accepts(const char *fields)
{
    char text[512], why[300];
    snprintf(text, sizeof text, "{\"pool\": \"main\"%s%s}", *fields ? ", " : "", fields);
    json_t *o = json_loads(text, 0, NULL);
    assert_non_null(o);
    struct ns_config cfg;
    memset(&cfg, 0, sizeof cfg);
    bool ok = ns_config_from_json(&cfg, o, NS_JSON_DOC, why, sizeof why) == 0;
    json_decref(o);
    return ok;
}

static void all_agree(const char *fields, bool want)
{
    if (control_accepts(fields) != want) fail_msg("control: %s should be %d", fields, want);
    if (router_accepts(fields) != want) fail_msg("router: %s should be %d", fields, want);
    if (node_accepts(fields) != want) fail_msg("node: %s should be %d", fields, want);
}

static void test_integer_bounds_agree_everywhere(void **state)
{
    char f[128];
    for (size_t i = 0; i < nsf_nints; i++) {
        const struct nsf_int *s = &nsf_ints[i];
        uint64_t lo = s->lo, hi = s->hi;
        if (!strcmp(s->name, "copies")) hi = 2; /* at most the pool's nodes (2 on the router) */
        snprintf(f, sizeof f, "\"%s\": %llu", s->name, (unsigned long long)lo);
        all_agree(f, true);
        snprintf(f, sizeof f, "\"%s\": %llu", s->name, (unsigned long long)hi);
        all_agree(f, true);
        snprintf(f, sizeof f, "\"%s\": %llu", s->name, (unsigned long long)s->hi + 1);
        all_agree(f, false);
        snprintf(f, sizeof f, "\"%s\": -1", s->name);
        all_agree(f, false);
        snprintf(f, sizeof f, "\"%s\": \"1\"", s->name);
        all_agree(f, false);
        if (lo > 0) {
            snprintf(f, sizeof f, "\"%s\": %llu", s->name, (unsigned long long)lo - 1);
            all_agree(f, false);
        }
    }
}

static void test_lease_bounds_are_the_nodes(void **state)
{
    /* the router once allowed 2592000 for these */
    all_agree("\"lease_ttl\": 3601", false);
    all_agree("\"lease_period\": 3601", false);
    all_agree("\"stale_ttl\": 86401", false);
    all_agree("\"memory\": 1125899906842625", false);
}

static void test_eviction_names_agree_everywhere(void **state)
{
    all_agree("\"eviction\": \"lru\"", true);
    all_agree("\"eviction\": \"lfu\"", true);
    all_agree("\"eviction\": \"s3fifo\"", true);
    all_agree("\"eviction\": \"fifo\"", false);
    all_agree("\"eviction\": 1", false);
    assert_string_equal(nsf_evictions[NSF_EVICTION_DEFAULT], "s3fifo");
    json_t *v = json_string("lfu");
    assert_int_equal(nsf_eviction_of(v), 1);
    json_decref(v);
}

static void test_default_ttl_longer_than_max_ttl_is_refused_everywhere(void **state)
{
    all_agree("\"default_ttl\": 600, \"max_ttl\": 60", false);
    all_agree("\"default_ttl\": 600, \"max_ttl\": 600", true);
    all_agree("\"default_ttl\": 600, \"max_ttl\": 0", true);
    assert_true(nsf_ttls_ok(5, 0));
    assert_false(nsf_ttls_ok(6, 5));
}

static void test_node_document_mode_skips_plane_fields_and_memory(void **state)
{
    json_t *o = json_loads("{\"pool\": \"main\", \"team\": \"t\", \"copies\": 2, \"memory\": 5, "
                           "\"stale_ttl\": 9, \"eviction\": \"lru\"}", 0, NULL);
    struct ns_config cfg;
    memset(&cfg, 0, sizeof cfg);
    char why[300] = "";
    assert_int_equal(ns_config_from_json(&cfg, o, NS_JSON_DOC, why, sizeof why), 0);
    assert_int_equal(cfg.memory, 0);
    assert_int_equal(cfg.stale_ttl, 9);
    assert_int_equal(cfg.eviction, NS_EVICT_LRU);
    assert_int_equal(ns_config_from_json(&cfg, o, 0, why, sizeof why), -1);
    assert_non_null(strstr(why, "unknown field"));
    json_decref(o);
}

static void test_share_splits_evenly_rounding_down(void **state)
{
    assert_int_equal(nsf_share(3000, 3), 1000);
    assert_int_equal(nsf_share(10, 3), 3);
    assert_int_equal(nsf_share(10, 0), 0);
    assert_int_equal(nsf_share(0, 4), 0);
}

/* The invalidation field: control and router accept and refuse the same values (the node
 * ignores it, accepting both). */
static void test_invalidation_agrees_between_control_and_router(void **state)
{
    static const struct {
        const char *fields;
        bool ok;
    } cases[] = {
        {"\"invalidation\": {\"tables\": {\"public.p\": [\"c:p:{id}\", \"c:s:{sku}\"]}}", true},
        {"\"invalidation\": {\"tables\": {}}", true},
        {"\"invalidation\": {\"tables\": {\"p\": [\"c:p:{id}\"]}}", false},
        {"\"invalidation\": {\"tables\": {\"public.p\": [\"c:p:{id\"]}}", false},
        {"\"invalidation\": {\"tables\": {\"public.p\": [\"d:p:{id}\"]}}", false},
        {"\"invalidation\": {\"tables\": {\"public.p\": [\"{t}:p:{id}\"]}}", false},
        {"\"invalidation\": {\"tables\": {\"public.p\": []}}", false},
        {"\"invalidation\": {\"table\": {}}", false},
        {"\"invalidation\": 1", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (control_accepts(cases[i].fields) != cases[i].ok)
            fail_msg("control: %s should be %d", cases[i].fields, cases[i].ok);
        if (router_accepts(cases[i].fields) != cases[i].ok)
            fail_msg("router: %s should be %d", cases[i].fields, cases[i].ok);
        if (!node_accepts(cases[i].fields)) fail_msg("node: %s should be ignored", cases[i].fields);
    }
    struct nsf_err e;
    json_t *v = json_loads("{\"tables\": {\"public.p\": [\"c:p:{id}\", \"x:{id}\"]}}", 0, NULL);
    assert_int_equal(nsf_invalidation_check("c", v, &e), -1);
    assert_string_equal(e.field, "invalidation.tables.public.p[1]");
    assert_string_equal(e.rule, "namespace");
    assert_int_equal(nsf_invalidation_check("default", v, &e), -1); /* c: fixes another one */
    json_decref(v);
    v = json_loads("{\"tables\": {\"public.p\": [\"p{id}\", \"default:{id}\"]}}", 0, NULL);
    assert_int_equal(nsf_invalidation_check("default", v, &e), 0);
    json_decref(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integer_bounds_agree_everywhere),
        cmocka_unit_test(test_lease_bounds_are_the_nodes),
        cmocka_unit_test(test_eviction_names_agree_everywhere),
        cmocka_unit_test(test_default_ttl_longer_than_max_ttl_is_refused_everywhere),
        cmocka_unit_test(test_node_document_mode_skips_plane_fields_and_memory),
        cmocka_unit_test(test_share_splits_evenly_rounding_down),
        cmocka_unit_test(test_invalidation_agrees_between_control_and_router),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
