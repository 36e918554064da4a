/* test_invalidator_rows.c — unit tests for key templates (src/common/template.c), the
 * JSON configuration (config.c) and rows to keys (rows.c): templates parse, escape braces,
 * refuse bad syntax naming the offset, fix their namespace only when a literal ':' comes first,
 * and evaluate to nothing on NULL and to an error on unusable keys; the configuration refuses
 * each bad field by name; an update yields the new and the old key (one when equal), an unsent
 * TOAST value is taken from the old row, a delete the old row's key, the invalidation table its
 * key column, a truncate its namespaces once; a transaction's key set holds each key once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "invalidator/config.h"
#include "invalidator/invalidator.h"
#include "invalidator/pgoutput.h"
#include "invalidator/rows.h"
#include "common/template.h"

static int eval_s(const char *tpl, const char *const *vals, char *out)
{
    char err[300];
    struct tmpl *t = tmpl_parse(tpl, err, sizeof err);
    assert_non_null(t);
    struct tmpl_val v[8];
    for (size_t i = 0; i < tmpl_nrefs(t); i++) {
        v[i].null = vals[i] == NULL;
        v[i].p = vals[i];
        v[i].n = vals[i] ? strlen(vals[i]) : 0;
    }
    char buf[TMPL_KEY_MAX + 1];
    int n = tmpl_eval(t, v, buf, sizeof buf);
    if (n >= 0) {
        memcpy(out, buf, (size_t)n);
        out[n] = 0;
    }
    tmpl_free(&t);
    assert_null(t);
    return n;
}

static void test_template_evaluates_placeholders(void **state)
{
    char out[300];
    const char *v1[] = {"42"};
    assert_int_equal(eval_s("catalog:product:{id}", v1, out), 18);
    assert_string_equal(out, "catalog:product:42");
    const char *v2[] = {"a", "b"};
    assert_true(eval_s("x:{p}-{q}:{{lit}}", v2, out) > 0);
    assert_string_equal(out, "x:a-b:{lit}");
    const char *vn[] = {NULL};
    assert_int_equal(eval_s("catalog:product:{id}", vn, out), TMPL_NULL);
    const char *vs[] = {"has space"};
    assert_int_equal(eval_s("k:{v}", vs, out), TMPL_BAD_BYTE);
    char longv[300];
    memset(longv, 'a', 299);
    longv[299] = 0;
    const char *vl[] = {longv};
    assert_int_equal(eval_s("k:{v}", vl, out), TMPL_TOO_LONG);
}

static void test_template_syntax_errors_name_the_offset(void **state)
{
    char err[300];
    assert_null(tmpl_parse("catalog:{id", err, sizeof err));
    assert_non_null(strstr(err, "offset 8"));
    assert_null(tmpl_parse("catalog:{}", err, sizeof err));
    assert_non_null(strstr(err, "empty placeholder"));
    assert_null(tmpl_parse("catalog:id}", err, sizeof err));
    assert_non_null(strstr(err, "stray '}'"));
    assert_null(tmpl_parse("catalog:all", err, sizeof err));
    assert_non_null(strstr(err, "no {column}"));
    assert_null(tmpl_parse("a:{b{c}", err, sizeof err));
}

static void test_template_namespace_fixed_by_a_leading_literal(void **state)
{
    char err[300];
    struct tmpl *t = tmpl_parse("catalog:product:{id}", err, sizeof err);
    assert_string_equal(tmpl_namespace(t), "catalog");
    assert_int_equal(tmpl_nrefs(t), 1);
    assert_string_equal(tmpl_ref(t, 0), "id");
    tmpl_free(&t);
    t = tmpl_parse("{tenant}:product:{id}", err, sizeof err);
    assert_null(tmpl_namespace(t));
    tmpl_free(&t);
    t = tmpl_parse("product{id}", err, sizeof err);
    assert_null(tmpl_namespace(t)); /* the value may hold the first ':' */
    tmpl_free(&t);
}

#define CLUSTERS "\"clusters\": {\"local\": {\"routers\": [\"127.0.0.1:11211\"]}}"

static void config_error(const char *doc, const char *needle)
{
    struct inv_config c;
    char err[600];
    assert_int_equal(inv_config_parse(doc, strlen(doc), &c, err, sizeof err), -1);
    if (strstr(err, needle) == NULL) fail_msg("error \"%s\" lacks \"%s\"", err, needle);
}

