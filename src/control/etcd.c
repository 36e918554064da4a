/* etcd.c — the etcd v3 JSON gateway client of etcd.h. */
#include "control/etcd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/httpc.h"

#define ETCD_MEMBERS_MAX 16

struct etcd {
    struct httpc *h;
    char *urls[ETCD_MEMBERS_MAX];
    size_t n, cur; /* cur: the member that answered last */
    unsigned timeout_ms;
};

struct etcd *etcd_create(const char *endpoints, unsigned timeout_ms, char *err, size_t errlen)
{
    struct etcd *e = calloc(1, sizeof *e);
    if (e == NULL || (e->h = httpc_create(0)) == NULL) {
        free(e);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    e->timeout_ms = timeout_ms;
    const char *p = endpoints;
    while (*p) {
        size_t len = strcspn(p, ",");
        while (len > 0 && (p[len - 1] == '/' || p[len - 1] == ' ')) len--;
        while (len > 0 && *p == ' ') p++, len--;
        if (len > 0) {
            if (e->n == ETCD_MEMBERS_MAX) {
                snprintf(err, errlen, "--etcd: at most %d URLs", ETCD_MEMBERS_MAX);
                etcd_destroy(&e);
                return NULL;
            }
            bool scheme = strstr(p, "://") && (size_t)(strstr(p, "://") - p) < len;
            if (asprintf(&e->urls[e->n], "%s%.*s", scheme ? "" : "http://", (int)len, p) < 0) {
                e->urls[e->n] = NULL;
                snprintf(err, errlen, "out of memory");
                etcd_destroy(&e);
                return NULL;
            }
            e->n++;
        }
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    if (e->n == 0) {
        snprintf(err, errlen, "--etcd needs at least one URL (http://host:2379[,...])");
        etcd_destroy(&e);
        return NULL;
    }
    return e;
}

void etcd_destroy(struct etcd **ep)
{
    struct etcd *e = *ep;
    if (e == NULL) return;
    for (size_t i = 0; i < e->n; i++) free(e->urls[i]);
    httpc_destroy(&e->h);
    free(e);
    *ep = NULL;
}

void etcd_cancel(struct etcd *e) { httpc_cancel(e->h); }
void etcd_uncancel(struct etcd *e) { httpc_uncancel(e->h); }

int etcd_call(struct etcd *e, const char *path, const json_t *req, json_t **out, char *err,
              size_t errlen)
{
    *out = NULL;
    char *body = json_dumps(req, JSON_COMPACT);
    if (body == NULL) return snprintf(err, errlen, "out of memory"), -1;
    struct httpc_reply r;
    httpc_reply_init(&r);
    int rc = -1;
    err[0] = 0;
    /* members in turn, round after round, until one answers or the budget is spent: a member
     * that lost its raft leader stalls until the others elect one (a second or two), which a
     * change should ride out rather than fail */
    uint64_t start = clock_mono_ms(), budget = (uint64_t)e->timeout_ms * 3;
    for (size_t k = 0; rc < 0 && !httpc_cancelled(e->h); k++) {
        if (k > 0 && k % e->n == 0) {
            if (clock_mono_ms() - start >= budget) break;
            struct timespec pause = {0, 50 * 1000000L};
            nanosleep(&pause, NULL);
        }
        if (k >= e->n && clock_mono_ms() - start >= budget) break;
        size_t i = (e->cur + k) % e->n;
        char url[512], why[300];
        snprintf(url, sizeof url, "%s%s", e->urls[i], path);
        if (httpc_request(e->h, "POST", url, body, strlen(body), e->timeout_ms, &r, why,
                          sizeof why) < 0) {
            snprintf(err, errlen, "%s", why);
            continue;
        }
        if (r.status != 200) {
            /* the body is not NUL-terminated: at most its own length */
            int shown = buf_used(&r.body) < 200 ? (int)buf_used(&r.body) : 200;
            snprintf(err, errlen, "etcd %s answered %ld: %.*s", url, r.status, shown,
                     shown ? buf_start(&r.body) : "");
            /* 4xx: the request itself is wrong, another member would say the same */
            if (r.status >= 400 && r.status < 500 && r.status != 408 && r.status != 429) break;
            continue;
        }
        json_error_t je;
        json_t *o = json_loadb(buf_start(&r.body), buf_used(&r.body), 0, &je);
        if (o == NULL) {
            snprintf(err, errlen, "etcd %s: reply is not JSON: %s", url, je.text);
            continue;
        }
        e->cur = i;
        *out = o;
        rc = 0;
    }
    httpc_reply_release(&r);
    free(body);
    return rc;
}

/* ---- base64 (keys and values are bytes in etcd's protobuf, base64 in its JSON) ----------- */

static const char b64chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json_t *etcd_b64(const char *p, size_t n)
{
    size_t outlen = (n + 2) / 3 * 4;
    char *s = malloc(outlen + 1);
    if (s == NULL) return NULL;
    const unsigned char *u = (const unsigned char *)p;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)u[i] << 16;
        if (i + 1 < n) v |= (uint32_t)u[i + 1] << 8;
        if (i + 2 < n) v |= u[i + 2];
        s[o++] = b64chars[(v >> 18) & 63];
        s[o++] = b64chars[(v >> 12) & 63];
        s[o++] = i + 1 < n ? b64chars[(v >> 6) & 63] : '=';
        s[o++] = i + 2 < n ? b64chars[v & 63] : '=';
    }
    json_t *j = json_stringn(s, o);
    free(s);
    return j;
}

