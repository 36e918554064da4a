/* repl_primary.c — the primary's half of replication: the workers' appends to the backlog
 * (repl_log_*) and one sender thread per replica, which connects to the replica's data port,
 * shakes hands, resumes from the replica's offset when the backlog still holds it or else sends
 * a full sync, then streams the frames of the replica's slots and reads its acks.
 *
 * Full sync: a reset of the replica's slots, then the store walked in bounded steps
 * (store_dump_step), each step's items sent after every backlog frame produced before the step
 * began. A stream frame sent before a snapshot item is older than the item's read; one sent
 * after it is replayed in order on top, so the replica ends as the primary is.
 *
 * The walk goes over item memory, which segment cleaning rearranges meanwhile: an item moved
 * from a segment the walk has not reached to one it has passed would be missed. So while a full
 * sync runs the store tells every move (store_watch_moves), and repl_note_move appends the moved
 * item to the backlog as a REPL_BL_MOVED frame, in the stream's order with the key's writes
 * (both under its shard lock). The syncing sender sends it as an 'S' frame: an item the walk
 * missed arrives, one it read arrives again with the same or a newer value, and a later write
 * still comes after it. Other senders skip it. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/node.h"
#include "node/repl_int.h"
#include "node/repl_wire.h"

#define REPL_SEND_TIMEOUT_MS 5000
#define REPL_IDLE_PROGRESS_MS 500 /* a progress frame this often when idle (a heartbeat) */
#define REPL_SNAP_STEP 256        /* records per snapshot step */
#define LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)

bool repl_slot_streams(const struct repl_pub *p, const char *key, size_t nkey)
{
    uint8_t role = __atomic_load_n(&p->role[slot_of_key(key, nkey)], __ATOMIC_RELAXED);
    return (role & (REPL_ROLE_PRIMARY | REPL_ROLE_STREAMS)) ==
           (REPL_ROLE_PRIMARY | REPL_ROLE_STREAMS);
}

/* seconds left of a store-clock exptime: 0 never, UINT32_MAX already expired */
static uint32_t ttl_left(uint32_t exptime)
{
    if (exptime == 0) return 0;
    uint32_t now = clock_now();
    return exptime > now ? exptime - now : UINT32_MAX;
}

/* iflags a replica keeps. Not ITEM_TOKEN: a win handed out here can only be filled here (the
 * replica's CAS values are its own), so after a promotion an item still marked won would make
 * readers wait until its TTL; without the mark the next reader wins. For the same reason an mg N
 * placeholder is not streamed at all: its fill is. */
#define REPL_IFLAGS (ITEM_STALE | ITEM_HOLD | ITEM_KEY_BINARY)

void repl_log_item(struct node *n, const struct item *it)
{
    struct repl *r = n->repl;
    uint32_t ttl = ttl_left(it->exptime);
    if (ttl == UINT32_MAX) { /* stored already expired: what the replica holds must go */
        repl_log_del(n, it->data, it->nkey);
        return;
    }
    uint8_t fixed[REPL_ITEM_FIXED + 255];
    struct repl_rec rec = {.key = it->data, .nkey = it->nkey,
                           .iflags = (uint8_t)(it->iflags & REPL_IFLAGS),
                           .flags = item_flags(it), .ttl = ttl, .cas = item_cas(it)};
    repl_item_encode(fixed, &rec);
    struct repl_part parts[2] = {{fixed, REPL_ITEM_FIXED + it->nkey},
                                 {it->data + it->nkey, it->nbytes}};
    if (REPL_HDR + parts[0].n + parts[1].n > r->bl.cap) repl_inc(&r->m.backlog_oversize, 1);
    repl_backlog_append(&r->bl, REPL_F_ITEM, parts, 2);
}

