/* cmd_meta.c — memcached's meta commands: mg, ms, md, ma, me, mn.
 *
 * Besides plain reads and writes these carry the cache-aside protocol the product depends on:
 * a miss with N creates an empty placeholder and hands exactly one client the win (W), later
 * readers see Z until the winner's fill replaces it; R hands one client an early recache; md I
 * marks an item stale (X) so the next reader wins and the rest may serve the old value; a fill
 * whose CAS no longer matches is refused, or with I stored as stale. Namespaces may ration wins
 * further (lease_period, one win in flight under lease_ttl: lease.h) and serve expired values
 * stale for stale_ttl to readers with N or R. Reply flags come back in the order they were
 * asked, then Z, X, W as memcached orders them. */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "node/cmd.h"
#include "node/cmd_store.h"
#include "node/repl_hook.h"

/* One reply line being built: code, then flags. Sized for every flag's largest token. */
struct mline {
    char b[1200];
    size_t n;
};

static void ml_put(struct mline *l, const char *s, size_t n)
{
    if (l->n + n <= sizeof l->b) {
        memcpy(l->b + l->n, s, n);
        l->n += n;
    }
}

static void ml_flag(struct mline *l, char f)
{
    char s[2] = {' ', f};
    ml_put(l, s, 2);
}

static void ml_u64(struct mline *l, char f, uint64_t v)
{
    char s[24];
    s[0] = ' ', s[1] = f;
    size_t n = 2 + fmt_u64(s + 2, v);
    ml_put(l, s, n);
}

static void ml_ttl(struct mline *l, uint32_t exptime, uint32_t now)
{
    if (exptime == 0) ml_put(l, " t-1", 4);
    else ml_u64(l, 't', (uint64_t)clock_ttl_left(exptime, now));
}

/* Echo a key: base64 with a trailing b when `b64`, else as it is. */
static void ml_key(struct mline *l, const char *key, size_t nkey, bool b64)
{
    ml_flag(l, 'k');
    if (b64) {
        char enc[PROTO_KEY_MAX * 2];
        int n = proto_base64_encode(key, nkey, enc, sizeof enc);
        if (n > 0) ml_put(l, enc, (size_t)n);
        ml_flag(l, 'b');
    } else {
        ml_put(l, key, nkey);
    }
}

/* Echo O (opaque) and k (key; base64 with a trailing b when the request used b). */
static void ml_common(struct mline *l, const struct proto_req *req, const struct proto_mflag *f)
{
    if (f->flag == 'O') {
        ml_flag(l, 'O');
        ml_put(l, f->tok, f->ntok);
    } else if (f->flag == 'k') {
        ml_key(l, req->key, req->nkey, req->meta.base64);
    }
}

static void ml_send(struct conn *c, struct mline *l)
{
    ml_put(l, "\r\n", 2);
    conn_reply(c, l->b, l->n);
}

/* May the key hand out a win now? Always, unless its namespace rations wins (lease_period,
 * lease_ttl) and the lease table says a recent win's period or a win in flight blocks it. */
static bool meta_may_win(struct conn *c, const struct ns *ns, uint64_t hv)
{
    return !cmd_lease_ruled(ns) || lease_may_win(c->node->leases, hv, lease_now_ms(), NULL);
}

/* Remember a win (token = the CAS its holder fills with) for lease_period and, with lease_ttl,
 * as in flight for `inflight` seconds. */
static void meta_record_win(struct conn *c, const struct ns *ns, uint64_t hv, uint64_t token,
                            uint64_t inflight)
{
    if (!cmd_lease_ruled(ns)) return;
    if (!lease_record_win(c->node->leases, hv, token, lease_now_ms(), ns->cfg.lease_period * 1000,
                          ns->cfg.lease_ttl ? inflight * 1000 : 0))
        c->w->m.lease_table_overflows++;
}

