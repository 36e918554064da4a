/* parse.c — memcache request-line parser: command dispatch, the text commands, keys, numbers.
 *
 * Runs once per request, so it makes one left-to-right pass over the line, never allocates and
 * never copies: every pointer it hands back points into the caller's line (or req->keybuf).
 * Acceptance and error strings follow memcached 1.6.18 as observed on the wire; the places we
 * deliberately differ are noted where they happen. Meta commands are in meta.c. */
#include <stddef.h>
#include <string.h>

#include "protocol/parse_internal.h"
#include "protocol/protocol.h"

/* proto_parse() clears everything in front of meta.flag[] in one memset and leaves the flag
 * array and keybuf alone (they are written before being read), so new fields must go in front. */
_Static_assert(offsetof(struct proto_meta, flag) + sizeof(((struct proto_meta *)0)->flag) ==
                   sizeof(struct proto_meta),
               "flag[] must stay the last member of struct proto_meta");
_Static_assert(offsetof(struct proto_req, keybuf) ==
                   offsetof(struct proto_req, meta) + sizeof(struct proto_meta),
               "keybuf must directly follow meta in struct proto_req");

static const char e_delta[] = "CLIENT_ERROR invalid numeric delta argument";
static const char e_exptime[] = "CLIENT_ERROR invalid exptime argument";
static const char e_delete[] = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";

size_t proto_split(const char *p, const char *end, struct proto_tok *t, size_t max)
{
    size_t n = 0;
    for (;;) {
        p = proto_skip_spaces(p, end);
        if (p == end) return n;
        if (n == max) return max + 1;
        const char *e = proto_tok_end(p, end);
        t[n].p = p;
        t[n].n = (size_t)(e - p);
        n++;
        p = e;
    }
}

static inline bool is_noreply(const struct proto_tok *t)
{
    return t->n == 7 && memcmp(t->p, "noreply", 7) == 0;
}

static enum proto_status fail(enum proto_status st, const char **errmsg, const char *msg)
{
    *errmsg = msg;
    return st;
}

static enum proto_status unknown(const char **errmsg)
{
    return fail(PROTO_ERR_UNKNOWN, errmsg, PROTO_E_UNKNOWN);
}

static enum proto_status client(const char **errmsg, const char *msg)
{
    return fail(PROTO_ERR_CLIENT, errmsg, msg);
}

bool proto_parse_u64(const char *s, size_t n, uint64_t *out)
{
    if (n == 0) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9) return false;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, d, &v)) return false;
    }
    *out = v;
    return true;
}

bool proto_parse_i64(const char *s, size_t n, int64_t *out)
{
    bool neg = n > 0 && s[0] == '-';
    uint64_t u;
    if (!proto_parse_u64(s + neg, n - neg, &u)) return false;
    if (neg) {
        if (u > (uint64_t)INT64_MAX + 1) return false;
        *out = u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u;
    } else {
        if (u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)u;
    }
    return true;
}

static inline bool mc_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* The strto* scan memcached relies on, over [s, s + n): optional white space and sign, at least
 * one digit, then the end or a white-space byte (anything may follow it). Fails on overflow of
 * the 64-bit magnitude, as strtoul/strtol set ERANGE there. */
static bool mc_scan(const char *s, size_t n, bool *neg, uint64_t *mag)
{
    size_t i = 0;
    while (i < n && mc_space((unsigned char)s[i])) i++;
    *neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) *neg = s[i++] == '-';
    size_t first = i;
    uint64_t v = 0;
    bool over = false;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        over |= __builtin_mul_overflow(v, 10, &v) ||
                __builtin_add_overflow(v, (uint64_t)(s[i] - '0'), &v);
    if (i == first || over || (i < n && !mc_space((unsigned char)s[i]))) return false;
    *mag = v;
    return true;
}

bool proto_mc_u64(const char *s, size_t n, uint64_t *out)
{
    bool neg;
    uint64_t v;
    if (!mc_scan(s, n, &neg, &v)) return false;
    if (neg) v = 0 - v; /* strtoul negates in unsigned arithmetic */
    if (neg && (int64_t)v < 0) return false;
    *out = v;
    return true;
}

bool proto_mc_u32(const char *s, size_t n, uint32_t *out)
{
    uint64_t v;
    if (!proto_mc_u64(s, n, &v)) return false;
    *out = (uint32_t)v;
    return true;
}

