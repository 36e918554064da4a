/* meta.c — parser for the meta commands (mg ms md ma mn me) and their flags.
 *
 * Which flags a command accepts and which error string each mistake gets follow memcached 1.6.18
 * as observed on the wire, plus the newer flags we implement (E everywhere, S on ms, x on md,
 * lower-case M modes). 1.6.18 accepts one common flag set on every meta command and ignores the
 * flags a command does not use, so we do the same rather than refuse lines memcached serves. */
#include <stddef.h>
#include <string.h>

#include "protocol/parse_internal.h"
#include "protocol/protocol.h"

static const char e_badtoken[] = "CLIENT_ERROR bad token in command line format";
static const char e_invflag[] = "CLIENT_ERROR invalid flag";
static const char e_dupflag[] = "CLIENT_ERROR duplicate flag";
static const char e_invdup[] = "CLIENT_ERROR invalid or duplicate flag";
static const char e_toomany[] = "CLIENT_ERROR too many meta flags";
static const char e_opaque[] = "CLIENT_ERROR opaque token too long";
static const char e_decode[] = "CLIENT_ERROR error decoding key";
static const char e_mlen[] = "CLIENT_ERROR incorrect length for M token";
static const char e_ms_mode[] = "CLIENT_ERROR invalid mode for ms M token";
static const char e_ma_mode[] = "CLIENT_ERROR invalid mode for ma M token";
static const char e_delta[] = "CLIENT_ERROR invalid numeric delta value";
static const char e_initial[] = "CLIENT_ERROR invalid numeric initial value";

#define LO(c) (1u << ((c) - 'a'))
#define UP(c) (1u << ((c) - 'A'))
/* memcached 1.6.18's common set, accepted by mg, ms, md and ma alike, plus the newer E. */
#define COMMON_LO (LO('b') | LO('c') | LO('f') | LO('h') | LO('k') | LO('l') | LO('q') | LO('s') | \
                   LO('t') | LO('u') | LO('v'))
#define COMMON_UP (UP('C') | UP('D') | UP('E') | UP('F') | UP('I') | UP('J') | UP('L') | UP('M') | \
                   UP('N') | UP('O') | UP('P') | UP('R') | UP('T'))

struct flag_set {
    uint32_t lo, up;
};

static const struct flag_set valid[] = {
    [CMD_MG - CMD_MG] = {COMMON_LO, COMMON_UP},
    [CMD_MS - CMD_MG] = {COMMON_LO, COMMON_UP | UP('S')},
    [CMD_MD - CMD_MG] = {COMMON_LO | LO('x'), COMMON_UP | UP('H')},
    [CMD_MA - CMD_MG] = {COMMON_LO, COMMON_UP},
};

/* Mistakes found while scanning flags, kept apart because memcached ranks them: an invalid or
 * duplicate flag ends the scan at once; a bad token does not, and the last one is reported (a
 * bad F keeps the default "bad command line format"); a bad M mode comes next and an overlong
 * opaque last, as those are checked only once all flags are in. */
struct flag_errs {
    const char *hard;
    const char *soft;
    bool any_soft;
    const char *mode;
    bool long_opaque;
};

static void soft(struct flag_errs *fe, const char *msg)
{
    fe->soft = msg;
    fe->any_soft = true;
}

/* M token: one byte, folded to the canonical upper-case mode. mg and md take any byte. */
static void meta_mode(struct proto_req *req, struct flag_errs *fe, const char *tok, size_t ntok)
{
    if (ntok != 1) {
        soft(fe, e_mlen);
        return;
    }
    char c = tok[0];
    if (req->cmd == CMD_MS) {
        if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
        if (c != 'E' && c != 'A' && c != 'P' && c != 'R' && c != 'S') {
            if (!fe->mode) fe->mode = e_ms_mode;
            return;
        }
    } else if (req->cmd == CMD_MA) {
        if (c == 'I' || c == 'i' || c == '+') {
            c = 'I';
        } else if (c == 'D' || c == 'd' || c == '-') {
            c = 'D';
        } else {
            if (!fe->mode) fe->mode = e_ma_mode;
            return;
        }
    }
    req->meta.mode = c;
}

