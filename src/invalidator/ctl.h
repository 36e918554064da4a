/* ctl.h — shoal-invalidator --control URL[,URL...]: the key templates of the control plane's
 * namespace records, merged with the configuration file's tables, prepared in PostgreSQL and
 * handed to the reader as they change (ctl.c; docs/invalidator.md). */
#ifndef SHOAL_INVALIDATOR_CTL_H
#define SHOAL_INVALIDATOR_CTL_H

#include <stddef.h>

struct buf;
struct inv;
struct inv_ctl;

/* Start following inv->opt.control. Until the first document's map is handed over
 * (inv->map_ready) the reader does not stream. NULL with a message when a thread cannot start
 * or memory ran out. */
struct inv_ctl *inv_ctl_start(struct inv *inv, char *err, size_t errlen);
/* Stop both threads and free; sets *c to NULL. */
void inv_ctl_stop(struct inv_ctl **c);
/* The follower's figures (shoal_invalidator_control_...) for /metrics; nothing for NULL. */
void inv_ctl_metrics(struct inv_ctl *c, struct buf *out);

#endif