static int b64val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

/* Decode s (len bytes) into a new NUL-terminated buffer. NULL when invalid or out of memory. */
static char *unb64(const char *s, size_t len, size_t *outlen)
{
    char *out = malloc(len / 4 * 3 + 4);
    if (out == NULL) return NULL;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '=') break;
        int v = b64val((unsigned char)s[i]);
        if (v < 0) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[o] = 0;
    *outlen = o;
    return out;
}

json_t *etcd_i64(int64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%" PRId64, v);
    return json_string(s);
}

int64_t etcd_int(const json_t *v)
{
    if (json_is_integer(v)) return (int64_t)json_integer_value(v);
    if (json_is_string(v)) return strtoll(json_string_value(v), NULL, 10);
    return 0;
}

int64_t etcd_revision(const json_t *reply)
{
    return etcd_int(json_object_get(json_object_get(reply, "header"), "revision"));
}

void etcd_kv_release(struct etcd_kv *kv)
{
    free(kv->value);
    memset(kv, 0, sizeof *kv);
}

int etcd_kv_from(const json_t *range_reply, size_t i, struct etcd_kv *kv)
{
    memset(kv, 0, sizeof *kv);
    const json_t *o = json_array_get(json_object_get(range_reply, "kvs"), i);
    if (o == NULL) return 0;
    kv->exists = true;
    kv->create_rev = etcd_int(json_object_get(o, "create_revision"));
    kv->mod_rev = etcd_int(json_object_get(o, "mod_revision"));
    kv->lease = etcd_int(json_object_get(o, "lease"));
    const json_t *v = json_object_get(o, "value");
    if (v == NULL) return 0;
    kv->value = unb64(json_string_value(v), json_string_length(v), &kv->len);
    return kv->value ? 0 : -1;
}

int etcd_get(struct etcd *e, const char *key, bool keys_only, struct etcd_kv *kv, char *err,
             size_t errlen)
{
    memset(kv, 0, sizeof *kv);
    json_t *req = json_pack("{s:o,s:b}", "key", etcd_b64(key, strlen(key)), "keys_only",
                            keys_only);
    json_t *rep = NULL;
    int rc = req ? etcd_call(e, "/v3/kv/range", req, &rep, err, errlen)
                 : (snprintf(err, errlen, "out of memory"), -1);
    if (rc == 0 && etcd_kv_from(rep, 0, kv) < 0) {
        snprintf(err, errlen, "etcd key %s: value is not base64, or out of memory", key);
        rc = -1;
    }
    json_decref(req);
    json_decref(rep);
    return rc;
}

int etcd_lease_grant(struct etcd *e, unsigned ttl, int64_t *id, char *err, size_t errlen)
{
    json_t *req = json_pack("{s:i}", "TTL", (int)ttl), *rep = NULL;
    int rc = req ? etcd_call(e, "/v3/lease/grant", req, &rep, err, errlen) : -1;
    if (rc == 0) {
        *id = etcd_int(json_object_get(rep, "ID"));
        if (*id == 0) {
            snprintf(err, errlen, "etcd granted no lease: %.200s",
                     json_string_value(json_object_get(rep, "error")) ?: "no ID in the reply");
            rc = -1;
        }
    }
    json_decref(req);
    json_decref(rep);
    return rc;
}

int etcd_lease_keepalive(struct etcd *e, int64_t id, int64_t *ttl_left, char *err, size_t errlen)
{
    json_t *req = json_pack("{s:o}", "ID", etcd_i64(id)), *rep = NULL;
    int rc = req ? etcd_call(e, "/v3/lease/keepalive", req, &rep, err, errlen) : -1;
    if (rc == 0) {
        /* the gateway streams results: one {"result": {...}} per request sent */
        const json_t *res = json_object_get(rep, "result");
        if (res == NULL) {
            snprintf(err, errlen, "etcd keepalive: unexpected reply");
            rc = -1;
        } else {
            *ttl_left = etcd_int(json_object_get(res, "TTL"));
        }
    }
    json_decref(req);
    json_decref(rep);
    return rc;
}

int etcd_lease_revoke(struct etcd *e, int64_t id, char *err, size_t errlen)
{
    json_t *req = json_pack("{s:o}", "ID", etcd_i64(id)), *rep = NULL;
    int rc = req ? etcd_call(e, "/v3/lease/revoke", req, &rep, err, errlen) : -1;
    json_decref(req);
    json_decref(rep);
    return rc;
}
