/* cmd_text.c — memcached's classic text commands: get family, storage, delete, incr/decr,
 * touch, flush_all, flush_ns (shoal's), version, verbosity, quit, shutdown, cache_memlimit. Replies and counters
 * follow memcached 1.6. */
#include <ctype.h>
#include <stdint.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/cmd.h"
#include "node/cmd_dump.h"
#include "node/cmd_store.h"
#include "node/repl_hook.h"

static void reply_unless_noreply(struct conn *c, const struct proto_req *req, const char *s)
{
    if (!req->noreply) conn_reply_str(c, s);
}

/* Append "VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n". False when out_max forbids it. */
static bool text_value(struct conn *c, struct item *it, bool with_cas)
{
    size_t need = 6 + it->nkey + 1 + 10 + 1 + 10 + 1 + 20 + 2 + it->nbytes + 2;
    if (!conn_out_room(c, need)) return false;
    if (buf_reserve(&c->wbuf, need) < 0) {
        c->w->m.conn_oom++;
        return false;
    }
    char *p = c->wbuf.data + c->wbuf.len;
    memcpy(p, "VALUE ", 6);
    p += 6;
    memcpy(p, item_key(it), it->nkey);
    p += it->nkey;
    *p++ = ' ';
    p += fmt_u64(p, item_flags(it));
    *p++ = ' ';
    p += fmt_u64(p, it->nbytes);
    if (with_cas) {
        *p++ = ' ';
        p += fmt_u64(p, item_cas(it));
    }
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, item_value(it), it->nbytes);
    p += it->nbytes;
    *p++ = '\r';
    *p++ = '\n';
    c->wbuf.len = (size_t)(p - c->wbuf.data);
    return true;
}

/* Answer the keys in [keys, end) of a get/gets/gat/gats (`cmd`; a gat's `exptime` as sent),
 * in order, without END. After each key, stops once more than `soft` reply bytes are queued
 * and returns where it stopped (a long get's part, resumed when the output drains; SIZE_MAX
 * for a whole line, which the compiler then drops). Returns NULL after answering the
 * SERVER_ERROR that replaces this call's output when a value would pass out_max. The keys
 * must be valid (proto_keys_valid). */
static inline const char *get_keys(struct conn *c, enum proto_cmd cmd, int64_t exptime,
                                   const char *keys, const char *end, size_t soft)
{
    struct store *st = c->node->store;
    struct node_metrics *m = &c->w->m;
    bool with_cas = cmd == CMD_GETS || cmd == CMD_GATS;
    bool touch = cmd == CMD_GAT || cmd == CMD_GATS;
    uint32_t now = clock_now();
    size_t mark = buf_used(&c->wbuf);
    bool overflow = false;
    const char *cur = keys, *key;
    uint8_t nkey;
    while (!overflow && proto_next_key(&cur, end, &key, &nkey)) {
        if (cmd_fenced(c, key, nkey)) {
            /* no per-key error in a get: the whole request is refused, as for overflow */
            c->wbuf.len = c->wbuf.off + mark;
            conn_reply_str(c, FENCE_REPLY);
            return NULL;
        }
        uint64_t hv = store_hash(key, nkey);
        const struct ns *ns = cmd_ns(c, key, nkey);
        struct ns_metrics *nsm = cmd_nsm(c, ns);
        enum store_miss why;
        m->cmd_get++;
        if (touch) m->cmd_touch++;
        store_lock(st, hv);
        struct item *it = store_find_ex(st, hv, key, nkey, now, &why, STORE_FIND_GRACE);
        /* an expired item kept for stale_ttl is for lease-aware mg readers: a miss here, and
         * left in place for them */
        if (it && why == STORE_MISS_EXPIRED) it = NULL;
        if (it) {
            if (touch) {
                it->exptime = ns_exptime(ns, exptime, now);
                repl_hook_touch(c->node, ns, key, nkey, it->exptime);
                m->touch_hits++;
            } else {
                m->get_hits++;
            }
            struct class_metrics *cm = cmd_clsm(c, it);
            if (touch) cm->touch_hits++;
            else cm->get_hits++;
            nsm->get_hits++;
            store_bump(st, it, now);
            overflow = !text_value(c, it, with_cas);
        } else {
            if (touch) m->touch_misses++;
            else m->get_misses++;
            nsm->get_misses++;
            if (why == STORE_MISS_EXPIRED) m->get_expired++;
            else if (why == STORE_MISS_FLUSHED) m->get_flushed++;
        }
        store_unlock(st, hv);
        if (detail_enabled(&c->node->detail))
            detail_record(&c->node->detail, key, nkey, DETAIL_GET, it != NULL);
        if (buf_used(&c->wbuf) > soft) break;
    }
    if (overflow) {
        /* Drop this reply's partial output so the stream stays well formed. */
        c->wbuf.len = c->wbuf.off + mark;
        m->conn_closed_out_limit++;
        conn_reply_str(c, "SERVER_ERROR out of memory writing get response\r\n");
        return NULL;
    }
    return cur;
}

