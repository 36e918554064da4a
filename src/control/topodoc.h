/* topodoc.h — one version's topology document as served: rendered once when the version is
 * made, compressed (gzip) at most once, when a follower that accepts gzip first asks for it,
 * and shared by every answer of that version without a copy. A follower that asks for version
 * V gets this text; nothing is rendered per request.
 *
 * Reference counted: control holds one for the current version, each answer being sent holds
 * one, so a new version can replace it while older answers are still going out. */
#ifndef SHOAL_CONTROL_TOPODOC_H
#define SHOAL_CONTROL_TOPODOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct admin_held;
struct topo_doc;

/* A document of `version` holding `text` (malloc'd, len bytes; taken over). One reference.
 * NULL on memory (text is freed). */
struct topo_doc *topo_doc_new(char *text, size_t len, uint64_t version);
struct topo_doc *topo_doc_ref(struct topo_doc *d);
void topo_doc_unref(struct topo_doc *d);
const char *topo_doc_text(const struct topo_doc *d, size_t *len);
uint64_t topo_doc_version(const struct topo_doc *d);

/* Whether an Accept-Encoding header value admits gzip. */
bool topo_doc_gzip_accepted(const char *accept_encoding);
/* Answer held request `h` 200 with the document (gzip'd when `gzip` and compression works),
 * with an X-Shoal-Version header; the answer holds its own reference. Any thread; may
 * compress, so not under control's lock. */
void topo_doc_answer(struct topo_doc *d, struct admin_held *h, bool gzip);

#endif
