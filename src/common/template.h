/* template.h — key templates: "catalog:product:{id}" turns a row into the cache key its value
 * is stored under. shoal-invalidator evaluates them; they live in common code because
 * shoal-control and shoal-router check the templates of a namespace's `invalidation` field
 * (common/nsfields.h) with this same parser.
 *
 * Syntax: literal text with {column} placeholders; "{{" and "}}" stand for one brace. A column
 * name is any non-empty text without braces (PostgreSQL's name as pgoutput sends it, so a
 * quoted "Mixed Case" column is written {Mixed Case}). Pure code: parsing allocates once;
 * evaluation writes into the caller's buffer. */
#ifndef SHOAL_COMMON_TEMPLATE_H
#define SHOAL_COMMON_TEMPLATE_H

#include <stddef.h>

/* memcached's longest key */
#define TMPL_KEY_MAX 250

struct tmpl;

/* Parse `s`. Returns NULL with the reason (naming the offset) in err: an unclosed or stray
 * brace, an empty placeholder, no placeholder at all (a constant key is refused: it would be
 * deleted on every change to the table, which is what a namespace flush is for), or out of
 * memory. */
struct tmpl *tmpl_parse(const char *s, char *err, size_t errlen);
void tmpl_free(struct tmpl **t);

/* The template's text as given. */
const char *tmpl_text(const struct tmpl *t);
/* Placeholders in order of appearance (a column used twice counts twice). */
size_t tmpl_nrefs(const struct tmpl *t);
const char *tmpl_ref(const struct tmpl *t, size_t i);
/* The key's namespace when the template fixes it (the literal text before the first ':'), or
 * NULL when a placeholder may come before the first ':'. */
const char *tmpl_namespace(const struct tmpl *t);

/* A column value for evaluation; `null` set for SQL NULL. */
struct tmpl_val {
    const char *p;
    size_t n;
    int null;
};

#define TMPL_NULL (-1)    /* a placeholder's column is NULL: the row has no key */
#define TMPL_TOO_LONG (-2) /* the key would pass TMPL_KEY_MAX (or cap) */
#define TMPL_BAD_BYTE (-3) /* the key would hold a space or control byte memcached refuses */

/* Write the key for `vals` (vals[i] is placeholder i's column) into out (cap bytes). Returns
 * its length, or one of the TMPL_* codes. */
int tmpl_eval(const struct tmpl *t, const struct tmpl_val *vals, char *out, size_t cap);

#endif