void repl_note_move(void *ctx, const struct item *it)
{
    struct node *n = ctx;
    struct repl *r = n->repl;
    if (r == NULL || !repl_slot_streams(&r->pub, it->data, it->nkey)) return;
    uint32_t ttl = ttl_left(LOAD_RELAXED(&it->exptime));
    if (ttl == UINT32_MAX) return; /* expired: the walk would not have sent it either */
    uint8_t fixed[REPL_MOVED_NSID + REPL_ITEM_FIXED + 255];
    fixed[0] = (uint8_t)it->nsid;
    fixed[1] = (uint8_t)(it->nsid >> 8);
    struct repl_rec rec = {.key = it->data, .nkey = it->nkey,
                           .iflags = (uint8_t)(LOAD_RELAXED(&it->iflags) & REPL_IFLAGS),
                           .flags = item_flags(it), .ttl = ttl, .cas = item_cas(it)};
    repl_item_encode(fixed + REPL_MOVED_NSID, &rec);
    struct repl_part parts[2] = {{fixed, REPL_MOVED_NSID + REPL_ITEM_FIXED + it->nkey},
                                 {it->data + it->nkey, it->nbytes}};
    repl_backlog_append(&r->bl, REPL_BL_MOVED, parts, 2);
    repl_inc(&r->m.snapshot_moves, 1);
}

void repl_log_del(struct node *n, const char *key, size_t nkey)
{
    uint8_t k = (uint8_t)nkey;
    struct repl_part parts[2] = {{&k, 1}, {key, nkey}};
    repl_backlog_append(&n->repl->bl, REPL_F_DEL, parts, 2);
}

void repl_log_touch(struct node *n, const char *key, size_t nkey, uint32_t exptime)
{
    uint32_t ttl = ttl_left(exptime);
    if (ttl == UINT32_MAX) {
        repl_log_del(n, key, nkey);
        return;
    }
    uint8_t h[5] = {(uint8_t)nkey, (uint8_t)ttl, (uint8_t)(ttl >> 8), (uint8_t)(ttl >> 16),
                    (uint8_t)(ttl >> 24)};
    struct repl_part parts[2] = {{h, 5}, {key, nkey}};
    repl_backlog_append(&n->repl->bl, REPL_F_TOUCH, parts, 2);
}

void repl_log_flush(struct node *n, uint32_t delay)
{
    if (n->repl == NULL) return;
    uint8_t d[4] = {(uint8_t)delay, (uint8_t)(delay >> 8), (uint8_t)(delay >> 16),
                    (uint8_t)(delay >> 24)};
    struct repl_part part = {d, 4};
    repl_backlog_append(&n->repl->bl, REPL_F_FLUSH, &part, 1);
}

void repl_log_flush_ns(struct node *n, const struct ns *ns)
{
    if (n->repl == NULL || ns->cfg.copies < 2) return;
    uint8_t k = ns->nname;
    struct repl_part parts[2] = {{&k, 1}, {ns->name, ns->nname}};
    repl_backlog_append(&n->repl->bl, REPL_F_FLUSH_NS, parts, 2);
}

/* ---- sender ---- */

struct sender {
    struct repl_link *l;
    struct repl *r;
    int fd;
    uint8_t slots[SLOT_COUNT];
    uint8_t *buf; /* backlog frames read, then the kept ones */
    size_t cap;
    uint8_t *snap; /* snapshot frames of one step */
    size_t snap_len, snap_cap;
    bool snap_oom;
    bool nsrep[NS_MAX];
    bool snapping;  /* walking the snapshot: moved-item frames are sent, not skipped */
    bool watching;  /* counted in the store's move watchers */
    uint64_t pos; /* stream offset sent up to (frames not this replica's count as sent) */
    uint8_t in[64 * REPL_HDR]; /* acks */
    size_t nin;
    uint64_t nacks; /* acks this connection; a replica sends none during a full sync */
    uint64_t ack_max; /* the highest offset acknowledged on this connection (within pos) */
};

static int connect_to(const char *addr, int timeout_ms)
{
    char host[REPL_ADDR_MAX], *port;
    snprintf(host, sizeof host, "%s", addr);
    port = strrchr(host, ':');
    if (port == NULL) return -1;
    *port++ = 0;
    char *h = host;
    if (*h == '[') { /* [v6]:port */
        h++;
        char *e = strchr(h, ']');
        if (e) *e = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(h, port, &hints, &ai) != 0 || ai == NULL) return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return -1;
    struct pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof err;
    if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 ||
        err != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Send all of it within REPL_SEND_TIMEOUT_MS of no progress. */
static int send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            b += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        struct pollfd pf = {fd, POLLOUT, 0};
        if (poll(&pf, 1, REPL_SEND_TIMEOUT_MS) != 1) return -1;
    }
    return 0;
}

