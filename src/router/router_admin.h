/* router_admin.h — shoal-router's admin HTTP content: /metrics and the topology API. */
#ifndef SHOAL_ROUTER_ROUTER_ADMIN_H
#define SHOAL_ROUTER_ROUTER_ADMIN_H

#include <stddef.h>

#include "common/admin.h"
#include "router/router.h"

/* Start the admin listener on cfg.admin_listen:admin_port. NULL with a message on failure. */
struct admin *router_admin_create(struct router *r, char *err, size_t errlen);

#endif