static void meta_get(struct conn *c, struct proto_req *req)
{
    struct store *st = c->node->store;
    struct node_metrics *m = &c->w->m;
    const struct proto_meta *mf = &req->meta;
    uint32_t now = clock_now();
    uint64_t hv = store_hash(req->key, req->nkey);
    const struct ns *ns = cmd_ns(c, req->key, req->nkey);
    struct ns_metrics *nsm = cmd_nsm(c, ns);
    bool lease_aware = proto_meta_has(mf, 'N') || proto_meta_has(mf, 'R');
    enum store_miss why;
    bool created = false, won = false;
    /* A miss that may not win (lease_period, or a win still in flight) is answered as if a
     * placeholder held by someone else were there: an empty value with Z, nothing stored. */
    bool ghost = false;
    _Alignas(struct item) char ghost_buf[sizeof(struct item) + 8];
    int64_t life = 0; /* a vivified placeholder's life, seconds */
    m->cmd_get++;
    store_lock(st, hv);
    struct item *it = store_find_ex(st, hv, req->key, req->nkey, now, &why, STORE_FIND_GRACE);
    /* An expired item kept for stale_ttl (the store's grace) is served, marked stale, only to
     * lease-aware readers; to the others it is a miss, and it stays for the next N/R reader. */
    bool grace = it != NULL && why == STORE_MISS_EXPIRED;
    if (grace && !lease_aware) it = NULL;
    if (it == NULL && proto_meta_has(mf, 'N') && why != STORE_MISS_HELD) {
        if (!meta_may_win(c, ns, hv)) {
            ghost = true;
            memset(ghost_buf, 0, sizeof ghost_buf);
            it = (struct item *)ghost_buf;
            it->iflags = ITEM_TOKEN;
            it->atime = now;
        } else {
            /* vivify: an empty placeholder whose creator wins the right to fill it */
            it = store_alloc(st, ns->id, req->key, req->nkey, 0, 0);
            if (it) {
                if (mf->base64) it->iflags |= ITEM_KEY_BINARY; /* not linked yet */
                /* the TTL is set when the flag walk reaches N, as memcached does: a t asked
                 * before N reports -1 */
                it->exptime = 0;
                if (proto_meta_has(mf, 'E')) item_set_cas(it, mf->cas_new);
                if (store_link(st, hv, it, now)) {
                    created = true;
                } else { /* index shard full: a plain miss, as when the allocation fails */
                    store_free(st, it);
                    it = NULL;
                }
            }
        }
    }
    if (it == NULL || created || ghost) {
        m->get_misses++;
        nsm->get_misses++;
        if (why == STORE_MISS_EXPIRED) m->get_expired++;
        else if (why == STORE_MISS_FLUSHED) m->get_flushed++;
    } else {
        m->get_hits++;
        nsm->get_hits++;
        cmd_clsm(c, it)->get_hits++;
    }
    if (it == NULL) {
        store_unlock(st, hv);
        if (!mf->quiet) { /* memcached echoes O and k on a miss too */
            struct mline l = {.n = 0};
            ml_put(&l, "EN", 2);
            for (int i = 0; i < mf->nflags; i++) ml_common(&l, req, &mf->flag[i]);
            ml_send(c, &l);
        }
        return;
    }
    bool want_value = proto_meta_has(mf, 'v');
    size_t need = 64 + sizeof(struct mline) + (want_value ? it->nbytes : 0);
    if (!conn_out_room(c, need)) {
        store_unlock(st, hv);
        m->conn_closed_out_limit++;
        conn_reply_str(c, "SERVER_ERROR out of memory writing get response\r\n");
        return;
    }
    /* h and l report the state before this access */
    bool fetched = it->iflags & ITEM_FETCHED;
    uint32_t idle = now > it->atime ? now - it->atime : 0;
    struct mline l = {.n = 0};
    if (want_value) {
        ml_put(&l, "VA ", 3);
        char num[20];
        ml_put(&l, num, fmt_u64(num, it->nbytes));
    } else {
        ml_put(&l, "HD", 2);
    }
    for (int i = 0; i < mf->nflags; i++) {
        const struct proto_mflag *f = &mf->flag[i];
        switch (f->flag) {
        case 'T':
            if (ghost || grace) break; /* nothing to touch; an expired value is not revived */
            it->exptime = ns_exptime(ns, mf->ttl, now);
            if (!created) repl_hook_touch(c->node, ns, req->key, req->nkey, it->exptime);
            m->cmd_touch++;
            m->touch_hits++;
            cmd_clsm(c, it)->touch_hits++;
            break;
        case 'N':
            if (created) {
                /* a holder that never fills must not block the key for longer than lease_ttl */
                life = mf->vivify;
                if (ns->cfg.lease_ttl && (life <= 0 || life > (int64_t)ns->cfg.lease_ttl))
                    life = (int64_t)ns->cfg.lease_ttl;
                it->exptime = ns_exptime(ns, life, now);
                won = true;
            }
            break;
        case 'R':
            if (!(it->iflags & ITEM_TOKEN) && !created && it->exptime != 0 &&
                it->exptime < clock_exptime(mf->recache, now))
                won = true;
            break;
        case 's': ml_u64(&l, 's', it->nbytes); break;
        case 't':
            /* an expired value in its grace reports how long it is still served stale */
            ml_ttl(&l, grace ? it->exptime + (uint32_t)ns->cfg.stale_ttl : it->exptime, now);
            break;
        case 'c': ml_u64(&l, 'c', item_cas(it)); break;
        case 'f': ml_u64(&l, 'f', item_flags(it)); break;
        case 'l': ml_u64(&l, 'l', idle); break;
        case 'h': ml_put(&l, fetched ? " h1" : " h0", 3); break;
        case 'k': /* a hit echoes the key in the form it was stored in (memcached) */
            if (ghost) ml_common(&l, req, f);
            else ml_key(&l, req->key, req->nkey, it->iflags & ITEM_KEY_BINARY);
            break;
        default: ml_common(&l, req, f); break;
        }
    }
    bool stale = (it->iflags & ITEM_STALE) || grace;
    bool wait = it->iflags & ITEM_TOKEN;
    if (stale && !wait) won = true;
    if (won && !created && !meta_may_win(c, ns, hv)) {
        /* lease_period not over, or another win still in flight: wait (with the stale value
         * if there is one); the item is left without a token so the next reader asks again */
        won = false;
        wait = true;
    }
    if (wait) {
        ml_flag(&l, 'Z');
        m->lease_waits++;
        nsm->lease_waits++;
    }
    if (stale) {
        ml_flag(&l, 'X');
        m->stale_hits++;
        nsm->stale_hits++;
    }
    if (won) {
        ml_flag(&l, 'W');
        item_set_iflags(it, it->iflags | ITEM_TOKEN);
        m->lease_wins++;
        nsm->lease_wins++;
        meta_record_win(c, ns, hv, item_cas(it), created ? (uint64_t)life : ns->cfg.lease_ttl);
    }
    /* a placeholder N created counts as fetched, as in memcached */
    if (!proto_meta_has(mf, 'u') && !ghost && !grace) store_bump(st, it, now);
    ml_send(c, &l);
    if (want_value) {
        conn_reply(c, item_value(it), it->nbytes);
        conn_reply(c, "\r\n", 2);
    }
    store_unlock(st, hv);
}

