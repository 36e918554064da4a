/* promote.h — promotions between two versions of the topology document (FAILOVER.md C1).
 *
 * A slot of a pool was promoted when its `node` in the new document was its `replica` in the
 * old one, unless its new `replica` is its old `node`: that swap is a drain (C5), published
 * only once the handoff found no lag, so nothing can have been lost and nothing is replayed
 * (a replay would delete values set after the deletes it sends again). Every reader of the document (shoal-router, shoal-invalidator, the nodes) finds
 * promotions by comparing the document it used with the one it is about to use, so control
 * needs to announce nothing: after a promotion the readers replay their recent deletes of those
 * slots to the new primary (asynchronous replication may have lost some). */
#ifndef SHOAL_COMMON_PROMOTE_H
#define SHOAL_COMMON_PROMOTE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* The slots promoted from old_doc to new_doc, ascending and each once, into slots_out (room
 * for SLOT_COUNT entries); returns how many. Only pools present in both documents with an
 * explicit "slots" map in both count; `pool` (NULL: every pool) limits it to one. Pure: reads
 * the documents only; a malformed document or range is skipped as far as it is malformed
 * (callers pass documents they have already validated). NULL documents give 0. */
size_t promote_diff(json_t *old_doc, json_t *new_doc, const char *pool, uint16_t *slots_out);

#endif
