/* node_admin.h — shoal-node's admin HTTP listener: namespaces API and metrics. */
#ifndef SHOAL_NODE_NODE_ADMIN_H
#define SHOAL_NODE_NODE_ADMIN_H

#include <stddef.h>

#include "common/admin.h"
#include "node/ns.h"

struct node;

/* Start the admin listener of `n` (cfg.admin_listen, cfg.admin_port). NULL with err on failure. */
struct admin *node_admin_create(struct node *n, char *err, size_t errlen);
/* A namespace's request figures since it was created. */
void node_ns_figures(struct node *n, const struct ns *ns, struct ns_metrics *out);

#endif
