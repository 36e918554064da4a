/* deliver_spill.c — a cluster's spill file: the deletes of a cluster that cannot take them fast
 * enough (unreachable, or slower than the commits) past mem_max_bytes, in commit order, written
 * durably so the LSN they belong to can be confirmed to PostgreSQL, and replayed in order.
 *
 * The file is a sequence of records, each the 44-byte header below then its packed items (the
 * bytes of struct rec's data), in the host's byte order:
 *   u32 magic "SHSP" | u8 kind | u8 last | u16 0 | u32 items | u32 data bytes |
 *   u64 lsn | u64 safe_after | i64 commit_us | u32 XXH32 of the data seeded with the XXH32 of
 *   the header (this field 0)
 * A record counts once its bytes and the fsync after them have returned. A crash while writing
 * leaves a torn or unchecked tail, which the next start cuts off: those records were never
 * counted safe, so PostgreSQL still has them. */
#include "invalidator/deliver_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/log.h"

#define SPILL_MAGIC 0x50534853u
#define SPILL_HDR 44
#define SPILL_DATA_MAX (1u << 30)

static void hdr_put(char *h, const struct rec *r)
{
    uint32_t magic = SPILL_MAGIC, zero = 0;
    uint16_t z16 = 0;
    memcpy(h, &magic, 4);
    h[4] = (char)r->kind;
    h[5] = (char)r->last;
    memcpy(h + 6, &z16, 2);
    memcpy(h + 8, &r->n, 4);
    memcpy(h + 12, &r->ndata, 4);
    memcpy(h + 16, &r->lsn, 8);
    memcpy(h + 24, &r->safe_after, 8);
    memcpy(h + 32, &r->commit_us, 8);
    memcpy(h + 40, &zero, 4);
}

static uint32_t rec_sum(const char *hdr, const char *data, uint32_t ndata)
{
    return XXH32(data, ndata, XXH32(hdr, SPILL_HDR, 0x5d11));
}

static int pread_all(int fd, void *p, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)p + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Read and check the record at off: header fields into *h (data NULL-ed), data malloc'ed into
 * *data. Returns the record's size, 0 when it does not read or check. */
static uint64_t read_rec(int fd, uint64_t off, uint64_t end, struct rec *h, char **data)
{
    char hdr[SPILL_HDR];
    *data = NULL;
    if (end - off < SPILL_HDR || pread_all(fd, hdr, SPILL_HDR, off) < 0) return 0;
    uint32_t magic, sum;
    memcpy(&magic, hdr, 4);
    h->kind = (uint8_t)hdr[4];
    h->last = (uint8_t)hdr[5];
    memcpy(&h->n, hdr + 8, 4);
    memcpy(&h->ndata, hdr + 12, 4);
    memcpy(&h->lsn, hdr + 16, 8);
    memcpy(&h->safe_after, hdr + 24, 8);
    memcpy(&h->commit_us, hdr + 32, 8);
    memcpy(&sum, hdr + 40, 4);
    if (magic != SPILL_MAGIC || (h->kind != REC_KEYS && h->kind != REC_FLUSH) ||
        h->ndata > SPILL_DATA_MAX || end - off - SPILL_HDR < h->ndata)
        return 0;
    char *d = malloc(h->ndata ? h->ndata : 1);
    if (!d) return 0;
    memset(hdr + 40, 0, 4);
    if (pread_all(fd, d, h->ndata, off + SPILL_HDR) < 0 || rec_sum(hdr, d, h->ndata) != sum) {
        free(d);
        return 0;
    }
    *data = d;
    return SPILL_HDR + (uint64_t)h->ndata;
}

static void note_ns(struct spill *s, const struct rec *r)
{
    uint32_t off = 0;
    struct ritem it;
    /* a flush of no named namespace is a flush_all: only a flush_all can stand for it */
    if (r->kind == REC_FLUSH && r->n == 0) s->ns_overflow = true;
    while (!s->ns_overflow && rec_next(r, &off, &it)) {
        if (!it.nns) { /* a key of no known namespace: no namespace flush covers it */
            s->ns_overflow = true;
            break;
        }
        size_t i;
        for (i = 0; i < s->nns; i++)
            if (strlen(s->ns[i]) == it.nns && !memcmp(s->ns[i], it.ns, it.nns)) break;
        if (i < s->nns) continue;
        if (s->nns == sizeof s->ns / sizeof s->ns[0] || !(s->ns[s->nns] = strndup(it.ns, it.nns)))
            s->ns_overflow = true;
        else
            s->nns++;
    }
}

static void forget_ns(struct spill *s)
{
    for (size_t i = 0; i < s->nns; i++) free(s->ns[i]);
    s->nns = 0;
    s->ns_overflow = false;
}