void cmd_meta_store(struct conn *c, struct proto_req *req, struct item *it, const struct ns *ns)
{
    const struct proto_meta *mf = &req->meta;
    struct cmd_store_args a = {.mode = CS_SET};
    it->exptime = ns_exptime(ns, proto_meta_has(mf, 'T') ? mf->ttl : 0, clock_now());
    if (proto_meta_has(mf, 'E')) item_set_cas(it, mf->cas_new);
    if (mf->base64) it->iflags |= ITEM_KEY_BINARY; /* not linked yet */
    switch (mf->mode) {
    case 'E': case 'e': a.mode = CS_ADD; break;
    case 'A': case 'a': a.mode = CS_APPEND; break;
    case 'P': case 'p': a.mode = CS_PREPEND; break;
    case 'R': case 'r': a.mode = CS_REPLACE; break;
    default: a.mode = CS_SET; break;
    }
    a.has_cas = proto_meta_has(mf, 'C');
    a.cas = mf->cas_in;
    /* I applies to a compare-and-swap only (set or replace with C), as in memcached */
    a.set_stale = mf->invalidate && (a.mode == CS_SET || a.mode == CS_REPLACE);
    uint64_t cas = 0;
    enum cmd_store_res r = cmd_store_apply(c, it, &a, &cas);
    if (r == CS_NO_MEMORY) {
        conn_reply_str(c, "SERVER_ERROR out of memory storing object\r\n");
        return;
    }
    if (r == CS_STORED && mf->quiet) return;
    static const char codes[][3] = {[CS_STORED] = "HD", [CS_NOT_STORED] = "NS",
                                    [CS_EXISTS] = "EX", [CS_NOT_FOUND] = "NF"};
    struct mline l = {.n = 0};
    ml_put(&l, codes[r], 2);
    for (int i = 0; i < mf->nflags; i++) {
        const struct proto_mflag *f = &mf->flag[i];
        if (f->flag == 'c') ml_u64(&l, 'c', cas);
        else ml_common(&l, req, f);
    }
    ml_send(c, &l);
}

