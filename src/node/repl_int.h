/* repl_int.h — replication's shared state between repl.c (roles, figures, admin, handoff),
 * repl_primary.c (producer and senders) and repl_replica.c (applier). Not for other files. */
#ifndef SHOAL_NODE_REPL_INT_H
#define SHOAL_NODE_REPL_INT_H

#include <pthread.h>

#include "node/repl.h"
#include "node/repl_backlog.h"

#define REPL_ADDR_MAX 300
#define REPL_PEERS_MAX 1024 /* distinct peer addresses ever named (append-only table) */

enum repl_state { REPL_DOWN, REPL_SYNC, REPL_ONLINE };

/* A backlog-only frame, never sent as is: an item segment cleaning moved while a full sync ran
 * (repl_note_move). Payload: the item's namespace id (u16 LE), then an 'S' payload. A sender in
 * its snapshot sends it as an 'S' frame of its place in the stream; other senders skip it. */
#define REPL_BL_MOVED 'M'
#define REPL_MOVED_NSID 2
/* The store's move hook (store_set_move_hook; ctx: the node). */
void repl_note_move(void *ctx, const struct item *it);
const char *repl_state_name(enum repl_state s);

/* Primary side: one per replica address, with its sender thread. Fields the sender changes are
 * atomics (figures read them); `slots` and `resync` under repl.lock. */
struct repl_link {
    struct repl_link *next;
    struct repl *r;
    char addr[REPL_ADDR_MAX];
    uint8_t slots[SLOT_COUNT]; /* 1: this replica's slot (copy taken by the sender per batch) */
    bool resync;               /* slots were added: the next connection syncs in full */
    int stop;                  /* atomic: the sender ends */
    int fd;                    /* atomic: the connection, -1 when none (shutdown() to wake) */
    pthread_t th;
    uint64_t state, sent, acked, behind_since_ms; /* atomics */
};

/* Replica side: one per primary address that ever connected (kept for its offset). */
struct repl_src {
    struct repl_src *next;
    char addr[REPL_ADDR_MAX];
    char replid[17]; /* "-" until a full sync ended */
    uint64_t applied;
    uint64_t applied_wall_ms; /* the primary's Unix ms up to which all its records are applied */
    enum repl_state state;
    int fd;          /* the live connection's socket, -1 when none */
    uint64_t conn_id; /* which connection owns the entry now */
};

struct repl {
    struct repl_pub pub; /* first: repl_hook.h casts */
    struct node *n;
    char me[REPL_ADDR_MAX];
    char replid[17];
    pthread_mutex_t lock; /* peers, links, srcs, handoffs */
    uint16_t peer[SLOT_COUNT]; /* per slot: replica (as primary) or primary (as replica) */
    char (*peers)[REPL_ADDR_MAX];
    unsigned npeers;
    struct repl_backlog bl;
    struct repl_link *links;
    struct repl_src *srcs;
    uint64_t next_conn_id;
    int appliers; /* live applier threads (under lock) */
    pthread_cond_t appliers_done;
    int handoffs;         /* handoff threads waiting (under lock), signalled on appliers_done */
    int handoffs_ending;  /* atomic: they answer now (repl_handoffs_end) */
    int stopping;
    uint64_t fence_until_ms; /* atomic: fences lift by themselves at this time (0: none) */
    uint64_t fence_lifts;    /* under lock: fences lifted other than by a document (a handoff
                              * still waiting answers 200 only if none was meanwhile) */
    struct repl_metrics m;   /* counters (atomics); gauges are computed when read */
};

/* The index of `addr` in the peer table, added if new (lock held); REPL_PEERS_MAX when full.
 * Only names from a topology document are added: the table is append-only and bounded. */
unsigned repl_peer_index(struct repl *r, const char *addr);
/* The index of `addr` when the table holds it, else REPL_PEER_NONE, which matches no slot's
 * peer (lock held). For names a peer or an admin caller gives, which must not fill the table. */
#define REPL_PEER_NONE 0xffffffffu
unsigned repl_peer_find(const struct repl *r, const char *addr);
/* Start a link's sender thread; stop and join one (lock NOT held). */
int repl_link_start(struct repl_link *l);
void repl_link_join(struct repl_link *l);
/* Lift every fence now (lock held). */
void repl_fence_clear(struct repl *r);
/* Largest frame payload either side accepts: an item of -I with the longest key. */
size_t repl_max_payload(const struct repl *r);

static inline uint64_t repl_ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void repl_st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void repl_inc(uint64_t *p, uint64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

#endif
