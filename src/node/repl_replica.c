/* repl_replica.c — the replica's half of replication: a data-port connection that opened with
 * the replication handshake is handed here by its worker (repl_adopt) and served by its own
 * applier thread, which checks that the peer is the primary of slots this node replicates in
 * the topology in use (else it answers REPL REFUSED and closes), then applies the frames to the
 * store and acknowledges offsets every 10 ms or 256 KiB.
 *
 * Bounds: the input buffer holds one largest frame (an item of -I) and a read's worth more; a
 * frame announcing more, an unknown type or a malformed record closes the connection, as does a
 * peer silent for 5 s (a live primary sends a progress frame every 0.5 s). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/control.h"
#include "node/node.h"
#include "node/repl_int.h"
#include "node/repl_wire.h"

#define APPLY_SILENT_MS 5000
#define ACK_EVERY_MS 10
#define ACK_EVERY_BYTES (256 * 1024)
#define REPL_APPLIERS_MAX 32

struct applier {
    struct repl *r;
    int fd;
    uint8_t *buf;
    size_t len, cap, maxp;
    char peer[REPL_ADDR_MAX];
    unsigned peer_idx;
    struct repl_src *src;
    uint64_t id;
    uint64_t applied, acked, last_ack_ms;
    uint64_t wall_ms; /* the primary's clock up to which every record of it is applied */
    bool online; /* past a full sync's end, or resumed */
    bool ack_due; /* the snapshot's end: acknowledged even when the offset did not move */
};

/* Is slot s one this node replicates from the applier's peer now? */
static bool mine(const struct applier *a, uint16_t s)
{
    uint8_t role = __atomic_load_n(&a->r->pub.role[s], __ATOMIC_RELAXED);
    return (role & REPL_ROLE_REPLICA) && !(role & REPL_ROLE_PRIMARY) &&
           __atomic_load_n(&a->r->peer[s], __ATOMIC_RELAXED) == a->peer_idx;
}

static void apply_item(struct applier *a, const struct repl_rec *rec)
{
    struct node *n = a->r->n;
    struct store *st = n->store;
    const struct ns *ns = ns_of_key(ns_current(&n->ns), rec->key, rec->nkey);
    if (store_item_size(st, rec->nkey, rec->nbytes, rec->flags) == 0) return;
    struct item *it = store_alloc(st, ns->id, rec->key, rec->nkey, rec->nbytes, rec->flags);
    if (it == NULL) return; /* no memory: the replica misses it, as a cache may */
    memcpy(it->data + it->nkey, rec->value, rec->nbytes);
    uint32_t now = clock_now();
    it->exptime = rec->ttl ? now + rec->ttl : 0;
    it->iflags |= rec->iflags & (ITEM_STALE | ITEM_HOLD | ITEM_KEY_BINARY);
    /* the CAS is this node's own (store_link gives a fresh one): flush_all, flush_ns and slot
     * drops order items of one second by CAS, which the primary's values would defeat */
    uint64_t hv = store_hash(rec->key, rec->nkey);
    enum store_miss why;
    store_lock(st, hv);
    struct item *old = store_find_ex(st, hv, rec->key, rec->nkey, now, &why,
                                     STORE_FIND_HELD | STORE_FIND_GRACE);
    if (old) store_replace(st, hv, old, it, now);
    else if (!store_link(st, hv, it, now)) store_free(st, it);
    store_unlock(st, hv);
}

static void apply_del(struct applier *a, const struct repl_rec *rec)
{
    struct store *st = a->r->n->store;
    uint64_t hv = store_hash(rec->key, rec->nkey);
    enum store_miss why;
    store_lock(st, hv);
    struct item *it = store_find_ex(st, hv, rec->key, rec->nkey, clock_now(), &why,
                                    STORE_FIND_GRACE);
    if (it) store_unlink(st, hv, it);
    store_unlock(st, hv);
}

