/* protocol.h — memcache text and meta protocol: request-line parser and reply composer.
 *
 * Shared by every binary that speaks memcache (node, router, bench). The parser is pure: it
 * takes one request line (without its \r\n) and fills a struct proto_req whose pointers point
 * into that line, so the line must outlive the request. It never allocates. Semantics (what a
 * command does) live in the binaries; this file only decides what was asked and whether the
 * line is well formed, with memcached 1.6's error strings. */
#ifndef SHOAL_PROTOCOL_PROTOCOL_H
#define SHOAL_PROTOCOL_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Text keys are 1..250 bytes of anything but a space, as in memcached: control bytes, DEL and
 * high bytes are key bytes (a NUL ends the request line, as memcached reads it as a C string).
 * Tokens are split on ' ' only, as memcached does: a tab is part of a token. */
#define PROTO_KEY_MAX 250
#define PROTO_META_FLAGS_MAX 32 /* flags kept per meta request; more is a parse error */
#define PROTO_OPAQUE_MAX 32

enum proto_cmd {
    CMD_NONE = 0,
    /* retrieval: keys in req->keys (iterate with proto_next_key) */
    CMD_GET, CMD_GETS, CMD_GAT, CMD_GATS,
    /* storage: a data block of req->nbytes follows the line */
    CMD_SET, CMD_ADD, CMD_REPLACE, CMD_APPEND, CMD_PREPEND, CMD_CAS,
    CMD_DELETE, CMD_INCR, CMD_DECR, CMD_TOUCH,
    CMD_FLUSH_ALL,
    CMD_FLUSH_NS, /* shoal's: flush one namespace; its name in req->arg/narg */
    CMD_VERSION, CMD_VERBOSITY, CMD_QUIT, CMD_STATS,
    CMD_SHUTDOWN, CMD_CACHE_MEMLIMIT,
    /* memcached's tuning commands: req->arg holds the rest; see proto_tune_reply */
    CMD_SLABS, CMD_LRU, CMD_LRU_CRAWLER, CMD_WATCH,
    /* meta */
    CMD_MG, CMD_MS, CMD_MD, CMD_MA, CMD_MN, CMD_ME,
};

/* Meta-flag parse result: one entry per flag, in request order (replies echo this order).
 * tok/ntok are the bytes after the letter, kept even for flags that take no token (memcached
 * ignores them there); a token over 255 bytes is refused as a bad token. */
struct proto_mflag {
    char flag;          /* the flag letter, e.g. 'v', 'N', 'O' */
    uint8_t ntok;       /* token length (0 when the flag has none) */
    const char *tok;    /* token bytes, into the line */
};

/* Meta-flag meanings gathered while parsing, so handlers need not rescan the list. Numeric
 * tokens are validated here: a flag that needs a number and has a bad one is a parse error
 * ("CLIENT_ERROR bad token in command line format"). */
struct proto_meta {
    uint32_t has; /* bit per letter: 1u << (c - 'A') for 'A'..'Z' in has_upper, 'a'..'z' here */
    uint32_t has_upper;
    bool base64;      /* b: key was base64; req->key holds the DECODED key (in req->keybuf) */
    bool quiet;       /* q */
    bool invalidate;  /* I */
    char mode;        /* M token, normalised: ms E/A/P/R/S, ma I/D ('+', '-' and lower case are
                         folded); mg keeps the byte as sent; 0 when absent */
    int64_t ttl;      /* T token */
    int64_t vivify;   /* N token (ttl) */
    int64_t recache;  /* R token (ttl threshold) */
    int64_t holdoff;  /* H token (md: delete hold-off, seconds; ours) */
    uint32_t flags;   /* F token (client flags) */
    uint64_t cas_in;  /* C token (compare) */
    uint64_t cas_new; /* E token (explicit new cas) */
    uint64_t delta;   /* D token, default 1 */
    uint64_t initial; /* J token, default 0 */
    const char *opaque; uint8_t nopaque; /* O token; like memcached, 'O' plus the token is at
                                            most PROTO_OPAQUE_MAX bytes, so nopaque <= 31 */
    uint8_t nflags;
    struct proto_mflag flag[PROTO_META_FLAGS_MAX];
};

static inline bool proto_meta_has(const struct proto_meta *m, char c)
{
    if (c >= 'a' && c <= 'z') return m->has & (1u << (c - 'a'));
    if (c >= 'A' && c <= 'Z') return m->has_upper & (1u << (c - 'A'));
    return false;
}

struct proto_req {
    enum proto_cmd cmd;
    const char *key;      /* the (first) key; for b-flag meta requests points at keybuf */
    uint8_t nkey;
    bool noreply;         /* text commands' trailing "noreply". Set whenever the last token is
                             "noreply", even when parsing then fails ("set k 0 0 noreply"):
                             memcached sends no error reply then either (the data-swallow rules
                             still apply). A wrong token count (plain ERROR) never sets it */
    uint32_t flags;       /* storage commands' client flags */
    int64_t exptime;      /* storage, touch, gat: as sent (convert with clock_exptime); also
                             flush_all's delay as sent (may be negative) and delete's legacy
                             time argument (has_arg set; the node decides what it means) */
    int64_t nbytes;       /* storage and ms: data block length, without \r\n */
    uint64_t cas;         /* cas command's compare value */
    uint64_t delta;       /* incr/decr; verbosity level; flush_all delay (0 if negative);
                             cache_memlimit MB */
    bool has_arg;         /* flush_all/verbosity/shutdown/cache_memlimit/delete had an argument */
    const char *keys;     /* retrieval commands: the rest of the line, keys separated by spaces */
    const char *keys_end;
    const char *arg;      /* stats: argument text (may be NULL); flush_ns: the namespace
                             token (1..250 bytes, unchecked: the node judges it); shutdown: its argument text,
                             unchecked: memcached refuses a disabled shutdown before it looks at
                             the mode, so the node checks "graceful" (else "CLIENT_ERROR invalid
                             shutdown mode"). Both trimmed of surrounding spaces */
    size_t narg;
    struct proto_meta meta;
    char keybuf[PROTO_KEY_MAX + 1]; /* decoded base64 key */
};

