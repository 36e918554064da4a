/* replyframe.c — where one node reply ends in a stream of them (see replyframe.h). */
#include "router/replyframe.h"

#include <stdbool.h>
#include <string.h>

#include "protocol/protocol.h"
#include "router/metareply.h"

long reply_token_num(const char *p, const char *end, int which)
{
    /* tokens split on ' ' only: a key may hold any other byte, \r included (memcached) */
    if (end > p && end[-1] == '\n') end--;
    if (end > p && end[-1] == '\r') end--;
    int t = 0;
    while (p < end) {
        const char *s = p;
        while (p < end && *p != ' ') p++;
        if (t == which) {
            if (p == s || p - s > 10) return -1;
            long v = 0;
            for (const char *q = s; q < p; q++) {
                if (*q < '0' || *q > '9') return -1;
                v = v * 10 + (*q - '0');
            }
            return v;
        }
        t++;
        if (p < end) p++;
    }
    return -1;
}

long reply_length(const char *p, size_t n, uint64_t max_value, uint64_t max_reply, size_t *scan)
{
    size_t pos = *scan;
    for (;;) {
        const char *nl = memchr(p + pos, '\n', n - pos);
        if (nl == NULL) return (n - pos > REPLY_LINE_MAX) ? -1 : 0;
        const char *line = p + pos;
        size_t ll = (size_t)(nl - line) + 1;
        bool value = ll >= 6 && !memcmp(line, "VALUE ", 6);
        bool va = !value && ll >= 3 && !memcmp(line, "VA ", 3);
        if (!value && !va) return (long)(pos + ll);
        long vlen = reply_token_num(line, nl + 1, value ? 3 : 1);
        if (vlen < 0 || (uint64_t)vlen > max_value) return -1;
        size_t need = pos + ll + (size_t)vlen + 2;
        if (need > max_reply) return -1;
        if (n < need) return 0;
        if (p[need - 2] != '\r' || p[need - 1] != '\n') return -1;
        if (va) return (long)need;
        pos = need;
        *scan = pos;
    }
}

/* Request lines split on runs of ' ', as proto_parse splits them. */
static const char *skip_spaces(const char *p, const char *end)
{
    while (p < end && *p == ' ') p++;
    return p;
}

static const char *token_end(const char *p, const char *end)
{
    const char *sp = p < end ? memchr(p, ' ', (size_t)(end - p)) : NULL;
    return sp ? sp : end;
}

/* Is the token [p, e) exactly `word`? */
static bool token_is(const char *p, const char *e, const char *word)
{
    size_t k = strlen(word);
    return (size_t)(e - p) == k && !memcmp(p, word, k);
}

/* The list a `stats` line with arguments [p, end) is answered with. */
static uint8_t stats_list(const char *p, const char *end)
{
    static const char *const stat_lists[] = {"items", "slabs", "sizes", "settings", "conns",
                                             "extstore"};
    const char *e = token_end(p, end);
    if (p == end) return RLIST_STAT;
    for (size_t i = 0; i < sizeof stat_lists / sizeof stat_lists[0]; i++)
        if (token_is(p, e, stat_lists[i])) return RLIST_STAT;
    if (token_is(p, e, "cachedump")) return RLIST_ITEM;
    if (token_is(p, e, "detail")) {
        p = skip_spaces(e, end);
        if (token_is(p, token_end(p, end), "dump")) return RLIST_PREFIX;
    }
    return RLIST_NONE;
}

