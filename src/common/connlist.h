/* connlist.h — the process's client connections as memcached's `stats conns` lists them.
 *
 * Each connection belongs to one worker thread, which alone reads and writes its buffers and
 * state; `stats conns` is asked on any worker and must see them all. So each connection carries
 * a small entry linked into one process-wide list under a mutex taken only when a connection
 * opens or closes and when the list is written (never per request). What changes per request
 * (when it last ran a command, which of memcached's states it is in) the owning worker publishes
 * in the entry with relaxed atomic stores; the writer reads them the same way and holds the lock,
 * so no entry is freed under it. */
#ifndef SHOAL_COMMON_CONNLIST_H
#define SHOAL_COMMON_CONNLIST_H

#include <pthread.h>
#include <stdint.h>

#include "common/buf.h"

/* memcached's connection states a shoal connection can be described by */
enum connlist_state {
    CONNLIST_READ,     /* waiting for a request (memcached: conn_read) */
    CONNLIST_PARSE,    /* running requests (conn_parse_cmd; the connection asking, always) */
    CONNLIST_NREAD,    /* receiving a storage command's data block (conn_nread) */
    CONNLIST_SWALLOW,  /* discarding a refused store's data block (conn_swallow) */
    CONNLIST_WRITE,    /* replies waiting for the socket to take them (conn_mwrite) */
    CONNLIST_CLOSING,  /* closing once its replies are out (conn_closing) */
    CONNLIST_IO_QUEUE, /* a router's client waiting for its nodes' replies (conn_io_queue) */
};

struct connlist_ent {
    struct connlist_ent *next, *prev;
    int fd;
    char addr[80];      /* the peer as memcached writes it: tcp:1.2.3.4:5 or tcp6:[::1]:5 */
    uint32_t last_cmd;  /* the owner's clock (seconds) at its last request: atomic */
    uint8_t state;      /* enum connlist_state: atomic */
};

struct connlist {
    pthread_mutex_t lock;
    struct connlist_ent *head;
};

void connlist_init(struct connlist *l);
/* Link a new connection's entry (fd: its accepted socket; now: the caller's clock). */
void connlist_add(struct connlist *l, struct connlist_ent *e, int fd, uint32_t now);
/* Unlink it: before its memory is freed. */
void connlist_remove(struct connlist *l, struct connlist_ent *e);

/* The owner publishes what its connection is doing. */
static inline void connlist_set_state(struct connlist_ent *e, enum connlist_state s)
{
    __atomic_store_n(&e->state, (uint8_t)s, __ATOMIC_RELAXED);
}
static inline void connlist_touch(struct connlist_ent *e, uint32_t now)
{
    __atomic_store_n(&e->last_cmd, now, __ATOMIC_RELAXED);
}

/* Append memcached's `stats conns` lines (without END): the listening socket `listen_fd` (idle
 * for `listen_secs`), then every connection in fd order, `self` (the connection asking) shown
 * as parsing. `now` is the clock the entries were touched with. -1 when memory ran out. */
int connlist_write(struct connlist *l, struct buf *b, int listen_fd, uint32_t listen_secs,
                   const struct connlist_ent *self, uint32_t now);

#endif
