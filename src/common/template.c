/* template.c — key template parsing and evaluation (see template.h).
 *
 * A parsed template is a list of parts, each a literal (unescaped text) or a placeholder; all
 * strings live in one allocation after the struct. */
#include "common/template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct part {
    int ref;           /* -1: literal */
    const char *s;     /* literal text, or the column name */
    size_t n;
};

struct tmpl {
    char *text;
    char *ns;          /* NULL: not fixed */
    size_t nparts, nrefs;
    struct part *parts;
    const char **refs;
    char *pool;
};

void tmpl_free(struct tmpl **t)
{
    if (*t == NULL) return;
    free((*t)->text);
    free((*t)->ns);
    free((*t)->parts);
    free((*t)->refs);
    free((*t)->pool);
    free(*t);
    *t = NULL;
}

struct tmpl *tmpl_parse(const char *s, char *err, size_t errlen)
{
    size_t len = strlen(s);
    struct tmpl *t = calloc(1, sizeof *t);
    if (t == NULL) goto oom;
    t->text = strdup(s);
    /* at most one part per input byte plus one; the pool holds every unescaped byte and a NUL
     * after each part */
    t->parts = calloc(len + 1, sizeof *t->parts);
    t->refs = calloc(len + 1, sizeof *t->refs);
    t->pool = malloc(2 * len + 2);
    if (!t->text || !t->parts || !t->refs || !t->pool) goto oom;
    char *w = t->pool;
    size_t i = 0;
    while (i < len) {
        struct part *p = &t->parts[t->nparts];
        if (s[i] == '{' && s[i + 1] != '{') {
            const char *close = strchr(s + i + 1, '}');
            const char *open = strchr(s + i + 1, '{');
            if (close == NULL || (open && open < close)) {
                snprintf(err, errlen, "template \"%.200s\": the '{' at offset %zu is not closed",
                         s, i);
                goto fail;
            }
            size_t n = (size_t)(close - (s + i + 1));
            if (n == 0) {
                snprintf(err, errlen, "template \"%.200s\": empty placeholder at offset %zu", s,
                         i);
                goto fail;
            }
            p->ref = (int)t->nrefs;
            p->s = w;
            p->n = n;
            memcpy(w, s + i + 1, n);
            w[n] = 0;
            t->refs[t->nrefs++] = w;
            w += n + 1;
            i += n + 2;
            t->nparts++;
            continue;
        }
        /* a literal run up to the next lone brace */
        p->ref = -1;
        p->s = w;
        while (i < len) {
            if (s[i] == '{' && s[i + 1] == '{') {
                *w++ = '{';
                i += 2;
            } else if (s[i] == '}' && s[i + 1] == '}') {
                *w++ = '}';
                i += 2;
            } else if (s[i] == '}') {
                snprintf(err, errlen,
                         "template \"%.200s\": stray '}' at offset %zu (write }} for a brace)", s,
                         i);
                goto fail;
            } else if (s[i] == '{') {
                break;
            } else {
                *w++ = s[i++];
            }
        }
        p->n = (size_t)(w - p->s);
        *w++ = 0;
        t->nparts++;
    }
    if (t->nrefs == 0) {
        snprintf(err, errlen,
                 "template \"%.200s\" has no {column}: a constant key is not a template", s);
        goto fail;
    }
    /* the key's namespace is its text before the first ':'; fixed only when a literal that
     * holds a ':' comes before any placeholder (a value may hold ':' itself) */
    if (t->parts[0].ref < 0) {
        const char *colon = memchr(t->parts[0].s, ':', t->parts[0].n);
        if (colon) {
            t->ns = strndup(t->parts[0].s, (size_t)(colon - t->parts[0].s));
            if (t->ns == NULL) goto oom;
        }
    }
    return t;
oom:
    snprintf(err, errlen, "out of memory parsing template");
fail:
    tmpl_free(&t);
    return NULL;
}

const char *tmpl_text(const struct tmpl *t) { return t->text; }
size_t tmpl_nrefs(const struct tmpl *t) { return t->nrefs; }
const char *tmpl_ref(const struct tmpl *t, size_t i) { return i < t->nrefs ? t->refs[i] : NULL; }
const char *tmpl_namespace(const struct tmpl *t) { return t->ns; }

int tmpl_eval(const struct tmpl *t, const struct tmpl_val *vals, char *out, size_t cap)
{
    size_t len = 0;
    if (cap > TMPL_KEY_MAX) cap = TMPL_KEY_MAX;
    for (size_t i = 0; i < t->nparts; i++) {
        const struct part *p = &t->parts[i];
        const char *s = p->s;
        size_t n = p->n;
        if (p->ref >= 0) {
            const struct tmpl_val *v = &vals[p->ref];
            if (v->null) return TMPL_NULL;
            s = v->p;
            n = v->n;
        }
        if (n > cap - len) return TMPL_TOO_LONG;
        for (size_t j = 0; j < n; j++) {
            unsigned char ch = (unsigned char)s[j];
            if (ch <= ' ' || ch == 0x7f) return TMPL_BAD_BYTE;
        }
        memcpy(out + len, s, n);
        len += n;
    }
    return (int)len;
}
