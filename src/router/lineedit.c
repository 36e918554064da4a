/* lineedit.c — TTL, q, noreply and insertion edits of request lines (see lineedit.h). */
#include "router/lineedit.h"

#include <stdio.h>

#include "router/policy.h"

bool ledit_token(const char *line, size_t len, int idx, const char **tok, size_t *ntok)
{
    const char *p = line, *end = line + len;
    if (end > p && end[-1] == '\r') end--; /* the terminator's; a \r before it is a key byte */
    for (int t = 0; p < end; t++) {
        while (p < end && *p == ' ') p++;
        const char *s = p;
        while (p < end && *p != ' ') p++;
        if (p == s) return false;
        if (t == idx) {
            *tok = s;
            *ntok = (size_t)(p - s);
            return true;
        }
    }
    return false;
}

struct ledit_cut ledit_append(const char *line, size_t len, const char *text, size_t ntext)
{
    const char *end = line + len;
    if (end > line && end[-1] == '\r') end--;
    while (end > line && end[-1] == ' ') end--;
    return (struct ledit_cut){end, end, text, ntext};
}

/* One edit: the token [tok, tok + ntok) carrying `ttl` (or, with ntok 0 and `flag`, an
 * insertion of that flag at tok), when the rules change it. */
static void ledit_one(struct ledit_ttl *e, const struct topo_ns *ns, uint64_t cap, int64_t now,
                      int64_t ttl, const char *tok, size_t ntok, char flag)
{
    int64_t to;
    if (e->n >= LEDIT_TTL_MAX || !policy_ttl_capped(ns, cap, ttl, now, &to)) return;
    char *num = e->num[e->n];
    int k = flag ? snprintf(num, sizeof e->num[0], " %c%lld", flag, (long long)to)
                 : snprintf(num, sizeof e->num[0], "%lld", (long long)to);
    e->cut[e->n++] = (struct ledit_cut){tok, tok + ntok, num, (size_t)k};
}

int ledit_ttl(const struct proto_req *req, const char *line, size_t len, const struct topo_ns *ns,
              uint64_t cap, int64_t now, struct ledit_ttl *e)
{
    e->n = 0;
    const char *tok;
    size_t ntok;
    int idx;
    switch (req->cmd) {
    case CMD_SET: case CMD_ADD: case CMD_REPLACE: case CMD_CAS: idx = 3; goto text;
    case CMD_TOUCH: idx = 2; goto text;
    case CMD_GAT: case CMD_GATS: idx = 1; goto text;
    text:
        if (ledit_token(line, len, idx, &tok, &ntok))
            ledit_one(e, ns, cap, now, req->exptime, tok, ntok, 0);
        return e->n;
    case CMD_MG: case CMD_MS: case CMD_MA: case CMD_MD:
        break;
    default:
        return 0;
    }
    const struct proto_meta *m = &req->meta;
    if (req->cmd == CMD_MD && !m->invalidate) return 0; /* md's T counts only with I */
    for (int i = 0; i < m->nflags; i++) { /* line order, so the cuts come sorted */
        const struct proto_mflag *f = &m->flag[i];
        if (f->flag == 'T') ledit_one(e, ns, cap, now, m->ttl, f->tok, f->ntok, 0);
        else if (f->flag == 'N' && req->cmd != CMD_MD)
            ledit_one(e, ns, cap, now, m->vivify, f->tok, f->ntok, 0);
    }
    if (req->cmd == CMD_MS && !proto_meta_has(m, 'T')) { /* ms without T: "never" */
        struct ledit_cut at = ledit_append(line, len, NULL, 0);
        ledit_one(e, ns, cap, now, 0, at.from, 0, 'T');
    }
    return e->n;
}

int ledit_copy(struct buf *out, const char *line, size_t len, const struct proto_req *req,
               bool strip_noreply, const char *drop, const struct ledit_cut *cuts, int ncuts)
{
    if (len && line[len - 1] == '\r') len--;
    while (len && line[len - 1] == ' ') len--;
    if (strip_noreply) {
        size_t k = len;
        while (k && line[k - 1] != ' ') k--;
        while (k && line[k - 1] == ' ') k--;
        len = k;
    }
    struct ledit_cut all[PROTO_META_FLAGS_MAX + 8];
    int n = 0;
    for (int i = 0; drop && i < req->meta.nflags; i++) {
        const struct proto_mflag *mf = &req->meta.flag[i];
        if (mf->flag == 0 || !strchr(drop, mf->flag)) continue;
        const char *from = mf->tok - 1; /* the letter, and the spaces before it */
        while (from > line && from[-1] == ' ') from--;
        all[n++] = (struct ledit_cut){from, mf->tok + mf->ntok, NULL, 0};
    }
    for (int i = 0; i < ncuts && n < (int)(sizeof all / sizeof all[0]); i++) {
        int k = n++; /* insertion sort, stable: cuts at one place keep their order */
        while (k > 0 && all[k - 1].from > cuts[i].from) {
            all[k] = all[k - 1];
            k--;
        }
        all[k] = cuts[i];
    }
    const char *p = line, *end = line + len;
    for (int i = 0; i < n; i++) {
        const char *from = all[i].from > end ? end : all[i].from;
        if (from < p) from = p;
        if (buf_append(out, p, (size_t)(from - p)) < 0 ||
            (all[i].ntext && buf_append(out, all[i].text, all[i].ntext) < 0))
            return -1;
        p = all[i].to > from ? (all[i].to > end ? end : all[i].to) : from;
    }
    if (buf_append(out, p, (size_t)(end - p)) < 0) return -1;
    return buf_append(out, "\r\n", 2);
}
