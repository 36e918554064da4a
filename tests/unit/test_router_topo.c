/* test_router_topo.c — unit tests for shoal-router's topology document: parsing the minimal
 * form, routing keys by namespace and slot, explicit slot maps, errors that name the field,
 * the registry's version rule, and the reply framing used on upstream connections. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router/request.h"
#include "common/slot.h"
#include "router/replyframe.h"
#include "router/topo.h"

static const char minimal[] =
    "{\"version\": 1, \"pools\": {\"main\": {\"nodes\": [\"127.0.0.1:21001\", "
    "\"127.0.0.1:21002\", \"127.0.0.1:21003\"]}, \"gutter\": {\"nodes\": [\"127.0.0.1:21009\"]}},"
    " \"gutter_pool\": \"gutter\", \"namespaces\": {\"default\": {\"pool\": \"main\"}, "
    "\"catalog\": {\"pool\": \"main\", \"default_ttl\": 600, \"max_ttl\": 86400}, "
    "\"g\": {\"pool\": \"gutter\"}}}";

static struct topo *parse_ok(const char *doc)
{
    struct topo *t = NULL;
    char err[512] = "";
    int rc = topo_parse(doc, strlen(doc), 0, &t, err, sizeof err);
    if (rc != 0) fail_msg("expected the document to parse, got: %s", err);
    return t;
}

/* Parse must fail with a message that contains `want`. */
static void parse_fails_naming(const char *doc, const char *want)
{
    struct topo *t = NULL;
    char err[512] = "";
    assert_int_equal(topo_parse(doc, strlen(doc), 0, &t, err, sizeof err), -1);
    assert_null(t);
    if (strstr(err, want) == NULL) fail_msg("error '%s' does not name '%s'", err, want);
}

static void test_minimal_document(void **state)
{
    struct topo *t = parse_ok(minimal);
    assert_int_equal(t->version, 1);
    assert_int_equal(t->nnodes, 4);
    assert_int_equal(t->npools, 2);
    assert_string_equal(t->pools[t->gutter_pool].name, "gutter");
    assert_int_equal(t->gutter_ttl, TOPO_GUTTER_TTL_DEFAULT);
    assert_int_equal(topo_gutter_route(t, "any:key", 7), 3);
    const struct topo_ns *ns = topo_namespace(t, "catalog:v7:product:1", 20);
    assert_string_equal(ns->name, "catalog");
    assert_int_equal(ns->default_ttl, 600);
    assert_int_equal(ns->max_ttl, 86400);
    assert_string_equal(topo_namespace(t, "plain", 5)->name, "default");
    assert_string_equal(topo_namespace(t, "unknown:x", 9)->name, "default");
    topo_destroy(&t);
    assert_null(t);
}

/* Default map: a key's node is the one whose slot range holds CRC16(key) mod 16384. */
static void test_route_follows_default_slot_map(void **state)
{
    struct topo *t = parse_ok(minimal);
    char key[32];
    for (int i = 0; i < 2000; i++) {
        int n = snprintf(key, sizeof key, "key%d", i);
        uint32_t slot = slot_of_key(key, (size_t)n);
        uint32_t want = slot < 5461 ? 0 : slot < 10922 ? 1 : 2;
        assert_int_equal(topo_route(t, key, (size_t)n), want);
    }
    /* a namespace on another pool routes there */
    assert_int_equal(topo_route(t, "g:anything", 10), 3);
    topo_destroy(&t);
}

static void test_explicit_slot_map(void **state)
{
    struct topo *t = parse_ok(
        "{\"version\": 3, \"pools\": {\"p\": {\"nodes\": [\"127.0.0.1:1\", \"127.0.0.1:2\"], "
        "\"slots\": [{\"from\": 0, \"to\": 99, \"node\": \"127.0.0.1:2\"}, "
        "{\"from\": 100, \"to\": 16383, \"node\": \"127.0.0.1:1\"}]}}, "
        "\"namespaces\": {\"default\": {\"pool\": \"p\"}}}");
    assert_int_equal(t->pools[0].owner[0], 1);
    assert_int_equal(t->pools[0].owner[99], 1);
    assert_int_equal(t->pools[0].owner[100], 0);
    assert_int_equal(t->pools[0].owner[16383], 0);
    topo_destroy(&t);
}

/* The control plane's namespace fields (team, memory, copies, eviction, lease and stale
 * settings): accepted within their rules and kept in the document; outside them refused with
 * the field named. */
