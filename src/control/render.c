/* render.c — the topology document and the state text, one namespace's text rendered again
 * only when its value changed (see render.h). */
#include "control/render.h"

#include <stdlib.h>
#include <string.h>

#include "control/model.h"

struct render {
    json_t *cache;   /* namespace name -> [its value as rendered (a reference), "\"name\":{...}"] */
    json_t *nss;     /* the namespaces object whose text is `text` (a reference), or NULL */
    char *text;      /* "{...}" of nss */
    size_t len;
};

struct render *render_create(void)
{
    struct render *r = calloc(1, sizeof *r);
    if (r && (r->cache = json_object()) == NULL) {
        free(r);
        r = NULL;
    }
    return r;
}

void render_destroy(struct render **rp)
{
    struct render *r = *rp;
    if (r == NULL) return;
    json_decref(r->cache);
    json_decref(r->nss);
    free(r->text);
    free(r);
    *rp = NULL;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One namespace's "\"name\":{...}", from the cache when `v` is the value rendered there. */
static json_t *fragment(struct render *r, const char *name, json_t *v)
{
    json_t *e = json_object_get(r->cache, name);
    if (e && json_array_get(e, 0) == v) return json_array_get(e, 1);
    char *body = json_dumps(v, JSON_SORT_KEYS | JSON_COMPACT);
    if (body == NULL) return NULL;
    /* names are letters, digits, '_', '-' and '.' (model_check): nothing to escape */
    size_t nl = strlen(name), bl = strlen(body);
    char *f = malloc(nl + bl + 4);
    json_t *s = NULL;
    if (f) {
        f[0] = '"';
        memcpy(f + 1, name, nl);
        memcpy(f + 1 + nl, "\":", 2);
        memcpy(f + 3 + nl, body, bl);
        s = json_stringn_nocheck(f, nl + bl + 3);
        free(f);
    }
    free(body);
    e = s ? json_pack("[O,o]", v, s) : NULL;
    if (e == NULL || json_object_set_new(r->cache, name, e) < 0) return NULL;
    return s;
}

/* Make r->text the text of m's namespaces object. 0, or -1 on memory. */
static int namespaces_text(struct render *r, const json_t *m)
{
    json_t *nss = json_object_get(m, "namespaces");
    if (nss == r->nss && r->text) return 0;
    size_t n = json_object_size(nss), i = 0, total = 2;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    json_t **frags = malloc((n ? n : 1) * sizeof *frags);
    int rc = -1;
    char *text = NULL;
    if (names == NULL || frags == NULL) goto out;
    const char *k;
    json_t *v;
    json_object_foreach(nss, k, v) names[i++] = k;
    qsort(names, n, sizeof *names, cmp_name);
    for (i = 0; i < n; i++) {
        if ((frags[i] = fragment(r, names[i], json_object_get(nss, names[i]))) == NULL) goto out;
        total += json_string_length(frags[i]) + 1;
    }
    if ((text = malloc(total + 1)) == NULL) goto out;
    char *p = text;
    *p++ = '{';
    for (i = 0; i < n; i++) {
        if (i) *p++ = ',';
        size_t l = json_string_length(frags[i]);
        memcpy(p, json_string_value(frags[i]), l);
        p += l;
    }
    *p++ = '}';
    *p = 0;
    /* forget namespaces that are gone, so the cache holds no value the model does not */
    if (json_object_size(r->cache) > n) {
        void *tmp;
        json_object_foreach_safe(r->cache, tmp, k, v)
            if (json_object_get(nss, k) != json_array_get(v, 0)) json_object_del(r->cache, k);
    }
    free(r->text);
    json_decref(r->nss);
    r->text = text;
    r->len = (size_t)(p - text);
    r->nss = json_incref(nss);
    text = NULL;
    rc = 0;
out:
    free(text);
    free(names);
    free(frags);
    return rc;
}

/* `frame` dumped, with its "namespaces":0 replaced by the namespaces' text. */
static char *splice(struct render *r, json_t *frame, const char *end, size_t *len)
{
    char *s = frame ? json_dumps(frame, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(frame);
    if (s == NULL) return NULL;
    /* the first one is the top level's: only strings and integers sort before it */
    static const char key[] = "\"namespaces\":0";
    char *at = strstr(s, key);
    if (at == NULL) {
        free(s);
        return NULL;
    }
    size_t head = (size_t)(at - s) + sizeof key - 2, tail = strlen(at + sizeof key - 1),
           el = strlen(end);
    char *out = malloc(head + r->len + tail + el + 1);
    if (out) {
        memcpy(out, s, head);
        memcpy(out + head, r->text, r->len);
        memcpy(out + head + r->len, at + sizeof key - 1, tail);
        memcpy(out + head + r->len + tail, end, el + 1);
        *len = head + r->len + tail + el;
    }
    free(s);
    return out;
}

char *render_topology(struct render *r, const json_t *m, size_t *len)
{
    if (namespaces_text(r, m) < 0) return NULL;
    json_t *frame = model_topology_frame(m);
    if (frame && json_object_set_new(frame, "namespaces", json_integer(0)) < 0) {
        json_decref(frame);
        return NULL;
    }
    return splice(r, frame, "\n", len);
}

char *render_state(struct render *r, const json_t *m, size_t *len)
{
    if (namespaces_text(r, m) < 0) return NULL;
    json_t *frame = json_copy((json_t *)m); /* shallow: only its own top level changes */
    if (frame && json_object_set_new(frame, "namespaces", json_integer(0)) < 0) {
        json_decref(frame);
        return NULL;
    }
    return splice(r, frame, "", len);
}
