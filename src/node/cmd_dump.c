/* cmd_dump.c — key dumps in memcached's formats: `lru_crawler metadump all|hash|<classes>`
 * (and the other `lru_crawler` subcommands, answered as memcached 1.6.18 answers them) and
 * `stats cachedump <class> <limit>`, which memcdump, memcached-tool and php-memcached's
 * getAllKeys() read.
 *
 * A dump is a cursor over item memory (store_dump_step), not a snapshot. It runs in slices: each
 * slice looks at a bounded number of chunks and queues what it found, then the connection
 * waits for its output to drain (conn.c calls dump_continue again), so a dump of a huge cache
 * neither stalls the worker's other connections nor piles up more than a slice of output.
 * Requests pipelined behind the dump wait for its END. `stats detail dump` (up to 65,536
 * prefixes) goes out in slices the same way. */
#include "node/cmd_dump.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "node/cmd.h"
#include "node/index.h"

/* Chunks looked at per slice, and the output after which a slice stops early. */
#define DUMP_SLICE_CHUNKS 16384
#define DUMP_SLICE_BYTES (256 * 1024)
/* memcached's class ids run 1..63; ours may go further (stats slabs says how far). */
#define DUMP_MEMCACHED_CLASSES 64

enum dump_kind { DUMP_META, DUMP_CACHE, DUMP_DETAIL };

struct dump {
    enum dump_kind kind;
    struct store_cursor cur;
    int clsid;            /* walk only this class (0: any) */
    int min_cls;          /* cachedump 0: only classes from this id on (see cmd_cachedump) */
    uint64_t limit, seen; /* cachedump: stop after `limit` items (0: no limit) */
    uint8_t classes[32];  /* metadump of a class list: bit per class id */
    bool all;             /* metadump all/hash */
    struct conn *c;
    int64_t epoch;
    bool oom;
    int bucket;           /* DUMP_DETAIL: the next prefix bucket (detail.h) */
};

void dump_free(struct dump **dp)
{
    free(*dp);
    *dp = NULL;
}

/* Highest class id a dump request may name: memcached's range, or ours if larger. */
static int dump_max_class(const struct conn *c)
{
    int n = store_class_count(c->node->store);
    return n >= DUMP_MEMCACHED_CLASSES ? n : DUMP_MEMCACHED_CLASSES - 1;
}

/* memcached's number rule (safe_strtoul): optional '+', decimal digits, fits 32 bits. */
static bool dump_u32(const char *s, size_t n, uint32_t *out)
{
    if (n && *s == '+') s++, n--;
    if (n == 0 || n > 10) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

/* Append `key` with every byte outside [A-Za-z0-9-._~] as %XX, as memcached's metadump. */
static char *dump_urlencode(char *p, const char *key, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)key[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '.' || ch == '_' || ch == '~') {
            *p++ = (char)ch;
        } else {
            *p++ = '%';
            *p++ = hex[ch >> 4];
            *p++ = hex[ch & 15];
        }
    }
    return p;
}

static char *dump_str(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

static char *dump_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return p + fmt_u64(p, (uint64_t)-v);
    }
    return p + fmt_u64(p, (uint64_t)v);
}