bool proto_mc_i32(const char *s, size_t n, int32_t *out)
{
    bool neg;
    uint64_t v;
    if (!mc_scan(s, n, &neg, &v) || v > (uint64_t)INT64_MAX + neg) return false;
    *out = (int32_t)(uint32_t)(neg ? 0 - v : v);
    return true;
}

bool proto_key_ok(const char *k, size_t n)
{
    if (n == 0 || n > PROTO_KEY_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!proto_key_byte_ok((unsigned char)k[i])) return false;
    return true;
}

bool proto_next_key(const char **cursor, const char *end, const char **key, uint8_t *nkey)
{
    const char *p = proto_skip_spaces(*cursor, end);
    const char *e = proto_tok_end(p, end);
    if (p >= end || e - p > PROTO_KEY_MAX) {
        *cursor = end;
        return false;
    }
    *key = p;
    *nkey = (uint8_t)(e - p);
    *cursor = e;
    return true;
}

bool proto_keys_valid(const char *keys, const char *end)
{
    for (const char *p = proto_skip_spaces(keys, end); p < end;) {
        const char *e = proto_tok_end(p, end);
        if (!proto_key_ok(p, (size_t)(e - p))) return false;
        p = proto_skip_spaces(e, end);
    }
    return true;
}

/* Command names, dispatched on length and then first byte so that a request costs at most one
 * short memcmp. */
enum proto_cmd proto_command(const char *s, size_t n)
{
#define IS(lit) (memcmp(s, lit, sizeof(lit) - 1) == 0)
    switch (n) {
    case 2:
        if (s[0] != 'm') return CMD_NONE;
        switch (s[1]) {
        case 'g': return CMD_MG;
        case 's': return CMD_MS;
        case 'd': return CMD_MD;
        case 'a': return CMD_MA;
        case 'n': return CMD_MN;
        case 'e': return CMD_ME;
        }
        return CMD_NONE;
    case 3:
        switch (s[0]) {
        case 'g': return IS("get") ? CMD_GET : IS("gat") ? CMD_GAT : CMD_NONE;
        case 's': return IS("set") ? CMD_SET : CMD_NONE;
        case 'a': return IS("add") ? CMD_ADD : CMD_NONE;
        case 'c': return IS("cas") ? CMD_CAS : CMD_NONE;
        case 'l': return IS("lru") ? CMD_LRU : CMD_NONE;
        }
        return CMD_NONE;
    case 4:
        switch (s[0]) {
        case 'g': return IS("gets") ? CMD_GETS : IS("gats") ? CMD_GATS : CMD_NONE;
        case 'i': return IS("incr") ? CMD_INCR : CMD_NONE;
        case 'd': return IS("decr") ? CMD_DECR : CMD_NONE;
        case 'q': return IS("quit") ? CMD_QUIT : CMD_NONE;
        }
        return CMD_NONE;
    case 5:
        switch (s[0]) {
        case 't': return IS("touch") ? CMD_TOUCH : CMD_NONE;
        case 's': return IS("stats") ? CMD_STATS : IS("slabs") ? CMD_SLABS : CMD_NONE;
        case 'w': return IS("watch") ? CMD_WATCH : CMD_NONE;
        }
        return CMD_NONE;
    case 6:
        switch (s[0]) {
        case 'a': return IS("append") ? CMD_APPEND : CMD_NONE;
        case 'd': return IS("delete") ? CMD_DELETE : CMD_NONE;
        }
        return CMD_NONE;
    case 7:
        switch (s[0]) {
        case 'r': return IS("replace") ? CMD_REPLACE : CMD_NONE;
        case 'p': return IS("prepend") ? CMD_PREPEND : CMD_NONE;
        case 'v': return IS("version") ? CMD_VERSION : CMD_NONE;
        }
        return CMD_NONE;
    case 8:
        switch (s[0]) {
        case 's': return IS("shutdown") ? CMD_SHUTDOWN : CMD_NONE;
        case 'f': return IS("flush_ns") ? CMD_FLUSH_NS : CMD_NONE;
        }
        return CMD_NONE;
    case 9:
        switch (s[0]) {
        case 'f': return IS("flush_all") ? CMD_FLUSH_ALL : CMD_NONE;
        case 'v': return IS("verbosity") ? CMD_VERBOSITY : CMD_NONE;
        }
        return CMD_NONE;
    case 11: return IS("lru_crawler") ? CMD_LRU_CRAWLER : CMD_NONE;
    case 14: return IS("cache_memlimit") ? CMD_CACHE_MEMLIMIT : CMD_NONE;
    }
    return CMD_NONE;
#undef IS
}