static void apply_touch(struct applier *a, const struct repl_rec *rec)
{
    struct store *st = a->r->n->store;
    uint32_t now = clock_now();
    uint64_t hv = store_hash(rec->key, rec->nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, rec->key, rec->nkey, now, NULL);
    if (it) it->exptime = rec->ttl ? now + rec->ttl : 0;
    store_unlock(st, hv);
}

/* A full sync begins: the items of the slots in the bitmap (those we replicate from this peer)
 * go. The store is walked for their keys, which are then deleted in turn. */
struct reset_walk {
    struct applier *a;
    const uint8_t *bits;
    char (*keys)[256];
    uint8_t *nkeys;
    size_t n, cap;
};

static void reset_collect(void *ctx, const struct item *it, int clsid)
{
    (void)clsid;
    struct reset_walk *w = ctx;
    uint16_t s = slot_of_key(it->data, it->nkey);
    if (!(w->bits[s / 8] & (1u << (s % 8))) || !mine(w->a, s) || w->n == w->cap) return;
    memcpy(w->keys[w->n], it->data, it->nkey);
    w->nkeys[w->n++] = it->nkey;
}

static int apply_reset(struct applier *a, const uint8_t *bits)
{
    struct store_cursor cur = {0};
    struct reset_walk w = {.a = a, .bits = bits, .cap = STORE_DUMP_BATCH * 4};
    w.keys = malloc(w.cap * sizeof *w.keys);
    w.nkeys = malloc(w.cap);
    if (w.keys == NULL || w.nkeys == NULL) {
        free(w.keys);
        free(w.nkeys);
        return -1;
    }
    bool more = true;
    uint64_t dropped = 0;
    while (more) {
        w.n = 0;
        /* budget below cap: every live record of a step fits */
        more = store_dump_step(a->r->n->store, &cur, 0, STORE_DUMP_BATCH * 4, reset_collect, &w);
        for (size_t i = 0; i < w.n; i++) {
            struct repl_rec rec = {.key = w.keys[i], .nkey = w.nkeys[i]};
            apply_del(a, &rec);
        }
        dropped += w.n;
    }
    free(w.keys);
    free(w.nkeys);
    log_notice("replication from %s: full sync begins, %llu items of its slots dropped", a->peer,
               (unsigned long long)dropped);
    return 0;
}

static void src_update(struct applier *a, const char *replid, int state)
{
    pthread_mutex_lock(&a->r->lock);
    if (a->src->conn_id == a->id) {
        if (replid) snprintf(a->src->replid, sizeof a->src->replid, "%s", replid);
        a->src->applied = a->applied;
        a->src->applied_wall_ms = a->wall_ms;
        if (state >= 0) a->src->state = (enum repl_state)state;
    }
    pthread_mutex_unlock(&a->r->lock);
}

