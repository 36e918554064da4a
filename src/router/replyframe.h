/* replyframe.h — framing of node replies: memcached answers in order on a connection, so the
 * router only needs to know where each reply ends to match it with its request. Pure
 * functions: unit-tested, and fuzzed with any bytes (tests/fuzz/fuzz_reply.c). Each reply is
 * also checked against its request (reply_fits), so a misbehaving node cannot shift replies
 * onto the wrong requests. */
#ifndef SHOAL_ROUTER_REPLYFRAME_H
#define SHOAL_ROUTER_REPLYFRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

/* The longest reply line taken, and the most a VALUE block's header line can take (the key,
 * flags, length and CAS of a memcached VALUE line with room to spare). */
#define REPLY_LINE_MAX (64 * 1024)
#define REPLY_VALUE_HEADER_MAX 320

/* Length of one whole reply at p (n bytes available): a line, or "VALUE ..." / "VA ..." blocks
 * ending in a non-VALUE line. Returns 0 when more bytes are needed, -1 when the bytes cannot
 * be a reply: a value block not followed by \r\n, a bad length, a value over `max_value`
 * bytes, a reply over `max_reply` bytes, or a line over REPLY_LINE_MAX. The two bounds are
 * checked from the headers, before the bytes arrive, so a node cannot make the router buffer
 * more than they allow (reply_max_bytes gives max_reply for a request). `scan` keeps progress
 * between calls (set 0 for a new reply). */
long reply_length(const char *p, size_t n, uint64_t max_value, uint64_t max_reply, size_t *scan);

/* What a request line lets its reply be, taken from the line once when it is sent (reply_want_of)
 * so that the reply is checked without parsing the line again (reply_fits_want). Offsets are
 * into the line. */
/* Replies that are a list of lines ended by END: stats and its subcommands (STAT lines),
 * `stats cachedump` (ITEM lines), `lru_crawler metadump` (key= lines, ended by a bare \n as
 * memcached sends them), `stats detail dump` (PREFIX lines). The router takes them line by
 * line (reply_list_line), so a dump of any size never has to be held whole. */
/* RLIST_QUIET: a batch of quiet meta deletes closed by `mn` that the router sends of its own
 * accord (the recent-deletes replay, dellog.h): NF and error lines, ended by MN (set on the
 * fragment, not taken from its line). */
enum reply_list { RLIST_NONE, RLIST_STAT, RLIST_ITEM, RLIST_KEY, RLIST_PREFIX, RLIST_QUIET };

/* What reply_list_line found at the start of a list reply's remaining bytes. */
enum reply_lline {
    RLL_MORE, /* no whole line yet */
    RLL_ITEM, /* a line of the list: more follow */
    RLL_END,  /* END: the reply is complete */
    RLL_ONE,  /* as the reply's first line, a line that is the whole reply (an error line, or
               * memcached's BUSY / BADCLASS to a metadump) */
    RLL_BAD,  /* cannot be part of the reply: a line of another kind, a line over
               * REPLY_LINE_MAX, a missing \r */
};

struct reply_want {
    enum proto_cmd cmd;      /* the line's command; CMD_NONE when it has none or its key or
                              * O token is too long, which only an error line answers */
    uint32_t slots;          /* VALUE blocks it may be answered with (reply_value_slots) */
    uint32_t key, key_end;   /* get/gets/gat/gats: the keys; mg/ms/md/ma: the key as sent */
    uint32_t opaque;         /* mg/ms/md/ma with an O flag: its token, nopaque bytes */
    uint8_t nopaque;
    bool has_opaque;         /* the reply must echo the O token */
    bool echo_key;           /* k: the reply must echo the key */
    bool base64;             /* b: the key as sent (and as echoed) is base64 */
    uint8_t list;            /* enum reply_list: the reply is a list of lines ending in END */
};

/* Fill *w from the request at `req` (its line first, n bytes; read up to its first \n). The
 * line is taken to be one proto_parse accepts, as every line the router sends is: only the
 * command, where the keys, the O token and the k and b flags stand are looked for (a line that
 * may not parse goes through reply_fits). Tokens are split on runs of ' ' as proto_parse does. */