static void meta_delete(struct conn *c, struct proto_req *req)
{
    struct store *st = c->node->store;
    const struct proto_meta *mf = &req->meta;
    uint32_t now = clock_now();
    uint64_t hv = store_hash(req->key, req->nkey);
    const struct ns *ns = cmd_ns(c, req->key, req->nkey);
    const char *code = "HD";
    if (proto_meta_has(mf, 'H')) { /* delete with hold-off */
        bool ok;
        bool existed = cmd_delete_holdoff(c, ns, req->key, req->nkey, mf->holdoff, &ok);
        if (!ok) {
            conn_reply_str(c, "SERVER_ERROR out of memory\r\n");
            return;
        }
        if (existed && mf->quiet) return;
        struct mline l = {.n = 0};
        ml_put(&l, existed ? "HD" : "NF", 2);
        for (int i = 0; i < mf->nflags; i++) ml_common(&l, req, &mf->flag[i]);
        ml_send(c, &l);
        return;
    }
    enum store_miss why;
    store_lock(st, hv);
    struct item *it = store_find_ex(st, hv, req->key, req->nkey, now, &why, STORE_FIND_GRACE);
    if (it && why == STORE_MISS_EXPIRED && !mf->invalidate) {
        /* an expired value kept for stale readers: a plain delete drops it, and answers NF as
         * for any expired item; md I marks it stale below like a live one */
        store_unlink(st, hv, it);
        it = NULL;
    }
    if (it == NULL) {
        code = "NF";
        cmd_count_delete(c, ns, false);
    } else if (proto_meta_has(mf, 'C') && mf->cas_in != item_cas(it)) {
        code = "EX";
    } else {
        cmd_count_delete(c, ns, true);
        cmd_clsm(c, it)->delete_hits++;
        if (proto_meta_has(mf, 'x')) {
            /* drop the value but keep the item (and its TTL) in place */
            struct item *nit = store_alloc(st, it->nsid, req->key, req->nkey, 0, 0);
            if (nit) {
                nit->exptime = it->exptime;
                store_replace(st, hv, it, nit, now);
                it = nit;
            } else {
                code = "SERVER_ERROR out of memory";
            }
        }
        if (mf->invalidate) {
            item_set_iflags(it, (uint8_t)((it->iflags | ITEM_STALE) & ~ITEM_TOKEN));
            item_set_cas(it, proto_meta_has(mf, 'E') ? mf->cas_new : store_next_cas(st));
            if (proto_meta_has(mf, 'T')) it->exptime = ns_exptime(ns, mf->ttl, now);
            else if (ns->cfg.stale_ttl) /* serve the stale value for at most stale_ttl */
                it->exptime = now + (uint32_t)ns->cfg.stale_ttl;
        } else if (!proto_meta_has(mf, 'x')) {
            store_unlink(st, hv, it);
            repl_hook_del(c->node, ns, req->key, req->nkey);
            it = NULL;
        }
        if (it && code[0] == 'H') repl_hook_item(c->node, ns, it); /* md I, md x */
    }
    store_unlock(st, hv);
    if (code[0] == 'H' && mf->quiet) return;
    struct mline l = {.n = 0};
    ml_put(&l, code, strlen(code));
    if (code[0] != 'S')
        for (int i = 0; i < mf->nflags; i++) ml_common(&l, req, &mf->flag[i]);
    ml_send(c, &l);
}

