/* render.h — the texts made from each version of the model: the topology document every
 * follower polls (docs/router.md) and the state the store writes (model.h), both compact JSON
 * with sorted keys.
 *
 * With 10,000 namespaces both texts are megabytes, and a change touches one namespace, so a
 * renderer keeps each namespace's text and renders again only those whose JSON value is not
 * the one it rendered before: a change works on a fork of the model (model_fork) that shares
 * every value it did not touch, so an unchanged namespace is the same json_t from version to
 * version. The cache holds a reference to each value it rendered, so a freed value's address
 * can never come back with other contents and pass for it.
 *
 * One renderer belongs to one thread at a time (control's, under its lock). */
#ifndef SHOAL_CONTROL_RENDER_H
#define SHOAL_CONTROL_RENDER_H

#include <jansson.h>
#include <stddef.h>

struct render;

struct render *render_create(void);
void render_destroy(struct render **r);

/* The topology document of `m` (what model_topology makes, as json_dumps with JSON_SORT_KEYS |
 * JSON_COMPACT writes it), with a final '\n': malloc'd, its length in *len. NULL on memory. */
char *render_topology(struct render *r, const json_t *m, size_t *len);
/* The model `m` itself, as json_dumps with JSON_SORT_KEYS | JSON_COMPACT writes it (no
 * newline): malloc'd, *len. NULL on memory. */
char *render_state(struct render *r, const json_t *m, size_t *len);

#endif
