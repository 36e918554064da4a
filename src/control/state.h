/* state.h — where the control plane's model lives between runs (issue 13.4).
 *
 * A state store loads the model once at start and saves every change before the change is
 * acknowledged; a save that returns 0 is durable (survives kill -9 and a power cut), so no
 * acknowledged change is lost and the version never goes back. Today's store is one file,
 * written atomically: a temporary file in the same directory, fsync, rename over the old one,
 * fsync of the directory. A shared store for several control processes (etcd, with a leader
 * lease) is another implementation of the same ops: the seam is `struct state_ops`. */
#ifndef SHOAL_CONTROL_STATE_H
#define SHOAL_CONTROL_STATE_H

#include <jansson.h>
#include <stddef.h>

struct state_store;

struct state_ops {
    /* *out: the stored model (a new reference), or NULL when none was ever stored. */
    int (*load)(struct state_store *s, json_t **out, char *err, size_t errlen);
    int (*save)(struct state_store *s, const json_t *model, char *err, size_t errlen);
    void (*close)(struct state_store *s);
};

struct state_store {
    const struct state_ops *ops;
};

/* The embedded store: the file at `path` (its directory must exist). NULL on memory. */
struct state_store *state_file_open(const char *path);

static inline int state_load(struct state_store *s, json_t **out, char *err, size_t errlen)
{
    return s->ops->load(s, out, err, errlen);
}
static inline int state_save(struct state_store *s, const json_t *m, char *err, size_t errlen)
{
    return s->ops->save(s, m, err, errlen);
}
static inline void state_close(struct state_store **s)
{
    if (*s) (*s)->ops->close(*s);
    *s = NULL;
}

#endif