void reply_want_of(struct reply_want *w, const char *req, size_t n)
{
    *w = (struct reply_want){.cmd = CMD_NONE, .slots = 1};
    const char *end = memchr(req, '\n', n);
    if (end == NULL) end = req + n;
    const char *nul = end > req ? memchr(req, '\0', (size_t)(end - req)) : NULL; /* as the parser */
    if (nul != NULL) end = nul;
    if (end > req && end[-1] == '\r') end--;
    if (end - req > (ptrdiff_t)UINT32_MAX) return;
    const char *p = skip_spaces(req, end), *e = token_end(p, end);
    enum proto_cmd cmd = proto_command(p, (size_t)(e - p));
    if (cmd == CMD_LRU_CRAWLER) {
        p = skip_spaces(e, end);
        if (token_is(p, token_end(p, end), "metadump")) w->list = RLIST_KEY;
        w->cmd = cmd; /* the router forwards only metadump: any other form only an error answers */
        return;
    }
    switch (cmd) {
    case CMD_STATS:
        w->list = stats_list(skip_spaces(e, end), end);
        break;
    case CMD_GAT: case CMD_GATS:
        e = token_end(skip_spaces(e, end), end); /* the exptime */
        /* fall through */
    case CMD_GET: case CMD_GETS: {
        p = skip_spaces(e, end);
        w->key = (uint32_t)(p - req);
        w->key_end = (uint32_t)(end - req);
        uint32_t keys = 0;
        for (; p < end; p = skip_spaces(token_end(p, end), end)) keys++;
        if (keys > 1) w->slots = keys;
        break;
    }
    case CMD_MG: case CMD_MS: case CMD_MD: case CMD_MA:
        p = skip_spaces(e, end);
        e = token_end(p, end);
        if (e == p || e - p > PROTO_KEY_MAX) return; /* does not parse */
        w->key = (uint32_t)(p - req);
        w->key_end = (uint32_t)(e - req);
        if (cmd == CMD_MS) e = token_end(skip_spaces(e, end), end); /* the data length */
        for (p = skip_spaces(e, end); p < end; p = skip_spaces(e, end)) {
            e = token_end(p, end);
            if (*p == 'b') w->base64 = true;
            else if (*p == 'k') w->echo_key = true;
            else if (*p == 'O' && !w->has_opaque) {
                if (e - p > PROTO_OPAQUE_MAX) return; /* 'O' and its token: does not parse */
                w->has_opaque = true;
                w->opaque = (uint32_t)(p + 1 - req);
                w->nopaque = (uint8_t)(e - p - 1);
            }
        }
        break;
    default:
        break;
    }
    w->cmd = cmd;
}

uint32_t reply_value_slots(const char *req, size_t n)
{
    struct reply_want w;
    reply_want_of(&w, req, n);
    return w.slots;
}

/* The length of the line at p (n bytes) with its \r\n; 0 when it has none or ends in a bare \n. */
static size_t reply_line(const char *p, size_t n)
{
    const char *nl = memchr(p, '\n', n);
    if (nl == NULL || nl == p || nl[-1] != '\r') return 0;
    return (size_t)(nl - p) + 1;
}

/* Is the line (ll bytes with its \r\n) exactly `word`? */
static bool line_is(const char *p, size_t ll, const char *word)
{
    size_t k = strlen(word);
    return ll == k + 2 && !memcmp(p, word, k);
}

/* Does the line's first token equal `word`? */
static bool line_code(const char *p, size_t ll, const char *word)
{
    size_t k = strlen(word);
    return ll >= k + 2 && !memcmp(p, word, k) && (p[k] == ' ' || p[k] == '\r');
}

static bool line_error(const char *p, size_t ll)
{
    return line_code(p, ll, "ERROR") || line_code(p, ll, "CLIENT_ERROR") ||
           line_code(p, ll, "SERVER_ERROR");
}

/* Is the line one of the space-separated words of `words`? */
static bool line_one_of(const char *p, size_t ll, const char *words)
{
    while (*words) {
        size_t k = strcspn(words, " ");
        if (ll == k + 2 && !memcmp(p, words, k)) return true;
        words += k + (words[k] == ' ');
    }
    return false;
}

/* incr/decr's answer: the new value, 1 to 20 digits. */
static bool line_number(const char *p, size_t ll)
{
    if (ll < 3 || ll > 22) return false;
    for (size_t i = 0; i < ll - 2; i++)
        if (p[i] < '0' || p[i] > '9') return false;
    return true;
}

/* A get's reply: VALUE blocks for keys of the request in order, then END or an error line.
 * RFIT_ECHO when it is such a reply but for other keys (or in another order). */
static enum reply_fit fits_get(const struct reply_want *w, const char *req, const char *p,
                               size_t n)
{
    int ntok = w->cmd == CMD_GETS || w->cmd == CMD_GATS ? 5 : 4;
    const char *kp = req + w->key, *kend_req = req + w->key_end;
    size_t pos = 0;
    bool keys_ok = true;
    for (;;) {
        const char *line = p + pos;
        size_t ll = reply_line(line, n - pos);
        if (ll == 0) return RFIT_BAD;
        if (!line_code(line, ll, "VALUE")) {
            if (pos + ll != n || !(line_is(line, ll, "END") || line_error(line, ll)))
                return RFIT_BAD;
            return keys_ok ? RFIT_OK : RFIT_ECHO;
        }
        int spaces = 0;
        for (size_t i = 0; i < ll - 2; i++) spaces += line[i] == ' ';
        const char *key = line + 6, *kend = memchr(key, ' ', ll - 6);
        long vlen = reply_token_num(line, line + ll, 3);
        if (spaces + 1 != ntok || kend == NULL || vlen < 0) return RFIT_BAD;
        const char *want;
        uint8_t nwant;
        while (keys_ok) { /* the next key asked that it can answer; the ones skipped missed */
            if (!proto_next_key(&kp, kend_req, &want, &nwant)) keys_ok = false;
            else if (nwant == (size_t)(kend - key) && !memcmp(want, key, nwant)) break;
        }
        pos += ll;
        if (n - pos < (size_t)vlen + 2 || memcmp(p + pos + vlen, "\r\n", 2)) return RFIT_BAD;
        pos += (size_t)vlen + 2;
    }
}

