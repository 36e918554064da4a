/* state.h — where the control plane's model lives between runs (issue 13.4).
 *
 * A state store loads the model once at start and saves every change before the change is
 * acknowledged; a save that returns 0 is durable (survives kill -9 and a power cut), so no
 * acknowledged change is lost and the version never goes back. Today's store is one file,
 * written atomically: a temporary file in the same directory, fsync, rename over the old one,
 * fsync of the directory. The shared store for several control processes (--etcd, with a
 * leader lease: leader.h) is another implementation of the same ops (state_etcd.c). */
#ifndef SHOAL_CONTROL_STATE_H
#define SHOAL_CONTROL_STATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct state_store;

struct state_ops {
    /* *out: the stored model (a new reference), or NULL when none was ever stored. */
    int (*load)(struct state_store *s, json_t **out, char *err, size_t errlen);
    /* text: the model as render_state() writes it (len bytes), made once for every store */
    int (*save)(struct state_store *s, const json_t *model, const char *text, size_t len,
                char *err, size_t errlen);
    void (*close)(struct state_store *s);
};

struct state_store {
    const struct state_ops *ops;
};

/* The embedded store: the file at `path` (its directory must exist). NULL on memory. */
struct state_store *state_file_open(const char *path);

/* The shared store (state_etcd.c): the model in etcd keys under <prefix> (<prefix>state and
 * 64 namespace buckets <prefix>ns/<b>; see state_etcd.c), reached through
 * the etcd members' client URLs in `endpoints` ("URL[,URL...]"), each attempt bounded by
 * timeout_ms. NULL with a message on a bad list or memory. Its save succeeds only while a
 * leader guard is set and holds in etcd: */
struct state_store *state_etcd_open(const char *endpoints, const char *prefix,
                                    unsigned timeout_ms, char *err, size_t errlen);
/* This process won the election with its leader key at create_revision leader_rev: saves are
 * guarded by it from now on. 0: not leader, every save is refused without asking etcd. */
void state_etcd_guard(struct state_store *s, int64_t leader_rev);
/* A save found the leader key gone or another's: the guard is cleared (the leader steps down). */
bool state_etcd_lost(struct state_store *s);
/* True when mod_rev (the state key's, as etcd reports it now; every save writes it) is newer
 * than the revision this store last read or wrote: the state changed elsewhere and should be
 * loaded again. */
bool state_etcd_stale(struct state_store *s, int64_t mod_rev);
/* End its etcd request in progress, and every later one (shutdown). */
void state_etcd_cancel(struct state_store *s);

static inline int state_load(struct state_store *s, json_t **out, char *err, size_t errlen)
{
    return s->ops->load(s, out, err, errlen);
}
static inline int state_save(struct state_store *s, const json_t *m, const char *text,
                             size_t len, char *err, size_t errlen)
{
    return s->ops->save(s, m, text, len, err, errlen);
}
static inline void state_close(struct state_store **s)
{
    if (*s) (*s)->ops->close(*s);
    *s = NULL;
}

#endif