/* One item (class lock held; see store_dump_fn): format its line straight into the output. */
static void dump_item(void *ctx, const struct item *it, int clsid)
{
    struct dump *d = ctx;
    if (d->oom) return;
    if (d->kind == DUMP_META && !d->all && !(d->classes[clsid >> 3] & (1u << (clsid & 7))))
        return;
    if (d->kind == DUMP_CACHE && d->limit && d->seen >= d->limit) return;
    if (clsid < d->min_cls) return;
    /* key bytes (x3 when encoded) plus the fixed fields */
    if (buf_reserve(&d->c->wbuf, 3 * (size_t)it->nkey + 160) < 0) {
        d->oom = true;
        return;
    }
    d->seen++;
    uint32_t exptime = __atomic_load_n(&it->exptime, __ATOMIC_RELAXED);
    char *p = d->c->wbuf.data + d->c->wbuf.len;
    if (d->kind == DUMP_META) {
        p = dump_str(p, "key=");
        p = dump_urlencode(p, it->data, it->nkey);
        p = dump_str(p, " exp=");
        p = dump_i64(p, exptime ? d->epoch + exptime : -1);
        p = dump_str(p, " la=");
        p = dump_i64(p, d->epoch + __atomic_load_n(&it->atime, __ATOMIC_RELAXED));
        p = dump_str(p, " cas=");
        p += fmt_u64(p, ((uint64_t)__atomic_load_n(&it->cas_hi, __ATOMIC_RELAXED) << 32) |
                            __atomic_load_n(&it->cas_lo, __ATOMIC_RELAXED));
        p = dump_str(p, (__atomic_load_n(&it->iflags, __ATOMIC_RELAXED) & ITEM_FETCHED)
                            ? " fetch=yes cls="
                            : " fetch=no cls=");
        p += fmt_u64(p, (uint64_t)clsid);
        p = dump_str(p, " size=");
        p += fmt_u64(p, index_item_bytes(it));
        *p++ = '\n'; /* memcached ends metadump lines with a bare \n, and END with \r\n */
    } else {
        p = dump_str(p, "ITEM ");
        memcpy(p, it->data, it->nkey);
        p += it->nkey;
        p = dump_str(p, " [");
        p += fmt_u64(p, it->nbytes);
        p = dump_str(p, " b; ");
        p = dump_i64(p, exptime ? d->epoch + exptime : 0);
        p = dump_str(p, " s]\r\n");
    }
    d->c->wbuf.len = (size_t)(p - d->c->wbuf.data);
}

bool dump_continue(struct conn *c)
{
    struct dump *d = c->dump;
    size_t start = buf_used(&c->wbuf);
    uint32_t chunks = 0;
    bool more = true;
    d->epoch = (int64_t)clock_epoch();
    if (d->kind == DUMP_DETAIL) {
        d->bucket = detail_dump(&c->node->detail, &c->wbuf, d->bucket, DUMP_SLICE_BYTES);
        more = d->bucket < DETAIL_BUCKETS;
    }
    while (d->kind != DUMP_DETAIL && more && chunks < DUMP_SLICE_CHUNKS && buf_used(&c->wbuf) - start < DUMP_SLICE_BYTES &&
           !d->oom && !(d->kind == DUMP_CACHE && d->limit && d->seen >= d->limit)) {
        more = store_dump_step(c->node->store, &d->cur, d->clsid, STORE_DUMP_BATCH, dump_item, d);
        chunks += STORE_DUMP_BATCH;
    }
    if (d->oom) {
        /* the lines already queued cannot be taken back: end the stream so the client stops */
        c->w->m.conn_oom++;
        conn_reply_str(c, "SERVER_ERROR out of memory\r\n");
    } else if (more && !(d->kind == DUMP_CACHE && d->limit && d->seen >= d->limit)) {
        return false;
    } else {
        conn_reply_str(c, "END\r\n");
    }
    dump_free(&c->dump);
    return true;
}

static void dump_start(struct conn *c, struct dump *d)
{
    d->c = c;
    c->dump = d;
    dump_continue(c);
}

/* Parse memcached's class list ("1,2,3"; empty pieces skipped) into d->classes. */
static bool dump_class_list(struct conn *c, const char *s, size_t n, struct dump *d)
{
    int max = dump_max_class(c), count = 0, last = 0;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != ',') j++;
        if (j > i) {
            uint32_t v;
            if (!dump_u32(s + i, j - i, &v) || v < 1 || v > (uint32_t)max) return false;
            d->classes[v >> 3] |= (uint8_t)(1u << (v & 7));
            count++;
            last = (int)v;
        }
        i = j + 1;
    }
    if (count == 1) d->clsid = last; /* one class: walk only its pages */
    return true;
}

static bool dump_crawler_off(const struct conn *c)
{
    return __atomic_load_n(&c->node->crawler_off, __ATOMIC_RELAXED);
}