/* <cmd> <key> <flags> <exptime> <bytes> [noreply], cas with <cas> before [noreply]. memcached
 * ignores a last token that is not "noreply" and answers ERROR to any more or fewer tokens (and
 * then, as memcached does, the data block is read as commands: without the token count we
 * cannot know where the length is). Numbers are read as memcached reads them (proto_mc_*):
 * flags keep their low 32 bits, "+5" and "5\t" are 5.
 *
 * Once <bytes> reads as a length, every other mistake (overlong key, bad flags, exptime or
 * cas) is PROTO_ERR_CLIENT_SWALLOW: the caller drops the data block, so data can never run as a
 * command. memcached 1.6.18 runs it in every such case; current memcached swallows only after an
 * overlong key and ms errors; we swallow always (docs/protocol.md). A <bytes> that does not
 * read, is negative or too large for memcached's int leaves the data unread, as memcached does.
 *
 * Like memcached, once the token count fits, a last token "noreply" sets req->noreply wherever
 * it stands ("set k 0 0 noreply" fails silently); the same holds for the other commands that
 * take noreply. */
static enum proto_status parse_storage(struct proto_req *req, const char *p, const char *end,
                                       size_t item_max, const char **errmsg)
{
    struct proto_tok t[6];
    size_t want = req->cmd == CMD_CAS ? 5 : 4;
    size_t n = proto_split(p, end, t, want + 1);
    if (n < want || n > want + 1) return unknown(errmsg);
    req->noreply = is_noreply(&t[n - 1]);
    int32_t nbytes, exptime;
    if (!proto_mc_i32(t[3].p, t[3].n, &nbytes) || nbytes < 0 || nbytes > PROTO_NBYTES_MAX)
        return client(errmsg, PROTO_E_BADFMT);
    req->nbytes = nbytes;
    if (!proto_key_ok(t[0].p, t[0].n) || !proto_mc_u32(t[1].p, t[1].n, &req->flags) ||
        !proto_mc_i32(t[2].p, t[2].n, &exptime) ||
        (want == 5 && !proto_mc_u64(t[4].p, t[4].n, &req->cas)))
        return fail(PROTO_ERR_CLIENT_SWALLOW, errmsg, PROTO_E_BADFMT);
    req->exptime = exptime;
    req->key = t[0].p;
    req->nkey = (uint8_t)t[0].n;
    if ((uint64_t)nbytes + 2 > item_max) return fail(PROTO_ERR_TOO_LARGE, errmsg, PROTO_E_TOO_LARGE);
    return PROTO_OK;
}

/* get|gets <key>+ and gat|gats <exptime> <key>*. Every key is checked here, in the same pass
 * that finds the first one; memcached fails the whole command for one bad key. gat with no key
 * is valid (memcached answers END); get without one is ERROR. */
static enum proto_status parse_retrieval(struct proto_req *req, const char *p, const char *end,
                                         const char **errmsg)
{
    p = proto_skip_spaces(p, end);
    if (req->cmd == CMD_GAT || req->cmd == CMD_GATS) {
        if (p == end) return unknown(errmsg);
        const char *e = proto_tok_end(p, end);
        int32_t exptime;
        if (!proto_mc_i32(p, (size_t)(e - p), &exptime)) return client(errmsg, e_exptime);
        req->exptime = exptime;
        p = proto_skip_spaces(e, end);
    } else if (p == end) {
        return unknown(errmsg);
    }
    req->keys = p;
    req->keys_end = end;
    const char *q = p;
    while (q < end) {
        const char *k = q;
        while (q < end && *q != ' ') {
            if (!proto_key_byte_ok((unsigned char)*q)) return client(errmsg, PROTO_E_BADFMT);
            q++;
        }
        if (q - k > PROTO_KEY_MAX) return client(errmsg, PROTO_E_BADFMT);
        if (req->key == NULL) {
            req->key = k;
            req->nkey = (uint8_t)(q - k);
        }
        q = proto_skip_spaces(q, end);
    }
    return PROTO_OK;
}

/* delete <key> [<time>] [noreply]. memcached 1.6.18 takes only a literal 0 as <time> and
 * answers the usage error to anything else; we accept any integer into req->exptime with
 * has_arg set and let the node decide, so a later hold-off needs no parser change. */