/* Apply one frame. -1 closes the connection (with *why). */
static int apply_frame(struct applier *a, const struct repl_frame *f, const char **why)
{
    struct repl *r = a->r;
    struct repl_rec rec;
    switch (f->type) {
    case REPL_F_ACK: *why = "an ack from the primary"; return -1;
    case REPL_F_RESET:
        if (f->len != REPL_SLOT_BITMAP) {
            *why = "reset frame of a wrong length";
            return -1;
        }
        repl_inc(&r->m.full_syncs_applied, 1);
        return apply_reset(a, f->payload) < 0 ? (*why = "out of memory", -1) : 0;
    case REPL_F_SNAP_END:
    case REPL_F_PROGRESS: {
        uint64_t wall = 0;
        int stamped = f->type == REPL_F_PROGRESS ? repl_progress_decode(f, &wall, why) : 0;
        if (stamped < 0) return -1;
        if (f->type == REPL_F_SNAP_END && f->len != 0) {
            *why = "snapshot end with a payload";
            return -1;
        }
        if (f->offset < a->applied) {
            *why = "offset going back";
            return -1;
        }
        a->applied = f->offset;
        /* every frame before this one is applied, so every record the primary appended before
         * its stamp is (a clock stepping back keeps the older, later stamp) */
        if (stamped && wall > a->wall_ms) a->wall_ms = wall;
        if (f->type == REPL_F_SNAP_END) a->online = a->ack_due = true; /* acked at once */
        return 0;
    }
    default: break;
    }
    if (repl_rec_decode(f, &rec, why) < 0) return -1;
    if (repl_type_stream(f->type)) {
        if (f->offset < a->applied) {
            *why = "offset going back";
            return -1;
        }
        repl_inc(&r->m.applied_bytes, f->offset - a->applied);
        a->applied = f->offset;
    }
    repl_inc(&r->m.applied_records, 1);
    if (f->type == REPL_F_FLUSH) {
        uint32_t now = clock_now();
        store_flush(r->n->store, rec.ttl ? now + rec.ttl : now, now);
        return 0;
    }
    if (f->type == REPL_F_FLUSH_NS) {
        const struct ns *ns = ns_find(ns_current(&r->n->ns), rec.key, rec.nkey);
        if (ns) store_flush_ns(r->n->store, ns->id, clock_now());
        return 0;
    }
    if (rec.nkey > 250) {
        *why = "key longer than 250 bytes";
        return -1;
    }
    /* no client could have stored it (the text protocol splits on both), and `stats cachedump`
     * prints text keys as they are: such a key would forge lines of its answer */
    if ((f->type == REPL_F_ITEM || f->type == REPL_F_SNAP) && !(rec.iflags & ITEM_KEY_BINARY) &&
        (memchr(rec.key, ' ', rec.nkey) || memchr(rec.key, '\n', rec.nkey))) {
        *why = "a text key with a space or a newline";
        return -1;
    }
    if (!mine(a, slot_of_key(rec.key, rec.nkey))) {
        repl_inc(&r->m.records_skipped, 1);
        return 0;
    }
    if (f->type == REPL_F_ITEM || f->type == REPL_F_SNAP) apply_item(a, &rec);
    else if (f->type == REPL_F_DEL) apply_del(a, &rec);
    else apply_touch(a, &rec);
    return 0;
}

static int send_ack(struct applier *a)
{
    uint8_t h[REPL_HDR];
    repl_frame_header(h, REPL_F_ACK, 0, a->applied);
    if (send(a->fd, h, REPL_HDR, MSG_NOSIGNAL) != REPL_HDR) return -1;
    a->acked = a->applied;
    a->ack_due = false;
    a->last_ack_ms = clock_now_ms();
    src_update(a, NULL, -1);
    return 0;
}

/* Read a handshake line from the buffer (and the socket). Returns its length, -1 on error. */
static int take_line(struct applier *a, char *line, size_t cap)
{
    uint64_t until = clock_now_ms() + 3000;
    for (;;) {
        uint8_t *nl = memchr(a->buf, '\n', a->len);
        if (nl) {
            size_t n = (size_t)(nl - a->buf);
            if (n == 0 || n >= cap || a->buf[n - 1] != '\r') return -1;
            memcpy(line, a->buf, n - 1);
            line[n - 1] = 0;
            memmove(a->buf, nl + 1, a->len - n - 1);
            a->len -= n + 1;
            return (int)(n - 1);
        }
        if (a->len >= cap) return -1;
        uint64_t now = clock_now_ms();
        struct pollfd pf = {a->fd, POLLIN, 0};
        if (now >= until || poll(&pf, 1, (int)(until - now)) != 1) return -1;
        ssize_t got = recv(a->fd, a->buf + a->len, cap - a->len, MSG_DONTWAIT);
        if (got <= 0 && !(got < 0 && (errno == EAGAIN || errno == EINTR))) return -1;
        if (got > 0) a->len += (size_t)got;
    }
}

