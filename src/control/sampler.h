/* sampler.h — the dashboard's figures: every --stats-interval-ms, shoal-control reads the
 * /metrics of every node that has an admin address (common/httpc, common/nodefigs) and keeps
 * the last --stats-window seconds of each namespace's ops/s, hit ratio and memory (summed over
 * its nodes) and each node's health, in fixed rings.
 *
 * Cost is bounded: nodes are read by --stats-workers threads at once, each request within
 * --stats-timeout-ms, so a dead or slow node costs one worker at most that long and the others
 * go on; at most --stats-namespaces namespaces are tracked (more are counted, not kept). */
#ifndef SHOAL_CONTROL_SAMPLER_H
#define SHOAL_CONTROL_SAMPLER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct control;
struct sampler;

/* Start the sampling threads. NULL with a message on failure. */
struct sampler *sampler_create(struct control *c, char *err, size_t errlen);
/* GET /v1/stats: pools with their nodes (health, slot ranges, figures) and every tracked
 * namespace's series after sample `since` (0: the whole window). Takes c->lock, then the
 * sampler's own. A new reference, or NULL when memory ran out. */
json_t *sampler_json(struct sampler *s, uint64_t since);
/* Stop the threads (a request in progress is cancelled) and free everything. */
void sampler_destroy(struct sampler **s);

#endif