/* A b flag: decode the raw key [k, k + nk) into keybuf. */
static void meta_b64_key(struct proto_req *req, struct flag_errs *fe, const char *k, size_t nk)
{
    int n = proto_base64_decode(k, nk, req->keybuf, PROTO_KEY_MAX);
    if (n <= 0) {
        soft(fe, e_decode);
        return;
    }
    req->keybuf[n] = '\0';
    req->key = req->keybuf;
    req->nkey = (uint8_t)n;
}

/* Take in one flag token [s, e). The raw key [k, k + nk) is needed by b. */
static void meta_flag(struct proto_req *req, struct flag_errs *fe, const struct flag_set *ok,
                      const char *s, const char *e, const char *k, size_t nk)
{
    struct proto_meta *m = &req->meta;
    unsigned char c = (unsigned char)s[0];
    uint32_t *has, bit;
    if (c >= 'a' && c <= 'z') {
        has = &m->has;
        bit = LO(c);
        if (!(ok->lo & bit)) goto invalid;
    } else if (c >= 'A' && c <= 'Z') {
        has = &m->has_upper;
        bit = UP(c);
        if (!(ok->up & bit)) goto invalid;
    } else {
        goto invalid;
    }
    if (*has & bit) {
        fe->hard = e_dupflag;
        return;
    }
    *has |= bit;
    const char *tok = s + 1;
    size_t ntok = (size_t)(e - tok);
    if (ntok > UINT8_MAX) { /* ours: proto_mflag.ntok cannot hold it */
        soft(fe, e_badtoken);
        return;
    }
    m->flag[m->nflags++] = (struct proto_mflag){.flag = (char)c, .ntok = (uint8_t)ntok, .tok = tok};
    uint64_t u;
    int32_t i32;
    switch (c) {
    case 'b':
        m->base64 = true;
        meta_b64_key(req, fe, k, nk);
        break;
    case 'q': m->quiet = true; break;
    case 'I': m->invalidate = true; break;
    case 'T':
        if (!proto_mc_i32(tok, ntok, &i32)) soft(fe, e_badtoken);
        else m->ttl = i32;
        break;
    case 'N':
        if (!proto_mc_i32(tok, ntok, &i32)) soft(fe, e_badtoken);
        else m->vivify = i32;
        break;
    case 'R':
        if (!proto_mc_i32(tok, ntok, &i32)) soft(fe, e_badtoken);
        else m->recache = i32;
        break;
    case 'H': /* ours: delete hold-off, seconds */
        if (!proto_parse_i64(tok, ntok, &m->holdoff) || m->holdoff < 0) soft(fe, e_badtoken);
        break;
    case 'C':
        if (!proto_mc_u64(tok, ntok, &m->cas_in)) soft(fe, e_badtoken);
        break;
    case 'E':
        /* the node keeps 48-bit CAS values (store.h STORE_CAS_MAX) */
        if (!proto_mc_u64(tok, ntok, &m->cas_new) || m->cas_new >> 48) soft(fe, e_badtoken);
        break;
    case 'S':
        if (!proto_mc_u64(tok, ntok, &u)) soft(fe, e_badtoken);
        break;
    case 'D':
        if (!proto_mc_u64(tok, ntok, &m->delta)) soft(fe, e_delta);
        break;
    case 'J':
        if (!proto_mc_u64(tok, ntok, &m->initial)) soft(fe, e_initial);
        break;
    case 'F': /* as memcached: the low 32 bits of the number */
        if (!proto_mc_u32(tok, ntok, &m->flags)) fe->any_soft = true;
        break;
    case 'O': /* memcached counts the letter too */
        if (ntok + 1 > PROTO_OPAQUE_MAX) {
            fe->long_opaque = true;
        } else {
            m->opaque = tok;
            m->nopaque = (uint8_t)ntok;
        }
        break;
    case 'M': meta_mode(req, fe, tok, ntok); break;
    }
    return;
invalid:
    fe->hard = e_invflag;
}

/* Scan the flag tokens in [p, end) and return the error memcached would report, or NULL.
 * Tokens are still counted after a mistake, as an overlong list is reported first. */
