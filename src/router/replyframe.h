/* replyframe.h — framing of node replies: memcached answers in order on a connection, so the
 * router only needs to know where each reply ends to match it with its request. Pure
 * functions: unit-tested, and fuzzed with any bytes (tests/fuzz/fuzz_reply.c). */
#ifndef SHOAL_ROUTER_REPLYFRAME_H
#define SHOAL_ROUTER_REPLYFRAME_H

#include <stddef.h>
#include <stdint.h>

/* Length of one whole reply at p (n bytes available): a line, or "VALUE ..." / "VA ..." blocks
 * ending in a non-VALUE line. Returns 0 when more bytes are needed, -1 when the bytes cannot
 * be a reply: a value block not followed by \r\n, a bad length, a value over `max_value`
 * bytes (so a node cannot make the router buffer without bound), or a line over 64 KiB.
 * `scan` keeps progress between calls (set 0 for a new reply). */
long reply_length(const char *p, size_t n, uint64_t max_value, size_t *scan);

/* The decimal token number `which` (0-based, split on ' ') of the reply line [p, end): 0 to
 * 9,999,999,999, or -1 when absent or not a number. */
long reply_token_num(const char *p, const char *end, int which);

#endif
