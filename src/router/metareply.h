/* metareply.h — reading and writing meta reply lines for warm-up (warm.c): the warm pool's
 * answer to a lookup, the answer a client's mg gets from a warm hit (composed exactly as
 * shoal-node would have answered had the cold pool held the item), and a flag the router asked
 * for itself taken back out of a node's reply. Pure functions, unit-tested alone. */
#ifndef SHOAL_ROUTER_METAREPLY_H
#define SHOAL_ROUTER_METAREPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "protocol/protocol.h"

/* A warm-pool item as a lookup (`mg KEY v f t c ...`) returned it. Tokens point into the reply. */
struct mreply_item {
    const char *data;   /* the value, vlen bytes (its \r\n follows) */
    size_t vlen;
    const char *flags;  /* client flags, decimal */
    size_t nflags;
    int64_t ttl;        /* seconds left; -1: never expires */
    const char *cas;    /* decimal */
    size_t ncas;
    const char *key;    /* k, when asked (NULL otherwise) */
    size_t nkey;
    const char *h, *l;  /* h and l tokens, when asked (NULL otherwise) */
    size_t nh, nl;
};

/* The token of flag `letter` in the meta reply line [p, end) (flags after the code and, for VA,
 * the length), or NULL. A flag without a token gives a token of length 0. */
const char *mreply_flag(const char *p, const char *end, char letter, size_t *n);

/* Parse a warm lookup's reply: a whole "VA <len> ... f.. t.. c..\r\n<data>\r\n". False for a
 * miss, an error, a malformed reply, or a value flagged X, W or Z: an invalidated value, or a
 * placeholder someone is filling, is not copied into the cold pool as a fresh one. */
bool mreply_hit(const char *reply, size_t n, struct mreply_item *it);

/* Append the answer to the client's mg `req` for the hit `it`, in its flags, as shoal-node
 * would give it: "VA <len>" with v (the value follows) else "HD", then in request order s, t,
 * c, f, l, h, O and k (base64 plus " b" for a b key); T moves the TTL that a later t reports to
 * `touched` (seconds left, -1 never). No W, X or Z: the value is a fresh one. 0, or -1 when
 * memory ran out. */
int mreply_compose_mg(struct buf *out, const struct proto_req *req, const struct mreply_item *it,
                      int64_t touched);

/* Append the reply (n bytes) without the token of flag `letter` in its first line (a flag the
 * router added to the request for itself; at most one such token). 0, or -1. */
int mreply_drop_flag(struct buf *out, const char *reply, size_t n, char letter);

#endif
