/* metareply.c — meta reply lines read and composed for warm-up (see metareply.h). */
#include "router/metareply.h"

#include <string.h>

const char *mreply_flag(const char *p, const char *end, char letter, size_t *n)
{
    bool first = true; /* the code (VA, HD, ...) */
    /* split on ' ' only: an echoed key may hold a \r (memcached keys take any other byte) */
    if (end > p && end[-1] == '\n') end--;
    if (end > p && end[-1] == '\r') end--;
    while (p < end) {
        const char *s = p;
        while (p < end && *p != ' ') p++;
        if (!first && p > s && *s == letter) {
            *n = (size_t)(p - s - 1);
            return s + 1;
        }
        first = false;
        if (p < end && *p == ' ') p++;
        else break;
    }
    return NULL;
}

/* A whole decimal number of at most 18 digits, optionally negative. */
static bool mreply_num(const char *s, size_t n, int64_t *out)
{
    bool neg = n > 0 && *s == '-';
    if (neg) s++, n--;
    if (n == 0 || n > 18) return false;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return true;
}

bool mreply_hit(const char *reply, size_t n, struct mreply_item *it)
{
    memset(it, 0, sizeof *it);
    if (n < 3 || memcmp(reply, "VA ", 3)) return false;
    const char *nl = memchr(reply, '\n', n);
    if (nl == NULL) return false;
    const char *len = reply + 3, *e = len;
    while (e < nl && *e >= '0' && *e <= '9') e++;
    int64_t vlen, ttl;
    size_t nttl, nx;
    const char *t = mreply_flag(reply, nl, 't', &nttl);
    if (!mreply_num(len, (size_t)(e - len), &vlen) || t == NULL || !mreply_num(t, nttl, &ttl))
        return false;
    it->flags = mreply_flag(reply, nl, 'f', &it->nflags);
    it->cas = mreply_flag(reply, nl, 'c', &it->ncas);
    if (it->flags == NULL || it->nflags == 0 || it->cas == NULL || it->ncas == 0) return false;
    if (mreply_flag(reply, nl, 'X', &nx) || mreply_flag(reply, nl, 'W', &nx) ||
        mreply_flag(reply, nl, 'Z', &nx))
        return false;
    it->data = nl + 1;
    it->vlen = (size_t)vlen;
    if ((size_t)(it->data - reply) + it->vlen + 2 > n) return false;
    it->ttl = ttl;
    it->key = mreply_flag(reply, nl, 'k', &it->nkey);
    it->h = mreply_flag(reply, nl, 'h', &it->nh);
    it->l = mreply_flag(reply, nl, 'l', &it->nl);
    return true;
}

static int mreply_tok(struct buf *out, char letter, const char *tok, size_t ntok)
{
    char s[2] = {' ', letter};
    return buf_append(out, s, 2) < 0 || (ntok && buf_append(out, tok, ntok) < 0) ? -1 : 0;
}

int mreply_compose_mg(struct buf *out, const struct proto_req *req, const struct mreply_item *it,
                      int64_t touched)
{
    const struct proto_meta *m = &req->meta;
    bool value = proto_meta_has(m, 'v');
    int64_t ttl = it->ttl;
    int rc = value ? buf_printf(out, "VA %zu", it->vlen) : buf_append(out, "HD", 2);
    for (int i = 0; i < m->nflags && rc == 0; i++) {
        const struct proto_mflag *f = &m->flag[i];
        switch (f->flag) {
        case 'T': ttl = touched; break;
        case 's': rc = buf_printf(out, " s%zu", it->vlen); break;
        case 't': rc = buf_printf(out, " t%lld", (long long)ttl); break;
        case 'c': rc = mreply_tok(out, 'c', it->cas, it->ncas); break;
        case 'f': rc = mreply_tok(out, 'f', it->flags, it->nflags); break;
        case 'l': rc = it->l ? mreply_tok(out, 'l', it->l, it->nl) : 0; break;
        case 'h': rc = it->h ? mreply_tok(out, 'h', it->h, it->nh) : 0; break;
        case 'O': rc = mreply_tok(out, 'O', f->tok, f->ntok); break;
        case 'k':
            if (m->base64) {
                char enc[PROTO_KEY_MAX * 2];
                int k = proto_base64_encode(req->key, req->nkey, enc, sizeof enc);
                rc = mreply_tok(out, 'k', enc, k > 0 ? (size_t)k : 0) < 0 ||
                             buf_append(out, " b", 2) < 0
                         ? -1
                         : 0;
            } else {
                rc = mreply_tok(out, 'k', req->key, req->nkey);
            }
            break;
        default: break; /* v, q, u, b, N, R, E, ...: nothing in the reply line */
        }
    }
    if (rc == 0) rc = buf_append(out, "\r\n", 2);
    if (rc == 0 && value) rc = buf_append(out, it->data, it->vlen + 2);
    return rc < 0 ? -1 : 0;
}

int mreply_drop_flag(struct buf *out, const char *reply, size_t n, char letter)
{
    const char *nl = memchr(reply, '\n', n);
    const char *end = nl ? nl : reply + n;
    size_t ntok;
    const char *tok = mreply_flag(reply, end, letter, &ntok);
    if (tok == NULL) return buf_append(out, reply, n);
    const char *from = tok - 2; /* the space and the letter */
    const char *to = tok + ntok;
    if (buf_append(out, reply, (size_t)(from - reply)) < 0) return -1;
    return buf_append(out, to, n - (size_t)(to - reply));
}