static void applier_run(struct applier *a)
{
    struct repl *r = a->r;
    char line[REPL_LINE_MAX + 1], replid[17];
    int len = take_line(a, line, sizeof line);
    if (len < 0 || repl_hello_parse(line, (size_t)len, a->peer, sizeof a->peer, replid) < 0) {
        repl_inc(&r->m.protocol_errors, 1);
        log_warn("replication handshake refused: malformed");
        send(a->fd, "REPL REFUSED bad handshake\r\n", 28, MSG_NOSIGNAL);
        return;
    }
    /* the peer must be the primary of a slot this node replicates, in the topology in use */
    pthread_mutex_lock(&r->lock);
    /* looked up, not added: a name no document gave is no primary of ours, and a stream of
     * made-up names must not fill the peer table (then the next real peer had no index) */
    a->peer_idx = repl_peer_find(r, a->peer);
    bool ok = false;
    for (unsigned s = 0; s < SLOT_COUNT && !ok; s++) ok = mine(a, (uint16_t)s);
    struct repl_src *src = NULL;
    if (ok) {
        for (src = r->srcs; src && strcmp(src->addr, a->peer); src = src->next) {}
        if (src == NULL && (src = calloc(1, sizeof *src)) != NULL) {
            snprintf(src->addr, sizeof src->addr, "%s", a->peer);
            strcpy(src->replid, "-");
            src->fd = -1;
            src->next = r->srcs;
            r->srcs = src;
        }
    }
    if (src) {
        if (src->fd >= 0) shutdown(src->fd, SHUT_RDWR); /* an older connection of this peer */
        src->fd = a->fd;
        src->conn_id = a->id = ++r->next_conn_id;
        src->state = REPL_SYNC;
    }
    char have[17];
    uint64_t applied = src ? src->applied : 0;
    a->wall_ms = src ? src->applied_wall_ms : 0;
    snprintf(have, sizeof have, "%s", src && src->replid[0] && strcmp(src->replid, "-") ? src->replid : "-");
    pthread_mutex_unlock(&r->lock);
    if (!src) {
        repl_inc(&r->m.handshakes_refused, 1);
        log_warn("replication handshake from %s refused: not the primary of any slot this node "
                 "replicates in topology version %llu", a->peer,
                 (unsigned long long)node_control_version(r->n->control));
        send(a->fd, "REPL REFUSED not a primary of this replica\r\n", 44, MSG_NOSIGNAL);
        return;
    }
    a->src = src;
    a->applied = a->acked = applied; /* what it keeps should this connection end at once */
    int n = snprintf(line, sizeof line, "REPL HAVE %s %llu\r\n", have, (unsigned long long)applied);
    bool full = false;
    uint64_t off = 0;
    if (send(a->fd, line, (size_t)n, MSG_NOSIGNAL) != n ||
        (len = take_line(a, line, sizeof line)) < 0 ||
        repl_start_parse(line, (size_t)len, &full, &off) < 0 || (!full && off != applied)) {
        repl_inc(&r->m.protocol_errors, 1);
        log_warn("replication from %s: bad handshake", a->peer);
        goto out;
    }
    a->applied = off;
    a->online = !full;
    /* a full sync leaves no valid offset until it ends (a drop midway starts over) */
    src_update(a, full ? "-" : NULL, full ? REPL_SYNC : REPL_ONLINE);
    log_notice("replication from %s: %s at offset %llu", a->peer, full ? "full sync" : "resumed",
               (unsigned long long)off);
    a->last_ack_ms = clock_now_ms();
    uint64_t heard = clock_now_ms();
    for (;;) {
        size_t used = 0;
        const char *why = NULL;
        pthread_mutex_lock(&r->n->ns.lock); /* the namespace table stays while frames apply */
        for (;;) {
            struct repl_frame f;
            long fl = repl_frame_parse(a->buf + used, a->len - used, a->maxp, &f, &why);
            if (fl == 0) break;
            if (fl < 0 || apply_frame(a, &f, &why) < 0) {
                used = SIZE_MAX;
                break;
            }
            used += (size_t)fl;
            if (f.type == REPL_F_SNAP_END) {
                pthread_mutex_lock(&r->lock);
                if (src->conn_id == a->id) snprintf(src->replid, 17, "%s", replid);
                pthread_mutex_unlock(&r->lock);
                log_notice("replication from %s: full sync done at offset %llu", a->peer,
                           (unsigned long long)a->applied);
            }
        }
        pthread_mutex_unlock(&r->n->ns.lock);
        if (used == SIZE_MAX) {
            repl_inc(&r->m.protocol_errors, 1);
            log_warn("replication from %s: closing on a bad frame (%s)", a->peer, why);
            break;
        }
        memmove(a->buf, a->buf + used, a->len - used);
        a->len -= used;
        if (a->online) src_update(a, NULL, REPL_ONLINE);
        uint64_t now = clock_now_ms();
        /* no ack during a full sync: its offsets mean nothing until the snapshot is in */
        if (a->online && (a->applied != a->acked || a->ack_due) &&
            (now - a->last_ack_ms >= ACK_EVERY_MS || a->applied - a->acked >= ACK_EVERY_BYTES) &&
            send_ack(a) < 0)
            break;
        if (__atomic_load_n(&r->stopping, __ATOMIC_RELAXED)) break;
        struct pollfd pf = {a->fd, POLLIN, 0};
        bool due = a->online && (a->applied != a->acked || a->ack_due);
        int pr = poll(&pf, 1, due ? ACK_EVERY_MS : 100);
        if (pr == 0) {
            if (clock_now_ms() - heard > APPLY_SILENT_MS) {
                log_warn("replication from %s: silent for %d ms, closing", a->peer,
                         APPLY_SILENT_MS);
                break;
            }
            continue;
        }
        ssize_t got = recv(a->fd, a->buf + a->len, a->cap - a->len, MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) break;
        if (got > 0) {
            a->len += (size_t)got;
            heard = clock_now_ms();
        }
    }
    if (a->online && a->applied != a->acked) send_ack(a);
out:
    pthread_mutex_lock(&r->lock);
    if (src->conn_id == a->id) {
        src->fd = -1;
        src->state = REPL_DOWN;
        src->applied = a->applied;
        src->applied_wall_ms = a->wall_ms; /* kept: the router's replay after a promotion */
    }
    pthread_mutex_unlock(&r->lock);
    log_notice("replication from %s: connection closed at offset %llu", a->peer,
               (unsigned long long)a->applied);
}

