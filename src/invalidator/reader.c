/* reader.c — the log reader: a logical replication client on PostgreSQL's pgoutput plugin that
 * turns each committed transaction's row changes into keys (rows.c) and hands them to delivery
 * in commit order, confirming to PostgreSQL only what delivery says is safe.
 *
 * What is confirmed: the standby status update's flush position is deliver_safe_lsn(), never
 * more, so after a crash PostgreSQL sends again every transaction whose deletes may not have
 * been applied. A transaction already handed over in this process and sent again after a
 * reconnect (its end LSN at or below the last handed over) is skipped.
 *
 * Idle WAL: pgoutput sends nothing for transactions that touch no published table, so with
 * quiet mapped tables the confirmed position would stay put and the slot would hold WAL back
 * forever. When no transaction is open, a keepalive's WAL end (the walsender's position: every
 * commit before it has been sent) is handed to delivery as an empty commit, so the safe LSN
 * passes it in order like any other. */
#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "invalidator/deliver.h"
#include "invalidator/invalidator.h"
#include "invalidator/pgoutput.h"
#include "invalidator/rows.h"
#include "invalidator/setup.h"

/* keys handed to deliver_commit per call of a large transaction */
#define HAND_CHUNK 8192

struct pending { /* a commit handed over, not yet confirmed */
    uint64_t end_lsn;
    int64_t commit_us;
    uint64_t max_inv_id;
};

struct stream_txn {
    uint32_t xid;
    struct keyset ks;
    struct stream_txn *next;
};

struct reader {
    struct inv *inv;
    PGconn *conn;
    struct pgo_msg *m;
    struct rows *rows;
    int in_txn;
    struct keyset cur;
    int in_stream;
    struct stream_txn *streams, *stream_cur;
    uint64_t last_handed, last_sent, received, server_end;
    int64_t last_status_ms, last_idle_ms;
    struct pending *pend;
    size_t npend, pend_head, pend_cap;
    struct deliver_key *hand;
};

static void streams_clear(struct reader *r)
{
    while (r->streams) {
        struct stream_txn *s = r->streams;
        r->streams = s->next;
        keyset_free(&s->ks);
        free(s);
    }
    r->stream_cur = NULL;
    r->in_stream = 0;
}

static struct stream_txn *stream_find(struct reader *r, uint32_t xid, int create)
{
    struct stream_txn **pp = &r->streams;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->xid == xid) return *pp;
    if (!create) return NULL;
    struct stream_txn *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->xid = xid;
    *pp = s;
    return s;
}

static void stream_drop(struct reader *r, uint32_t xid)
{
    for (struct stream_txn **pp = &r->streams; *pp; pp = &(*pp)->next) {
        if ((*pp)->xid == xid) {
            struct stream_txn *s = *pp;
            *pp = s->next;
            keyset_free(&s->ks);
            free(s);
            return;
        }
    }
}

static int pend_push(struct reader *r, uint64_t end_lsn, int64_t commit_us, uint64_t max_id)
{
    if (r->pend_head + r->npend == r->pend_cap) {
        if (r->pend_head > 0) {
            memmove(r->pend, r->pend + r->pend_head, r->npend * sizeof *r->pend);
            r->pend_head = 0;
        }
        if (r->npend == r->pend_cap) {
            size_t cap = r->pend_cap ? r->pend_cap * 2 : 256;
            struct pending *p = realloc(r->pend, cap * sizeof *p);
            if (p == NULL) return -1;
            r->pend = p;
            r->pend_cap = cap;
        }
    }
    r->pend[r->pend_head + r->npend++] = (struct pending){end_lsn, commit_us, max_id};
    return 0;
}

/* Hand one transaction to delivery. A truncate's flush goes first, at the commit's start LSN:
 * confirming that position (should the keys not be applied yet) still has PostgreSQL send the
 * transaction again, since it re-sends every commit at or after the confirmed position. */
