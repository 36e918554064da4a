/* statslist.c — one memcached stat list merged from several nodes' lists (see statslist.h).
 *
 * Entries are found by name in an open-addressing table (a node's `stats items` has thousands
 * of lines); each keeps the first node's text and, when numeric, the merged number(s). Which
 * rule merges a name (sum, largest, smallest, first, the router's own) follows from the kind
 * of list and the name: see sm_classify. */
#include "router/statslist.h"

#include <stdlib.h>
#include <string.h>

#define SL_NELEM(a) (sizeof(a) / sizeof((a)[0]))

static uint32_t sm_hash(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

/* The entry named [name, name+n), added when absent; NULL when memory ran out. *fresh says
 * which. */
static struct statslist_ent *sm_find(struct statslist *m, const char *name, uint32_t n, bool *fresh)
{
    if (2 * (m->n + 1) > m->nslot) {
        uint32_t ns = m->nslot ? 2 * m->nslot : 256;
        uint32_t *slot = calloc(ns, sizeof *slot);
        if (slot == NULL) return NULL;
        for (uint32_t i = 0; i < m->n; i++) {
            uint32_t h = sm_hash(m->e[i].name, m->e[i].nname) & (ns - 1);
            while (slot[h]) h = (h + 1) & (ns - 1);
            slot[h] = i + 1;
        }
        free(m->slot);
        m->slot = slot;
        m->nslot = ns;
    }
    uint32_t h = sm_hash(name, n) & (m->nslot - 1);
    for (; m->slot[h]; h = (h + 1) & (m->nslot - 1)) {
        struct statslist_ent *e = &m->e[m->slot[h] - 1];
        if (e->nname == n && !memcmp(e->name, name, n)) {
            *fresh = false;
            return e;
        }
    }
    if (m->n == m->cap) {
        uint32_t nc = m->cap ? 2 * m->cap : 128;
        struct statslist_ent *e = realloc(m->e, nc * sizeof *e);
        if (e == NULL) return NULL;
        m->e = e;
        m->cap = nc;
    }
    m->slot[h] = m->n + 1;
    struct statslist_ent *e = &m->e[m->n];
    *e = (struct statslist_ent){.name = name, .nname = n, .seq = m->n, .cls = -1};
    m->n++;
    *fresh = true;
    return e;
}

struct statslist_ent *statslist_get(const struct statslist *m, const char *name, size_t n)
{
    if (m->nslot == 0) return NULL;
    for (uint32_t h = sm_hash(name, n) & (m->nslot - 1); m->slot[h]; h = (h + 1) & (m->nslot - 1)) {
        struct statslist_ent *e = &m->e[m->slot[h] - 1];
        if (e->nname == n && !memcmp(e->name, name, n)) return e;
    }
    return NULL;
}

/* [p, end) as a decimal number (at most 20 digits; saturating). */
static bool sm_num(const char *p, const char *end, uint64_t *v)
{
    if (p == end || end - p > 20) return false;
    uint64_t x = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') return false;
        uint64_t d = (uint64_t)(*p - '0');
        x = x > (UINT64_MAX - d) / 10 ? UINT64_MAX : x * 10 + d;
    }
    *v = x;
    return true;
}

static bool name_is(const struct statslist_ent *e, const char *s)
{
    return strlen(s) == e->nname && !memcmp(e->name, s, e->nname);
}

static bool name_ends(const struct statslist_ent *e, const char *s)
{
    size_t k = strlen(s);
    return e->nname >= k && !memcmp(e->name + e->nname - k, s, k);
}

/* `stats` fields that describe the process answering, not the cache: the router's own. A
 * node's connections are the routers' connections to it. */
static const char *const sm_own[] = {
    "pid", "uptime", "time", "version", "libevent", "pointer_size", "rusage_user",
    "rusage_system", "max_connections", "curr_connections", "total_connections",
    "rejected_connections", "connection_structures", "response_obj_oom", "response_obj_count",
    "response_obj_bytes", "read_buf_oom", "read_buf_count", "read_buf_bytes",
    "read_buf_bytes_free", "reserved_fds", "threads", "conn_yields", "listen_disabled_num",
    "time_in_listen_disabled_us", "accepting_conns",
};

/* `stats` gauges a sum means nothing for: the largest. */
static const char *const sm_max[] = {
    "hash_power_level", "hash_is_expanding", "lru_crawler_running", "slab_reassign_running",
    "malloc_fails_running",
};

/* `stats settings` names that describe the process answering: the router's values replace the
 * nodes' (sm_settings_head), as do the router's own options of the same name (line_max, ...). */
static const char *const sm_settings_own[] = {"maxconns", "tcpport", "udpport", "inter",
                                              "verbosity", "num_threads", "tcp_backlog"};

static bool in_list(const struct statslist_ent *e, const char *const *l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (name_is(e, l[i])) return true;
    return false;
}