static void meta_arith(struct conn *c, struct proto_req *req)
{
    struct store *st = c->node->store;
    struct node_metrics *m = &c->w->m;
    const struct proto_meta *mf = &req->meta;
    bool incr = !(mf->mode == 'D' || mf->mode == 'd' || mf->mode == '-');
    uint32_t now = clock_now();
    uint64_t hv = store_hash(req->key, req->nkey);
    uint64_t value = 0;
    const struct ns *ns = cmd_ns(c, req->key, req->nkey);
    uint32_t ttl_before = UINT32_MAX; /* t reports the TTL as it was before this command's T */
    const char *err = NULL, *code = NULL;
    bool created = false; /* N made the item: memcached answers that even under q */
    store_lock(st, hv);
    enum store_miss why;
    struct item *it = store_find(st, hv, req->key, req->nkey, now, &why);
    if (it == NULL) {
        if (incr) m->incr_misses++;
        else m->decr_misses++;
        if (proto_meta_has(mf, 'N') && why == STORE_MISS_HELD) {
            code = "NS"; /* held off: nothing may be created until the hold ends */
        } else if (proto_meta_has(mf, 'N')) {
            char digits[20];
            size_t len = fmt_u64(digits, mf->initial);
            it = store_alloc(st, ns->id, req->key, req->nkey, len, 0);
            if (it) {
                memcpy(item_value(it), digits, len);
                it->exptime = ns_exptime(ns, mf->vivify, now);
                if (proto_meta_has(mf, 'E')) item_set_cas(it, mf->cas_new);
                if (store_link(st, hv, it, now)) {
                    value = mf->initial;
                    created = true;
                } else { /* index shard full: as when the allocation fails */
                    store_free(st, it);
                    it = NULL;
                    code = "NS";
                }
            } else {
                code = "NS";
            }
        } else {
            code = "NF";
        }
    } else if (it->nbytes == 0) {
        /* memcached: an empty value is not a number, whatever the CAS asked */
        err = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
    } else if (proto_meta_has(mf, 'C') && mf->cas_in != 0 && mf->cas_in != item_cas(it)) {
        code = "EX"; /* C0 asks for no compare, as in memcached */
    } else {
        ttl_before = it->exptime;
        switch (cmd_delta_locked(st, hv, &it, incr, mf->delta, now, &value)) {
        case DELTA_OK:
            if (incr) m->incr_hits++, cmd_clsm(c, it)->incr_hits++;
            else m->decr_hits++, cmd_clsm(c, it)->decr_hits++;
            if (proto_meta_has(mf, 'T')) it->exptime = ns_exptime(ns, mf->ttl, now);
            if (proto_meta_has(mf, 'E')) item_set_cas(it, mf->cas_new);
            break;
        case DELTA_NON_NUMERIC:
            err = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
            break;
        default: err = "SERVER_ERROR out of memory\r\n"; break;
        }
    }
    if (err) {
        store_unlock(st, hv);
        conn_reply_str(c, err);
        return;
    }
    bool ok = code == NULL, want_value = ok && proto_meta_has(mf, 'v');
    if (ok && mf->quiet && !created) { /* q hides a hit's reply, HD or VA, as in memcached */
        repl_hook_item(c->node, ns, it);
        store_unlock(st, hv);
        return;
    }
    struct mline l = {.n = 0};
    char digits[20];
    size_t nd = fmt_u64(digits, value);
    if (want_value) {
        ml_put(&l, "VA ", 3);
        char num[20];
        ml_put(&l, num, fmt_u64(num, nd));
    } else {
        ml_put(&l, ok ? "HD" : code, 2);
    }
    /* As memcached, the flags act in the order given: t shows the TTL set by the T (or, for an
     * item N created, N) before it, else the one the item had (none for a created item); the
     * last of T and N sets a created item's TTL. */
    uint32_t shown = created ? 0 : ttl_before;
    for (int i = 0; i < mf->nflags; i++) {
        const struct proto_mflag *f = &mf->flag[i];
        if (ok && f->flag == 'T') {
            if (created) it->exptime = ns_exptime(ns, mf->ttl, now);
            shown = it->exptime;
        } else if (ok && created && f->flag == 'N') {
            it->exptime = ns_exptime(ns, mf->vivify, now);
            shown = it->exptime;
        } else if (ok && f->flag == 't') {
            ml_ttl(&l, shown, now);
        } else if (ok && f->flag == 'c') {
            ml_u64(&l, 'c', item_cas(it));
        } else {
            ml_common(&l, req, f);
        }
    }
    if (ok) repl_hook_item(c->node, ns, it);
    store_unlock(st, hv);
    ml_send(c, &l);
    if (want_value) {
        conn_reply(c, digits, nd);
        conn_reply(c, "\r\n", 2);
    }
}

