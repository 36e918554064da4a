/* fuzz_protocol.c — libFuzzer target for the memcache request-line parser and base64.
 *
 * Every '\n'-separated piece of the input, and the whole input, is parsed as one request line
 * from an exact-size heap copy, so ASan catches any read past the line. The checks are the
 * parser's contract: pointers stay inside the line (or keybuf), lengths and statuses agree,
 * error lines are well formed, and keys, flags and numbers mean what the request said. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/protocol.h"

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);      \
            abort();                                                                             \
        }                                                                                        \
    } while (0)

static bool inside(const char *p, size_t n, const char *lo, const char *hi)
{
    return p >= lo && p <= hi && n <= (size_t)(hi - p);
}

static bool is_storage(enum proto_cmd c) { return c >= CMD_SET && c <= CMD_CAS; }

/* memcached's keys: any byte but a space (and NUL, which ends the line) */
static bool text_key_ok(const char *k, size_t n)
{
    if (n == 0 || n > PROTO_KEY_MAX) return false;
    return memchr(k, ' ', n) == NULL && memchr(k, '\0', n) == NULL;
}

static void check_errmsg(enum proto_status st, const char *err)
{
    if (st == PROTO_OK) {
        CHECK(err == NULL);
        return;
    }
    CHECK(err != NULL);
    if (st == PROTO_ERR_CLOSE) { /* an HTTP line: closed without a reply */
        CHECK(err[0] == '\0');
        return;
    }
    size_t n = strlen(err);
    CHECK(n > 0 && strpbrk(err, "\r\n") == NULL);
    switch (st) {
    case PROTO_ERR_UNKNOWN: CHECK(strcmp(err, "ERROR") == 0); break;
    case PROTO_ERR_CLIENT:
    case PROTO_ERR_CLIENT_SWALLOW: CHECK(strncmp(err, "CLIENT_ERROR ", 13) == 0); break;
    case PROTO_ERR_TOO_LARGE: CHECK(strcmp(err, "SERVER_ERROR object too large for cache") == 0); break;
    default: CHECK(!"unknown status");
    }
}

static void check_key(const struct proto_req *r, const char *lo, const char *hi)
{
    CHECK(r->nkey <= PROTO_KEY_MAX);
    if (r->key == NULL) return;
    if (r->key == r->keybuf) {
        /* a decoded b key: it must survive an encode/decode round trip */
        char enc[PROTO_KEY_MAX * 2], dec[PROTO_KEY_MAX + 1];
        CHECK(r->meta.base64 && r->nkey >= 1);
        int e = proto_base64_encode(r->key, r->nkey, enc, sizeof enc);
        CHECK(e > 0 && e <= PROTO_KEY_MAX);
        CHECK(proto_base64_decode(enc, (size_t)e, dec, sizeof dec) == r->nkey);
        CHECK(memcmp(dec, r->key, r->nkey) == 0);
    } else {
        CHECK(inside(r->key, r->nkey, lo, hi));
        CHECK(text_key_ok(r->key, r->nkey));
    }
}

static void check_meta(const struct proto_req *r, const char *lo, const char *hi, bool ok)
{
    const struct proto_meta *m = &r->meta;
    CHECK(m->nflags <= PROTO_META_FLAGS_MAX);
    if (ok) { /* a failed scan may stop between marking a flag seen and recording it */
        CHECK((size_t)__builtin_popcount(m->has) + (size_t)__builtin_popcount(m->has_upper) ==
              m->nflags);
        CHECK(m->base64 == proto_meta_has(m, 'b'));
        CHECK(m->quiet == proto_meta_has(m, 'q'));
    }
    for (int i = 0; i < m->nflags; i++) {
        const struct proto_mflag *f = &m->flag[i];
        CHECK(proto_meta_has(m, f->flag));
        CHECK(inside(f->tok, f->ntok, lo, hi));
        CHECK(f->tok[-1] == f->flag); /* the token follows its letter */
        for (int j = 0; j < i; j++) CHECK(m->flag[j].flag != f->flag);
    }
    if (m->opaque) {
        CHECK(inside(m->opaque, m->nopaque, lo, hi));
        CHECK(m->nopaque < PROTO_OPAQUE_MAX && proto_meta_has(m, 'O'));
    }
    if (!proto_meta_has(m, 'D')) CHECK(m->delta == 1);
    if (r->cmd == CMD_MS) CHECK(m->mode == 0 || strchr("EAPRS", m->mode));
    if (r->cmd == CMD_MA) CHECK(m->mode == 0 || m->mode == 'I' || m->mode == 'D');
}