static void ns_doc(char *out, size_t n, const char *fields)
{
    snprintf(out, n, "{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"]}}, "
                     "\"namespaces\": {\"default\": {\"pool\": \"m\"}, "
                     "\"cat\": {\"pool\": \"m\"%s}}}", fields);
}

static void test_control_plane_namespace_fields(void **state)
{
    char doc[1024];
    ns_doc(doc, sizeof doc, ", \"team\": \"shop\", \"memory\": 67108864, \"copies\": 2, "
           "\"eviction\": \"s3fifo\", \"lease_ttl\": 10, \"stale_ttl\": 0, "
           "\"lease_period\": 3600");
    struct topo *t = parse_ok(doc);
    assert_non_null(strstr(t->doc, "\"s3fifo\""));
    assert_non_null(strstr(t->doc, "67108864"));
    topo_destroy(&t);
    static const struct {
        const char *fields, *want;
    } bad[] = {
        {", \"team\": 7", "namespaces.cat.team"},
        {", \"team\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
         "namespaces.cat.team"}, /* 65 bytes */
        {", \"memory\": -1", "namespaces.cat.memory"},
        {", \"memory\": \"64m\"", "namespaces.cat.memory"},
        {", \"copies\": 3", "namespaces.cat.copies"},
        {", \"copies\": 0", "namespaces.cat.copies"},
        {", \"eviction\": \"fifo\"", "namespaces.cat.eviction"},
        {", \"eviction\": 1", "namespaces.cat.eviction"},
        {", \"lease_ttl\": 3601", "namespaces.cat.lease_ttl"},
        {", \"stale_ttl\": 1.5", "namespaces.cat.stale_ttl"},
        {", \"lease_period\": true", "namespaces.cat.lease_period"},
        {", \"leases\": 1", "namespaces.cat.leases: unknown field"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ns_doc(doc, sizeof doc, bad[i].fields);
        parse_fails_naming(doc, bad[i].want);
    }
}

/* A slot range's "replica" (design.md, copies = 2): another node of the pool. */
static void test_slot_range_replica(void **state)
{
    static const char head[] = "{\"version\": 1, \"pools\": {\"m\": {\"nodes\": "
                               "[\"127.0.0.1:1\", \"127.0.0.1:2\"], \"slots\": [";
    static const char tail[] = "]}}, \"namespaces\": {\"default\": {\"pool\": \"m\", "
                               "\"copies\": 2}}}";
    char doc[1024];
    snprintf(doc, sizeof doc, "%s{\"from\": 0, \"to\": 16383, \"node\": \"127.0.0.1:1\", "
             "\"replica\": \"127.0.0.1:2\"}%s", head, tail);
    struct topo *t = parse_ok(doc);
    assert_int_equal(topo_route(t, "k", 1), 0); /* routed by `node` */
    topo_destroy(&t);
    snprintf(doc, sizeof doc, "%s{\"from\": 0, \"to\": 16383, \"node\": \"127.0.0.1:1\", "
             "\"replica\": \"127.0.0.1:1\"}%s", head, tail);
    parse_fails_naming(doc, "pools.m.slots[0].replica");
    snprintf(doc, sizeof doc, "%s{\"from\": 0, \"to\": 16383, \"node\": \"127.0.0.1:1\", "
             "\"replica\": \"127.0.0.1:3\"}%s", head, tail);
    parse_fails_naming(doc, "pools.m.slots[0].replica");
}

static void test_errors_name_the_field(void **state)
{
    parse_fails_naming("{", "not valid JSON");
    parse_fails_naming("[]", "JSON object");
    parse_fails_naming("{\"pools\": {}}", "version");
    parse_fails_naming("{\"version\": 0, \"pools\": {}}", "version");
    parse_fails_naming("{\"version\": \"1\"}", "version");
    parse_fails_naming("{\"version\": 1, \"pools\": {}}", "pools");
    parse_fails_naming("{\"version\": 1, \"pool\": {}}", "pool: unknown field");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": []}}}", "pools.m.nodes");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1\"]}}}",
                       "pools.m.nodes[0]: '127.0.0.1' is not host:port");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\", "
                       "\"127.0.0.1:99999\"]}}}",
                       "pools.m.nodes[1]");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\", "
                       "\"127.0.0.1:1\"]}}}",
                       "listed twice");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"], "
                       "\"weight\": 2}}}",
                       "pools.m.weight: unknown field");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"]}}}",
                       "namespaces");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"]}}, "
                       "\"namespaces\": {\"x\": {\"pool\": \"m\"}}}",
                       "namespaces.default");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"]}}, "
                       "\"namespaces\": {\"default\": {\"pool\": \"n\"}}}",
                       "namespaces.default.pool: no pool named 'n'");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"]}}, "
                       "\"namespaces\": {\"default\": {\"pool\": \"m\", \"max_ttl\": -1}}}",
                       "namespaces.default.max_ttl");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"]}}, "
                       "\"gutter_pool\": \"g\", \"namespaces\": {\"default\": {\"pool\": \"m\"}}}",
                       "gutter_pool");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"]}}, "
                       "\"gutter_ttl\": 0, \"namespaces\": {\"default\": {\"pool\": \"m\"}}}",
                       "gutter_ttl: must be an integer from 1");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"], "
                       "\"slots\": [{\"from\": 0, \"to\": 10, \"node\": \"127.0.0.1:1\"}]}}, "
                       "\"namespaces\": {\"default\": {\"pool\": \"m\"}}}",
                       "slot 11 has no node");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"], "
                       "\"slots\": [{\"from\": 0, \"to\": 16383, \"node\": \"127.0.0.1:2\"}]}}, "
                       "\"namespaces\": {\"default\": {\"pool\": \"m\"}}}",
                       "pools.m.slots[0].node");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"m\": {\"nodes\": [\"127.0.0.1:1\"], "
                       "\"slots\": [{\"from\": 0, \"to\": 16383, \"node\": \"127.0.0.1:1\"}, "
                       "{\"from\": 5, \"to\": 5, \"node\": \"127.0.0.1:1\"}]}}, "
                       "\"namespaces\": {\"default\": {\"pool\": \"m\"}}}",
                       "pools.m.slots[1]: slot 5 is already assigned");
}