const char *cmd_get_part(struct conn *c, enum proto_cmd cmd, int64_t exptime, const char *keys,
                         const char *end)
{
    return get_keys(c, cmd, exptime, keys, end, c->node->cfg.out_max / 4);
}

static void text_get(struct conn *c, struct proto_req *req)
{
    if (!proto_keys_valid(req->keys, req->keys_end)) {
        c->w->m.protocol_errors++;
        conn_reply_str(c, "CLIENT_ERROR bad command line format\r\n");
        return;
    }
    if (get_keys(c, req->cmd, req->exptime, req->keys, req->keys_end, SIZE_MAX))
        conn_reply(c, "END\r\n", 5);
}

void cmd_text_store(struct conn *c, struct proto_req *req, struct item *it, const struct ns *ns)
{
    struct cmd_store_args a = {0};
    it->exptime = ns_exptime(ns, req->exptime, clock_now());
    switch (req->cmd) {
    case CMD_ADD: a.mode = CS_ADD; break;
    case CMD_REPLACE: a.mode = CS_REPLACE; break;
    case CMD_APPEND: a.mode = CS_APPEND; break;
    case CMD_PREPEND: a.mode = CS_PREPEND; break;
    case CMD_CAS:
        a.mode = CS_REPLACE;
        a.has_cas = true;
        a.cas = req->cas;
        break;
    default: a.mode = CS_SET; break;
    }
    static const char *const replies[] = {
        [CS_STORED] = "STORED\r\n",       [CS_NOT_STORED] = "NOT_STORED\r\n",
        [CS_EXISTS] = "EXISTS\r\n",       [CS_NOT_FOUND] = "NOT_FOUND\r\n",
        [CS_NO_MEMORY] = "SERVER_ERROR out of memory storing object\r\n",
    };
    enum cmd_store_res r = cmd_store_apply(c, it, &a, NULL);
    reply_unless_noreply(c, req, replies[r]);
}

static void text_delete(struct conn *c, struct proto_req *req)
{
    if (detail_enabled(&c->node->detail))
        detail_record(&c->node->detail, req->key, req->nkey, DETAIL_DEL, false);
    if (req->has_arg && req->exptime < 0) {
        c->w->m.protocol_errors++;
        reply_unless_noreply(c, req,
                             "CLIENT_ERROR bad command line format.  Usage: delete <key> [<hold-off seconds>] [noreply]\r\n");
        return;
    }
    if (cmd_fenced(c, req->key, req->nkey)) {
        reply_unless_noreply(c, req, FENCE_REPLY);
        return;
    }
    const struct ns *ns = cmd_ns(c, req->key, req->nkey);
    if (req->has_arg && req->exptime > 0) { /* legacy form: delete, and hold the key off */
        bool ok;
        bool existed = cmd_delete_holdoff(c, ns, req->key, req->nkey, req->exptime, &ok);
        if (!ok) {
            c->w->m.store_no_memory++;
            reply_unless_noreply(c, req, "SERVER_ERROR out of memory\r\n");
            return;
        }
        reply_unless_noreply(c, req, existed ? "DELETED\r\n" : "NOT_FOUND\r\n");
        return;
    }
    struct store *st = c->node->store;
    uint64_t hv = store_hash(req->key, req->nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, req->key, req->nkey, clock_now(), NULL);
    if (it) {
        cmd_clsm(c, it)->delete_hits++;
        store_unlink(st, hv, it);
        repl_hook_del(c->node, ns, req->key, req->nkey);
    }
    store_unlock(st, hv);
    cmd_count_delete(c, ns, it != NULL);
    reply_unless_noreply(c, req, it ? "DELETED\r\n" : "NOT_FOUND\r\n");
}

/* Parse an item value as memcached's incr does (strtoull on the value and its \r\n): leading
 * white space, an optional sign, decimal digits that fit 64 bits, then white space (the spaces
 * an earlier in-place decr left, anything after a space) or the end. A '-' negates modulo 2^64
 * and is refused where that reads as negative, so "-0" is 0. */