static void test_config_refuses_each_bad_field_by_name(void **state)
{
    config_error("[]", "JSON object");
    config_error("{\"tables\": {\"t\": {\"keys\": [\"a:{b}\"]}}}", "\"clusters\"");
    config_error("{" CLUSTERS ", \"tables\": {\"public.t\": {\"keys\": []}}}",
                 "tables.public.t.keys");
    config_error("{" CLUSTERS ", \"tables\": {\"public.t\": {\"keys\": [\"a:{b\"]}}}",
                 "tables.public.t.keys[0]");
    config_error("{" CLUSTERS ", \"tables\": {\"public.t\": {\"keys\": [\"{x}:{b}\"]}}}",
                 "tables.public.t.namespaces");
    config_error("{" CLUSTERS ", \"tables\": {\"public.t\": {\"key\": [\"a:{b}\"]}}}",
                 "unknown field \"key\"");
    config_error("{\"clusters\": {\"l\": {\"routers\": [\"nohost\"]}}, \"tables\": {}}",
                 "clusters.l.routers[0]");
    config_error("{" CLUSTERS "}", "nothing to read");
    config_error("{" CLUSTERS ", \"invalidation_table\": 5}", "invalidation_table");
}

static void test_config_minimal_form(void **state)
{
    const char *doc = "{" CLUSTERS ", \"tables\": {\"public.products\": {\"keys\": "
                      "[\"catalog:product:{id}\", \"catalog:sku:{sku}\"]}, \"orders\": {\"keys\": "
                      "[\"{tenant}:order:{id}\"], \"namespaces\": [\"shop\"]}}, "
                      "\"invalidation_table\": \"public.shoal_invalidations\"}";
    struct inv_config c;
    char err[600];
    assert_int_equal(inv_config_parse(doc, strlen(doc), &c, err, sizeof err), 0);
    assert_int_equal(c.nclusters, 1);
    assert_string_equal(c.clusters[0].name, "local");
    assert_string_equal(c.clusters[0].routers[0], "127.0.0.1:11211");
    assert_null(c.clusters[0].replica);
    const struct inv_table *t = inv_config_table(&c, "public", "products");
    assert_non_null(t);
    assert_int_equal(t->nkeys, 2);
    assert_int_equal(t->nns, 1); /* catalog, once */
    assert_string_equal(t->namespaces[0], "catalog");
    t = inv_config_table(&c, "public", "orders");
    assert_non_null(t);
    assert_string_equal(t->namespaces[0], "shop");
    assert_string_equal(c.inv_schema, "public");
    assert_string_equal(c.inv_name, "shoal_invalidations");
    inv_config_free(&c);
}

static struct pgo_msg *M;

static void relation(struct rows *r, uint32_t relid, const char *schema, const char *name,
                     const char *const *cols, uint16_t n)
{
    memset(M, 0, sizeof *M);
    M->kind = PGO_RELATION;
    M->relid = relid;
    M->nspname = schema;
    M->relname = name;
    M->ncols = n;
    M->replident = 'f';
    for (uint16_t i = 0; i < n; i++) M->cols[i].name = cols[i];
    assert_int_equal(rows_relation(r, M), 0);
}

static void tuple(struct pgo_tuple *t, const char *const *vals, uint16_t n)
{
    t->ncols = n;
    for (uint16_t i = 0; i < n; i++) {
        const char *v = vals[i];
        t->vals[i].kind = v == NULL ? 'n' : !strcmp(v, "<u>") ? 'u' : 't';
        t->vals[i].data = v;
        t->vals[i].len = t->vals[i].kind == 't' ? (uint32_t)strlen(v) : 0;
    }
}

static char *key(const struct keyset *ks, size_t i)
{
    static char out[300];
    memcpy(out, ks->bytes + ks->e[i].off, ks->e[i].len);
    out[ks->e[i].len] = 0;
    return out;
}