/* Does the meta reply line [p, end) echo the request's key (k) and opaque (O), where it asked
 * for them? A key is compared decoded under b, as both sides may spell it differently. */
static bool meta_echoes(const struct reply_want *w, const char *req, const char *p,
                        const char *end)
{
    size_t ntok;
    const char *tok;
    if (w->has_opaque) {
        tok = mreply_flag(p, end, 'O', &ntok);
        if (tok == NULL || ntok != w->nopaque || memcmp(tok, req + w->opaque, ntok))
            return false;
    }
    if (!w->echo_key) return true;
    if ((tok = mreply_flag(p, end, 'k', &ntok)) == NULL) return false;
    /* each side may be in base64: the request under b, the reply when it carries b (a hit
     * echoes the key in the form it was stored in, as memcached does) */
    size_t nb;
    bool got_b64 = mreply_flag(p, end, 'b', &nb) != NULL;
    char want[PROTO_KEY_MAX + 1], got[PROTO_KEY_MAX + 1];
    const char *wk = req + w->key, *gk = tok;
    int nwant = (int)(w->key_end - w->key), ngot = (int)ntok;
    if (w->base64) {
        nwant = proto_base64_decode(wk, (size_t)nwant, want, PROTO_KEY_MAX);
        wk = want;
    }
    if (got_b64) {
        ngot = proto_base64_decode(tok, ntok, got, sizeof got);
        gk = got;
    }
    return nwant > 0 && ngot == nwant && !memcmp(gk, wk, (size_t)nwant);
}

/* A meta reply: one of `codes` (space-separated two-letter codes) as the first token, with its
 * value when it is VA, and the request's k and O echoed (`echo`; RFIT_ECHO when they are not). */
static enum reply_fit fits_meta(const struct reply_want *w, const char *req, const char *codes,
                                bool echo, const char *p, size_t n)
{
    size_t ll = reply_line(p, n);
    if (ll < 4 || (p[2] != ' ' && p[2] != '\r')) return RFIT_BAD;
    bool known = false;
    for (const char *c = codes; *c && !known; c += c[2] ? 3 : 2) known = !memcmp(p, c, 2);
    if (!known) return RFIT_BAD;
    if (!memcmp(p, "VA", 2)) {
        long vlen = reply_token_num(p, p + ll, 1);
        if (vlen < 0 || n - ll != (size_t)vlen + 2 || memcmp(p + n - 2, "\r\n", 2))
            return RFIT_BAD;
    } else if (ll != n) {
        return RFIT_BAD;
    }
    /* the whole line with its \r\n: mreply_flag takes off exactly that, so a token that ends
     * in a \r of its own (`mg k O1\r v` is answered `EN O1\r\r\n`) keeps it */
    return !echo || meta_echoes(w, req, p, p + ll) ? RFIT_OK : RFIT_ECHO;
}

enum reply_lline reply_list_line(const struct reply_want *w, const char *p, size_t n, bool first,
                                 size_t *len)
{
    static const char *const item[] = {[RLIST_STAT] = "STAT ", [RLIST_ITEM] = "ITEM ",
                                       [RLIST_KEY] = "key=", [RLIST_PREFIX] = "PREFIX "};
    const char *nl = memchr(p, '\n', n < REPLY_LINE_MAX ? n : REPLY_LINE_MAX);
    if (nl == NULL) return n < REPLY_LINE_MAX ? RLL_MORE : RLL_BAD;
    size_t ll = (size_t)(nl - p) + 1;
    bool crlf = ll >= 2 && nl[-1] == '\r';
    *len = ll;
    if (w->list == RLIST_QUIET) { /* memcached's q hides md's HD, not its NF */
        if (!crlf) return RLL_BAD;
        if (line_is(p, ll, "MN")) return RLL_END;
        return line_is(p, ll, "NF") || line_error(p, ll) ? RLL_ITEM : RLL_BAD;
    }
    if (w->list == RLIST_NONE || w->list > RLIST_PREFIX) return RLL_BAD;
    const char *want = item[w->list];
    size_t k = strlen(want);
    /* memcached ends metadump's lines with a bare \n, the rest with \r\n */
    if (ll > k && !memcmp(p, want, k) && (crlf || w->list == RLIST_KEY)) return RLL_ITEM;
    if (!crlf) return RLL_BAD;
    if (line_is(p, ll, "END")) return RLL_END;
    if (first && (line_error(p, ll) || (w->list == RLIST_KEY && (line_code(p, ll, "BUSY") ||
                                                                 line_code(p, ll, "BADCLASS")))))
        return RLL_ONE;
    return RLL_BAD;
}