static bool text_value_u64(const struct item *it, uint64_t *out)
{
    const char *v = item_value((struct item *)it);
    size_t n = it->nbytes, i = 0;
    while (i < n && isspace((unsigned char)v[i])) i++;
    bool neg = false;
    if (i < n && (v[i] == '+' || v[i] == '-')) neg = v[i++] == '-';
    size_t start = i;
    uint64_t x = 0;
    for (; i < n && v[i] >= '0' && v[i] <= '9'; i++) {
        unsigned d = (unsigned)(v[i] - '0');
        if (x > (UINT64_MAX - d) / 10) return false; /* ERANGE */
        x = x * 10 + d;
    }
    if (i == start || (i < n && !isspace((unsigned char)v[i]))) return false;
    if (neg) {
        x = -x;
        if ((int64_t)x < 0) return false;
    }
    *out = x;
    return true;
}

/* incr/decr on a linked item with its shard lock held; shared with ma. The new number is
 * written in place when it is no longer than the old (padded with spaces, as memcached does),
 * else into a new item that replaces *itp. */
enum delta_res cmd_delta_locked(struct store *st, uint64_t hv, struct item **itp, bool incr,
                                uint64_t delta, uint32_t now, uint64_t *value)
{
    struct item *it = *itp;
    uint64_t v;
    if (!text_value_u64(it, &v)) return DELTA_NON_NUMERIC;
    v = incr ? v + delta : (delta > v ? 0 : v - delta);
    char digits[20];
    size_t len = fmt_u64(digits, v);
    if (len <= it->nbytes) {
        memcpy(item_value(it), digits, len);
        memset(item_value(it) + len, ' ', it->nbytes - len);
        item_set_cas(it, store_next_cas(st));
        store_bump(st, it, now);
    } else {
        struct item *nit = store_alloc(st, it->nsid, item_key(it), it->nkey, len, item_flags(it));
        if (nit == NULL) return DELTA_NO_MEMORY;
        nit->exptime = it->exptime;
        nit->iflags |= it->iflags & ITEM_FETCHED;
        memcpy(item_value(nit), digits, len);
        store_replace(st, hv, it, nit, now);
        *itp = nit;
    }
    *value = v;
    return DELTA_OK;
}

static enum delta_res text_apply_delta(struct conn *c, const struct proto_req *req, bool incr,
                                       uint64_t *value, struct class_metrics **cm)
{
    struct store *st = c->node->store;
    uint32_t now = clock_now();
    uint64_t hv = store_hash(req->key, req->nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, req->key, req->nkey, now, NULL);
    enum delta_res res =
        it ? cmd_delta_locked(st, hv, &it, incr, req->delta, now, value) : DELTA_MISS;
    if (res == DELTA_OK) {
        *cm = cmd_clsm(c, it);
        repl_hook_item(c->node, cmd_ns(c, req->key, req->nkey), it);
    }
    store_unlock(st, hv);
    return res;
}