static void check_retrieval(const struct proto_req *r, const char *lo, const char *hi)
{
    CHECK(r->keys != NULL && r->keys <= r->keys_end);
    CHECK(inside(r->keys, (size_t)(r->keys_end - r->keys), lo, hi));
    CHECK(proto_keys_valid(r->keys, r->keys_end));
    const char *cur = r->keys, *k;
    uint8_t nk;
    size_t count = 0;
    while (proto_next_key(&cur, r->keys_end, &k, &nk)) {
        CHECK(inside(k, nk, lo, hi) && text_key_ok(k, nk));
        if (count++ == 0) CHECK(k == r->key && nk == r->nkey);
        CHECK(cur <= r->keys_end);
    }
    CHECK(cur == r->keys_end);
    if (r->cmd == CMD_GET || r->cmd == CMD_GETS) CHECK(count >= 1);
    if (count == 0) CHECK(r->key == NULL);
}

static void check_parse(const char *line, size_t len, size_t item_max)
{
    struct proto_req r;
    const char *err = "unset";
    enum proto_status st = proto_parse(line, len, item_max, &r, &err);
    const char *lo = line, *hi = line + len;
    check_errmsg(st, err);
    check_key(&r, lo, hi);
    check_meta(&r, lo, hi, st == PROTO_OK);
    if (r.arg) {
        CHECK(r.narg > 0 && inside(r.arg, r.narg, lo, hi));
        CHECK(r.arg[0] != ' ' && r.arg[r.narg - 1] != ' ');
    } else {
        CHECK(r.narg == 0);
    }
    if (st == PROTO_ERR_TOO_LARGE) {
        CHECK(is_storage(r.cmd) || r.cmd == CMD_MS);
        CHECK(r.nbytes >= 0 && (uint64_t)r.nbytes + 2 > item_max);
        CHECK(r.key != NULL && r.nkey >= 1);
    }
    if (st == PROTO_ERR_CLIENT_SWALLOW) { /* a refused store whose length read */
        CHECK((is_storage(r.cmd) || r.cmd == CMD_MS) && r.nbytes >= 0 && r.nbytes <= INT32_MAX - 2);
    }
    if (st == PROTO_ERR_CLOSE) {
        CHECK(r.cmd == CMD_NONE);
        CHECK(len >= 5 && memmem(line, len, "HTTP/", 5) != NULL);
    }
    if (st != PROTO_OK) return;
    switch (r.cmd) {
    case CMD_NONE: CHECK(!"OK without a command"); break;
    case CMD_GET:
    case CMD_GETS:
    case CMD_GAT:
    case CMD_GATS: check_retrieval(&r, lo, hi); break;
    case CMD_SET:
    case CMD_ADD:
    case CMD_REPLACE:
    case CMD_APPEND:
    case CMD_PREPEND:
    case CMD_CAS:
    case CMD_MS:
        CHECK(r.nbytes >= 0 && (uint64_t)r.nbytes + 2 <= item_max);
        CHECK(r.key != NULL && r.nkey >= 1);
        break;
    case CMD_DELETE:
    case CMD_INCR:
    case CMD_DECR:
    case CMD_TOUCH:
    case CMD_MG:
    case CMD_MD:
    case CMD_MA:
    case CMD_ME: CHECK(r.key != NULL && r.nkey >= 1); break;
    case CMD_FLUSH_ALL:
        if (r.has_arg) CHECK(r.delta == (r.exptime > 0 ? (uint64_t)r.exptime : 0));
        break;
    case CMD_FLUSH_NS:
        CHECK(r.has_arg && r.arg != NULL && r.narg >= 1 && r.narg <= PROTO_KEY_MAX);
        CHECK(memchr(r.arg, ' ', r.narg) == NULL);
        break;
    case CMD_VERBOSITY:
    case CMD_CACHE_MEMLIMIT: CHECK(r.has_arg); break;
    case CMD_SLABS:
    case CMD_LRU:
    case CMD_LRU_CRAWLER:
    case CMD_WATCH: {
        bool silent;
        const char *t = proto_tune_reply(&r, &silent);
        CHECK(t != NULL && t[0] != '\0' && strpbrk(t, "\r\n") == NULL);
        break;
    }
    case CMD_STATS:
    case CMD_SHUTDOWN:
    case CMD_VERSION:
    case CMD_QUIT:
    case CMD_MN: break;
    }
}

