/* longget.c — get/gets/gat/gats lines over the line limit, taken in parts (see longget.h). */
#include "protocol/longget.h"

#include <stddef.h>
#include <string.h>

#include "protocol/parse_internal.h"

/* memcached looks past at most this many leading spaces for a long line's get verb */
#define LGET_LEAD_MAX 100

static const char e_exptime[] = "CLIENT_ERROR invalid exptime argument";

size_t lget_start(struct lget *g, const char *p, size_t n, const char **err)
{
    const char *end = p + n;
    const char *verb = proto_skip_spaces(p, end);
    if (verb - p > LGET_LEAD_MAX) return 0;
    const char *sp = proto_tok_end(verb, end);
    if (sp == end) return 0;
    enum proto_cmd cmd = proto_command(verb, (size_t)(sp - verb));
    if (cmd != CMD_GET && cmd != CMD_GETS && cmd != CMD_GAT && cmd != CMD_GATS) return 0;
    *g = (struct lget){.cmd = cmd};
    const char *q = sp;
    if (cmd == CMD_GAT || cmd == CMD_GATS) {
        const char *t = proto_skip_spaces(q, end);
        if (t == end) return 0; /* spaces to the end: nothing says what it is */
        q = proto_tok_end(t, end);
        if (q == end || !proto_parse_i64(t, (size_t)(q - t), &g->exptime)) {
            *err = e_exptime;
            g->skip = true;
        }
    }
    return (size_t)(q - p);
}

enum lget_step lget_next(struct lget *g, const char *p, size_t n, size_t max, const char **keys,
                         const char **keys_end, size_t *used, const char **err)
{
    *keys = *keys_end = p;
    if (g->skip) { /* drop up to the newline */
        const char *nl = memchr(p, '\n', n);
        *used = nl ? (size_t)(nl - p) + 1 : n;
        return nl ? LGET_LAST : LGET_PART;
    }
    size_t win = n < max ? n : max;
    const char *nl = memchr(p, '\n', win);
    const char *end;
    if (nl) {
        end = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
        *used = (size_t)(nl - p) + 1;
    } else {
        const char *wend = p + win, *first = proto_skip_spaces(p, wend);
        const char *last = first < wend ? memrchr(first, ' ', (size_t)(wend - first)) : wend;
        /* a key of PROTO_KEY_MAX bytes may stand before a \r whose \n is still to come */
        ptrdiff_t room = PROTO_KEY_MAX + (wend > first && wend[-1] == '\r');
        if (last != NULL) end = last;               /* complete keys up to the last space */
        else if (wend - first > room) end = wend;   /* too long to be a key: fails */
        else if (first > p) end = first;            /* only leading spaces go now */
        else return LGET_WAIT;                      /* one key, still arriving */
        *used = (size_t)(end - p);
    }
    if (!proto_keys_valid(p, end)) {
        *err = PROTO_E_BADFMT;
        g->skip = true;
        return LGET_BAD;
    }
    *keys = p;
    *keys_end = end;
    if (proto_skip_spaces(p, end) < end) g->any = true;
    return nl ? LGET_LAST : LGET_PART;
}

const char *lget_end_reply(const struct lget *g)
{
    if (g->skip) return NULL;
    if (!g->any && (g->cmd == CMD_GET || g->cmd == CMD_GETS)) return "ERROR\r\n";
    return "END\r\n";
}