/* Decide how a fresh entry merges, and its class (items:<cls>:... / <cls>:...). */
static void sm_classify(struct statslist_ent *e, uint8_t merge)
{
    const char *p = e->name, *end = e->name + e->nname;
    switch (merge) {
    case STATSMERGE_GENERAL:
        e->rule = in_list(e, sm_own, SL_NELEM(sm_own)) ? SM_OWN
                : in_list(e, sm_max, SL_NELEM(sm_max)) ? SM_MAX : SM_SUM;
        break;
    case STATSMERGE_ITEMS:
        if (e->nname > 6 && !memcmp(p, "items:", 6)) p += 6;
        e->rule = name_ends(e, ":age") || name_ends(e, ":age_hot") ||
                          name_ends(e, ":age_warm") || name_ends(e, ":evicted_time")
                      ? SM_MAX : SM_SUM;
        break;
    case STATSMERGE_SETTINGS: /* the cache behind the router: all the nodes' memory, the
                               * largest item every node takes; the rest as the first node says */
        e->rule = name_is(e, "maxbytes") ? SM_SUM
                : name_is(e, "item_size_max") ? SM_MIN
                : in_list(e, sm_settings_own, SL_NELEM(sm_settings_own)) ? SM_OWN : SM_FIRST;
        break;
    case STATSMERGE_SLABS:
        e->rule = name_ends(e, ":chunk_size") || name_ends(e, ":chunks_per_page") ? SM_FIRST
                : name_is(e, "active_slabs") ? SM_MAX : SM_SUM;
        break;
    default:
        e->rule = SM_SUM;
        break;
    }
    if (merge == STATSMERGE_ITEMS || merge == STATSMERGE_SLABS) {
        const char *colon = memchr(p, ':', (size_t)(end - p));
        uint64_t v;
        if (colon && sm_num(p, colon, &v) && v < 1000000) e->cls = (long)v;
    }
}

/* The value of a PREFIX line after its prefix: "get N hit N set N del N". */
static bool sm_prefix_nums(const char *p, const char *end, uint64_t num[4])
{
    static const char *const words[] = {"get", "hit", "set", "del"};
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(words[i]);
        if ((size_t)(end - p) < k + 2 || memcmp(p, words[i], k) || p[k] != ' ') return false;
        p += k + 1;
        const char *e = memchr(p, ' ', (size_t)(end - p));
        if (e == NULL) e = end;
        if (!sm_num(p, e, &num[i])) return false;
        p = e < end ? e + 1 : end;
    }
    return p == end;
}

int statslist_add(struct statslist *m, const char *p, size_t n)
{
    if (n == 0) return 0; /* an empty reply may have no buffer at all */
    uint8_t merge = m->merge;
    const char *end = p + n;
    size_t skip = merge == STATSMERGE_PREFIX ? 7 : 5; /* "PREFIX " / "STAT " */
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) break;
        const char *le = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
        const char *name = p + skip;
        p = nl + 1;
        if (name >= le) continue;
        const char *sp = memchr(name, ' ', (size_t)(le - name));
        const char *nend = sp ? sp : le, *val = sp ? sp + 1 : le;
        bool fresh;
        struct statslist_ent *e = sm_find(m, name, (uint32_t)(nend - name), &fresh);
        if (e == NULL) return -1;
        uint64_t num[4] = {0};
        bool isnum = merge == STATSMERGE_PREFIX ? sm_prefix_nums(val, le, num)
                                                : sm_num(val, le, &num[0]);
        if (fresh) {
            sm_classify(e, merge);
            e->val = val;
            e->nval = (uint32_t)(le - val);
            e->isnum = isnum;
            memcpy(e->num, num, sizeof num);
            continue;
        }
        if (!e->isnum || !isnum || e->rule == SM_FIRST || e->rule == SM_OWN) continue;
        for (int i = 0; i < 4; i++) {
            if (e->rule == SM_MAX) {
                if (num[i] > e->num[i]) e->num[i] = num[i];
            } else if (e->rule == SM_MIN) {
                if (num[i] < e->num[i]) e->num[i] = num[i];
            } else {
                e->num[i] = num[i] > UINT64_MAX - e->num[i] ? UINT64_MAX : e->num[i] + num[i];
            }
        }
    }
    return 0;
}

static int sm_cmp(const void *a, const void *b)
{
    const struct statslist_ent *x = a, *y = b;
    unsigned long cx = (unsigned long)x->cls, cy = (unsigned long)y->cls; /* -1: last */
    if (cx != cy) return cx < cy ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void statslist_write(struct buf *b, struct statslist *m)
{
    uint8_t merge = m->merge;
    if (m->n > 1 && (merge == STATSMERGE_ITEMS || merge == STATSMERGE_SLABS))
        qsort(m->e, m->n, sizeof *m->e, sm_cmp); /* m->slot is stale from here */
    for (uint32_t i = 0; i < m->n; i++) {
        const struct statslist_ent *e = &m->e[i];
        if (e->rule == SM_OWN) continue;
        if (merge == STATSMERGE_PREFIX && e->isnum)
            buf_printf(b, "PREFIX %.*s get %llu hit %llu set %llu del %llu\r\n", (int)e->nname,
                       e->name, (unsigned long long)e->num[0], (unsigned long long)e->num[1],
                       (unsigned long long)e->num[2], (unsigned long long)e->num[3]);
        else if (merge == STATSMERGE_PREFIX)
            buf_printf(b, "PREFIX %.*s %.*s\r\n", (int)e->nname, e->name, (int)e->nval, e->val);
        else if (e->isnum)
            buf_printf(b, "STAT %.*s %llu\r\n", (int)e->nname, e->name,
                       (unsigned long long)e->num[0]);
        else
            buf_printf(b, "STAT %.*s %.*s\r\n", (int)e->nname, e->name, (int)e->nval, e->val);
    }
}

void statslist_free(struct statslist *m)
{
    free(m->e);
    free(m->slot);
    *m = (struct statslist){0};
}
