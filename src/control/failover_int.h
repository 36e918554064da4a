/* failover_int.h — what failover.c (detection, promotion, returns) and drain.c (planned
 * handoffs) share: the failover object, whose one mutex guards both threads' state, and the
 * drain thread's entry points. Private to those two files. */
#ifndef SHOAL_CONTROL_FAILOVER_INT_H
#define SHOAL_CONTROL_FAILOVER_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "control/failover.h"
#include "control/model.h"

struct admin_held;
struct control;
struct httpc;
struct fo_node;
struct fo_router;

struct drain_job {
    struct admin_held *h;
    char pool[MODEL_NAME_MAX + 1], node[MODEL_ADDR_MAX + 1];
    bool force;
    unsigned timeout_ms;
    struct drain_job *next;
};

struct failover {
    struct control *c;
    pthread_t th, dth; /* the failover thread; the drain thread */
    bool started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv, dcv; /* the failover thread's wake-up; a drain queued */
    struct fo_node *nodes; /* under mu */
    size_t nn, cap;
    struct fo_router *routers; /* under mu */
    size_t nr;
    struct drain_job *drains, **drains_tail; /* under mu */
    struct failover_lease_hooks lease; /* .lapsed NULL: none */
    struct httpc *http;  /* the failover thread's */
    struct httpc *dhttp; /* the drain thread's: a drain's handoffs never hold up detection */
};

/* The drain thread: runs queued drains one at a time until f->stop. */
void *drain_main(void *arg);
/* Answer every drain still queued 503 (shutting down) and free them. f->mu not held; the drain
 * thread has ended. */
void drain_refuse_queued(struct failover *f);

#endif
