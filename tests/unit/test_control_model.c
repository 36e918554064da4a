/* test_control_model.c — unit tests for shoal-control's model (src/control/model.c): changes
 * and their refusals, the whole-state rules a state file must meet on load (a map that is not
 * even, a slot twice, a namespace missing a field), and the topology document it renders;
 * changes on a fork that shares untouched values (model_fork), the check that skips them
 * (model_check_since), and the texts rendered from cached namespace texts (render.c). */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/model.h"
#include "control/render.h"

static json_t *pool_of(const char *spec)
{
    return json_loads(spec, 0, NULL);
}

/* A model with pool "main" of three nodes and the default namespace. */
static json_t *three(void)
{
    json_t *m = model_new();
    struct model_err e;
    const char *name;
    json_t *body = pool_of("{\"name\": \"main\", \"nodes\": [\"10.0.0.1:1\", \"10.0.0.2:1\", "
                           "{\"node\": \"10.0.0.3:1\", \"admin\": \"10.0.0.3:2\"}]}");
    assert_int_equal(model_pool_create(m, body, &name, &e), 0);
    json_decref(body);
    assert_int_equal(model_check(m, &e), 0);
    return m;
}

static void test_new_model_is_valid_and_empty(void **state)
{
    json_t *m = model_new();
    struct model_err e;
    assert_int_equal(model_check(m, &e), 0);
    assert_int_equal(model_version(m), 0);
    json_t *doc = model_topology(m);
    assert_int_equal(json_object_size(json_object_get(doc, "pools")), 0);
    json_decref(doc);
    json_decref(m);
}

static void test_first_pool_gets_default_namespace(void **state)
{
    json_t *m = three();
    json_t *d = json_object_get(json_object_get(m, "namespaces"), "default");
    assert_non_null(d);
    assert_string_equal(json_string_value(json_object_get(d, "pool")), "main");
    json_decref(m);
}

static void test_namespace_create_and_share(void **state)
{
    json_t *m = three();
    struct model_err e;
    const char *name;
    json_t *b = pool_of("{\"name\": \"c\", \"pool\": \"main\", \"memory\": 3000}");
    assert_int_equal(model_ns_create(m, b, &name, &e), 0);
    assert_string_equal(name, "c");
    assert_int_equal(model_ns_share(m, "c"), 1000);
    assert_int_equal(model_check(m, &e), 0);
    json_decref(b);
    json_decref(m);
}