static enum proto_status parse_delete(struct proto_req *req, const char *p, const char *end,
                                      const char **errmsg)
{
    struct proto_tok t[3];
    size_t n = proto_split(p, end, t, 3);
    if (n == 0 || n > 3) return unknown(errmsg);
    req->noreply = n > 1 && is_noreply(&t[n - 1]); /* "delete noreply" deletes "noreply" */
    size_t nargs = n - 1 - req->noreply;
    if (nargs > 1) return client(errmsg, e_delete); /* memcached checks these before the key */
    if (nargs == 1) {
        if (!proto_parse_i64(t[1].p, t[1].n, &req->exptime)) return client(errmsg, e_delete);
        req->has_arg = true;
    }
    if (!proto_key_ok(t[0].p, t[0].n)) return client(errmsg, PROTO_E_BADFMT);
    req->key = t[0].p;
    req->nkey = (uint8_t)t[0].n;
    return PROTO_OK;
}

/* incr|decr <key> <delta> [noreply] and touch <key> <exptime> [noreply]. */
static enum proto_status parse_key_num(struct proto_req *req, const char *p, const char *end,
                                       const char **errmsg)
{
    struct proto_tok t[3];
    size_t n = proto_split(p, end, t, 3);
    if (n < 2 || n > 3) return unknown(errmsg);
    req->noreply = is_noreply(&t[n - 1]);
    if (!proto_key_ok(t[0].p, t[0].n)) return client(errmsg, PROTO_E_BADFMT);
    if (req->cmd == CMD_TOUCH) {
        int32_t exptime;
        if (!proto_mc_i32(t[1].p, t[1].n, &exptime)) return client(errmsg, e_exptime);
        req->exptime = exptime;
    } else if (!proto_mc_u64(t[1].p, t[1].n, &req->delta)) {
        return client(errmsg, e_delta);
    }
    req->key = t[0].p;
    req->nkey = (uint8_t)t[0].n;
    return PROTO_OK;
}

/* flush_all [delay] [noreply]: like memcached, a second token that is not "noreply" is ignored
 * and "flush_all noreply 10" reads "noreply" as the delay (and fails). */
static enum proto_status parse_flush_all(struct proto_req *req, const char *p, const char *end,
                                         const char **errmsg)
{
    struct proto_tok t[2];
    size_t n = proto_split(p, end, t, 2);
    if (n > 2) return unknown(errmsg);
    if (n > 0 && is_noreply(&t[n - 1])) req->noreply = true;
    if (n > (size_t)req->noreply) {
        int32_t delay;
        if (!proto_mc_i32(t[0].p, t[0].n, &delay)) return client(errmsg, e_exptime);
        req->exptime = delay;
        req->delta = req->exptime > 0 ? (uint64_t)req->exptime : 0;
        req->has_arg = true;
    }
    return PROTO_OK;
}

/* flush_ns <namespace> [noreply] (shoal's, docs/protocol.md): exactly one name, read as a key
 * token; whether it names a namespace is the node's to say. A second token other than
 * "noreply" is a format error rather than ignored (flush_all's leniency): a typo must not turn
 * a quiet flush into a loud one or the reverse. */
static enum proto_status parse_flush_ns(struct proto_req *req, const char *p, const char *end,
                                        const char **errmsg)
{
    struct proto_tok t[2];
    size_t n = proto_split(p, end, t, 2);
    if (n == 0 || n > 2) return unknown(errmsg);
    if (n == 2) {
        if (!is_noreply(&t[1])) return client(errmsg, PROTO_E_BADFMT);
        req->noreply = true;
    }
    if (!proto_key_ok(t[0].p, t[0].n)) return client(errmsg, PROTO_E_BADFMT);
    req->arg = t[0].p;
    req->narg = t[0].n;
    req->has_arg = true;
    return PROTO_OK;
}

/* verbosity <level> [noreply] and cache_memlimit <MB> [noreply]: one required number. A bad
 * cache_memlimit number is a plain ERROR in memcached. */
