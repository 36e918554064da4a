/* test_control_model.c — unit tests for shoal-control's model (src/control/model.c): changes
 * and their refusals, the whole-state rules a state file must meet on load (a map that is not
 * even, a slot twice, a namespace missing a field), and the topology document it renders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "control/model.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_model_is_valid_and_empty),
        cmocka_unit_test(test_first_pool_gets_default_namespace),
        cmocka_unit_test(test_namespace_create_and_share),
        cmocka_unit_test(test_refusals_name_field_and_rule),
        cmocka_unit_test(test_node_add_and_remove_keep_map_even),
        cmocka_unit_test(test_check_refuses_broken_slot_maps),
        cmocka_unit_test(test_topology_has_router_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