static void test_refusals_name_field_and_rule(void **state)
{
    json_t *m = three();
    struct model_err e;
    const char *name;
    static const struct {
        const char *body, *field, *rule;
        int status;
    } cases[] = {
        {"{\"name\": \"c\", \"pool\": \"nope\"}", "pool", "exists", 400},
        {"{\"name\": \"c\", \"pool\": \"main\", \"copies\": 2, \"default_ttl\": 9, "
         "\"max_ttl\": 3}", "default_ttl", "at_most_max_ttl", 400},
        {"{\"name\": \"c\", \"pool\": \"main\", \"eviction\": \"random\"}", "eviction", "one_of",
         400},
        {"{\"name\": \"c\", \"pool\": \"main\", \"ttl\": 1}", "ttl", "unknown_field", 400},
        {"{\"name\": \"default\", \"pool\": \"main\"}", "name", "unique", 409},
        {"{\"pool\": \"main\"}", "name", "name", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *b = pool_of(cases[i].body);
        assert_non_null(b);
        assert_int_equal(model_ns_create(m, b, &name, &e), cases[i].status);
        assert_string_equal(e.field, cases[i].field);
        assert_string_equal(e.rule, cases[i].rule);
        json_decref(b);
    }
    json_decref(m);
}

static void test_node_add_and_remove_keep_map_even(void **state)
{
    json_t *m = three();
    struct model_err e;
    uint32_t moved;
    json_t *b = pool_of("{\"node\": \"10.0.0.4:1\"}");
    assert_int_equal(model_node_add(m, "main", b, &moved, &e), 0);
    assert_int_equal(moved, 16384 / 4);
    assert_int_equal(model_check(m, &e), 0);
    assert_int_equal(model_node_remove(m, "main", "10.0.0.2:1", &moved, &e), 0);
    assert_int_equal(moved, 4096);
    assert_int_equal(model_check(m, &e), 0);
    assert_int_equal(model_node_remove(m, "main", "10.0.0.9:1", &moved, &e), 404);
    json_decref(b);
    json_decref(m);
}

/* A state file whose map was edited by hand is refused on load. */
static void test_check_refuses_broken_slot_maps(void **state)
{
    struct model_err e;
    json_t *m = three();
    json_t *slots = json_object_get(json_object_get(json_object_get(m, "pools"), "main"), "slots");
    json_integer_set(json_object_get(json_array_get(slots, 0), "to"), 5000); /* a gap */
    assert_int_not_equal(model_check(m, &e), 0);
    assert_string_equal(e.rule, "slot_map");
    json_decref(m);

    m = three();
    slots = json_object_get(json_object_get(json_object_get(m, "pools"), "main"), "slots");
    /* move 100 slots from node 2 to node 1: covered, but not even */
    json_integer_set(json_object_get(json_array_get(slots, 0), "to"), 5560);
    json_integer_set(json_object_get(json_array_get(slots, 1), "from"), 5561);
    assert_int_not_equal(model_check(m, &e), 0);
    assert_string_equal(e.rule, "even");
    json_decref(m);

    m = three();
    json_object_del(json_object_get(json_object_get(m, "namespaces"), "default"), "copies");
    assert_int_not_equal(model_check(m, &e), 0);
    assert_string_equal(e.rule, "fields");
    json_decref(m);
}

static void test_topology_has_router_shape(void **state)
{
    json_t *m = three();
    json_t *doc = model_topology(m);
    json_t *pool = json_object_get(json_object_get(doc, "pools"), "main");
    assert_int_equal(json_array_size(json_object_get(pool, "nodes")), 3);
    assert_string_equal(json_string_value(json_array_get(json_object_get(pool, "nodes"), 2)),
                        "10.0.0.3:1"); /* addresses only: no admin */
    assert_int_equal(json_array_size(json_object_get(pool, "slots")), 3);
    assert_null(json_object_get(doc, "format"));
    assert_non_null(json_object_get(json_object_get(doc, "namespaces"), "default"));
    json_decref(doc);
    json_decref(m);
}

static json_t *nss_of(json_t *m) { return json_object_get(m, "namespaces"); }

/* A fork shares what the change does not touch and copies what it does, so changing the fork
 * leaves the model it came from as it was. */
static void test_fork_shares_untouched_and_copies_touched(void **state)
{
    json_t *m = three();
    struct model_err e;
    const char *name;
    json_t *b = pool_of("{\"name\": \"c\", \"pool\": \"main\"}");
    assert_int_equal(model_ns_create(m, b, &name, &e), 0);
    json_decref(b);
    json_t *f = model_fork(m, "c", NULL);
    assert_non_null(f);
    assert_ptr_equal(json_object_get(nss_of(f), "default"), json_object_get(nss_of(m), "default"));
    assert_ptr_not_equal(json_object_get(nss_of(f), "c"), json_object_get(nss_of(m), "c"));
    assert_ptr_not_equal(nss_of(f), nss_of(m));
    b = pool_of("{\"default_ttl\": 7}");
    assert_int_equal(model_ns_update(f, "c", b, &e), 0);
    json_decref(b);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(nss_of(f), "c"),
                                                        "default_ttl")), 7);
    assert_int_not_equal(json_integer_value(json_object_get(json_object_get(nss_of(m), "c"),
                                                            "default_ttl")), 7);
    assert_int_equal(model_ns_delete(f, "c", &e), 0); /* a removal is the fork's own too */
    assert_non_null(json_object_get(nss_of(m), "c"));
    json_decref(f);

    f = model_fork(m, NULL, "main");
    uint32_t moved;
    b = pool_of("{\"node\": \"10.0.0.4:1\"}");
    assert_int_equal(model_node_add(f, "main", b, &moved, &e), 0);
    json_decref(b);
    const json_t *old = json_object_get(json_object_get(m, "pools"), "main");
    assert_int_equal(json_array_size(json_object_get(old, "nodes")), 3);
    assert_int_equal(model_check(m, &e), 0);
    assert_int_equal(model_check_since(f, m, &e), 0);
    json_decref(f);
    json_decref(m);
}

