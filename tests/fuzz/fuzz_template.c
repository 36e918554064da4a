/* fuzz_template.c — libFuzzer target for key templates (template.c).
 *
 * The input up to its first NUL is a template; the bytes after it are the values, split at
 * each 0x01 (a missing value is NULL). Any template must parse or be refused with a message;
 * a parsed one must evaluate to a key within memcached's rules (at most 250 bytes, no space or
 * control byte) or to one of the TMPL_* codes; never a crash, an over-read or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    char *text = malloc(tlen + 1);
    if (text == NULL) return 0;
    memcpy(text, data, tlen);
    text[tlen] = 0;
    char err[300];
    err[0] = 0;
    struct tmpl *t = tmpl_parse(text, err, sizeof err);
    if (t == NULL) {
        if (err[0] == 0) __builtin_trap();
        free(text);
        return 0;
    }
    if (strcmp(tmpl_text(t), text) != 0 || tmpl_nrefs(t) == 0) __builtin_trap();
    size_t n = tmpl_nrefs(t);
    struct tmpl_val *v = calloc(n, sizeof *v);
    const char *p = nul ? (const char *)nul + 1 : "";
    const char *end = (const char *)data + size;
    if (!nul) end = p;
    for (size_t i = 0; v && i < n; i++) {
        if (tmpl_ref(t, i) == NULL || tmpl_ref(t, i)[0] == 0) __builtin_trap();
        if (p >= end) {
            v[i].null = 1;
            continue;
        }
        const char *sep = memchr(p, 1, (size_t)(end - p));
        v[i].p = p;
        v[i].n = (size_t)((sep ? sep : end) - p);
        p = sep ? sep + 1 : end;
    }
    char out[TMPL_KEY_MAX];
    int k = v ? tmpl_eval(t, v, out, sizeof out) : 0;
    if (k > TMPL_KEY_MAX || (k < 0 && k != TMPL_NULL && k != TMPL_TOO_LONG && k != TMPL_BAD_BYTE))
        __builtin_trap();
    for (int i = 0; i < k; i++)
        if ((unsigned char)out[i] <= ' ' || out[i] == 0x7f) __builtin_trap();
    if (k > 0 && tmpl_namespace(t)) {
        size_t nl = strlen(tmpl_namespace(t));
        if ((size_t)k <= nl || memcmp(out, tmpl_namespace(t), nl) || out[nl] != ':')
            __builtin_trap(); /* the fixed namespace is the key's text before its first ':' */
    }
    free(v);
    tmpl_free(&t);
    free(text);
    return 0;
}