/* A list reply: its lines (reply_list_line) then END, or one line that is the whole reply. */
static bool fits_list(const struct reply_want *w, const char *p, size_t n)
{
    size_t pos = 0, ll;
    for (bool first = true;; first = false) {
        switch (reply_list_line(w, p + pos, n - pos, first, &ll)) {
        case RLL_ITEM: pos += ll; break;
        case RLL_END: case RLL_ONE: return pos + ll == n;
        default: return false;
        }
    }
}

enum reply_fit reply_check_want(const struct reply_want *w, const char *req, const char *reply,
                                size_t n)
{
    if (w->list != RLIST_NONE) return fits_list(w, reply, n) ? RFIT_OK : RFIT_BAD;
    size_t ll = reply_line(reply, n);
    if (ll == 0) return RFIT_BAD;
    if (line_error(reply, ll)) return ll == n ? RFIT_OK : RFIT_BAD;
    switch (w->cmd) {
    case CMD_GET: case CMD_GETS: case CMD_GAT: case CMD_GATS:
        return fits_get(w, req, reply, n);
    case CMD_MG: return fits_meta(w, req, "VA HD EN", true, reply, n);
    case CMD_MS: return fits_meta(w, req, "HD NS EX NF", true, reply, n);
    case CMD_MD: return fits_meta(w, req, "HD NF EX", true, reply, n);
    case CMD_MA: return fits_meta(w, req, "VA HD NF NS EX", true, reply, n);
    case CMD_MN: return fits_meta(w, req, "MN", false, reply, n);
    case CMD_ME: return fits_meta(w, req, "ME EN", false, reply, n);
    default: break;
    }
    if (ll != n) return RFIT_BAD; /* the text commands below answer one line */
    bool ok;
    switch (w->cmd) {
    case CMD_SET: case CMD_ADD: case CMD_REPLACE: case CMD_APPEND: case CMD_PREPEND: case CMD_CAS:
        ok = line_one_of(reply, ll, "STORED NOT_STORED EXISTS NOT_FOUND");
        break;
    case CMD_DELETE:
        ok = line_one_of(reply, ll, "DELETED NOT_FOUND");
        break;
    case CMD_INCR: case CMD_DECR:
        ok = line_number(reply, ll) || line_is(reply, ll, "NOT_FOUND");
        break;
    case CMD_TOUCH:
        ok = line_one_of(reply, ll, "TOUCHED NOT_FOUND");
        break;
    case CMD_VERSION:
        ok = line_code(reply, ll, "VERSION");
        break;
    case CMD_STATS: /* stats detail on|off, stats reset */
        ok = line_is(reply, ll, "OK") || line_is(reply, ll, "RESET");
        break;
    case CMD_FLUSH_ALL: case CMD_FLUSH_NS: case CMD_VERBOSITY:
        ok = line_is(reply, ll, "OK");
        break;
    default:
        ok = false; /* never forwarded: only an error line could be its answer */
    }
    return ok ? RFIT_OK : RFIT_BAD;
}

bool reply_fits_want(const struct reply_want *w, const char *req, const char *reply, size_t n)
{
    return reply_check_want(w, req, reply, n) == RFIT_OK;
}

bool reply_fits(const char *req, size_t nreq, const char *reply, size_t n)
{
    const char *nl = memchr(req, '\n', nreq);
    struct proto_req rq;
    const char *err;
    struct reply_want w;
    reply_want_of(&w, req, nreq);
    /* any length: a value the node finds too large is refused with an error line; a line the
     * parser refuses only an error line answers */
    if (proto_parse(req, nl ? (size_t)(nl - req) : nreq, SIZE_MAX, &rq, &err) != PROTO_OK)
        w = (struct reply_want){.cmd = CMD_NONE, .slots = 1};
    return reply_fits_want(&w, req, reply, n);
}