/* A namespace value the fork shares is not checked again, unless its pool changed: a pool
 * that lost nodes below a namespace's copies is refused though the namespace did not change. */
static void test_check_since_rechecks_namespaces_of_a_changed_pool(void **state)
{
    json_t *m = three();
    struct model_err e;
    const char *name;
    json_t *b = pool_of("{\"name\": \"c\", \"pool\": \"main\", \"copies\": 2}");
    assert_int_equal(model_ns_create(m, b, &name, &e), 0);
    json_decref(b);
    json_t *f = model_fork(m, NULL, "main");
    uint32_t moved;
    assert_int_equal(model_node_remove(f, "main", "10.0.0.1:1", &moved, &e), 0);
    assert_int_equal(model_check_since(f, m, &e), 0); /* two nodes: copies 2 still fit */
    json_t *g = model_fork(f, NULL, "main");
    assert_int_equal(model_node_remove(g, "main", "10.0.0.2:1", &moved, &e), 0);
    assert_int_equal(model_check_since(g, f, &e), 409);
    assert_string_equal(e.rule, "at_most_nodes");
    json_decref(g);
    json_decref(f);
    json_decref(m);
}

/* The pool's namespace limit holds on a fork checked since its model. */
static void test_check_since_counts_the_pool_limit(void **state)
{
    json_t *m = three(); /* "default" is the pool's first */
    struct model_err e;
    const char *name;
    char body[120];
    for (int i = 1; i < MODEL_NS_PER_POOL_MAX; i++) {
        snprintf(body, sizeof body, "{\"name\": \"n%d\", \"pool\": \"main\"}", i);
        json_t *b = pool_of(body);
        assert_int_equal(model_ns_create(m, b, &name, &e), 0);
        json_decref(b);
    }
    assert_int_equal(model_check(m, &e), 0);
    json_t *f = model_fork(m, NULL, NULL);
    json_t *b = pool_of("{\"name\": \"one-more\", \"pool\": \"main\"}");
    assert_int_equal(model_ns_create(f, b, &name, &e), 0);
    assert_int_equal(model_check_since(f, m, &e), 409);
    assert_string_equal(e.field, "pool");
    assert_string_equal(e.rule, "limit");
    json_decref(b);
    json_decref(f);
    json_decref(m);
}

/* The renderer's texts are what json_dumps makes of the document and of the model, version
 * after version, with namespaces created, changed and removed between them. */
static void test_render_matches_whole_dumps_across_changes(void **state)
{
    struct render *r = render_create();
    json_t *m = three();
    struct model_err e;
    const char *name;
    static const char *const steps[] = {
        "+{\"name\": \"b\", \"pool\": \"main\"}", "+{\"name\": \"a.x\", \"pool\": \"main\"}",
        "~b{\"max_ttl\": 99, \"default_ttl\": 9}", "-a.x", "+{\"name\": \"a.x\", \"pool\": \"main\"}",
        "~default{\"eviction\": \"lru\"}",
    };
    for (size_t i = 0; i <= sizeof steps / sizeof steps[0]; i++) {
        size_t len;
        char *doc = render_topology(r, m, &len);
        json_t *want_doc = model_topology(m);
        char *want = json_dumps(want_doc, JSON_SORT_KEYS | JSON_COMPACT);
        assert_int_equal(len, strlen(want) + 1);
        assert_memory_equal(doc, want, len - 1);
        assert_int_equal(doc[len - 1], '\n');
        free(doc);
        free(want);
        json_decref(want_doc);
        char *st = render_state(r, m, &len);
        want = json_dumps(m, JSON_SORT_KEYS | JSON_COMPACT);
        assert_string_equal(st, want);
        assert_int_equal(len, strlen(want));
        free(st);
        free(want);
        if (i == sizeof steps / sizeof steps[0]) break;
        const char *s = steps[i];
        json_t *f;
        if (s[0] == '+') {
            f = model_fork(m, NULL, NULL);
            json_t *b = pool_of(s + 1);
            assert_int_equal(model_ns_create(f, b, &name, &e), 0);
            json_decref(b);
        } else if (s[0] == '-') {
            f = model_fork(m, NULL, NULL);
            assert_int_equal(model_ns_delete(f, s + 1, &e), 0);
        } else {
            char ns[32];
            size_t n = (size_t)(strchr(s, '{') - s - 1);
            memcpy(ns, s + 1, n);
            ns[n] = 0;
            f = model_fork(m, ns, NULL);
            json_t *b = pool_of(strchr(s, '{'));
            assert_int_equal(model_ns_update(f, ns, b, &e), 0);
            json_decref(b);
        }
        assert_int_equal(model_check_since(f, m, &e), 0);
        json_object_set_new(f, "version", json_integer((json_int_t)i + 1));
        json_decref(m);
        m = f;
    }
    json_decref(m);
    render_destroy(&r);
    assert_null(r);
}