/* Numbers: whatever parses must be plain digits (and '-') and agree with libc. */
static void check_numbers(const char *s, size_t n)
{
    char buf[64];
    uint64_t u;
    int64_t i;
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (proto_parse_u64(s, n, &u)) {
        CHECK(n > 0 && strspn(buf, "0123456789") == n);
        errno = 0;
        CHECK(strtoull(buf, NULL, 10) == u && errno == 0);
    }
    if (proto_parse_i64(s, n, &i)) {
        CHECK(n > 0 && strspn(buf + (buf[0] == '-'), "0123456789") == n - (buf[0] == '-'));
        errno = 0;
        CHECK(strtoll(buf, NULL, 10) == i && errno == 0);
    }
    /* memcached's readings: they agree with libc's strtoull/strtoll on the same bytes */
    uint32_t u32;
    int32_t i32;
    if (n == sizeof buf - 1) return; /* cut to fit buf: libc would read other bytes */
    if (proto_mc_u64(s, n, &u) && memchr(buf, '\0', n) == NULL) {
        char *e;
        errno = 0;
        CHECK(strtoull(buf, &e, 10) == u && errno == 0 && e != buf);
    }
    if (proto_mc_u32(s, n, &u32) && memchr(buf, '\0', n) == NULL) {
        errno = 0;
        CHECK((uint32_t)strtoull(buf, NULL, 10) == u32 && errno == 0);
    }
    if (proto_mc_i32(s, n, &i32) && memchr(buf, '\0', n) == NULL) {
        errno = 0;
        CHECK((int32_t)(uint32_t)(uint64_t)strtoll(buf, NULL, 10) == i32 && errno == 0);
    }
}

/* Base64: arbitrary bytes round-trip; arbitrary text either fails or decodes to bytes that
 * re-encode to the same length; an exact-size output buffer is never overrun. */
static void check_base64(const char *s, size_t n)
{
    if (n > 600) n = 600;
    size_t elen = (n + 2) / 3 * 4;
    char *enc = malloc(elen ? elen : 1), *dec = malloc(n ? n : 1);
    CHECK(proto_base64_encode(s, n, enc, elen) == (int)elen);
    if (elen) CHECK(proto_base64_encode(s, n, enc, elen - 1) == -1);
    CHECK(proto_base64_decode(enc, elen, dec, n) == (int)n);
    CHECK(memcmp(dec, s, n) == 0);
    if (n) CHECK(proto_base64_decode(enc, elen, dec, n - 1) == -1);
    free(enc);
    free(dec);

    size_t cap = n / 4 * 3;
    char *out = malloc(cap ? cap : 1);
    int d = proto_base64_decode(s, n, out, cap);
    if (d >= 0) {
        CHECK(n % 4 == 0 && (size_t)d <= cap);
        char *re = malloc(n ? n : 1);
        CHECK(proto_base64_encode(out, (size_t)d, re, n) == (int)n);
        free(re);
    }
    free(out);
}

static void one_line(const uint8_t *data, size_t len)
{
    char *line = malloc(len ? len : 1); /* exact size: ASan sees any overread */
    if (len) memcpy(line, data, len);
    check_parse(line, len, (size_t)1 << 20);
    check_parse(line, len, 64);
    check_numbers(line, len);
    check_base64(line, len);
    free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *e = nl ? nl : end;
        one_line(p, (size_t)(e - p));
        p = nl ? nl + 1 : end;
    }
    one_line(data, size);
    return 0;
}
