/* rows.h — from decoded row changes to keys: the relation cache (which PostgreSQL relation id
 * is which configured table, and where each templated column sits), template evaluation on the
 * old and the new row, the invalidation table's keys, and the key set a transaction collects.
 * Pure code (no libpq), so it is unit-tested and fuzzed with the decoder. */
#ifndef SHOAL_INVALIDATOR_ROWS_H
#define SHOAL_INVALIDATOR_ROWS_H

#include <stddef.h>
#include <stdint.h>

struct inv_config;
struct inv_figs;
struct pgo_msg;

struct keyent {
    size_t off;      /* into keyset.bytes */
    uint32_t len;
    const char *ns;  /* interned; NULL when the key has no ':' */
};

/* The keys and namespace flushes of one transaction, in the order they arose. */
struct keyset {
    char *bytes;
    size_t nbytes, capb;
    struct keyent *e;
    size_t n, cap;
    const char **flush; /* namespaces a truncate flushes, each once */
    size_t nflush, capflush;
    uint64_t max_inv_id; /* highest invalidation table id inserted */
    int truncated;       /* a truncate of a mapped table (flush also holds missing keys' flushes) */
    uint32_t *index;     /* open addressing over e (entry + 1; 0 empty), so a key is kept once */
    size_t nindex;       /* a power of two, at least twice n; 0 before the first key */
};

void keyset_reset(struct keyset *ks);
void keyset_free(struct keyset *ks);
/* Add a key unless the set holds it already. 0, or -1 out of memory. */
int keyset_add(struct keyset *ks, const char *key, size_t n, const char *ns);
int keyset_flush(struct keyset *ks, const char *ns);

struct rows;
/* `conf`'s tables are the map until rows_set_map; its invalidation table stays. `figs` may be
 * NULL (tests). */
struct rows *rows_create(const struct inv_config *conf, struct inv_figs *figs);
void rows_destroy(struct rows **r);
/* Use `map`'s tables (struct inv_config with tables only, malloc'd; rows owns it from here and
 * frees the one it replaces) for changes from now on: every relation seen so far is mapped
 * again. `conf` (rows_create) keeps naming the invalidation table. Call between transactions,
 * with no streamed transaction open (keysets hold namespace strings of the map in use). 0, or
 * -1 out of memory (a relation left unmapped: reconnect, so PostgreSQL describes it again). */
int rows_set_map(struct rows *r, struct inv_config *map);
/* A Relation message: remember (or forget) the relation's mapping. 0, or -1 out of memory. */
int rows_relation(struct rows *r, const struct pgo_msg *m);
/* Add the namespaces of table schema.name (in the map in use) to ks's flushes, as a truncate of
 * it would. The number added (0: not mapped), or -1 out of memory. */
int rows_table_flush(struct rows *r, const char *schema, const char *name, struct keyset *ks);
/* The namespaces of every table in the map in use, into ks's flushes. 0, or -1 out of memory. */
int rows_flush_all(struct rows *r, struct keyset *ks);
/* An Insert, Update, Delete or Truncate: add its keys or flushes to ks. 0; -1 out of memory or
 * a change to a relation no Relation message described (a protocol error). */
int rows_change(struct rows *r, const struct pgo_msg *m, struct keyset *ks);

#endif
