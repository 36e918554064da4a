/* replaycut.c — the start of a promotion's delete replay, from the new primary's replication
 * stamp (see replaycut.h). */
#include "router/replaycut.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/slot.h"

/* The value of "STAT primary:<idx>:<field> <value>" lines: calls fn for each. */
static void each_primary_stat(const char *reply, size_t len,
                              void (*fn)(void *ctx, long idx, const char *field, const char *val),
                              void *ctx)
{
    const char *p = reply, *end = reply + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char line[512], field[32], val[300];
        long idx;
        if (ll && p[ll - 1] == '\r') ll--;
        if (ll < sizeof line) {
            memcpy(line, p, ll);
            line[ll] = '\0';
            if (sscanf(line, "STAT primary:%ld:%31[a-z_] %299s", &idx, field, val) == 3 && idx >= 0)
                fn(ctx, idx, field, val);
        }
        p = nl ? nl + 1 : end;
    }
}

struct stamp_find {
    const char *primary;
    long idx;
    uint64_t wall;
};

static void find_idx(void *ctx, long idx, const char *field, const char *val)
{
    struct stamp_find *f = ctx;
    if (!strcmp(field, "node") && !strcmp(val, f->primary)) f->idx = idx;
}

static void find_stamp(void *ctx, long idx, const char *field, const char *val)
{
    struct stamp_find *f = ctx;
    char *e;
    errno = 0;
    unsigned long long v = strtoull(val, &e, 10);
    if (idx == f->idx && !strcmp(field, "applied_wall_ms") && *e == '\0' && errno == 0 &&
        val[0] >= '0' && val[0] <= '9')
        f->wall = v;
}

int replaycut_parse(const char *reply, size_t len, const char *primary, uint64_t *wall_ms)
{
    struct stamp_find f = {primary, -1, 0};
    each_primary_stat(reply, len, find_idx, &f);
    if (f.idx < 0) return -1;
    each_primary_stat(reply, len, find_stamp, &f);
    if (f.wall == 0) return -1; /* never stamped: an older node, or nothing applied */
    *wall_ms = f.wall;
    return 0;
}

/* Connect to host:port within the time left; -1 on failure. */
static int dial(const char *addr, uint64_t until)
{
    char host[300];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof host) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || ai == NULL) return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return -1;
    uint64_t now = clock_mono_ms();
    struct pollfd pf = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof err;
    if (now >= until || poll(&pf, 1, (int)(until - now)) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
        close(fd);
        return -1;
    }
    return fd;
}

int replaycut_query(const char *addr, const char *primary, int timeout_ms, uint64_t *wall_ms,
                    const char **why)
{
    uint64_t until = clock_mono_ms() + (uint64_t)timeout_ms;
    int fd = dial(addr, until);
    if (fd < 0) {
        *why = "cannot connect";
        return -1;
    }
    static const char q[] = "stats repl\r\n";
    if (send(fd, q, sizeof q - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof q - 1)) {
        close(fd);
        *why = "cannot send";
        return -1;
    }
    char buf[16384];
    size_t n = 0;
    int rc = -1;
    *why = "no answer in time";
    for (;;) {
        uint64_t now = clock_mono_ms();
        struct pollfd pf = {fd, POLLIN, 0};
        if (now >= until || poll(&pf, 1, (int)(until - now)) != 1) break;
        ssize_t got = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (got <= 0) {
            *why = "connection closed";
            break;
        }
        n += (size_t)got;
        buf[n] = '\0';
        bool done = n >= 5 && !memcmp(buf + n - 5, "END\r\n", 5);
        bool error = strstr(buf, "ERROR") != NULL && memchr(buf, '\n', n) != NULL;
        if (done || error || n == sizeof buf - 1) {
            rc = done ? replaycut_parse(buf, n, primary, wall_ms) : -1;
            *why = done ? "no stamp for that primary" : error ? "an error" : "too long";
            break;
        }
    }
    close(fd);
    return rc;
}

uint64_t replaycut_since(bool known, uint64_t applied_wall_ms, uint64_t margin_ms,
                         uint64_t now_wall_ms, uint64_t now_mono_ms)
{
    if (!known || applied_wall_ms <= margin_ms) return 0;
    uint64_t from_wall = applied_wall_ms - margin_ms;
    /* how long ago, by the wall clock; a stamp in our future (skew beyond the margin) means
     * nothing logged before now is needed */
    uint64_t ago = now_wall_ms > from_wall ? now_wall_ms - from_wall : 0;
    if (ago >= now_mono_ms) return 0; /* before the monotonic clock's start: everything */
    return now_mono_ms - ago;
}

/* Per-slot `node` names of one pool's slot map (pointers into the document). */
static void owners(json_t *slots, const char **node)
{
    size_t i;
    json_t *r;
    json_array_foreach(slots, i, r) {
        json_t *jf = json_object_get(r, "from"), *jt = json_object_get(r, "to");
        const char *nn = json_string_value(json_object_get(r, "node"));
        if (!json_is_integer(jf) || !json_is_integer(jt) || nn == NULL) continue;
        json_int_t from = json_integer_value(jf), to = json_integer_value(jt);
        if (from < 0) from = 0;
        if (to >= SLOT_COUNT) to = SLOT_COUNT - 1;
        for (json_int_t s = from; s <= to; s++) node[s] = nn;
    }
}

size_t replaycut_pairs(json_t *old_doc, json_t *new_doc, const uint16_t *slots, size_t n,
                       uint8_t *group, const char **old, const char **now, size_t maxpairs)
{
    size_t np = 0;
    if (maxpairs > REPLAYCUT_UNKNOWN) maxpairs = REPLAYCUT_UNKNOWN;
    const char **on = calloc(SLOT_COUNT, sizeof *on), **nn = calloc(SLOT_COUNT, sizeof *nn);
    for (size_t i = 0; i < n; i++) group[i] = REPLAYCUT_UNKNOWN;
    bool *seen = calloc(n, sizeof *seen);
    if (on && nn && seen) {
        const char *name;
        json_t *npv;
        json_t *op = json_object_get(old_doc, "pools"), *npools = json_object_get(new_doc, "pools");
        json_object_foreach(npools, name, npv) {
            json_t *os = json_object_get(json_object_get(op, name), "slots");
            json_t *ns = json_object_get(npv, "slots");
            if (!json_is_array(os) || !json_is_array(ns)) continue;
            memset(on, 0, SLOT_COUNT * sizeof *on);
            memset(nn, 0, SLOT_COUNT * sizeof *nn);
            owners(os, on);
            owners(ns, nn);
            for (size_t i = 0; i < n; i++) {
                uint16_t s = slots[i];
                if (!on[s] || !nn[s] || !strcmp(on[s], nn[s])) continue;
                if (seen[i]) { /* it moved in two pools (a slot number is every pool's):
                                * which stamp covers which delete is unknown */
                    group[i] = REPLAYCUT_UNKNOWN;
                    continue;
                }
                seen[i] = true;
                size_t k;
                for (k = 0; k < np; k++)
                    if (!strcmp(old[k], on[s]) && !strcmp(now[k], nn[s])) break;
                if (k == np && np < maxpairs) {
                    old[np] = on[s];
                    now[np] = nn[s];
                    np++;
                }
                if (k < np) group[i] = (uint8_t)k;
            }
        }
    }
    free(on);
    free(nn);
    free(seen);
    return np;
}