void cmd_lru_crawler(struct conn *c, struct proto_req *req)
{
    struct proto_tok t[3];
    size_t n = proto_split(req->arg, req->arg ? req->arg + req->narg : NULL, t, 2);
#define IS(i, s) (t[i].n == sizeof(s) - 1 && !memcmp(t[i].p, s, t[i].n))
    if (n == 1 && IS(0, "enable")) {
        /* memcached answers so when its crawler already runs, which ours always does */
        if (!dump_crawler_off(c)) {
            conn_reply_str(c, "ERROR failed to start lru crawler thread\r\n");
            return;
        }
        __atomic_store_n(&c->node->crawler_off, false, __ATOMIC_RELAXED);
        conn_reply_str(c, "OK\r\n");
    } else if (n == 1 && IS(0, "disable")) {
        __atomic_store_n(&c->node->crawler_off, true, __ATOMIC_RELAXED);
        conn_reply_str(c, "OK\r\n");
    } else if (n == 2 && IS(0, "metadump")) {
        struct dump tmp = {.kind = DUMP_META};
        if (IS(1, "all") || IS(1, "hash")) {
            tmp.all = true;
        } else if (!dump_class_list(c, t[1].p, t[1].n, &tmp)) {
            conn_reply_str(c, "BADCLASS invalid class id\r\n");
            return;
        }
        if (dump_crawler_off(c)) {
            conn_reply_str(c, "CLIENT_ERROR lru crawler disabled\r\n");
            return;
        }
        struct dump *d = malloc(sizeof *d);
        if (d == NULL) {
            c->w->m.conn_oom++;
            conn_reply_str(c, "SERVER_ERROR out of memory\r\n");
            return;
        }
        *d = tmp;
        dump_start(c, d);
    } else {
        /* crawl, tocrawl, sleep and the malformed forms: the sweeper has its own pace, so
         * these change nothing; answered as memcached answers them, as on the router */
        bool silent;
        const char *r = proto_tune_reply(req, &silent);
        if (!silent) {
            conn_reply_str(c, r);
            conn_reply(c, "\r\n", 2);
        }
    }
#undef IS
}

/* A zeroed dump of `kind`, or NULL after answering the out-of-memory error. */
static struct dump *dump_new(struct conn *c, enum dump_kind kind)
{
    struct dump *d = calloc(1, sizeof *d);
    if (d == NULL) {
        c->w->m.conn_oom++;
        conn_reply_str(c, "SERVER_ERROR out of memory\r\n");
        return NULL;
    }
    d->kind = kind;
    return d;
}

void cmd_detail_dump(struct conn *c)
{
    struct dump *d = dump_new(c, DUMP_DETAIL);
    if (d == NULL) return;
    dump_start(c, d);
}

void cmd_cachedump(struct conn *c, const char *arg, size_t n)
{
    struct proto_tok t[3];
    /* memcached ignores tokens after the limit */
    size_t k = proto_split(arg, arg + n, t, 2);
    if (k < 2) {
        conn_reply_str(c, "CLIENT_ERROR bad command line\r\n");
        return;
    }
    uint32_t id, limit;
    if (!dump_u32(t[0].p, t[0].n, &id) || !dump_u32(t[1].p, t[1].n, &limit)) {
        conn_reply_str(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    if (id > (uint32_t)dump_max_class(c)) {
        conn_reply_str(c, "CLIENT_ERROR Illegal slab id\r\n");
        return;
    }
    /* Class 0 is no class in memcached, and its ids stop at 63, where libmemcached's dump
     * loop (memcdump, php-memcached's getAllKeys) stops too: so shoal answers class 0 with its
     * classes beyond memcached's range, and that loop sees every key once. */
    int nclasses = store_class_count(c->node->store);
    if ((id == 0 && nclasses < DUMP_MEMCACHED_CLASSES) || id > (uint32_t)nclasses) {
        conn_reply_str(c, "END\r\n"); /* no such class here: nothing in it */
        return;
    }
    struct dump *d = dump_new(c, DUMP_CACHE);
    if (d == NULL) return;
    d->clsid = (int)id;
    if (id == 0) d->min_cls = DUMP_MEMCACHED_CLASSES;
    d->limit = limit;
    dump_start(c, d);
}
