/* tune.c — memcached's tuning commands (slabs, lru, lru_crawler, watch), answered as memcached
 * 1.6.18 answers them, for node and router alike.
 *
 * These adjust memcached internals shoal does not have (slab automove, segmented LRU, the
 * crawler thread) or stream its log (watch). What they would change has no meaning here, so a
 * well-formed request that memcached accepts is accepted and ignored ("OK"), malformed ones get
 * memcached's exact error, and the two that cannot be honoured at all get the error memcached
 * gives when they are disabled: `slabs reassign` ("slab reassignment disabled") and `watch`
 * ("watch commands not allowed"). docs/protocol.md lists each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/parse_internal.h"
#include "protocol/protocol.h"

#define TUNE_TOKENS 8

struct targs {
    size_t n; /* tokens after the command */
    const char *p[TUNE_TOKENS];
    size_t len[TUNE_TOKENS];
};

static void targs_split(const struct proto_req *req, struct targs *a)
{
    a->n = 0;
    const char *p = req->arg, *end = req->arg ? req->arg + req->narg : NULL;
    while (p && p < end && a->n < TUNE_TOKENS) {
        p = proto_skip_spaces(p, end);
        if (p == end) break;
        const char *e = proto_tok_end(p, end);
        a->p[a->n] = p;
        a->len[a->n++] = (size_t)(e - p);
        p = e;
    }
}

static bool targ_is(const struct targs *a, size_t i, const char *word)
{
    return i < a->n && a->len[i] == strlen(word) && memcmp(a->p[i], word, a->len[i]) == 0;
}

/* memcached's set_noreply_maybe: the last token is "noreply" */
static bool targ_noreply(const struct targs *a)
{
    return a->n > 0 && targ_is(a, a->n - 1, "noreply");
}

/* strtod as memcached's safe_strtod reads it: a number, then the end or white space. */
static bool targ_double(const struct targs *a, size_t i, double *out)
{
    char buf[64];
    if (i >= a->n || a->len[i] >= sizeof buf) return false;
    memcpy(buf, a->p[i], a->len[i]);
    buf[a->len[i]] = '\0';
    char *e;
    *out = strtod(buf, &e);
    return e != buf && (*e == '\0' || *e == ' ' || (*e >= '\t' && *e <= '\r'));
}

static const char *tune_slabs(const struct targs *a, bool *silent)
{
    if (a->n == 3 && targ_is(a, 0, "reassign")) return "CLIENT_ERROR slab reassignment disabled";
    if (a->n < 2 || !targ_is(a, 0, "automove")) return "ERROR";
    *silent = targ_noreply(a);
    if (targ_is(a, 1, "ratio")) {
        double r;
        return a->n >= 3 && targ_double(a, 2, &r) ? "OK" : "ERROR";
    }
    uint32_t level;
    if (!proto_mc_u32(a->p[1], a->len[1], &level)) return PROTO_E_BADFMT;
    return level <= 2 ? "OK" : "ERROR";
}

/* memcached's class list for a crawl: "all", or ids 1..63 separated by commas */
static bool crawl_classes_ok(const char *p, size_t n)
{
    if (n == 3 && memcmp(p, "all", 3) == 0) return true;
    for (const char *end = p + n; p < end;) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        const char *e = c ? c : end;
        uint32_t id;
        if (e > p && (!proto_mc_u32(p, (size_t)(e - p), &id) || id < 1 || id > 63)) return false;
        p = c ? c + 1 : end;
    }
    return true;
}

static const char *tune_lru_crawler(const struct targs *a)
{
    uint32_t v;
    if (a->n == 2 && targ_is(a, 0, "crawl"))
        return crawl_classes_ok(a->p[1], a->len[1]) ? "OK" : "BADCLASS invalid class id";
    if (a->n == 2 && targ_is(a, 0, "tocrawl"))
        return proto_mc_u32(a->p[1], a->len[1], &v) ? "OK" : PROTO_E_BADFMT;
    if (a->n == 2 && targ_is(a, 0, "sleep")) {
        if (!proto_mc_u32(a->p[1], a->len[1], &v)) return PROTO_E_BADFMT;
        return v > 1000000 ? "CLIENT_ERROR sleep must be one second or less" : "OK";
    }
    /* a router has no crawler: it answers as memcached does while its crawler runs (a node
     * answers these itself, with its own state) */
    if (a->n == 1 && targ_is(a, 0, "enable")) return "ERROR failed to start lru crawler thread";
    if (a->n == 1 && targ_is(a, 0, "disable")) return "OK";
    /* metadump never comes here: node and router dump keys themselves */
    return "ERROR";
}

static const char *tune_lru(const struct targs *a, bool *silent)
{
    if (a->n == 0) return "ERROR";
    *silent = targ_noreply(a);
    if (targ_is(a, 0, "tune") && a->n >= 5) {
        uint32_t hot, warm;
        double hot_factor, factor;
        if (!proto_mc_u32(a->p[1], a->len[1], &hot) || !proto_mc_u32(a->p[2], a->len[2], &warm) ||
            !targ_double(a, 3, &hot_factor) || !targ_double(a, 4, &factor))
            return "ERROR";
        if ((uint32_t)(hot + warm) > 80) return "ERROR hot and warm pcts must not exceed 80";
        if (factor <= 0 || hot_factor <= 0)
            return "ERROR hot/warm age factors must be greater than 0";
        return "OK";
    }
    if (targ_is(a, 0, "mode") && a->n >= 2)
        return targ_is(a, 1, "flat") || targ_is(a, 1, "segmented") ? "OK" : "ERROR";
    if (targ_is(a, 0, "temp_ttl") && a->n >= 2) {
        int32_t ttl;
        return proto_mc_i32(a->p[1], a->len[1], &ttl) ? "OK" : "ERROR";
    }
    return "ERROR";
}

const char *proto_tune_reply(const struct proto_req *req, bool *silent)
{
    struct targs a;
    targs_split(req, &a);
    *silent = false;
    switch (req->cmd) {
    case CMD_SLABS: return tune_slabs(&a, silent);
    case CMD_LRU_CRAWLER: return tune_lru_crawler(&a);
    case CMD_LRU: return tune_lru(&a, silent);
    case CMD_WATCH:
        *silent = targ_noreply(&a);
        return "CLIENT_ERROR watch commands not allowed";
    default: return "ERROR";
    }
}