/* ---- replicas and failover (issue 15) ----------------------------------------------------- */

static json_t *replicated(void)
{
    json_t *m = three();
    struct model_err e;
    const char *name;
    json_t *b = pool_of("{\"name\": \"orders\", \"pool\": \"main\", \"copies\": 2}");
    assert_int_equal(model_ns_create(m, b, &name, &e), 0);
    json_decref(b);
    assert_int_equal(model_replicas_sync(m, NULL, NULL, NULL, &e), 0);
    assert_int_equal(model_check(m, &e), 0);
    return m;
}

static json_t *main_slots(json_t *m)
{
    return json_object_get(json_object_get(json_object_get(m, "pools"), "main"), "slots");
}

static void test_sync_adds_and_removes_replicas_without_editing_shared_values(void **state)
{
    json_t *m = three();
    struct model_err e;
    json_t *pool_before = json_object_get(json_object_get(m, "pools"), "main");
    json_t *f = model_fork(m, "default", NULL);
    json_t *b = pool_of("{\"copies\": 2}");
    assert_int_equal(model_ns_update(f, "default", b, &e), 0);
    assert_int_equal(model_replicas_sync(f, NULL, NULL, NULL, &e), 0);
    json_t *pool_after = json_object_get(json_object_get(f, "pools"), "main");
    assert_ptr_not_equal(pool_after, pool_before); /* a new value */
    assert_false(json_object_get(json_array_get(json_object_get(pool_before, "slots"), 0),
                                 "replica")); /* the shared one untouched */
    size_t i;
    json_t *r;
    json_array_foreach(main_slots(f), i, r) {
        const char *rep = json_string_value(json_object_get(r, "replica"));
        assert_non_null(rep);
        assert_string_not_equal(rep, json_string_value(json_object_get(r, "node")));
    }
    assert_int_equal(model_check_since(f, m, &e), 0);
    json_decref(b);
    b = pool_of("{\"copies\": 1}");
    assert_int_equal(model_ns_update(f, "default", b, &e), 0);
    assert_int_equal(model_replicas_sync(f, NULL, NULL, NULL, &e), 0);
    json_array_foreach(main_slots(f), i, r) assert_null(json_object_get(r, "replica"));
    json_decref(b);
    json_decref(f);
    json_decref(m);
}

static bool not_node2(void *ctx, const char *node)
{
    return strcmp(node, "10.0.0.2:1") != 0;
}

static void test_promote_moves_ranges_to_their_replicas(void **state)
{
    json_t *m = replicated();
    struct model_err e;
    uint32_t promoted = 0;
    json_t *before = json_deep_copy(main_slots(m));
    assert_int_equal(model_promote(m, "main", "10.0.0.2:1", not_node2, NULL, &promoted, &e), 0);
    assert_int_equal(promoted, 5461);
    assert_int_equal(model_replicas_sync(m, "main", not_node2, NULL, &e), 0);
    assert_int_equal(model_check(m, &e), 0); /* uneven now, and marked so */
    assert_true(json_is_true(json_object_get(json_object_get(json_object_get(m, "pools"), "main"),
                                             "uneven")));
    size_t i;
    json_t *r;
    json_array_foreach(main_slots(m), i, r) {
        assert_string_not_equal(json_string_value(json_object_get(r, "node")), "10.0.0.2:1");
        const char *rep = json_string_value(json_object_get(r, "replica"));
        assert_true(rep == NULL || strcmp(rep, "10.0.0.2:1") != 0);
    }
    /* each of the dead node's old ranges now belongs to its old replica */
    json_array_foreach(before, i, r) {
        if (strcmp(json_string_value(json_object_get(r, "node")), "10.0.0.2:1")) continue;
        json_int_t s = json_integer_value(json_object_get(r, "from"));
        size_t k;
        json_t *x;
        json_array_foreach(main_slots(m), k, x)
            if (json_integer_value(json_object_get(x, "from")) <= s &&
                json_integer_value(json_object_get(x, "to")) >= s)
                assert_string_equal(json_string_value(json_object_get(x, "node")),
                                    json_string_value(json_object_get(r, "replica")));
    }
    json_decref(before);
    json_decref(m);
}

