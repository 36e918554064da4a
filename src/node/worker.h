/* worker.h — worker threads of shoal-node: each runs one epoll loop over the shared listening
 * socket (registered with EPOLLEXCLUSIVE, so one worker wakes per new connection) and over the
 * connections it owns. The worker that accepts gives each new connection to the worker with the
 * fewest (ties in turn), through that worker's queue and eventfd. */
#ifndef SHOAL_NODE_WORKER_H
#define SHOAL_NODE_WORKER_H

#include "node/node.h"

/* Create the workers and their epoll sets (no threads yet). 0, or -1 with a message in err. */
int worker_setup(struct node *n, char *err, size_t errlen);
/* Start the worker threads. 0, or -1 with a message in err. */
int worker_start(struct node *n, char *err, size_t errlen);
/* Ask every worker to stop, join them and close their connections. */
void worker_teardown(struct node *n);

#endif