static void test_replicated_pool_reads_one_replica(void **state)
{
    struct topo *t = parse_ok(
        "{\"version\": 1, \"pools\": {\"r\": {\"mode\": \"replicated\", \"nodes\": "
        "[\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]}}, "
        "\"namespaces\": {\"default\": {\"pool\": \"r\"}}}");
    assert_true(t->pools[0].replicated);
    for (uint32_t h = 0; h < 6; h++) {
        topo_set_replica(h);
        assert_int_equal(topo_route(t, "a", 1), h % 3);
        assert_int_equal(topo_route(t, "zzz", 3), h % 3); /* every key: the same replica */
    }
    topo_set_replica(0);
    topo_destroy(&t);
    t = parse_ok("{\"version\": 1, \"pools\": {\"c\": {\"nodes\": [\"127.0.0.1:1\"], "
                 "\"warm_from\": \"w\"}, \"w\": {\"nodes\": [\"127.0.0.1:2\"]}}, "
                 "\"namespaces\": {\"default\": {\"pool\": \"c\"}}}");
    assert_int_equal(t->pools[0].warm_from, 1);
    assert_int_equal(t->pools[1].warm_from, -1);
    topo_destroy(&t);
    parse_fails_naming("{\"version\": 1, \"pools\": {\"c\": {\"nodes\": [\"127.0.0.1:1\"], "
                       "\"warm_from\": \"c\"}}, \"namespaces\": {\"default\": {\"pool\": \"c\"}}}",
                       "pools.c.warm_from: must name another pool");
    parse_fails_naming("{\"version\": 1, \"pools\": {\"r\": {\"mode\": \"mirror\", \"nodes\": "
                       "[\"127.0.0.1:1\"]}}, \"namespaces\": {\"default\": {\"pool\": \"r\"}}}",
                       "pools.r.mode");
}

static uint64_t seen_word; /* one reader, always quiescent here */

static void test_registry_publishes_only_newer_versions(void **state)
{
    uint64_t *seen[1] = {&seen_word};
    struct topo_registry r;
    topo_registry_init(&r, parse_ok(minimal), seen, 1);
    uint64_t g = topo_gen(&r);
    char err[256];
    assert_int_equal(topo_publish(&r, parse_ok(minimal), err, sizeof err), -1);
    assert_non_null(strstr(err, "not newer"));
    assert_int_equal(topo_gen(&r), g);
    char doc[sizeof minimal + 8];
    snprintf(doc, sizeof doc, "%s", minimal);
    char *v = strstr(doc, "\"version\": 1");
    v[11] = '2';
    assert_int_equal(topo_publish(&r, parse_ok(doc), err, sizeof err), 0);
    assert_int_equal(topo_current(&r)->version, 2);
    assert_int_equal(topo_gen(&r), g + 1);
    topo_registry_teardown(&r);
}

