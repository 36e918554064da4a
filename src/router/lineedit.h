/* lineedit.h — the edits a request line gets on its way to a node: the TTLs a namespace's rules
 * change (every token of every command that carries a TTL), meta flags (q, a replicated
 * compare's C) and text noreply removed, and insertions (a delete's hold-off, a flag the router needs back). Pure functions
 * of the parsed request and its line, so they are unit-tested alone.
 *
 * TTL carriers, after memcached 1.6's protocol.txt: the exptime argument of set, add, replace,
 * cas, touch, gat and gats; the T (new TTL) and N (vivify TTL) flags of mg; T (inserted when
 * absent, since ms without T means "never") and N (append-mode autovivify) of ms; N
 * (auto-create TTL) and T (update TTL) of ma; T of md when paired with I (the stale item's
 * TTL). Not TTLs: mg R (a threshold compared with the TTL left), md H and delete's time
 * (hold-off lengths), flush_all's delay; append/prepend keep the item's TTL. */
#ifndef SHOAL_ROUTER_LINEEDIT_H
#define SHOAL_ROUTER_LINEEDIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "protocol/protocol.h"
#include "router/topo.h"

/* Replace the bytes [from, to) of a request line by `text` (from == to inserts). */
struct ledit_cut {
    const char *from, *to;
    const char *text;
    size_t ntext;
};

#define LEDIT_TTL_MAX 2 /* TTL tokens one request carries at most (mg/ma T and N, ms T and N) */

/* The TTL edits of one request; cut[i].text points into num[i], so use it where it lies. */
struct ledit_ttl {
    int n;
    struct ledit_cut cut[LEDIT_TTL_MAX];
    char num[LEDIT_TTL_MAX][24];
};

/* Fill `e` with the edits that make every TTL `req` carries obey namespace `ns` (policy_ttl:
 * 0 becomes default_ttl, then 0 and anything with more than max_ttl left become max_ttl;
 * negative TTLs and absolute times past or within the rules stand) with `cap`, when not 0, as
 * a further maximum (gutter_ttl).
 * Returns e->n, the number of edits (0: the line stands). */
int ledit_ttl(const struct proto_req *req, const char *line, size_t len, const struct topo_ns *ns,
              uint64_t cap, int64_t now, struct ledit_ttl *e);

/* Append the request line to `out` without its trailing "noreply" (strip_noreply: text) and
 * without the meta flags whose letters are in `drop` (NULL: none; "q" for a quiet request's
 * q), with the `ncuts` cuts applied (any order; they must not
 * overlap, and cuts at one position keep their order), then \r\n. 0, or -1 when memory ran
 * out. */
int ledit_copy(struct buf *out, const char *line, size_t len, const struct proto_req *req,
               bool strip_noreply, const char *drop, const struct ledit_cut *cuts, int ncuts);

/* Token number `idx` (0-based; split on spaces) of the line. */
bool ledit_token(const char *line, size_t len, int idx, const char **tok, size_t *ntok);

/* An insertion at the end of the line (after its last token). */
struct ledit_cut ledit_append(const char *line, size_t len, const char *text, size_t ntext);

#endif