static void test_swap_makes_the_drained_node_the_replica(void **state)
{
    json_t *m = replicated();
    struct model_err e;
    static uint8_t slots[16384];
    memset(slots, 1, sizeof slots);
    uint32_t swapped = 0;
    assert_int_equal(model_swap(m, "main", "10.0.0.1:1", slots, &swapped, &e), 0);
    assert_int_equal(swapped, 5461);
    assert_int_equal(model_check(m, &e), 0);
    size_t i;
    json_t *r;
    json_int_t as_replica = 0;
    json_array_foreach(main_slots(m), i, r) {
        assert_string_not_equal(json_string_value(json_object_get(r, "node")), "10.0.0.1:1");
        if (!strcmp(json_string_value(json_object_get(r, "replica")), "10.0.0.1:1"))
            as_replica += json_integer_value(json_object_get(r, "to")) -
                          json_integer_value(json_object_get(r, "from")) + 1;
    }
    assert_true(as_replica >= 5461);
    json_decref(m);
}

static void test_zone_is_kept_and_checked(void **state)
{
    json_t *m = model_new();
    struct model_err e;
    const char *name;
    json_t *b = pool_of("{\"name\": \"main\", \"nodes\": [{\"node\": \"10.0.0.1:1\", \"zone\": "
                        "\"a\"}, {\"node\": \"10.0.0.2:1\", \"zone\": \"b\"}]}");
    assert_int_equal(model_pool_create(m, b, &name, &e), 0);
    json_decref(b);
    json_t *n0 = json_array_get(json_object_get(json_object_get(json_object_get(m, "pools"), "main"),
                                                "nodes"), 0);
    assert_string_equal(json_string_value(json_object_get(n0, "zone")), "a");
    json_t *doc = model_topology(m);
    char *text = json_dumps(doc, 0);
    assert_null(strstr(text, "zone")); /* zones stay out of the document */
    free(text);
    json_decref(doc);
    uint32_t moved;
    b = pool_of("{\"node\": \"10.0.0.3:1\", \"zone\": \"\"}");
    assert_int_equal(model_node_add(m, "main", b, &moved, &e), 400);
    assert_string_equal(e.field, "zone");
    json_decref(b);
    json_decref(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_model_is_valid_and_empty),
        cmocka_unit_test(test_first_pool_gets_default_namespace),
        cmocka_unit_test(test_namespace_create_and_share),
        cmocka_unit_test(test_refusals_name_field_and_rule),
        cmocka_unit_test(test_node_add_and_remove_keep_map_even),
        cmocka_unit_test(test_sync_adds_and_removes_replicas_without_editing_shared_values),
        cmocka_unit_test(test_promote_moves_ranges_to_their_replicas),
        cmocka_unit_test(test_swap_makes_the_drained_node_the_replica),
        cmocka_unit_test(test_zone_is_kept_and_checked),
        cmocka_unit_test(test_check_refuses_broken_slot_maps),
        cmocka_unit_test(test_topology_has_router_shape),
        cmocka_unit_test(test_fork_shares_untouched_and_copies_touched),
        cmocka_unit_test(test_check_since_rechecks_namespaces_of_a_changed_pool),
        cmocka_unit_test(test_check_since_counts_the_pool_limit),
        cmocka_unit_test(test_render_matches_whole_dumps_across_changes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
