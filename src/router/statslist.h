/* statslist.h — one memcached stat list merged from several nodes' lists.
 *
 * The router answers `stats`, `stats items|slabs|sizes|settings` and `stats detail dump` as one
 * memcached: each node's list (STAT or PREFIX lines) is added here, and the merge is written
 * out once every node answered. Pure: no router state, so it can be fuzzed alone. Names and
 * values point into the lists added, which must outlive the merge. */
#ifndef SHOAL_ROUTER_STATSLIST_H
#define SHOAL_ROUTER_STATSLIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/* How the nodes' lists are merged. */
enum statsmerge_kind {
    STATSMERGE_GENERAL, /* `stats`: the router's own figures with the nodes' summed */
    STATSMERGE_ITEMS,   /* `stats items`: per class, summed (ages: the oldest) */
    STATSMERGE_SLABS,   /* `stats slabs`: per class, summed (chunk sizes as they are) */
    STATSMERGE_SUM,     /* `stats sizes`: every number summed */
    STATSMERGE_PREFIX,  /* `stats detail dump`: per prefix, summed */
    STATSMERGE_FIRST,   /* `stats detail on|off`, `stats reset`: the first node's answer */
    STATSMERGE_SETTINGS, /* `stats settings`: the router's own, with the nodes' cache settings */
};

enum statslist_rule { SM_SUM, SM_MAX, SM_MIN, SM_FIRST, SM_OWN };

struct statslist_ent {
    const char *name, *val; /* into the lists added */
    uint32_t nname, nval;
    uint64_t num[4];        /* the value as numbers (PREFIX lines: get, hit, set, del) */
    bool isnum;
    enum statslist_rule rule; /* SM_OWN: the router's to give, not written */
    long cls;               /* slab class, for the order of items and slabs; -1: none */
    uint32_t seq;           /* first seen */
};

/* Zero-initialised before use; statslist_free() after. */
struct statslist {
    uint8_t merge;          /* enum statsmerge_kind */
    struct statslist_ent *e;
    uint32_t n, cap;
    uint32_t *slot; /* open addressing: 1 + index into e, 0 empty */
    uint32_t nslot;
};

/* Add one node's list (STAT or PREFIX lines, each ending in \n) into l. -1: out of memory. */
int statslist_add(struct statslist *l, const char *p, size_t n);
/* The entry named [name, name + n), or NULL. Not after statslist_write (it reorders). */
struct statslist_ent *statslist_get(const struct statslist *l, const char *name, size_t n);
/* Append the merged entries as l->merge lists them (SM_OWN ones left out). */
void statslist_write(struct buf *b, struct statslist *l);
void statslist_free(struct statslist *l);

#endif
