/* outage.c — logging the writes a sharded pool's node misses while marked down, and putting
 * it back in use once they are repaired (see outage.h; the repair itself is replica.c's). */
#include "router/outage.h"

#include "common/log.h"
#include "router/replica.h"

int outage_write(struct frag *f, struct upnode *owner, struct upnode *to, const char *key,
                 size_t nkey)
{
    if (to == owner && outage_writes(owner))
        return replica_tag(f, owner, REPL_OWNER, key, nkey); /* logged if it fails there */
    replica_log(owner, key, nkey, false);
    return 0;
}

void outage_check_mended(struct upnode *un)
{
    if (!un->mending || un->down || un->repairs_inflight || !repairlog_clean(&un->repair))
        return;
    un->mending = false;
    log_notice("worker %d: node %s back in use", un->w->id, un->node.addr);
}
