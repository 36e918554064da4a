/* cmd_store.h — the one storage routine behind every text and meta store command. */
#ifndef SHOAL_NODE_CMD_STORE_H
#define SHOAL_NODE_CMD_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "node/conn.h"

enum cmd_store_mode { CS_SET, CS_ADD, CS_REPLACE, CS_APPEND, CS_PREPEND };
enum cmd_store_res { CS_STORED, CS_NOT_STORED, CS_EXISTS, CS_NOT_FOUND, CS_NO_MEMORY };

struct cmd_store_args {
    enum cmd_store_mode mode;
    bool has_cas;   /* compare with `cas` first (text cas, ms C) */
    uint64_t cas;
    bool set_stale; /* ms I: a CAS older than the item's stores the value marked stale */
};

/* Store `it` (owned by the call from here on) by the rules of `a`. On CS_STORED, *cas_out (if
 * not NULL) is the stored item's CAS. Counts cas_hits/cas_badval/cas_misses. */
enum cmd_store_res cmd_store_apply(struct conn *c, struct item *it, const struct cmd_store_args *a,
                                   uint64_t *cas_out);

/* Delete `key` (of namespace `ns`) and hold it off for `secs` seconds (the legacy
 * `delete <key> <time>` and md H): until then gets miss, add/replace/append/prepend/cas fail,
 * and a plain set stores and ends the hold. Counts the delete. Returns whether a live item was
 * there; *ok is false when the tombstone could not be allocated (the key is then left as it
 * was, and nothing is counted). */
bool cmd_delete_holdoff(struct conn *c, const struct ns *ns, const char *key, size_t nkey,
                        int64_t secs, bool *ok);

/* Refuse a storage command before its data is read: reply `msg` (unless text noreply) and, for
 * set and ms, remove any old value of the key as memcached does. */
void cmd_store_refuse(struct conn *c, struct proto_req *req, const char *msg);

enum delta_res { DELTA_OK, DELTA_MISS, DELTA_NON_NUMERIC, DELTA_NO_MEMORY };

/* Apply incr (or decr, which stops at 0) of `delta` to the linked item *itp, whose shard lock
 * (hash hv) the caller holds. The item may be replaced: *itp is then the new one. On DELTA_OK
 * *value is the new number and the item has a new CAS. */
enum delta_res cmd_delta_locked(struct store *st, uint64_t hv, struct item **itp, bool incr,
                                uint64_t delta, uint32_t now, uint64_t *value);

#endif