static int hand_over(struct reader *r, struct keyset *ks, uint64_t commit_lsn, uint64_t end_lsn,
                     int64_t ts_pg, int idle)
{
    struct inv *inv = r->inv;
    if (end_lsn <= r->last_handed) return 0; /* sent again after a reconnect */
    int64_t ts = ts_pg + PGO_EPOCH_OFFSET_US;
    if (ks->nflush && deliver_flush(inv->d, commit_lsn, ts, ks->flush, ks->nflush) < 0) return -1;
    size_t i = 0;
    do {
        size_t k = 0;
        for (; k < HAND_CHUNK && i < ks->n; k++, i++) {
            r->hand[k].key = ks->bytes + ks->e[i].off;
            r->hand[k].nkey = ks->e[i].len;
            r->hand[k].ns = ks->e[i].ns;
        }
        if (deliver_commit(inv->d, end_lsn, ts, r->hand, k, i < ks->n) < 0) return -1;
    } while (i < ks->n);
    if (pend_push(r, end_lsn, ts, ks->max_inv_id) < 0) return -1;
    r->last_handed = end_lsn;
    if (!idle) { /* where a commit-to-delete tail comes from: before delivery, or in it */
        int64_t delay = clock_wall_us() - ts;
        if (delay < 0) delay = 0;
        atomic_fetch_add(&inv->figs.receive_delay_us, (uint64_t)delay);
        if (delay > 50000) atomic_fetch_add(&inv->figs.received_late, 1);
    }
    atomic_fetch_add(&inv->figs.transactions, idle ? 0 : 1);
    atomic_fetch_add(&inv->figs.keys, ks->n);
    atomic_fetch_add(&inv->figs.truncates, ks->truncated ? 1 : 0);
    return 0;
}

/* Confirm what delivery made safe: pop pending commits, feed the cleaner, send a status
 * update when the safe LSN moved, the interval passed, or the server asked. */
static int send_status(struct reader *r, int force)
{
    struct inv *inv = r->inv;
    uint64_t safe = deliver_safe_lsn(inv->d);
    uint64_t upto = atomic_load(&inv->cleanup_upto);
    while (r->npend && r->pend[r->pend_head].end_lsn <= safe) {
        if (r->pend[r->pend_head].max_inv_id > upto) upto = r->pend[r->pend_head].max_inv_id;
        r->pend_head++;
        r->npend--;
    }
    if (r->npend == 0) r->pend_head = 0;
    atomic_store(&inv->cleanup_upto, upto);
    int64_t lag = r->npend ? clock_wall_us() - r->pend[r->pend_head].commit_us : 0;
    atomic_store(&inv->figs.lag_seconds, lag > 0 ? (uint64_t)(lag / 1000000) : 0);
    uint64_t conf = safe > r->last_sent ? safe : r->last_sent;
    atomic_store(&inv->figs.confirmed_lsn, conf);
    atomic_store(&inv->figs.lag_bytes, r->server_end > conf ? r->server_end - conf : 0);
    int64_t now = (int64_t)clock_mono_ms();
    if (!force && safe <= r->last_sent &&
        now - r->last_status_ms < (int64_t)inv->opt.status_interval_ms)
        return 0;
    uint8_t msg[34];
    uint64_t written = r->received > safe ? r->received : safe;
    size_t n = pgo_status_update(msg, written, safe, safe, clock_wall_us() - PGO_EPOCH_OFFSET_US, 0);
    if (PQputCopyData(r->conn, (const char *)msg, (int)n) != 1 || PQflush(r->conn) < 0) return -1;
    if (safe > r->last_sent) r->last_sent = safe;
    r->last_status_ms = now;
    return 0;
}

/* A map of templates --control handed over: in use from the transaction about to start.
 * Not while a streamed transaction is open: its keys point at the current map's strings. */
static int take_map(struct reader *r)
{
    if (r->streams) return 0;
    struct inv_config *m = atomic_exchange(&r->inv->next_map, NULL);
    if (m == NULL) return 0;
    log_info("key templates: %zu tables mapped", m->ntables);
    return rows_set_map(r->rows, m);
}

/* "flush\n<publication>\n<schema>\n<table>": our publication's table's namespaces go into
 * the transaction's flushes; "flushall\n<publication>" (a lost slot): every mapped table's. */
static int watch_flush(struct reader *r, const struct pgo_msg *m, struct keyset *ks)
{
    char buf[800], *f[4];
    if (m->ncontent >= sizeof buf) return 0;
    memcpy(buf, m->content, m->ncontent);
    buf[m->ncontent] = 0;
    if (!strncmp(buf, "flushall\n", 9) && !strcmp(buf + 9, r->inv->opt.publication)) {
        log_notice("flushing the namespaces of every mapped table (the slot was lost)");
        return rows_flush_all(r->rows, ks);
    }
    char *s = buf;
    for (int i = 0; i < 4; i++) {
        f[i] = s;
        s = i < 3 ? strchr(s, '\n') : NULL;
        if (i < 3 && s == NULL) return 0;
        if (s) *s++ = 0;
    }
    if (strcmp(f[0], "flush") || strcmp(f[1], r->inv->opt.publication)) return 0;
    int n = rows_table_flush(r->rows, f[2], f[3], ks);
    if (n > 0) log_notice("table %s.%s: %d namespaces flushed (it was out of the publication)",
                          f[2], f[3], n);
    return n < 0 ? -1 : 0;
}