static void test_rows_to_keys(void **state)
{
    const char *doc = "{" CLUSTERS ", \"tables\": {\"public.products\": {\"keys\": "
                      "[\"catalog:product:{id}\", \"catalog:sku:{sku}\"]}}, "
                      "\"invalidation_table\": \"public.inv\"}";
    struct inv_config c;
    char err[600];
    assert_int_equal(inv_config_parse(doc, strlen(doc), &c, err, sizeof err), 0);
    M = malloc(sizeof *M);
    struct rows *r = rows_create(&c, NULL);
    const char *cols[] = {"id", "sku", "descr"};
    relation(r, 10, "public", "products", cols, 3);
    const char *icols[] = {"id", "key", "created_at"};
    relation(r, 11, "public", "inv", icols, 3);
    const char *ocols[] = {"x"};
    relation(r, 12, "public", "other", ocols, 1);
    struct keyset ks = {0};

    /* an update changing sku: product key once (unchanged), old and new sku keys; the
     * description, not sent (TOAST), is taken from the old row and matters to no key */
    memset(M, 0, sizeof *M);
    M->kind = PGO_UPDATE;
    M->relid = 10;
    M->old_kind = 'O';
    const char *oldv[] = {"7", "A", "long"}, *newv[] = {"7", "B", "<u>"};
    tuple(&M->old, oldv, 3);
    tuple(&M->new, newv, 3);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 3);
    assert_string_equal(key(&ks, 0), "catalog:product:7");
    assert_string_equal(key(&ks, 1), "catalog:sku:B");
    assert_string_equal(key(&ks, 2), "catalog:sku:A");
    assert_string_equal(ks.e[0].ns, "catalog");

    /* an update of a templated column sent unchanged and without an old row: no key can be
     * made for it, so the table's namespace is flushed instead */
    keyset_reset(&ks);
    M->old_kind = 0;
    const char *newu[] = {"8", "<u>", "x"};
    tuple(&M->new, newu, 3);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 1);
    assert_string_equal(key(&ks, 0), "catalog:product:8");
    assert_int_equal(ks.nflush, 1);
    assert_string_equal(ks.flush[0], "catalog");
    assert_int_equal(ks.truncated, 0);

    /* a delete: the old row's keys */
    keyset_reset(&ks);
    M->kind = PGO_DELETE;
    M->old_kind = 'O';
    tuple(&M->old, oldv, 3);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 2);
    assert_string_equal(key(&ks, 1), "catalog:sku:A");

    /* the invalidation table: inserts give their key and raise the id; deletes nothing */
    keyset_reset(&ks);
    M->kind = PGO_INSERT;
    M->relid = 11;
    M->old_kind = 0;
    const char *inv1[] = {"41", "user:42", "now"};
    tuple(&M->new, inv1, 3);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 1);
    assert_string_equal(key(&ks, 0), "user:42");
    assert_string_equal(ks.e[0].ns, "user");
    assert_int_equal(ks.max_inv_id, 41);
    const char *inv2[] = {"43", "bad key", "now"};
    tuple(&M->new, inv2, 3);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 1); /* a space: refused */
    assert_int_equal(ks.max_inv_id, 43);
    M->kind = PGO_DELETE;
    M->old_kind = 'K';
    tuple(&M->old, inv1, 3);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 1);

    /* a table not in the config: nothing; a relation never described: a protocol error */
    M->kind = PGO_INSERT;
    M->relid = 12;
    assert_int_equal(rows_change(r, M, &ks), 0);
    M->relid = 99;
    assert_int_equal(rows_change(r, M, &ks), -1);

    /* truncate of products and other: products' namespace, once */
    uint8_t relids[12] = {0, 0, 0, 10, 0, 0, 0, 12, 0, 0, 0, 10};
    M->kind = PGO_TRUNCATE;
    M->nrels = 3;
    M->relids = relids;
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.nflush, 1);
    assert_string_equal(ks.flush[0], "catalog");
    assert_int_equal(ks.truncated, 1);

    keyset_free(&ks);
    rows_destroy(&r);
    assert_null(r);
    free(M);
    inv_config_free(&c);
}

/* rows_set_map: relations described before a new map are mapped again by their names and
 * columns; a table the old map lacked gets keys, one it dropped none; truncate namespaces come
 * from the map. */
static void test_new_map_remaps_known_relations(void **state)
{
    const char *doc = "{" CLUSTERS ", \"tables\": {\"public.products\": {\"keys\": "
                      "[\"catalog:product:{id}\"]}}}";
    struct inv_config c;
    char err[600];
    assert_int_equal(inv_config_parse(doc, strlen(doc), &c, err, sizeof err), 0);
    M = malloc(sizeof *M);
    struct rows *r = rows_create(&c, NULL);
    const char *cols[] = {"id", "sku"};
    relation(r, 10, "public", "products", cols, 2);
    relation(r, 12, "shop", "orders", cols, 2);
    struct inv_config *map = malloc(sizeof *map);
    json_t *t = json_loads("{\"shop.orders\": {\"keys\": [\"shop:order:{sku}\"], "
                           "\"namespaces\": [\"shop\"]}}", 0, NULL);
    assert_int_equal(inv_map_parse(t, map, err, sizeof err), 0);
    assert_int_equal(rows_set_map(r, map), 0);
    struct keyset ks = {0};
    memset(M, 0, sizeof *M);
    M->kind = PGO_INSERT;
    M->relid = 10;
    const char *v[] = {"1", "A"};
    tuple(&M->new, v, 2);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 0); /* products left the map */
    M->relid = 12;
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 1);
    assert_string_equal(key(&ks, 0), "shop:order:A");
    uint8_t relids[4] = {0, 0, 0, 12};
    M->kind = PGO_TRUNCATE;
    M->nrels = 1;
    M->relids = relids;
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.nflush, 1);
    assert_string_equal(ks.flush[0], "shop");
    keyset_free(&ks);
    rows_destroy(&r); /* frees the map it owns */
    free(M);
    inv_config_free(&c);
}