int spill_open(struct spill *s, const char *path, uint64_t *last_safe, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    *last_safe = 0;
    if (!(s->path = strdup(path))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    struct stat sb;
    if (s->fd < 0 || fstat(s->fd, &sb) < 0) {
        snprintf(err, errlen, "spill file %s: %s", path, strerror(errno));
        spill_close(s);
        return -1;
    }
    /* two invalidators sharing a spill file would replay and truncate each other's deletes */
    if (flock(s->fd, LOCK_EX | LOCK_NB) < 0) {
        snprintf(err, errlen, "spill file %s: %s", path,
                 errno == EWOULDBLOCK ? "in use by another process (another invalidator with "
                                        "the same spill directory?)" : strerror(errno));
        spill_close(s);
        return -1;
    }
    uint64_t size = (uint64_t)sb.st_size, off = 0;
    while (off < size) {
        struct rec h = {0};
        char *data;
        uint64_t len = read_rec(s->fd, off, size, &h, &data);
        if (!len) break;
        struct rec *r = rec_new(h.kind, h.n, h.ndata);
        if (r) {
            memcpy(r->data, data, h.ndata);
            note_ns(s, r);
            uint32_t o = 0;
            struct ritem it;
            while (h.kind == REC_KEYS && rec_next(r, &o, &it)) s->keys++;
            rec_unref(r);
        }
        free(data);
        if (h.safe_after > *last_safe) *last_safe = h.safe_after;
        if (h.lsn > s->max_lsn) s->max_lsn = h.lsn;
        s->records++;
        off += len;
    }
    if (off < size) {
        log_warn("spill file %s: %llu bytes after offset %llu do not read as whole checked "
                 "records (a write cut short by a crash); cut off: they were never confirmed",
                 path, (unsigned long long)(size - off), (unsigned long long)off);
        if (ftruncate(s->fd, (off_t)off) < 0) {
            snprintf(err, errlen, "spill file %s: truncate: %s", path, strerror(errno));
            spill_close(s);
            return -1;
        }
    }
    s->end = off;
    s->rd = 0;
    if (s->records)
        log_notice("spill file %s: %llu records (%llu deletes) left by an earlier run, "
                   "replayed first", path, (unsigned long long)s->records,
                   (unsigned long long)s->keys);
    return 0;
}

void spill_close(struct spill *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    forget_ns(s);
    free(s->path);
    s->path = NULL;
}

int spill_append(struct spill *s, struct rec *const *recs, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += SPILL_HDR + recs[i]->ndata;
    char *b = malloc(total ? total : 1);
    if (!b) {
        log_warn("spill file %s: out of memory writing %zu bytes", s->path, total);
        return -1;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        char *h = b + at;
        hdr_put(h, recs[i]);
        memcpy(h + SPILL_HDR, recs[i]->data, recs[i]->ndata);
        uint32_t sum = rec_sum(h, h + SPILL_HDR, recs[i]->ndata);
        memcpy(h + 40, &sum, 4);
        at += SPILL_HDR + recs[i]->ndata;
    }
    size_t put = 0;
    int rc = 0;
    while (put < total) {
        ssize_t w = pwrite(s->fd, b + put, total - put, (off_t)(s->end + put));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            rc = -1;
            break;
        }
        put += (size_t)w;
    }
    if (rc == 0 && fsync(s->fd) < 0) rc = -1;
    free(b);
    if (rc < 0) {
        log_error("spill file %s: write of %zu bytes failed: %s; the deletes stay in memory",
                  s->path, total, strerror(errno));
        if (ftruncate(s->fd, (off_t)s->end) < 0) {
            /* the tail stays, unchecked or torn: the next start cuts or replays it, both safe */
        }
        return -1;
    }
    s->end += total;
    for (size_t i = 0; i < n; i++) {
        s->records++;
        if (recs[i]->lsn > s->max_lsn) s->max_lsn = recs[i]->lsn;
        note_ns(s, recs[i]);
        if (recs[i]->kind == REC_KEYS) s->keys += recs[i]->n;
    }
    return 0;
}

struct rec *spill_load(struct spill *s, bool *bad)
{
    *bad = false;
    if (s->rd >= s->end) return NULL;
    struct rec h = {0};
    char *data;
    uint64_t len = read_rec(s->fd, s->rd, s->end, &h, &data);
    struct rec *r = len ? rec_new(h.kind, h.n, h.ndata) : NULL;
    if (!r) {
        free(data);
        *bad = true;
        log_error("spill file %s: record at offset %llu cannot be read back (%s); the %llu bytes "
                  "after it are given up", s->path, (unsigned long long)s->rd,
                  len ? "out of memory" : "corrupt", (unsigned long long)(s->end - s->rd));
        s->rd = s->end;
        return NULL;
    }
    memcpy(r->data, data, h.ndata);
    free(data);
    r->last = h.last;
    r->lsn = h.lsn;
    r->safe_after = h.safe_after;
    r->commit_us = h.commit_us;
    s->rd += len;
    return r;
}

int spill_reset(struct spill *s)
{
    s->rd = s->end = 0;
    s->records = s->keys = s->max_lsn = 0;
    forget_ns(s);
    if (ftruncate(s->fd, 0) < 0) {
        log_warn("spill file %s: truncate: %s", s->path, strerror(errno));
        return -1;
    }
    return 0;
}

int spill_replace(struct spill *s, struct rec *const *recs, size_t n)
{
    size_t plen = strlen(s->path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return -1;
    memcpy(tmp, s->path, plen);
    memcpy(tmp + plen, ".new", 5);
    struct spill t = {.fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600),
                      .path = tmp};
    if (t.fd >= 0) flock(t.fd, LOCK_EX | LOCK_NB);
    if (t.fd < 0 || spill_append(&t, recs, n) < 0 || rename(tmp, s->path) < 0) {
        log_error("spill file %s: cannot write its replacement %s: %s", s->path, tmp,
                  strerror(errno));
        if (t.fd >= 0) {
            close(t.fd);
            unlink(tmp);
        }
        forget_ns(&t);
        free(tmp);
        return -1;
    }
    /* the rename must be durable too before the flush stands for what the old file held */
    char *slash = strrchr(s->path, '/');
    char *dir = slash ? strndup(s->path, (size_t)(slash - s->path) + 1) : strdup(".");
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    close(s->fd);
    forget_ns(s);
    s->fd = t.fd;
    s->end = t.end;
    s->rd = 0;
    s->records = t.records;
    s->keys = t.keys;
    s->max_lsn = t.max_lsn;
    memcpy(s->ns, t.ns, sizeof t.ns);
    s->nns = t.nns;
    s->ns_overflow = t.ns_overflow;
    free(tmp);
    return 0;
}