static void text_delta(struct conn *c, struct proto_req *req)
{
    bool incr = req->cmd == CMD_INCR;
    uint64_t v;
    char out[24];
    struct class_metrics *cm = NULL;
    if (cmd_fenced(c, req->key, req->nkey)) {
        reply_unless_noreply(c, req, FENCE_REPLY);
        return;
    }
    switch (text_apply_delta(c, req, incr, &v, &cm)) {
    case DELTA_OK:
        if (incr) c->w->m.incr_hits++, cm->incr_hits++;
        else c->w->m.decr_hits++, cm->decr_hits++;
        if (!req->noreply) {
            size_t n = fmt_u64(out, v);
            out[n++] = '\r', out[n++] = '\n';
            conn_reply(c, out, n);
        }
        break;
    case DELTA_MISS:
        if (incr) c->w->m.incr_misses++;
        else c->w->m.decr_misses++;
        reply_unless_noreply(c, req, "NOT_FOUND\r\n");
        break;
    case DELTA_NON_NUMERIC:
        c->w->m.protocol_errors++;
        reply_unless_noreply(c, req, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        break;
    case DELTA_NO_MEMORY:
        c->w->m.store_no_memory++;
        reply_unless_noreply(c, req, "SERVER_ERROR out of memory\r\n");
        break;
    }
}

static void text_touch(struct conn *c, struct proto_req *req)
{
    struct store *st = c->node->store;
    uint32_t now = clock_now();
    if (cmd_fenced(c, req->key, req->nkey)) {
        reply_unless_noreply(c, req, FENCE_REPLY);
        return;
    }
    uint64_t hv = store_hash(req->key, req->nkey);
    c->w->m.cmd_touch++;
    store_lock(st, hv);
    struct item *it = store_find(st, hv, req->key, req->nkey, now, NULL);
    if (it) {
        const struct ns *ns = cmd_ns(c, req->key, req->nkey);
        it->exptime = ns_exptime(ns, req->exptime, now);
        repl_hook_touch(c->node, ns, req->key, req->nkey, it->exptime);
        store_bump(st, it, now);
        cmd_clsm(c, it)->touch_hits++;
    }
    store_unlock(st, hv);
    if (it) c->w->m.touch_hits++;
    else c->w->m.touch_misses++;
    reply_unless_noreply(c, req, it ? "TOUCHED\r\n" : "NOT_FOUND\r\n");
}

static void text_flush(struct conn *c, struct proto_req *req)
{
    uint32_t now = clock_now();
    int64_t delay = (int64_t)req->delta;
    c->w->m.cmd_flush++;
    store_flush(c->node->store, delay > 0 ? clock_exptime(delay, now) : now, now);
    repl_log_flush(c->node, delay > 0 ? (uint32_t)delay : 0);
    log_info("flush_all%s%lld", delay > 0 ? " in " : "", delay > 0 ? (long long)delay : 0LL);
    reply_unless_noreply(c, req, "OK\r\n");
}

/* flush_ns <namespace> [noreply]: the items of one namespace go, as flush_all's do (O(1):
 * store_flush_ns). Only a namespace the node has counts: keys of a prefix it does not know are
 * in `default`, and flushing `default` for them would be a surprise, so that is a client
 * error and the caller decides (shoal-invalidator falls back to flush_all). Errors are
 * silenced by noreply, as memcached does for its commands. */
static void text_flush_ns(struct conn *c, struct proto_req *req)
{
    const struct ns *ns = ns_find(ns_current(&c->node->ns), req->arg, req->narg);
    if (ns == NULL) {
        reply_unless_noreply(c, req, "CLIENT_ERROR unknown namespace\r\n");
        return;
    }
    c->w->m.cmd_flush_ns++;
    store_flush_ns(c->node->store, ns->id, clock_now());
    repl_log_flush_ns(c->node, ns);
    log_info("flush_ns %s", ns->name);
    reply_unless_noreply(c, req, "OK\r\n");
}

void cmd_text_run(struct conn *c, struct proto_req *req)
{
    switch (req->cmd) {
    case CMD_GET:
    case CMD_GETS:
    case CMD_GAT:
    case CMD_GATS: text_get(c, req); break;
    case CMD_DELETE: text_delete(c, req); break;
    case CMD_INCR:
    case CMD_DECR: text_delta(c, req); break;
    case CMD_TOUCH: text_touch(c, req); break;
    case CMD_FLUSH_ALL: text_flush(c, req); break;
    case CMD_FLUSH_NS: text_flush_ns(c, req); break;
    case CMD_VERSION: conn_reply_str(c, "VERSION " SHOAL_WIRE_VERSION "\r\n"); break;
    case CMD_VERBOSITY:
        log_set_level((int)(req->delta > 2 ? 2 : req->delta));
        reply_unless_noreply(c, req, "OK\r\n");
        break;
    case CMD_QUIT: c->state = CONN_CLOSE; break;
    case CMD_STATS: cmd_stats(c, req); break;
    case CMD_LRU_CRAWLER: cmd_lru_crawler(c, req); break;
    case CMD_SHUTDOWN: conn_reply_str(c, "ERROR: shutdown not enabled\r\n"); break;
    case CMD_CACHE_MEMLIMIT:
        /* memcached's own checks first; then, as the memory reservation is fixed at start,
         * say so rather than pretend. A trailing noreply silences all of them (memcached). */
        if (req->delta < 8)
            reply_unless_noreply(c, req, "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n");
        else if (req->delta > 1000000000)
            reply_unless_noreply(c, req, "MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n");
        else
            reply_unless_noreply(c, req, "SERVER_ERROR cache_memlimit is not supported; restart with -m\r\n");
        break;
    case CMD_SLABS:
    case CMD_LRU:
    case CMD_WATCH: {
        bool silent;
        const char *r = proto_tune_reply(req, &silent);
        if (!silent) {
            conn_reply_str(c, r);
            conn_reply(c, "\r\n", 2);
        }
        break;
    }
    default: conn_reply_str(c, "ERROR\r\n"); break;
    }
}