static void meta_debug(struct conn *c, struct proto_req *req)
{
    struct store *st = c->node->store;
    uint32_t now = clock_now();
    uint64_t hv = store_hash(req->key, req->nkey);
    store_lock(st, hv);
    struct item *it = store_find(st, hv, req->key, req->nkey, now, NULL);
    if (it == NULL) {
        store_unlock(st, hv);
        conn_reply(c, "EN\r\n", 4);
        return;
    }
    struct mline l = {.n = 0};
    ml_put(&l, "ME ", 3);
    /* as memcached: the key in the form it was stored in (base64, without a b, for a binary
     * one), whether or not the request used b */
    char enc[PROTO_KEY_MAX * 2];
    int nenc = it->iflags & ITEM_KEY_BINARY ? proto_base64_encode(req->key, req->nkey, enc,
                                                                   sizeof enc)
                                            : -1;
    if (nenc > 0) ml_put(&l, enc, (size_t)nenc);
    else ml_put(&l, req->key, req->nkey);
    /* memcached 1.6 prints exp as now - exptime: negative while the item lives */
    long long exp = it->exptime == 0 ? -1 : (long long)now - (long long)it->exptime;
    char tail[160];
    int n = snprintf(tail, sizeof tail, " exp=%lld la=%u cas=%llu fetch=%s cls=%u size=%zu",
                     exp,
                     now > it->atime ? now - it->atime : 0, (unsigned long long)item_cas(it),
                     (it->iflags & ITEM_FETCHED) ? "yes" : "no", store_item_class(st, it),
                     ITEM_HEADER + it->nkey + it->nbytes);
    ml_put(&l, tail, (size_t)n);
    store_unlock(st, hv);
    ml_send(c, &l);
}

void cmd_meta_run(struct conn *c, struct proto_req *req)
{
    c->w->m.cmd_meta++;
    bool keyed = req->cmd == CMD_MG || req->cmd == CMD_MD || req->cmd == CMD_MA ||
                 req->cmd == CMD_ME;
    if (keyed && cmd_fenced(c, req->key, req->nkey)) {
        conn_reply_str(c, FENCE_REPLY); /* mg, md, ma, me; ms when its value lands (cmd.c) */
        return;
    }
    switch (req->cmd) {
    case CMD_MG: meta_get(c, req); break;
    case CMD_MD: meta_delete(c, req); break;
    case CMD_MA: meta_arith(c, req); break;
    case CMD_ME: meta_debug(c, req); break;
    case CMD_MN: conn_reply(c, "MN\r\n", 4); break;
    default: conn_reply_str(c, "ERROR\r\n"); break;
    }
}