void reply_want_of(struct reply_want *w, const char *req, size_t n);

/* The next line of a list reply (w->list is not RLIST_NONE) at p, n bytes available; `first`
 * when it is the reply's first line. *len gets the line's length with its line end (RLL_ITEM,
 * RLL_END, RLL_ONE). */
enum reply_lline reply_list_line(const struct reply_want *w, const char *p, size_t n, bool first,
                                 size_t *len);

/* How many VALUE blocks the request at `req` (its line first, n bytes) may be answered with:
 * one per key of get/gets (after the command) and gat/gats (after the exptime), else 1. */
uint32_t reply_value_slots(const char *req, size_t n);

/* The longest reply to a request that may carry `slots` values of at most `max_value` bytes. */
static inline uint64_t reply_max_bytes(uint32_t slots, uint64_t max_value)
{
    return (uint64_t)slots * (max_value + 2 + REPLY_VALUE_HEADER_MAX) + REPLY_LINE_MAX;
}

/* The decimal token number `which` (0-based, split on ' ') of the reply line [p, end): 0 to
 * 9,999,999,999, or -1 when absent or not a number. */
long reply_token_num(const char *p, const char *end, int which);

/* Does the whole reply at `reply` (n bytes, as reply_length framed it) answer the request whose
 * line as sent is at `req` (nreq bytes; read up to its first \n, a storage command's data may
 * follow)? Matching replies by framing alone would let a node's wrong or stray reply shift every
 * later reply on the connection onto the wrong request, so each one must be of its request's
 * kind. An error line (ERROR, CLIENT_ERROR, SERVER_ERROR) answers any request, and is the only
 * answer to a line that does not parse or whose command the router never forwards. Otherwise:
 * - get/gets/gat/gats: VALUE blocks (with a CAS for gets/gats) whose keys are the request's in
 *   order, misses skipped, a key asked twice answered twice; then END (or an error line);
 * - set/add/replace/append/prepend/cas: STORED, NOT_STORED, EXISTS or NOT_FOUND; delete:
 *   DELETED or NOT_FOUND; incr/decr: a number or NOT_FOUND; touch: TOUCHED or NOT_FOUND;
 *   version: VERSION ...; flush_all, verbosity: OK;
 * - mg: VA (with its value), HD or EN; ms: HD, NS, EX or NF; md: HD, NF or EX; ma: VA, HD, NF,
 *   NS or EX; mn: MN; me: ME or EN; where the request carries k or O, the reply carries the
 *   same key (base64 under b, compared decoded) and the same opaque as its first k and O;
 * - stats (bare, items, slabs, sizes, settings, conns, extstore): STAT lines then END;
 *   stats cachedump: ITEM lines then END; stats detail dump: PREFIX lines then END; lru_crawler
 *   metadump: key= lines (ended by \n or \r\n) then END, or BUSY ... / BADCLASS ... alone;
 *   stats detail on|off: OK.
 * Every line must end in \r\n. */
bool reply_fits(const char *req, size_t nreq, const char *reply, size_t n);

/* reply_fits for a request whose line `req` gave *w (reply_want_of): the same check without
 * parsing the line, for the router's own lines, which always parse. */
bool reply_fits_want(const struct reply_want *w, const char *req, const char *reply, size_t n);

/* How a reply fits its request (reply_check_want). A reply of the request's kind that echoes
 * something else (another key or opaque under k or O, a get's VALUE blocks for keys it did not
 * ask in that order) is told apart from one of another kind: the first may be the node's answer
 * to a request whose echo the router did not foresee (the request's fault), or a reply shifted
 * onto the wrong request (the node's); upstream.c finds out which (docs/router.md, "Whose fault
 * a reply is"). A reply of another kind is always the node's fault: the router parses each line
 * as the node does, so no request it sends can be answered so. */
enum reply_fit {
    RFIT_OK,   /* it answers the request */
    RFIT_ECHO, /* of the request's kind, but for other keys or another opaque */
    RFIT_BAD,  /* of another kind, or malformed: no answer to this request */
};
enum reply_fit reply_check_want(const struct reply_want *w, const char *req, const char *reply,
                                size_t n);

#endif
