/* deliver_replica.c — replica gating (issue 14 point 4): a cluster whose readers fill from a
 * PostgreSQL replica must not see a commit's deletes before that replica has replayed the commit,
 * or a reader could refill the old row from the lagging replica right after the delete.
 * (While it waits, the interval doubles from POLL_BUSY_MS up to POLL_BUSY_MAX_MS as long as the
 * replica makes no progress, so a replica paused for long is not asked 500 times a second.)
 *
 * One thread per such cluster polls the replica's pg_last_wal_replay_lsn() (libpq) and publishes
 * it in c->replica_lsn; the cluster's thread sends a record only once its commit's end LSN is at
 * or below it. While the cluster waits (c->gate_want above what was seen) the replica is asked
 * every POLL_BUSY_MS, else every POLL_IDLE_MS (for the lag figure and replica_up). A replica
 * that is not in recovery (promoted, or a primary configured by mistake) has no replay LSN: the
 * gate is then open (logged), since nothing will ever replay there. An unreachable replica keeps
 * the gate shut: the deletes wait (and spill) rather than race a replica nobody can see. */
#include "invalidator/deliver_int.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

#define POLL_BUSY_MS 2
#define POLL_BUSY_MAX_MS 32
#define POLL_IDLE_MS 500
#define QUERY_TIMEOUT_MS 2000
#define RECONNECT_MS 500

static bool stopping(struct dcluster *c) { return __atomic_load_n(&c->d->stop, __ATOMIC_ACQUIRE); }

/* Wait up to ms, or until the cluster's thread asks for an LSN beyond what was seen. */
static void rwait(struct dcluster *c, uint64_t ms)
{
    struct timespec ts = clock_deadline(ms);
    pthread_mutex_lock(&c->lock);
    while (!stopping(c) && __atomic_load_n(&c->gate_want, __ATOMIC_ACQUIRE) <=
                               __atomic_load_n(&c->replica_lsn, __ATOMIC_ACQUIRE))
        if (pthread_cond_timedwait(&c->cv, &c->lock, &ts) == ETIMEDOUT) break;
    pthread_mutex_unlock(&c->lock);
}

/* "X/Y" (hex) to an LSN; 0 when it does not parse. */
static uint64_t parse_lsn(const char *s)
{
    unsigned hi, lo;
    char end;
    if (sscanf(s, "%X/%X%c", &hi, &lo, &end) != 2) return 0;
    return (uint64_t)hi << 32 | lo;
}

/* One round trip; -1 when the connection has to go. *lsn 0 and *recovering 0: not a replica. */
static int ask(PGconn *pg, uint64_t *lsn, int *recovering, char *why, size_t whylen)
{
    if (!PQsendQuery(pg, "SELECT pg_last_wal_replay_lsn()::text, pg_is_in_recovery()")) {
        snprintf(why, whylen, "%s", PQerrorMessage(pg));
        return -1;
    }
    PGresult *res = NULL, *r;
    uint64_t deadline = clock_mono_ms() + QUERY_TIMEOUT_MS;
    for (;;) {
        while (!PQisBusy(pg)) {
            r = PQgetResult(pg);
            if (!r) goto done;
            if (res) PQclear(res);
            res = r;
        }
        uint64_t now = clock_mono_ms();
        if (now >= deadline) {
            snprintf(why, whylen, "no answer within %d ms", QUERY_TIMEOUT_MS);
            if (res) PQclear(res);
            return -1;
        }
        struct pollfd p = {.fd = PQsocket(pg), .events = POLLIN};
        if (poll(&p, 1, (int)(deadline - now)) < 0 && errno != EINTR) {
            snprintf(why, whylen, "%s", strerror(errno));
            if (res) PQclear(res);
            return -1;
        }
        if (!PQconsumeInput(pg)) {
            snprintf(why, whylen, "%s", PQerrorMessage(pg));
            if (res) PQclear(res);
            return -1;
        }
    }
done:
    if (!res || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        snprintf(why, whylen, "%s", res ? PQresultErrorMessage(res) : "no result");
        if (res) PQclear(res);
        return -1;
    }
    *lsn = PQgetisnull(res, 0, 0) ? 0 : parse_lsn(PQgetvalue(res, 0, 0));
    *recovering = !strcmp(PQgetvalue(res, 0, 1), "t");
    PQclear(res);
    return 0;
}

static void set_up(struct dcluster *c, int up)
{
    pthread_mutex_lock(&c->lock);
    c->st.replica_up = (uint64_t)up;
    pthread_mutex_unlock(&c->lock);
}

static void *replica_main(void *arg)
{
    struct dcluster *c = arg;
    PGconn *pg = NULL;
    int warned_primary = 0, was_up = -1;
    uint64_t busy_ms = POLL_BUSY_MS;
    while (!stopping(c)) {
        char why[256] = "";
        if (!pg) {
            const char *keys[] = {"dbname", "connect_timeout", NULL};
            const char *vals[] = {c->replica, "2", NULL};
            pg = PQconnectdbParams(keys, vals, 1);
            if (!pg || PQstatus(pg) != CONNECTION_OK) {
                snprintf(why, sizeof why, "%s", pg ? PQerrorMessage(pg) : "out of memory");
                why[strcspn(why, "\n")] = 0;
                if (was_up != 0)
                    log_warn("cluster %s: replica does not answer (%s); its deletes wait", c->name,
                             why);
                was_up = 0;
                set_up(c, 0);
                if (pg) PQfinish(pg);
                pg = NULL;
                rwait(c, RECONNECT_MS);
                continue;
            }
        }
        uint64_t lsn = 0;
        int recovering = 0;
        if (ask(pg, &lsn, &recovering, why, sizeof why) < 0) {
            why[strcspn(why, "\n")] = 0;
            log_warn("cluster %s: replica query failed (%s); reconnecting", c->name, why);
            was_up = 0;
            set_up(c, 0);
            PQfinish(pg);
            pg = NULL;
            continue;
        }
        if (was_up != 1) log_notice("cluster %s: replica answers (replay LSN %X/%X)", c->name,
                                    (unsigned)(lsn >> 32), (unsigned)lsn);
        was_up = 1;
        set_up(c, 1);
        int pass = !recovering && !lsn;
        if (pass && !warned_primary)
            log_warn("cluster %s: the configured replica is not in recovery (no replay LSN); "
                     "its deletes are no longer held for it", c->name);
        warned_primary = pass;
        __atomic_store_n(&c->replica_passthrough, pass, __ATOMIC_RELEASE);
        uint64_t old = __atomic_load_n(&c->replica_lsn, __ATOMIC_ACQUIRE);
        if (lsn > old) __atomic_store_n(&c->replica_lsn, lsn, __ATOMIC_RELEASE);
        uint64_t want = __atomic_load_n(&c->gate_want, __ATOMIC_ACQUIRE);
        if ((lsn > old && want > old) || pass) {
            pthread_mutex_lock(&c->lock);
            c->wake = true;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->lock);
        }
        if (lsn > old) busy_ms = POLL_BUSY_MS;
        if (want > lsn && !pass) {
            struct timespec ts = {0, (long)busy_ms * 1000000L};
            nanosleep(&ts, NULL);
            if (busy_ms < POLL_BUSY_MAX_MS) busy_ms *= 2;
        } else {
            rwait(c, POLL_IDLE_MS);
        }
    }
    if (pg) PQfinish(pg);
    return NULL;
}

int replica_start(struct dcluster *c)
{
    return pthread_create(&c->rthread, NULL, replica_main, c) == 0 ? 0 : -1;
}

void replica_stop(struct dcluster *c)
{
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->rthread, NULL);
}
