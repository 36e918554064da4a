/* replaycut.h — where the replay of recent deletes after a promotion starts (dellog.h).
 *
 * A replica stamps how far it applied each primary's stream with that primary's wall clock
 * (`stats repl`: primary:<i>:applied_wall_ms, docs/protocol.md "Replication"): every record
 * the primary appended before that time is applied. A delete the router logged before the
 * stamp (less --replay-margin-ms for clock skew between the hosts) reached the dead primary
 * before it appended the stamp's records, so the new primary has it, and sending it again
 * would only delete values set since. The applier of the topology asks each new primary,
 * before the workers replay; no answer means the whole window is replayed (safe). */
#ifndef SHOAL_ROUTER_REPLAYCUT_H
#define SHOAL_ROUTER_REPLAYCUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* From a `stats repl` reply, the applied_wall_ms of primary `primary`: 0 with *wall_ms, -1 when
 * the reply does not name it or has no (or a zero) stamp for it. */
int replaycut_parse(const char *reply, size_t len, const char *primary, uint64_t *wall_ms);

/* Ask node `addr` (host:port, its data port) `stats repl` and parse its stamp for `primary`,
 * waiting at most timeout_ms in all (a blocking socket: never on a worker). 0 or -1 (with
 * *why). */
int replaycut_query(const char *addr, const char *primary, int timeout_ms, uint64_t *wall_ms,
                    const char **why);

/* The replay's start in the workers' clock (CLOCK_MONOTONIC ms) for a new primary whose stamp
 * is `applied_wall_ms` (known=false: none), the clocks read now being now_wall_ms and
 * now_mono_ms: the stamp less margin_ms, moved onto the monotonic clock. 0 means the whole
 * window (the caller never starts before the window's own start). */
uint64_t replaycut_since(bool known, uint64_t applied_wall_ms, uint64_t margin_ms,
                         uint64_t now_wall_ms, uint64_t now_mono_ms);

/* The promotion's pairs: for each promoted slot slots[i] (promote_diff's list), its dead
 * primary (old `node`) and new primary (new `node`) as group[i], an index into the pairs it
 * fills (old[k], now[k]: pointers into the documents, at most maxpairs), or REPLAYCUT_UNKNOWN
 * (more pairs than room, or the slot moved in two pools). Returns the number of pairs. */
#define REPLAYCUT_UNKNOWN 255
size_t replaycut_pairs(json_t *old_doc, json_t *new_doc, const uint16_t *slots, size_t n,
                       uint8_t *group, const char **old, const char **now, size_t maxpairs);

#endif