/* Read one handshake line (without \r\n) within timeout_ms. */
static int read_line(int fd, char *line, size_t cap, int timeout_ms)
{
    size_t n = 0;
    uint64_t until = clock_now_ms() + (uint64_t)timeout_ms;
    while (n + 1 < cap) {
        uint64_t now = clock_now_ms();
        struct pollfd pf = {fd, POLLIN, 0};
        if (now >= until || poll(&pf, 1, (int)(until - now)) != 1) return -1;
        ssize_t got = recv(fd, line + n, 1, MSG_DONTWAIT); /* byte by byte: no frame is read */
        if (got == 0) return -1;
        if (got < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            return -1;
        }
        if (line[n] == '\n') {
            if (n == 0 || line[n - 1] != '\r') return -1;
            line[n - 1] = 0;
            return (int)(n - 1);
        }
        n++;
    }
    return -1;
}

/* Read what acks arrived (waiting up to wait_ms for the first). -1 on a closed or bad peer. */
static int read_acks(struct sender *s, int wait_ms)
{
    struct pollfd pf = {s->fd, POLLIN, 0};
    if (poll(&pf, 1, wait_ms) <= 0) return 0;
    ssize_t got = recv(s->fd, s->in + s->nin, sizeof s->in - s->nin, MSG_DONTWAIT);
    if (got == 0) return -1;
    if (got < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
    s->nin += (size_t)got;
    size_t off = 0;
    for (;;) {
        struct repl_frame f;
        const char *why = NULL;
        long used = repl_frame_parse(s->in + off, s->nin - off, 0, &f, &why);
        if (used < 0 || (used > 0 && f.type != REPL_F_ACK)) {
            log_warn("replication to %s: bad frame from the replica (%s)", s->l->addr,
                     why ? why : "not an ack");
            repl_inc(&s->r->m.protocol_errors, 1);
            return -1;
        }
        if (used == 0) break;
        /* an offset past what was sent is ignored, and counts for nothing */
        if (f.offset <= s->pos) {
            s->nacks++;
            if (f.offset > s->ack_max) s->ack_max = f.offset;
            if (f.offset > repl_ld(&s->l->acked)) repl_st(&s->l->acked, f.offset);
        }
        off += (size_t)used;
    }
    memmove(s->in, s->in + off, s->nin - off);
    s->nin -= off;
    return 0;
}

/* Take the link's slots now; false when slots were added to it meanwhile (the connection
 * must end: the next one syncs them in full). */
static bool take_slots(struct sender *s)
{
    pthread_mutex_lock(&s->r->lock);
    memcpy(s->slots, s->l->slots, SLOT_COUNT);
    bool ok = !s->l->resync;
    pthread_mutex_unlock(&s->r->lock);
    return ok;
}

/* The moved-item frame at s->buf + off (a whole one: the backlog's): kept at s->buf + *keep as
 * an 'S' frame when this sender is in its snapshot and the item is its, else skipped. Returns
 * its length in the backlog. */
static size_t moved_frame(struct sender *s, size_t off, size_t *keep, bool *skipped)
{
    uint8_t *h = s->buf + off;
    uint32_t len = (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 |
                   (uint32_t)h[7] << 24;
    uint64_t at = 0;
    for (int i = 7; i >= 0; i--) at = at << 8 | h[8 + i];
    const uint8_t *p = h + REPL_HDR;
    uint16_t nsid = (uint16_t)(p[0] | p[1] << 8);
    struct repl_frame f = {.type = REPL_F_ITEM, .len = len - REPL_MOVED_NSID, .offset = at,
                           .payload = p + REPL_MOVED_NSID};
    struct repl_rec rec;
    const char *why;
    if (s->snapping && nsid < NS_MAX && s->nsrep[nsid] && repl_rec_decode(&f, &rec, &why) == 0 &&
        s->slots[slot_of_key(rec.key, rec.nkey)]) {
        memmove(s->buf + *keep + REPL_HDR, p + REPL_MOVED_NSID, f.len);
        repl_frame_header(s->buf + *keep, REPL_F_ITEM, f.len, at);
        *keep += REPL_HDR + f.len;
    } else {
        *skipped = true;
    }
    return REPL_HDR + len;
}

/* Frames of the backlog from s->pos: keep this replica's, send them and a progress frame when
 * some were not. 1 when something was read, 0 nothing new, -1 connection lost, -2 backlog lost
 * our place. */
static int pump_backlog(struct sender *s)
{
    /* the clock first, the backlog's end next: every record appended before `wall` lies
     * before `end`, so once the replica applied up to `end` it has them all */
    uint64_t wall = (uint64_t)(clock_wall_us() / 1000), end = repl_backlog_end(&s->r->bl);
    /* room kept at the end for the progress frame */
    long got = repl_backlog_read(&s->r->bl, &s->pos, s->buf, s->cap - REPL_HDR - REPL_WALL_LEN);
    if (got < 0) return -2;
    if (got == 0) return 0;
    size_t keep = 0, off = 0;
    bool skipped = false;
    while (off < (size_t)got) {
        struct repl_frame f;
        const char *why;
        if (s->buf[off] == REPL_BL_MOVED) {
            off += moved_frame(s, off, &keep, &skipped);
            continue;
        }
        long fl = repl_frame_parse(s->buf + off, (size_t)got - off, SIZE_MAX, &f, &why);
        if (fl <= 0) break; /* cannot happen: the backlog holds whole frames */
        struct repl_rec rec;
        bool mine = true;
        if (f.type != REPL_F_FLUSH && f.type != REPL_F_FLUSH_NS &&
            repl_rec_decode(&f, &rec, &why) == 0)
            mine = s->slots[slot_of_key(rec.key, rec.nkey)];
        if (mine) {
            if (keep != off) memmove(s->buf + keep, s->buf + off, (size_t)fl);
            keep += (size_t)fl;
        } else {
            skipped = true;
        }
        off += (size_t)fl;
    }
    if (s->pos >= end) { /* the whole backlog of `wall` read: stamp it (docs/protocol.md) */
        repl_progress_encode(s->buf + keep, s->pos, wall);
        keep += REPL_HDR + REPL_WALL_LEN;
    } else if (skipped) {
        repl_frame_header(s->buf + keep, REPL_F_PROGRESS, 0, s->pos);
        keep += REPL_HDR;
    }
    if (send_all(s->fd, s->buf, keep) < 0) return -1;
    repl_st(&s->l->sent, s->pos);
    return 1;
}

static void snap_put(void *ctx, const struct item *it, int clsid)
{
    (void)clsid;
    struct sender *s = ctx;
    if (!s->nsrep[it->nsid] || !s->slots[slot_of_key(it->data, it->nkey)])
        return;
    uint32_t exptime = __atomic_load_n(&it->exptime, __ATOMIC_RELAXED);
    uint32_t ttl = ttl_left(exptime);
    if (ttl == UINT32_MAX) return;
    size_t pl = repl_item_payload(it->nkey, it->nbytes), need = s->snap_len + REPL_HDR + pl;
    if (need > s->snap_cap) {
        size_t nc = s->snap_cap ? s->snap_cap : 1 << 20;
        while (nc < need) nc *= 2;
        uint8_t *nb = realloc(s->snap, nc);
        if (nb == NULL) {
            s->snap_oom = true;
            return;
        }
        s->snap = nb;
        s->snap_cap = nc;
    }
    uint8_t *p = s->snap + s->snap_len;
    repl_frame_header(p, REPL_F_SNAP, (uint32_t)pl, 0);
    struct repl_rec rec = {.key = it->data, .nkey = it->nkey,
                           .iflags = (uint8_t)(__atomic_load_n(&it->iflags, __ATOMIC_RELAXED) &
                                               REPL_IFLAGS),
                           .flags = item_flags(it), .ttl = ttl, .cas = item_cas(it)};
    repl_item_encode(p + REPL_HDR, &rec);
    memcpy(p + REPL_HDR + REPL_ITEM_FIXED + it->nkey, it->data + it->nkey, it->nbytes);
    s->snap_len += REPL_HDR + pl;
}

/* Stop the store's telling of moves for this sender (its walk is over or abandoned). */
static void unwatch(struct sender *s)
{
    s->snapping = false;
    if (!s->watching) return;
    store_watch_moves(s->r->n->store, false);
    s->watching = false;
}

/* Which namespace ids have copies 2 now. */
static void take_ns(struct sender *s)
{
    struct node *n = s->r->n;
    pthread_mutex_lock(&n->ns.lock);
    const struct ns_table *t = ns_current(&n->ns);
    for (int i = 0; i < NS_MAX; i++) s->nsrep[i] = t->byid[i] && t->byid[i]->cfg.copies >= 2;
    pthread_mutex_unlock(&n->ns.lock);
}

/* One connection's life: handshake, optional full sync, stream. Returns when it ends. */
static void sender_session(struct sender *s)
{
    struct repl *r = s->r;
    struct repl_link *l = s->l;
    char line[REPL_LINE_MAX + 1];
    int n = snprintf(line, sizeof line, REPL_HELLO "%d %s %s\r\n", REPL_PROTO_VERSION, r->me,
                     r->replid);
    if (send_all(s->fd, line, (size_t)n) < 0) return;
    int len = read_line(s->fd, line, sizeof line, 3000);
    char id[17] = "";
    uint64_t applied = 0;
    bool refused = false;
    if (len < 0 || repl_have_parse(line, (size_t)len, id, &applied, &refused) < 0) {
        log_warn("replication to %s: no valid handshake answer", l->addr);
        repl_inc(&r->m.protocol_errors, 1);
        return;
    }
    if (refused) {
        log_warn("replication to %s refused by the replica: %s", l->addr, line);
        return;
    }
    pthread_mutex_lock(&r->lock);
    bool full = l->resync || strcmp(id, r->replid) != 0 || !repl_backlog_holds(&r->bl, applied);
    l->resync = false;
    pthread_mutex_unlock(&r->lock);
    if (full) { /* before the walk's start: a move the walk could miss is logged after it */
        store_watch_moves(r->n->store, true);
        s->watching = s->snapping = true;
        take_ns(s);
    }
    s->pos = full ? repl_backlog_end(&r->bl) : applied;
    n = snprintf(line, sizeof line, "REPL %s %llu\r\n", full ? "FULL" : "CONTINUE",
                 (unsigned long long)s->pos);
    if (send_all(s->fd, line, (size_t)n) < 0) return;
    repl_inc(full ? &r->m.full_resyncs : &r->m.partial_resyncs, 1);
    log_notice("replication to %s: %s from offset %llu", l->addr,
               full ? "full sync" : "resumed", (unsigned long long)s->pos);
    repl_st(&l->sent, s->pos);
    repl_st(&l->acked, full ? s->pos : applied);
    repl_st(&l->state, full ? REPL_SYNC : REPL_ONLINE);
    (void)take_slots(s);
    struct store_cursor cur = {0};
    if (full) {
        uint8_t h[REPL_HDR + REPL_SLOT_BITMAP] = {0};
        repl_frame_header(h, REPL_F_RESET, REPL_SLOT_BITMAP, s->pos);
        for (unsigned i = 0; i < SLOT_COUNT; i++)
            if (s->slots[i]) h[REPL_HDR + i / 8] |= (uint8_t)(1u << (i % 8));
        if (send_all(s->fd, h, sizeof h) < 0) return;
    }
    bool snap = full;
    uint64_t snap_end = UINT64_MAX; /* online once the replica acks this (the snapshot's end) */
    uint64_t last_send = clock_now_ms(), last_slots = last_send;
    while (!__atomic_load_n(&l->stop, __ATOMIC_RELAXED)) {
        int rc = pump_backlog(s);
        if (rc == -1) return;
        if (rc == -2) {
            log_warn("replication to %s: the backlog no longer holds offset %llu (replica too far "
                     "behind): reconnecting for a full sync", l->addr, (unsigned long long)s->pos);
            pthread_mutex_lock(&r->lock);
            l->resync = true;
            pthread_mutex_unlock(&r->lock);
            return;
        }
        if (rc == 1) last_send = clock_now_ms();
        if (snap) {
            take_ns(s);
            s->snap_len = 0;
            bool more = store_dump_step(r->n->store, &cur, 0, REPL_SNAP_STEP, snap_put, s);
            if (s->snap_oom) {
                log_error("replication to %s: out of memory for a snapshot step", l->addr);
                return;
            }
            if (s->snap_len && send_all(s->fd, s->snap, s->snap_len) < 0) return;
            uint64_t items = 0;
            for (size_t off = 0; off < s->snap_len;) {
                struct repl_frame f;
                const char *why;
                long fl = repl_frame_parse(s->snap + off, s->snap_len - off, SIZE_MAX, &f, &why);
                if (fl <= 0) break;
                off += (size_t)fl;
                items++;
            }
            repl_inc(&r->m.snapshot_items, items);
            if (!more) {
                if (pump_backlog(s) == -1) return;
                uint8_t h[REPL_HDR];
                repl_frame_header(h, REPL_F_SNAP_END, 0, s->pos);
                if (send_all(s->fd, h, REPL_HDR) < 0) return;
                snap = false;
                snap_end = s->pos;
                unwatch(s);
                log_notice("replication to %s: full sync sent, streaming from offset %llu",
                           l->addr, (unsigned long long)s->pos);
            }
            if (read_acks(s, 0) < 0) return;
            continue;
        }
        if (clock_now_ms() - last_send >= REPL_IDLE_PROGRESS_MS) {
            uint8_t h[REPL_HDR + REPL_WALL_LEN];
            uint64_t wall = (uint64_t)(clock_wall_us() / 1000);
            size_t hl = REPL_HDR;
            if (s->pos >= repl_backlog_end(&r->bl)) { /* idle and caught up: stamped */
                repl_progress_encode(h, s->pos, wall);
                hl += REPL_WALL_LEN;
            } else {
                repl_frame_header(h, REPL_F_PROGRESS, 0, s->pos);
            }
            if (send_all(s->fd, h, hl) < 0) return;
            last_send = clock_now_ms();
        }
        if (clock_now_ms() - last_slots >= 100) { /* a newer document's slots for this replica */
            last_slots = clock_now_ms();
            if (!take_slots(s)) {
                log_notice("replication to %s: it replicates more slots now: syncing in full",
                           l->addr);
                return;
            }
        }
        if (read_acks(s, rc == 1 ? 0 : 2) < 0) return;
        /* the replica's own ack of the snapshot's end: l->acked was set to the resume offset
         * when the sync began, so it proves nothing */
        if (snap_end != UINT64_MAX && s->nacks > 0 && s->ack_max >= snap_end) {
            snap_end = UINT64_MAX;
            repl_st(&l->state, REPL_ONLINE); /* the replica applied the whole snapshot */
        }
        if (repl_ld(&l->acked) >= repl_backlog_end(&r->bl)) repl_st(&l->behind_since_ms, clock_now_ms());
    }
}

static void *sender_main(void *arg)
{
    struct repl_link *l = arg;
    struct repl *r = l->r;
    struct sender s = {.l = l, .r = r, .fd = -1};
    s.cap = repl_max_payload(r) + REPL_HDR * 2 + (1 << 20);
    s.buf = malloc(s.cap);
    if (s.buf == NULL) {
        log_error("replication to %s: out of memory for the send buffer", l->addr);
        return NULL;
    }
    unsigned backoff = 100;
    while (!__atomic_load_n(&l->stop, __ATOMIC_RELAXED)) {
        int fd = connect_to(l->addr, 1000);
        if (fd < 0) {
            repl_st(&l->state, REPL_DOWN);
            for (unsigned t = 0; t < backoff && !__atomic_load_n(&l->stop, __ATOMIC_RELAXED);
                 t += 50)
                usleep(50 * 1000);
            backoff = backoff < 1000 ? backoff * 2 : 1000;
            continue;
        }
        backoff = 100;
        s.fd = fd;
        s.nin = 0;
        s.nacks = 0;
        s.ack_max = 0;
        pthread_mutex_lock(&r->lock);
        __atomic_store_n(&l->fd, fd, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&r->lock);
        sender_session(&s);
        unwatch(&s);
        pthread_mutex_lock(&r->lock); /* repl_link_join shuts it down under the lock */
        __atomic_store_n(&l->fd, -1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&r->lock);
        close(fd);
        s.fd = -1;
        if (repl_ld(&l->state) != REPL_DOWN) repl_inc(&r->m.stream_errors, 1);
        repl_st(&l->state, REPL_DOWN);
        if (!__atomic_load_n(&l->stop, __ATOMIC_RELAXED)) usleep(100 * 1000);
    }
    free(s.buf);
    free(s.snap);
    return NULL;
}

int repl_link_start(struct repl_link *l)
{
    l->fd = -1;
    l->behind_since_ms = clock_now_ms();
    return pthread_create(&l->th, NULL, sender_main, l) == 0 ? 0 : -1;
}

void repl_link_join(struct repl_link *l)
{
    __atomic_store_n(&l->stop, 1, __ATOMIC_RELAXED);
    /* under the lock the sender takes to forget its socket before closing it: never another
     * file's number */
    pthread_mutex_lock(&l->r->lock);
    int fd = __atomic_load_n(&l->fd, __ATOMIC_ACQUIRE);
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
    pthread_mutex_unlock(&l->r->lock);
    pthread_join(l->th, NULL);
}