static int on_message(struct reader *r, const uint8_t *p, size_t n)
{
    struct pgo_msg *m = r->m;
    if (pgo_decode(p, n, r->in_stream, m) < 0) {
        log_error("undecodable pgoutput message (kind '%c', %zu bytes): reconnecting",
                  n ? p[0] : '?', n);
        return -1;
    }
    struct keyset *ks = r->in_stream ? (r->stream_cur ? &r->stream_cur->ks : NULL) : &r->cur;
    switch (m->kind) {
    case PGO_BEGIN:
        keyset_reset(&r->cur);
        r->in_txn = 1;
        return take_map(r);
    case PGO_COMMIT:
        r->in_txn = 0;
        return hand_over(r, &r->cur, m->lsn, m->end_lsn, m->ts, 0);
    case PGO_RELATION:
        return rows_relation(r->rows, m);
    case PGO_INSERT:
    case PGO_UPDATE:
    case PGO_DELETE:
    case PGO_TRUNCATE:
        if (ks == NULL) return -1;
        return rows_change(r->rows, m, ks);
    case PGO_STREAM_START:
        if ((m->flags & 1) && take_map(r) < 0) return -1;
        r->in_stream = 1;
        r->stream_cur = stream_find(r, m->xid, 1);
        if (r->stream_cur == NULL) return -1;
        if (m->flags & 1) keyset_reset(&r->stream_cur->ks); /* the first block: start afresh */
        return 0;
    case PGO_STREAM_STOP:
        r->in_stream = 0;
        r->stream_cur = NULL;
        return 0;
    case PGO_STREAM_COMMIT: {
        struct stream_txn *s = stream_find(r, m->xid, 0);
        struct keyset empty = {0};
        int rc = hand_over(r, s ? &s->ks : &empty, m->lsn, m->end_lsn, m->ts, 0);
        stream_drop(r, m->xid);
        atomic_fetch_add(&r->inv->figs.streamed_transactions, 1);
        return rc;
    }
    case PGO_STREAM_ABORT:
        /* a subtransaction's abort keeps its keys: deleting a key too many is harmless, and
         * the decoder does not track which change came from which subtransaction */
        if (m->subxid == m->xid) {
            stream_drop(r, m->xid);
            atomic_fetch_add(&r->inv->figs.aborted_streams, 1);
        }
        return 0;
    case PGO_MESSAGE:
        /* the watcher's flush of a table that was out of the publication (setup.h) */
        if ((m->flags & 1) && ks && !strcmp(m->nspname, SETUP_MSG_PREFIX))
            return watch_flush(r, m, ks);
        return 0;
    default: /* origin, type, other logical messages: nothing to invalidate */
        return 0;
    }
}

static int on_frame(struct reader *r, const uint8_t *p, size_t n)
{
    struct pgo_frame f;
    if (pgo_frame_decode(p, n, &f) < 0) {
        log_error("undecodable replication frame (%zu bytes): reconnecting", n);
        return -1;
    }
    if (f.wal_end > r->server_end) r->server_end = f.wal_end;
    atomic_store(&r->inv->figs.server_lsn, r->server_end);
    if (f.kind == 'w') {
        if (f.wal_start > r->received) r->received = f.wal_start;
        atomic_store(&r->inv->figs.received_lsn, r->received);
        return on_message(r, f.data, f.ndata);
    }
    int64_t now = (int64_t)clock_mono_ms();
    if (!r->in_txn && r->streams == NULL && f.wal_end > r->last_handed &&
        (f.reply_requested || now - r->last_idle_ms >= 1000)) {
        struct keyset empty = {0};
        r->last_idle_ms = now;
        if (hand_over(r, &empty, f.wal_end, f.wal_end, clock_wall_us() - PGO_EPOCH_OFFSET_US, 1) < 0)
            return -1;
    }
    return send_status(r, f.reply_requested);
}

static PGconn *connect_stream(struct inv *inv, char *err, size_t errlen)
{
    PGconn *c = setup_replication_connect(inv, err, errlen);
    if (c == NULL) return NULL;
    char *slot = PQescapeIdentifier(c, inv->opt.slot, strlen(inv->opt.slot));
    char *pubid = PQescapeIdentifier(c, inv->opt.publication, strlen(inv->opt.publication));
    char *pub = pubid ? PQescapeLiteral(c, pubid, strlen(pubid)) : NULL;
    char sql[800];
    snprintf(sql, sizeof sql,
             "START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '2', publication_names %s, "
             "streaming 'on', messages 'true')",
             slot ? slot : "", pub ? pub : "''");
    PQfreemem(slot);
    PQfreemem(pubid);
    PQfreemem(pub);
    PGresult *res = PQexec(c, sql);
    if (PQresultStatus(res) != PGRES_COPY_BOTH) {
        snprintf(err, errlen, "START_REPLICATION: %s", PQerrorMessage(c));
        char *nl = strrchr(err, '\n');
        if (nl && nl[1] == 0) *nl = 0;
        PQclear(res);
        PQfinish(c);
        return NULL;
    }
    PQclear(res);
    return c;
}