static void *applier_main(void *arg)
{
    struct applier *a = arg;
    struct repl *r = a->r;
    applier_run(a);
    close(a->fd);
    free(a->buf);
    free(a);
    pthread_mutex_lock(&r->lock);
    if (--r->appliers == 0) pthread_cond_broadcast(&r->appliers_done);
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

void repl_adopt(struct node *n, int fd, const char *pre, size_t npre)
{
    struct repl *r = n->repl;
    struct applier *a = r ? calloc(1, sizeof *a) : NULL;
    if (a) {
        a->r = r;
        a->fd = fd;
        a->maxp = repl_max_payload(r);
        a->cap = a->maxp + REPL_HDR + 65536;
        a->buf = malloc(a->cap);
    }
    if (a == NULL || a->buf == NULL || npre > a->cap) {
        if (a) free(a->buf);
        free(a);
        close(fd);
        return;
    }
    memcpy(a->buf, pre, npre);
    a->len = npre;
    pthread_mutex_lock(&r->lock);
    /* at most REPL_APPLIERS_MAX streams at once: a flood of handshakes costs a bounded number of
     * threads and buffers (a node has a handful of primaries) */
    bool ok = !r->stopping && r->appliers < REPL_APPLIERS_MAX;
    if (ok) r->appliers++;
    else repl_inc(&r->m.handshakes_refused, 1);
    pthread_mutex_unlock(&r->lock);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (!ok || pthread_create(&th, &at, applier_main, a) != 0) {
        if (ok) {
            pthread_mutex_lock(&r->lock);
            r->appliers--;
            pthread_mutex_unlock(&r->lock);
        }
        close(fd);
        free(a->buf);
        free(a);
    }
    pthread_attr_destroy(&at);
}
