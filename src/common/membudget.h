/* membudget.h — one budget for the bytes all client connections' buffers hold together, and
 * handing memory that closed connections freed back to the system.
 *
 * Each connection limits itself (--out-max, --line-max, the item size), but many connections
 * within their own limits can still add up to gigabytes: a hundred clients that never read their
 * replies, two thousand that each send most of a large value and stall. So every connection
 * accounts the bytes its buffers hold in one process-wide counter (changed only when a buffer's
 * size changes, which the request path rarely does), and --buffers-max bounds the sum:
 *   - past half of it ("pressed"), a connection takes no new request while more than
 *     MEMBUDGET_PRESSED_OUT bytes of its replies wait to be sent (it is paused, as it is at a
 *     quarter of --out-max normally): the client that reads gets its replies and goes on;
 *   - past all of it ("over"), each worker closes, of its own connections, those holding the
 *     most among the ones that are the client's doing (replies it does not read, a request it
 *     does not finish), stalled ones first, largest first, with a log line each, until the sum
 *     is back under MEMBUDGET_TARGET_EIGHTHS eighths of the budget. A connection whose bytes
 *     wait on the server itself (a reply still coming from a node) is never picked.
 * The allocator is set up so that buffers of MEMBUDGET_MMAP bytes and more are mapped on their
 * own and unmapped when freed, and the smaller ones that closed connections freed are handed
 * back with malloc_trim at most once a second: memory taken during an attack does not stay with
 * the process after it (glibc's default raises its mmap threshold to the largest buffer freed,
 * after which big buffers come from the heap and stay there). */
#ifndef SHOAL_COMMON_MEMBUDGET_H
#define SHOAL_COMMON_MEMBUDGET_H

#include <stdbool.h>
#include <stdint.h>

/* Replies a connection may have waiting while the budget is pressed: about one large reply. */
#define MEMBUDGET_PRESSED_OUT (64 * 1024)
/* Of the connections to close, those whose client has made no progress on its side (read no
 * reply byte, sent no request byte) for this long go first, largest first; the others, largest
 * first, only when none is left: a well-behaved client caught mid-way through a large value
 * keeps moving, and is spared while the stalled ones are closed. */
#define MEMBUDGET_STALL_MS 100
/* Closing stops once the sum is back under this share of the budget (in eighths). */
#define MEMBUDGET_TARGET_EIGHTHS 7
/* Allocations of at least this size are mapped on their own (mallopt M_MMAP_THRESHOLD). */
#define MEMBUDGET_MMAP (1u << 20)
/* malloc_trim runs once closed connections freed this much since the last one, counting only
 * those that held more than MEMBUDGET_TRIM_CONN: the small buffers of connections that come and
 * go are taken again by the next ones, and a trim (a walk of every arena, with page faults to
 * follow) once a second for them would cost latency for nothing. */
#define MEMBUDGET_TRIM_BYTES (4u << 20)
#define MEMBUDGET_TRIM_CONN (64 * 1024)

struct membudget {
    uint64_t max;   /* --buffers-max */
    uint64_t used;  /* atomic: bytes every open connection accounts */
    uint64_t freed; /* atomic: bytes closed connections released since the last trim */
    uint64_t trim_ms; /* atomic: when the last trim ran (clock_now_ms) */
};

/* Set the allocator up as described above: once, before any thread starts. */
void membudget_setup_allocator(void);
void membudget_init(struct membudget *b, uint64_t max);

/* A connection's buffers hold `now` bytes; `*acct` is what it accounted so far. */
static inline void membudget_account(struct membudget *b, uint64_t *acct, uint64_t now)
{
    if (now == *acct) return;
    if (now > *acct) __atomic_add_fetch(&b->used, now - *acct, __ATOMIC_RELAXED);
    else __atomic_sub_fetch(&b->used, *acct - now, __ATOMIC_RELAXED);
    *acct = now;
}

static inline uint64_t membudget_used(const struct membudget *b)
{
    return __atomic_load_n(&b->used, __ATOMIC_RELAXED);
}
static inline bool membudget_pressed(const struct membudget *b)
{
    return membudget_used(b) > b->max / 2;
}
static inline bool membudget_over(const struct membudget *b) { return membudget_used(b) > b->max; }
/* Closing may stop: the sum is back under the target. */
static inline bool membudget_relieved(const struct membudget *b)
{
    return membudget_used(b) <= b->max / 8 * MEMBUDGET_TARGET_EIGHTHS;
}

/* How often a worker sweeps while the budget is over (the loop's timeout brings it back then,
 * since the connections to close may be paused ones that report no events), and the longest
 * gap between its looks for idle incomplete requests. */
#define MEMBUDGET_SWEEP_OVER_MS 10
#define MEMBUDGET_SWEEP_IDLE_MAX_MS 1000

/* How often to look for requests left incomplete longer than --partial-timeout-ms: a quarter of
 * it, within [MEMBUDGET_SWEEP_OVER_MS, MEMBUDGET_SWEEP_IDLE_MAX_MS]. */
uint64_t membudget_idle_period(uint64_t partial_timeout_ms);

/* Choosing which of a worker's connections to close while the budget is over: start a pick,
 * offer it each connection whose bytes are there by its client's doing, take the victim.
 * The victim is the weightiest of those whose client made no progress for MEMBUDGET_STALL_MS,
 * or when there is none the weightiest of the others; only those holding at least half the
 * average share of all `conns` connections count (the other workers may hold the large ones,
 * and this one's small ones are no cause). */
struct membudget_pick {
    uint64_t floor, now_ms;
    void *stalled, *moving;
    uint64_t stalled_weight, moving_weight;
    const char *why_stalled, *why_moving;
};
void membudget_pick_start(struct membudget_pick *p, const struct membudget *b, uint64_t conns,
                          uint64_t now_ms);
/* `conn` holds `bytes` (compared with the floor) and weighs `weight` (the order: bytes alone, or
 * bytes scaled by how long they were held), there because of `blame` (NULL: not its client's
 * doing, never picked); its client last made progress on that side at `since_ms`. */
void membudget_pick_offer(struct membudget_pick *p, void *conn, uint64_t bytes, uint64_t weight,
                          const char *blame, uint64_t since_ms);
/* The connection to close (NULL: none), and in *why its blame. */
void *membudget_pick_victim(const struct membudget_pick *p, const char **why);
/* Memory closed connections freed waits for the next trim: a worker with nothing to do should
 * come back within MEMBUDGET_SWEEP_IDLE_MAX_MS to run it. */
static inline bool membudget_trim_due(const struct membudget *b)
{
    return __atomic_load_n(&b->freed, __ATOMIC_RELAXED) >= MEMBUDGET_TRIM_BYTES;
}

/* A connection closed with `*acct` bytes accounted: take them off (and zero *acct); count them
 * towards the next trim when they were many. */
void membudget_release(struct membudget *b, uint64_t *acct);
/* Hand freed memory back to the system when closed connections released enough since the
 * last time and a second has passed. Any thread, any time outside a request. */
void membudget_trim(struct membudget *b, uint64_t now_ms);

#endif