static const char *meta_flags(struct proto_req *req, const char *p, const char *end, const char *k,
                              size_t nk)
{
    const struct flag_set *ok = &valid[req->cmd - CMD_MG];
    struct flag_errs fe = {0};
    size_t count = 0;
    for (p = proto_skip_spaces(p, end); p < end; p = proto_skip_spaces(p, end)) {
        const char *e = proto_tok_end(p, end);
        if (++count > PROTO_META_FLAGS_MAX) return e_toomany;
        if (fe.hard == NULL) meta_flag(req, &fe, ok, p, e, k, nk);
        p = e;
    }
    bool md_ma = req->cmd == CMD_MD || req->cmd == CMD_MA;
    if (fe.hard) return md_ma ? e_invdup : fe.hard;
    if (fe.any_soft) return md_ma ? e_invdup : fe.soft ? fe.soft : PROTO_E_BADFMT;
    if (fe.mode) return fe.mode;
    if (fe.long_opaque) return e_opaque;
    return NULL;
}

/* me <key> [b]: memcached honours b only as the token right after the key and ignores the
 * rest; every mistake is "bad command line format". */
static enum proto_status parse_me(struct proto_req *req, const char *p, const char *end,
                                  const char **errmsg)
{
    const char *k = proto_skip_spaces(p, end);
    const char *ke = proto_tok_end(k, end);
    size_t nk = (size_t)(ke - k);
    const char *f = proto_skip_spaces(ke, end);
    const char *fe = proto_tok_end(f, end);
    if (fe - f == 1 && *f == 'b') {
        req->meta.base64 = true;
        req->meta.has |= LO('b');
        req->meta.flag[0] = (struct proto_mflag){.flag = 'b', .ntok = 0, .tok = f + 1};
        req->meta.nflags = 1;
    }
    if (!proto_key_ok(k, nk)) goto bad;
    if (req->meta.base64) {
        int n = proto_base64_decode(k, nk, req->keybuf, PROTO_KEY_MAX);
        if (n <= 0) goto bad;
        req->keybuf[n] = '\0';
        req->key = req->keybuf;
        req->nkey = (uint8_t)n;
    } else {
        req->key = k;
        req->nkey = (uint8_t)nk;
    }
    return PROTO_OK;
bad:
    *errmsg = PROTO_E_BADFMT;
    return PROTO_ERR_CLIENT;
}

enum proto_status proto_parse_meta(struct proto_req *req, const char *p, const char *end,
                                   size_t item_max, const char **errmsg)
{
    if (req->cmd == CMD_MN) return PROTO_OK; /* memcached ignores anything after mn */
    if (req->cmd == CMD_ME) return parse_me(req, p, end, errmsg);

    const char *k = proto_skip_spaces(p, end);
    if (k == end) {
        *errmsg = PROTO_E_UNKNOWN;
        return PROTO_ERR_UNKNOWN;
    }
    p = proto_tok_end(k, end);
    size_t nk = (size_t)(p - k);

    /* ms <key> <datalen>: until datalen is known a mistake leaves the data unread (memcached
     * then runs it as a command); after that every mistake swallows it, an overlong key too
     * (memcached checks the key first and runs the data: docs/protocol.md). */
    enum proto_status st = PROTO_ERR_CLIENT;
    if (req->cmd == CMD_MS) {
        const char *d = proto_skip_spaces(p, end);
        p = proto_tok_end(d, end);
        int32_t nbytes;
        if (!proto_mc_i32(d, (size_t)(p - d), &nbytes) || nbytes < 0 || nbytes > PROTO_NBYTES_MAX)
            goto badfmt;
        req->nbytes = nbytes;
        st = PROTO_ERR_CLIENT_SWALLOW;
    }
    /* A b key is held to 250 encoded bytes too. */
    if (!proto_key_ok(k, nk)) {
        *errmsg = PROTO_E_BADFMT;
        return st;
    }

    const char *err = meta_flags(req, p, end, k, nk);
    if (err != NULL) {
        req->key = NULL;
        req->nkey = 0;
        *errmsg = err;
        return st;
    }
    if (!req->meta.base64) {
        req->key = k;
        req->nkey = (uint8_t)nk;
    }
    if (req->cmd == CMD_MS && (uint64_t)req->nbytes + 2 > item_max) {
        *errmsg = PROTO_E_TOO_LARGE;
        return PROTO_ERR_TOO_LARGE;
    }
    return PROTO_OK;
badfmt:
    *errmsg = PROTO_E_BADFMT;
    return PROTO_ERR_CLIENT;
}
