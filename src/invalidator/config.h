/* config.h — shoal-invalidator's JSON configuration (--config FILE; docs/invalidator.md): the
 * clusters deletes go to, the tables whose rows map to keys, and the invalidation table.
 * Tunables (slot, publication, delivery limits) are options, not part of this document. */
#ifndef SHOAL_INVALIDATOR_CONFIG_H
#define SHOAL_INVALIDATOR_CONFIG_H

#include <jansson.h>
#include <stddef.h>

#include "invalidator/deliver.h"

struct tmpl;

struct inv_table {
    const char *schema, *name; /* "public", "products" */
    struct tmpl **keys;
    size_t nkeys;
    const char **namespaces;   /* what a truncate of the table flushes */
    size_t nns;
};

struct inv_config {
    struct deliver_cluster_cfg *clusters;
    size_t nclusters;
    struct inv_table *tables;
    size_t ntables;
    const char *inv_schema, *inv_name; /* the invalidation table, or NULL */
    void *doc;                         /* the parsed document the strings point into */
    char **owned;                      /* strings split from the document */
    size_t nowned;
};

/* Parse the document in text. 0, or -1 with a message naming the field in err (the config is
 * then empty and needs no free). */
int inv_config_parse(const char *text, size_t len, struct inv_config *c, char *err,
                     size_t errlen);
/* The same from a file; `control` nonzero (--control): tables may come from the control plane
 * only, so a document with neither tables nor an invalidation table is accepted. */
int inv_config_load(const char *path, struct inv_config *c, int control, char *err,
                    size_t errlen);
/* A map: a configuration of tables only, from `tables` in the configuration's "tables" form
 * ("schema.table": {"keys": [...], "namespaces": [...]}), whose reference it takes. 0, or -1
 * with a message (the map is then empty and needs no free). */
int inv_map_parse(json_t *tables, struct inv_config *m, char *err, size_t errlen);
/* The configuration's tables in that form, names as "schema.table" and "namespaces" listed (a
 * new reference; NULL when out of memory). */
json_t *inv_config_tables_json(const struct inv_config *c);
void inv_config_free(struct inv_config *c);

/* The configured table schema.name, or NULL. */
const struct inv_table *inv_config_table(const struct inv_config *c, const char *schema,
                                         const char *name);

#endif