static void test_reply_framing(void **state)
{
    size_t scan = 0;
    const char *one = "STORED\r\nEND\r\n";
    assert_int_equal(reply_length(one, strlen(one), 1 << 20, 1 << 30, &scan), 8);
    scan = 0;
    const char *get = "VALUE a 0 3\r\nabc\r\nVALUE b 5 1 77\r\nx\r\nEND\r\nrest";
    assert_int_equal(reply_length(get, strlen(get), 1 << 20, 1 << 30, &scan), strlen(get) - 4);
    /* incomplete: every prefix asks for more, and scanning resumes where it stopped */
    for (size_t n = 0; n < strlen(get) - 4; n++) {
        scan = 0;
        assert_int_equal(reply_length(get, n, 1 << 20, 1 << 30, &scan), 0);
        assert_int_equal(reply_length(get, strlen(get), 1 << 20, 1 << 30, &scan), strlen(get) - 4);
    }
    scan = 0;
    const char *va = "VA 2 t10\r\nhi\r\nHD\r\n";
    assert_int_equal(reply_length(va, strlen(va), 1 << 20, 1 << 30, &scan), 14);
    /* a value block that is not followed by \r\n cannot be a reply */
    scan = 0;
    assert_int_equal(reply_length("VA 1\r\nxyz", 9, 1 << 20, 1 << 30, &scan), -1);
    scan = 0;
    assert_int_equal(reply_length("VALUE a 0 zz\r\n", 14, 1 << 20, 1 << 30, &scan), -1);
    /* a value longer than the router takes is refused from its header, not buffered */
    scan = 0;
    assert_int_equal(reply_length("VALUE a 0 11\r\n", 15, 10, 1 << 30, &scan), -1);
    scan = 0;
    assert_int_equal(reply_length("VA 9999999999 t\r\n", 18, 1 << 20, 1 << 30, &scan), -1);
    scan = 0;
    assert_int_equal(reply_length("VALUE a 0 10\r\n", 15, 10, 1 << 30, &scan), 0);
    /* blocks within -I each, streamed without end: refused once past what the request can be
     * answered with, whether they arrive at once or bit by bit */
    uint64_t one_key = reply_max_bytes(reply_value_slots("get a\r\n", 7), 3);
    static const char block[] = "VALUE a 0 3\r\nabc\r\n";
    size_t nblocks = (size_t)one_key / (sizeof block - 1) + 2, total = nblocks * (sizeof block - 1);
    char *stream = malloc(total);
    assert_non_null(stream);
    for (size_t i = 0; i < nblocks; i++) memcpy(stream + i * (sizeof block - 1), block, sizeof block - 1);
    scan = 0;
    assert_int_equal(reply_length(stream, total, 3, one_key, &scan), -1);
    scan = 0;
    long r = 0;
    for (size_t n = 0; r == 0 && n < total + 1000; n += 1000)
        r = reply_length(stream, n < total ? n : total, 3, one_key, &scan);
    assert_int_equal(r, -1);
    assert_true(scan <= one_key);
    free(stream);
    scan = 0;
    assert_int_equal(reply_length(get, strlen(get), 1 << 20, 30, &scan), -1);
    /* how many values a request may be answered with */
    assert_int_equal(reply_value_slots("get a b c\r\n", 11), 3);
    assert_int_equal(reply_value_slots("gats 10 a b\r\n", 13), 2);
    assert_int_equal(reply_value_slots("mg a v\r\n", 8), 1);
    assert_int_equal(reply_value_slots("set a 0 0 1\r\nx\r\n", 16), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_document),
        cmocka_unit_test(test_route_follows_default_slot_map),
        cmocka_unit_test(test_explicit_slot_map),
        cmocka_unit_test(test_replicated_pool_reads_one_replica),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_control_plane_namespace_fields),
        cmocka_unit_test(test_slot_range_replica),
        cmocka_unit_test(test_registry_publishes_only_newer_versions),
        cmocka_unit_test(test_reply_framing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
