/* parse_internal.h — helpers shared by parse.c (text commands) and meta.c (meta commands).
 * Not part of the protocol API: only files in src/protocol include it. */
#ifndef SHOAL_PROTOCOL_PARSE_INTERNAL_H
#define SHOAL_PROTOCOL_PARSE_INTERNAL_H

#include <string.h>

#include "protocol/protocol.h"

#define PROTO_E_UNKNOWN "ERROR"
#define PROTO_E_BADFMT "CLIENT_ERROR bad command line format"
#define PROTO_E_TOO_LARGE "SERVER_ERROR object too large for cache"

/* Largest data length memcached takes: it adds 2 for the \r\n and keeps the sum in an int. */
#define PROTO_NBYTES_MAX (INT32_MAX - 2)

static inline const char *proto_skip_spaces(const char *p, const char *end)
{
    while (p < end && *p == ' ') p++;
    return p;
}

/* End of the token starting at p: the next ' ' or `end`. */
static inline const char *proto_tok_end(const char *p, const char *end)
{
    if (p >= end) return end;
    const char *sp = memchr(p, ' ', (size_t)(end - p));
    return sp ? sp : end;
}

/* memcached splits on ' ' only and takes every other byte in a key (a NUL ends the line before
 * the parser sees it, see proto_parse). */
static inline bool proto_key_byte_ok(unsigned char c) { return c != ' '; }

/* A whole text key: 1..PROTO_KEY_MAX bytes that pass proto_key_byte_ok. */
bool proto_key_ok(const char *k, size_t n);

/* Parse a meta command (req->cmd is one of CMD_MG..CMD_ME) whose arguments are [p, end). */
enum proto_status proto_parse_meta(struct proto_req *req, const char *p, const char *end,
                                   size_t item_max, const char **errmsg);

#endif