/* A templated column whose value cannot be known flushes the table's namespaces in place of
 * the key: the identity set back from FULL (an UPDATE or DELETE without the column's old
 * value), and the column renamed away; each counted in keys_missing. */
static void test_key_of_an_unknown_value_flushes_the_namespace(void **state)
{
    const char *doc = "{" CLUSTERS ", \"tables\": {\"public.products\": {\"keys\": "
                      "[\"catalog:product:{id}\", \"catalog:sku:{sku}\"]}}}";
    struct inv_config c;
    char err[600];
    assert_int_equal(inv_config_parse(doc, strlen(doc), &c, err, sizeof err), 0);
    M = malloc(sizeof *M);
    struct inv_figs figs = {0};
    struct rows *r = rows_create(&c, &figs);
    const char *cols[] = {"id", "sku"};
    relation(r, 10, "public", "products", cols, 2);
    /* described again with identity DEFAULT: only id (the key) is in it */
    M->replident = 'd';
    M->cols[0].flags = 1;
    assert_int_equal(rows_relation(r, M), 0);
    struct keyset ks = {0};

    /* an insert still makes both keys */
    memset(&M->old, 0, sizeof M->old);
    M->kind = PGO_INSERT;
    M->old_kind = 0;
    const char *v[] = {"7", "A"}, *k[] = {"7", NULL};
    tuple(&M->new, v, 2);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 2);
    assert_int_equal(ks.nflush, 0);

    /* a delete: the old row holds the key only (sku as NULL): id's key, and a flush for sku's */
    keyset_reset(&ks);
    M->kind = PGO_DELETE;
    M->old_kind = 'K';
    tuple(&M->old, k, 2);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 1);
    assert_string_equal(key(&ks, 0), "catalog:product:7");
    assert_int_equal(ks.nflush, 1);
    assert_string_equal(ks.flush[0], "catalog");
    assert_int_equal(figs.keys_missing, 1);
    assert_int_equal(figs.keys_null, 0);

    /* an update without an old row: sku's new key, and a flush for its unknown old one */
    keyset_reset(&ks);
    M->kind = PGO_UPDATE;
    M->old_kind = 0;
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 2);
    assert_int_equal(ks.nflush, 1);
    assert_int_equal(figs.keys_missing, 2);

    /* sku renamed to code (identity FULL again): no sku key can be made at all */
    const char *renamed[] = {"id", "code"};
    relation(r, 10, "public", "products", renamed, 2);
    keyset_reset(&ks);
    M->kind = PGO_UPDATE;
    M->old_kind = 'O';
    tuple(&M->old, v, 2);
    tuple(&M->new, v, 2);
    assert_int_equal(rows_change(r, M, &ks), 0);
    assert_int_equal(ks.n, 1);
    assert_string_equal(key(&ks, 0), "catalog:product:7");
    assert_int_equal(ks.nflush, 1);
    assert_int_equal(figs.keys_unusable, 0);

    keyset_free(&ks);
    rows_destroy(&r);
    free(M);
    inv_config_free(&c);
}

static void test_keyset_keeps_a_key_once(void **state)
{
    struct keyset ks = {0};
    char k[32];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 5000; i++) {
            int n = snprintf(k, sizeof k, "k:%d", i % 3000); /* 2000 names twice */
            assert_int_equal(keyset_add(&ks, k, (size_t)n, NULL), 0);
        }
        assert_int_equal(ks.n, 3000);
        assert_string_equal(key(&ks, 2999), "k:2999");
        keyset_reset(&ks); /* a large set's index is dropped, then built again */
        assert_int_equal(ks.n, 0);
    }
    assert_int_equal(keyset_add(&ks, "a", 1, NULL), 0);
    assert_int_equal(keyset_add(&ks, "a", 1, NULL), 0);
    assert_int_equal(keyset_add(&ks, "ab", 2, NULL), 0);
    assert_int_equal(ks.n, 2);
    keyset_reset(&ks); /* a small set's index is cleared in place */
    assert_int_equal(keyset_add(&ks, "a", 1, NULL), 0);
    assert_int_equal(ks.n, 1);
    keyset_free(&ks);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_evaluates_placeholders),
        cmocka_unit_test(test_template_syntax_errors_name_the_offset),
        cmocka_unit_test(test_template_namespace_fixed_by_a_leading_literal),
        cmocka_unit_test(test_config_refuses_each_bad_field_by_name),
        cmocka_unit_test(test_config_minimal_form),
        cmocka_unit_test(test_rows_to_keys),
        cmocka_unit_test(test_new_map_remaps_known_relations),
        cmocka_unit_test(test_key_of_an_unknown_value_flushes_the_namespace),
        cmocka_unit_test(test_keyset_keeps_a_key_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
