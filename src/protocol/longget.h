/* longget.h — get/gets/gat/gats lines longer than --line-max, taken in parts.
 *
 * memcached has no line limit for the get family (a multi-get of thousands of keys is one
 * line), while every other line is bounded. Holding such a line whole would let a peer make us
 * buffer without bound, so shoal-node and shoal-router answer it as it arrives: once a line
 * over the limit is seen to start with a get verb, the verb (and a gat's exptime) is taken,
 * then each run of complete keys (up to the last space buffered) is answered and consumed, and
 * END is sent when the newline finally comes. Memory stays bounded by the limit plus a key.
 *
 * Errors: a key over PROTO_KEY_MAX or with a byte a key may not have is answered
 * "CLIENT_ERROR bad command line format" (as memcached answers the whole line), in place of
 * END, and the rest of the line is dropped; values of earlier parts have been sent by then
 * (memcached, holding the line whole, would send none of them). Pure functions: the callers
 * own the buffers and the replies. */
#ifndef SHOAL_PROTOCOL_LONGGET_H
#define SHOAL_PROTOCOL_LONGGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

/* A long get in progress on a connection; zeroed (cmd CMD_NONE) when none is. */
struct lget {
    enum proto_cmd cmd;  /* CMD_GET, CMD_GETS, CMD_GAT or CMD_GATS while one is in progress */
    int64_t exptime;     /* gat/gats: as sent */
    bool skip;           /* an error was answered: drop the rest of the line */
    bool any;            /* a key has been seen */
};

/* The start of a line over the limit, [p, p + n) with no newline within the limit: does it
 * begin (after at most 100 spaces, memcached's allowance) with get/gets/gat/gats, a space and,
 * for gat/gats, an exptime and a space? Returns the bytes to consume (> 0) and fills *g, or 0
 * when it does not (the caller refuses the line as too long). A gat whose exptime is not a
 * number still starts one, with *err set to the reply (without \r\n) and g->skip set. */
size_t lget_start(struct lget *g, const char *p, size_t n, const char **err);

enum lget_step {
    LGET_WAIT,  /* nothing to do until more bytes arrive */
    LGET_PART,  /* answer the keys in [*keys, *keys_end) (maybe none); consume *used bytes */
    LGET_LAST,  /* the same, and the line ended: then answer lget_end_reply() and clear *g */
    LGET_BAD,   /* a bad key: answer *err (no \r\n); g->skip is set, nothing is consumed */
};

/* The next part of a long get from the buffered input [p, p + n), looking at most `max` bytes
 * ahead (the router bounds a part; >= PROTO_KEY_MAX + 2). Every key of a part is valid
 * (proto_keys_valid). A part ends at the last space seen or at the line's end (a \r before
 * the \n is dropped). While g->skip is set, parts have no keys and only drop input. */
enum lget_step lget_next(struct lget *g, const char *p, size_t n, size_t max, const char **keys,
                         const char **keys_end, size_t *used, const char **err);

/* The reply that ends a long get whose line has ended (with \r\n): "END", or "ERROR" for a
 * get/gets that had no key at all (memcached's answer to a bare get), or NULL when an error
 * already stood in for it (g->skip). */
const char *lget_end_reply(const struct lget *g);

#endif