static enum proto_status parse_one_num(struct proto_req *req, const char *p, const char *end,
                                       const char **errmsg)
{
    struct proto_tok t[2];
    size_t n = proto_split(p, end, t, 2);
    if (n == 0 || n > 2) return unknown(errmsg);
    if (is_noreply(&t[n - 1])) req->noreply = true;
    uint32_t v;
    if (!proto_mc_u32(t[0].p, t[0].n, &v))
        return req->cmd == CMD_VERBOSITY ? client(errmsg, PROTO_E_BADFMT) : unknown(errmsg);
    req->delta = v;
    req->has_arg = true;
    return PROTO_OK;
}

/* stats and shutdown: the rest of the line, trimmed, is the node's to judge. */
static void rest_as_arg(struct proto_req *req, const char *p, const char *end)
{
    p = proto_skip_spaces(p, end);
    while (end > p && end[-1] == ' ') end--;
    if (p == end) return;
    req->arg = p;
    req->narg = (size_t)(end - p);
    req->has_arg = true;
}

/* Does an unknown command look like an HTTP request? memcached closes the connection, sending
 * nothing, when the last of (at most 23) tokens starts with "HTTP/", but only on the path it
 * reaches for names it does not dispatch by first letter: a name of one byte, starting with one
 * of g s a c i d t, or a two-byte m name gets ERROR instead, as do the other commands it has. */
static bool looks_like_http(const char *name, size_t nname, const char *p, const char *end)
{
    static const char *const known[] = {"bget", "extstore"}; /* memcached's; not shoal's */
    if (nname < 2 || memchr("gsacidt", name[0], 7) || (name[0] == 'm' && nname == 2)) return false;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strlen(known[i]) == nname && memcmp(known[i], name, nname) == 0) return false;
    const char *last = name;
    size_t nlast = nname;
    for (size_t ntok = 1; ntok < 23; ntok++) {
        p = proto_skip_spaces(p, end);
        if (p == end) break;
        const char *e = proto_tok_end(p, end);
        last = p;
        nlast = (size_t)(e - p);
        p = e;
    }
    return nlast >= 5 && memcmp(last, "HTTP/", 5) == 0;
}

enum proto_status proto_parse(const char *line, size_t len, size_t item_max, struct proto_req *req,
                              const char **errmsg)
{
    memset(req, 0, offsetof(struct proto_req, meta.flag));
    req->meta.delta = 1;
    *errmsg = NULL;
    /* memcached reads the line as a C string: a NUL ends it */
    const char *nul = len ? memchr(line, '\0', len) : NULL;
    if (nul != NULL) len = (size_t)(nul - line);
    if (len == 0) return unknown(errmsg);
    const char *end = line + len;
    if (end[-1] == '\r') end--;
    const char *name = proto_skip_spaces(line, end);
    const char *p = proto_tok_end(name, end);
    req->cmd = proto_command(name, (size_t)(p - name));
    switch (req->cmd) {
    case CMD_GET:
    case CMD_GETS:
    case CMD_GAT:
    case CMD_GATS: return parse_retrieval(req, p, end, errmsg);
    case CMD_SET:
    case CMD_ADD:
    case CMD_REPLACE:
    case CMD_APPEND:
    case CMD_PREPEND:
    case CMD_CAS: return parse_storage(req, p, end, item_max, errmsg);
    case CMD_DELETE: return parse_delete(req, p, end, errmsg);
    case CMD_INCR:
    case CMD_DECR:
    case CMD_TOUCH: return parse_key_num(req, p, end, errmsg);
    case CMD_FLUSH_ALL: return parse_flush_all(req, p, end, errmsg);
    case CMD_FLUSH_NS: return parse_flush_ns(req, p, end, errmsg);
    case CMD_VERBOSITY:
    case CMD_CACHE_MEMLIMIT: return parse_one_num(req, p, end, errmsg);
    case CMD_VERSION:
    case CMD_QUIT: return PROTO_OK; /* memcached ignores anything after these */
    case CMD_STATS:
    case CMD_SHUTDOWN:
    case CMD_SLABS:
    case CMD_LRU:
    case CMD_LRU_CRAWLER:
    case CMD_WATCH: rest_as_arg(req, p, end); return PROTO_OK;
    case CMD_MG:
    case CMD_MS:
    case CMD_MD:
    case CMD_MA:
    case CMD_MN:
    case CMD_ME: return proto_parse_meta(req, p, end, item_max, errmsg);
    case CMD_NONE:
        if (looks_like_http(name, (size_t)(p - name), p, end)) {
            *errmsg = "";
            return PROTO_ERR_CLOSE;
        }
        break;
    }
    return unknown(errmsg);
}