/* Outcome of parsing one line. */
enum proto_status {
    PROTO_OK = 0,
    PROTO_ERR_UNKNOWN,     /* "ERROR" */
    PROTO_ERR_CLIENT,      /* "CLIENT_ERROR <msg>"; for storage commands the data is NOT read */
    PROTO_ERR_TOO_LARGE,   /* storage: "SERVER_ERROR object too large for cache", then the
                              caller swallows req->nbytes + 2 bytes. req->key is set (memcached
                              drops the old item) */
    PROTO_ERR_CLIENT_SWALLOW, /* "CLIENT_ERROR <msg>" for a storage line (text or ms) refused
                              after its length read: the caller swallows req->nbytes + 2 bytes so
                              the data block can never run as commands. req->key is not set */
    PROTO_ERR_CLOSE,       /* an HTTP request line: close the connection without a reply, as
                              memcached does (*errmsg is "") */
};

/* Parse one request line of `len` bytes (no \r\n; a trailing \r is tolerated and ignored).
 * `item_max` bounds storage lengths (a larger nbytes yields PROTO_ERR_TOO_LARGE with
 * req->nbytes set so the data can be swallowed). On an error *errmsg is the full reply line
 * without \r\n, e.g. "CLIENT_ERROR bad command line format". */
enum proto_status proto_parse(const char *line, size_t len, size_t item_max, struct proto_req *req,
                              const char **errmsg);

/* The command a request line's first token (n bytes) names, CMD_NONE for none: how
 * proto_parse tells commands apart, for a caller that needs only that. */
enum proto_cmd proto_command(const char *name, size_t n);

/* Does the command change its item (a router sends it to every replica of a replicated pool,
 * and never to a gutter node in place of a dead one)? */
static inline bool proto_cmd_writes(enum proto_cmd cmd)
{
    switch (cmd) {
    case CMD_SET: case CMD_ADD: case CMD_REPLACE: case CMD_APPEND: case CMD_PREPEND:
    case CMD_CAS: case CMD_DELETE: case CMD_INCR: case CMD_DECR: case CMD_TOUCH:
    case CMD_MS: case CMD_MD: case CMD_MA:
        return true;
    default:
        return false;
    }
}

/* Iterate the keys of a retrieval command: returns false when none are left. A key over 250
 * bytes makes the whole command fail with "CLIENT_ERROR bad command line format"; check with
 * proto_keys_valid() first. proto_parse() already does that check for get/gets/gat/gats (and
 * sets req->key to the first key), so after PROTO_OK every key is valid; gat/gats may have no
 * keys at all (memcached answers END). A key over PROTO_KEY_MAX ends the iteration. */
bool proto_next_key(const char **cursor, const char *end, const char **key, uint8_t *nkey);
bool proto_keys_valid(const char *keys, const char *end);

/* Base64 (RFC 4648) for b-flag keys. Return the output length, or -1 on bad input or when the
 * output would not fit `outcap`. */
int proto_base64_decode(const char *in, size_t n, char *out, size_t outcap);
int proto_base64_encode(const char *in, size_t n, char *out, size_t outcap);

/* A token of a request line: n bytes at p, into the line. */
struct proto_tok {
    const char *p;
    size_t n;
};
/* Split [p, end) on runs of ' ' into at most `max` tokens. Returns how many were found, or
 * max + 1 when more follow (callers treat that as "too many arguments"). A NULL p is none. */
size_t proto_split(const char *p, const char *end, struct proto_tok *t, size_t max);

/* Parse a whole decimal unsigned 64-bit number (no sign, no junk, no overflow). */
bool proto_parse_u64(const char *s, size_t n, uint64_t *out);
/* Signed 64-bit decimal (leading '-' allowed). */
bool proto_parse_i64(const char *s, size_t n, int64_t *out);

/* Numbers as memcached reads them (its safe_strto* helpers over strtoul/strtol/strtoull): leading
 * white space and a sign are taken, the digits may be followed by white space and then anything,
 * and a value that does not fit 64 bits fails. The 32-bit forms keep the low 32 bits, as
 * memcached stores the result in a 32-bit variable: flags 4294967296 are 0, a length of
 * 4294967297 is 1. An unsigned number that comes out negative as signed 64-bit fails when the
 * token holds a '-' ("-1" fails, "-18446744073709551615" is 1). */
bool proto_mc_u32(const char *s, size_t n, uint32_t *out);
bool proto_mc_i32(const char *s, size_t n, int32_t *out);
bool proto_mc_u64(const char *s, size_t n, uint64_t *out);

/* The reply line (without \r\n) to a tuning command (CMD_SLABS, CMD_LRU, CMD_LRU_CRAWLER,
 * CMD_WATCH), as memcached 1.6.18 answers it; *silent when a trailing noreply silences it.
 * shoal has none of the internals they tune: well-formed ones are accepted and ignored. */
const char *proto_tune_reply(const struct proto_req *req, bool *silent);

#endif