/* One replication session: returns when the connection fails or inv->stop is set. */
static void stream(struct reader *r)
{
    struct inv *inv = r->inv;
    atomic_store(&inv->figs.streaming, 1);
    r->last_status_ms = 0;
    while (!atomic_load(&inv->stop)) {
        char *buf = NULL;
        int n = PQgetCopyData(r->conn, &buf, 1);
        if (n > 0) {
            int rc = on_frame(r, (const uint8_t *)buf, (size_t)n);
            PQfreemem(buf);
            /* while data keeps coming, confirm what delivery finished every 100 ms anyway */
            if (rc == 0 && (int64_t)clock_mono_ms() - r->last_status_ms >= 100) rc = send_status(r, 0);
            if (rc < 0) break;
            continue;
        }
        if (n == -1) {
            PGresult *res = PQgetResult(r->conn);
            log_warn("replication stream ended: %s", PQerrorMessage(r->conn));
            PQclear(res);
            break;
        }
        if (n == -2) {
            log_warn("replication stream failed: %s", PQerrorMessage(r->conn));
            break;
        }
        if (send_status(r, 0) < 0) {
            log_warn("sending status to PostgreSQL failed: %s", PQerrorMessage(r->conn));
            break;
        }
        /* short waits: a confirmation should follow delivery closely */
        struct pollfd pfd = {PQsocket(r->conn), POLLIN, 0};
        if (poll(&pfd, 1, 20) < 0 && errno != EINTR) break;
        if (PQconsumeInput(r->conn) == 0) {
            log_warn("replication connection lost: %s", PQerrorMessage(r->conn));
            break;
        }
    }
    atomic_store(&inv->figs.streaming, 0);
}

/* Sleep *backoff ms (in 20 ms steps, so a stop is seen), then double it up to
 * --reconnect-max-ms. */
static void backoff_wait(struct inv *inv, unsigned *backoff)
{
    for (unsigned t = 0; t < *backoff && !atomic_load(&inv->stop); t += 20) usleep(20000);
    *backoff = *backoff * 2 > inv->opt.reconnect_max_ms ? (unsigned)inv->opt.reconnect_max_ms
                                                        : *backoff * 2;
}

int reader_run(struct inv *inv, char *err, size_t errlen)
{
    struct reader r = {.inv = inv};
    r.m = malloc(sizeof *r.m);
    r.hand = malloc(HAND_CHUNK * sizeof *r.hand);
    r.rows = inv->rows;
    if (r.m == NULL || r.hand == NULL || r.rows == NULL) {
        snprintf(err, errlen, "out of memory");
        free(r.m);
        free(r.hand);
        return -1;
    }
    unsigned backoff = 100;
    int first = 1;
    /* --control: a change decoded before the control plane's templates are in would give no
     * key, and be confirmed */
    if (inv->ctl && !atomic_load(&inv->map_ready)) {
        log_notice("waiting for the control plane's first topology before reading the log");
        while (!atomic_load(&inv->map_ready) && !atomic_load(&inv->stop)) usleep(20000);
    }
    while (!atomic_load(&inv->stop)) {
        char e[600];
        r.conn = connect_stream(inv, e, sizeof e);
        if (r.conn == NULL && (strstr(e, "does not exist") || strstr(e, "can no longer get")) &&
            strstr(e, "replication slot")) {
            /* dropped or invalidated under us: made again, its lost commits flushed */
            char e2[600];
            if (setup_slot(inv, e2, sizeof e2) < 0) log_warn_limited("%s", e2);
        }
        if (r.conn == NULL) {
            log_warn_limited("%s (retrying in %u ms)", e, backoff);
            backoff_wait(inv, &backoff);
            continue;
        }
        if (!first) atomic_fetch_add(&inv->figs.reconnects, 1);
        log_notice("streaming from slot %s (publication %s)", inv->opt.slot, inv->opt.publication);
        first = 0;
        r.in_txn = 0;
        streams_clear(&r);
        uint64_t began = clock_mono_ms();
        stream(&r);
        PQfinish(r.conn);
        r.conn = NULL;
        /* a session PostgreSQL ends at once (an error while decoding: the publication dropped,
         * the slot terminated again and again) is retried after the backoff, not in a loop */
        if (clock_mono_ms() - began >= 1000) {
            backoff = 100;
            continue;
        }
        backoff_wait(inv, &backoff);
    }
    streams_clear(&r);
    keyset_free(&r.cur);
    free(r.m);
    free(r.hand);
    free(r.pend);
    return 0;
}
