/* state_etcd.c — the shared state store (--etcd): the model lives in etcd under <prefix>
 * (see state.h), split so that no request nears etcd's request limit (1.5 MiB by default,
 * which one key holding 10,000 namespaces would pass):
 *   <prefix>state       the model without its namespaces, with "namespace_buckets": B
 *   <prefix>ns/<b>      for b in 0..B-1: {name: namespace...} of the namespaces whose name
 *                       hashes to b (FNV-1a), "{}" when none
 * A change writes the state key (its version changes every time) and the buckets whose
 * namespaces changed, in one txn: one bucket for a namespace change, none for a pool change.
 * A state key that still holds "namespaces" (the one-key layout of before) is read as it is,
 * and the first save writes every bucket.
 *
 * Only the leader writes it (leader.h), and every write is one txn guarded twice:
 *   - the leader key <prefix>leader still has the create_revision it had when this process
 *     won the election, so a deposed leader (its lease expired while it was stopped or cut
 *     off, another process elected since) has its write refused by etcd itself, whatever it
 *     believes;
 *   - the state key's mod_revision is still the one this process last read or wrote, so a
 *     write never replaces a state it has not seen (every write changes the state key, so its
 *     revision stands for the buckets too).
 * A save returns 0 only when etcd answered that the txn succeeded, i.e. the change is on a
 * quorum of members: it is then safe to acknowledge. */
#include "control/state.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/etcd.h"

struct etcd_store {
    struct state_store base;
    pthread_mutex_t mu; /* the client and the revisions below */
    struct etcd *e;
    char *state_key, *leader_key;
    int64_t guard;     /* the leader key's create_revision while leader; 0: not leader */
    int64_t state_rev; /* mod_revision of the state key as last read or written (0: absent) */
    int lost;          /* a save found the guard broken: this process is no longer leader */
    json_t *stored;    /* the namespaces object as last read or written (NULL: unknown, so the
                        * next save writes every bucket); values are shared with the model and
                        * never changed in place (model.h), so a changed one is a new address */
    char *bucket_prefix; /* <prefix>ns/ */
};

#define NS_BUCKETS 64

static unsigned bucket_of(const char *name)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 16777619u;
    return h % NS_BUCKETS;
}

static int etcd_load(struct state_store *s, json_t **out, char *err, size_t errlen)
{
    struct etcd_store *st = (struct etcd_store *)s;
    *out = NULL;
    /* the state key and every bucket in one txn, so all are of one revision */
    size_t bl = strlen(st->bucket_prefix);
    char end[600];
    snprintf(end, sizeof end, "%s", st->bucket_prefix);
    end[bl - 1]++; /* "ns/" -> "ns0": every key under ns/ */
    json_t *req = json_pack("{s:[{s:{s:o}},{s:{s:o,s:o}}]}", "success", "request_range", "key",
                            etcd_b64(st->state_key, strlen(st->state_key)), "request_range",
                            "key", etcd_b64(st->bucket_prefix, bl), "range_end",
                            etcd_b64(end, bl));
    json_t *rep = NULL, *m = NULL;
    pthread_mutex_lock(&st->mu);
    int rc = req ? etcd_call(st->e, "/v3/kv/txn", req, &rep, err, errlen)
                 : (snprintf(err, errlen, "out of memory"), -1);
    json_decref(req);
    const json_t *rs = json_object_get(rep, "responses");
    struct etcd_kv kv;
    if (rc == 0 && etcd_kv_from(json_object_get(json_array_get(rs, 0), "response_range"), 0,
                                &kv) < 0)
        rc = -1, snprintf(err, errlen, "etcd key %s: not base64, or out of memory", st->state_key);
    if (rc == 0 && kv.exists) {
        json_error_t je;
        m = json_loadb(kv.value, kv.len, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(m)) {
            snprintf(err, errlen, "etcd key %s is not a JSON object: %s (line %d); restore "
                     "it from a copy", st->state_key, je.text, je.line);
            rc = -1;
        }
    }
    bool split = rc == 0 && m && json_object_get(m, "namespaces") == NULL;
    if (split) {
        json_t *nss = json_object();
        const json_t *br = json_object_get(json_array_get(rs, 1), "response_range");
        size_t nb = json_array_size(json_object_get(br, "kvs"));
        for (size_t i = 0; nss && rc == 0 && i < nb; i++) {
            struct etcd_kv b;
            json_error_t je;
            json_t *o = etcd_kv_from(br, i, &b) == 0 && b.value
                            ? json_loadb(b.value, b.len, JSON_REJECT_DUPLICATES, &je) : NULL;
            if (!json_is_object(o) || json_object_update(nss, o) < 0) {
                snprintf(err, errlen, "a namespace bucket under %s is not a JSON object; "
                         "restore it from a copy", st->bucket_prefix);
                rc = -1;
            }
            json_decref(o);
            etcd_kv_release(&b);
        }
        json_object_del(m, "namespace_buckets");
        if (nss == NULL || json_object_set_new(m, "namespaces", nss) < 0)
            rc = -1, snprintf(err, errlen, "out of memory");
    }
    if (rc == 0) {
        st->state_rev = kv.exists ? kv.mod_rev : 0;
        json_decref(st->stored); /* the one-key layout's first save writes every bucket */
        st->stored = split ? json_incref(json_object_get(m, "namespaces")) : NULL;
        *out = m;
        m = NULL;
    }
    pthread_mutex_unlock(&st->mu);
    etcd_kv_release(&kv);
    json_decref(rep);
    json_decref(m);
    return rc;
}

/* The bucket puts of a save: those holding a namespace that changed, appeared or went since
 * `stored` (all when stored is NULL). Appended to `ops`; 0 or -1 on memory. */
static int bucket_puts(struct etcd_store *st, const json_t *nss, json_t *ops)
{
    bool dirty[NS_BUCKETS] = {false};
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)nss, k, v) {
        /* a value read again from etcd is equal though not the same: compared whole then */
        const json_t *was = json_object_get(st->stored, k);
        if (st->stored == NULL || (was != v && !json_equal((json_t *)was, v)))
            dirty[bucket_of(k)] = true;
    }
    json_object_foreach(st->stored, k, v)
        if (json_object_get(nss, k) == NULL) dirty[bucket_of(k)] = true;
    if (st->stored == NULL)
        for (unsigned b = 0; b < NS_BUCKETS; b++) dirty[b] = true;
    json_t *content[NS_BUCKETS] = {NULL};
    int rc = 0;
    for (unsigned b = 0; b < NS_BUCKETS; b++)
        if (dirty[b] && (content[b] = json_object()) == NULL) rc = -1;
    if (rc == 0) {
        json_object_foreach((json_t *)nss, k, v) {
            unsigned b = bucket_of(k);
            if (content[b] && json_object_set(content[b], k, v) < 0) rc = -1;
        }
    }
    for (unsigned b = 0; b < NS_BUCKETS; b++) {
        if (content[b] == NULL) continue;
        char key[600], *text = rc == 0 ? json_dumps(content[b], JSON_SORT_KEYS | JSON_COMPACT)
                                       : NULL;
        snprintf(key, sizeof key, "%s%u", st->bucket_prefix, b);
        json_t *op = text ? json_pack("{s:{s:o,s:o}}", "request_put", "key",
                                      etcd_b64(key, strlen(key)), "value",
                                      etcd_b64(text, strlen(text)))
                          : NULL;
        if (op == NULL || json_array_append_new(ops, op) < 0) rc = -1;
        free(text);
        json_decref(content[b]);
    }
    return rc;
}

static int etcd_save(struct state_store *s, const json_t *m, const char *text, size_t len,
                     char *err, size_t errlen)
{
    struct etcd_store *st = (struct etcd_store *)s;
    (void)text, (void)len; /* the one-key text: the layout here is split */
    const json_t *nss = json_object_get(m, "namespaces");
    json_t *head = json_copy((json_t *)m); /* shallow: only its top level changes */
    char *htext = NULL;
    if (head) {
        json_object_del(head, "namespaces");
        json_object_set_new(head, "namespace_buckets", json_integer(NS_BUCKETS));
        htext = json_dumps(head, JSON_SORT_KEYS | JSON_COMPACT);
    }
    json_decref(head);
    if (htext == NULL) return snprintf(err, errlen, "out of memory rendering the state"), -1;
    pthread_mutex_lock(&st->mu);
    int rc = -1;
    json_t *req = NULL, *rep = NULL;
    if (st->guard == 0) {
        snprintf(err, errlen, "this shoal-control is not the leader (any more): send the "
                 "change again, it goes to the leader");
        goto out;
    }
    json_t *lk = etcd_b64(st->leader_key, strlen(st->leader_key));
    json_t *sk = etcd_b64(st->state_key, strlen(st->state_key));
    json_t *puts = json_pack("[{s:{s:O,s:o}}]", "request_put", "key", sk, "value",
                             etcd_b64(htext, strlen(htext)));
    if (puts && bucket_puts(st, nss, puts) < 0) {
        json_decref(puts);
        puts = NULL;
    }
    req = puts ? json_pack(
                     "{s:[{s:O,s:s,s:o},{s:O,s:s,s:o}],s:o,s:[{s:{s:O,s:b}}]}", "compare",
                     "key", lk, "target", "CREATE", "create_revision", etcd_i64(st->guard),
                     "key", sk, "target", "MOD", "mod_revision", etcd_i64(st->state_rev),
                     "success", puts, "failure", "request_range", "key", lk, "keys_only", 1)
               : NULL;
    json_decref(lk);
    json_decref(sk);
    if (req == NULL) {
        snprintf(err, errlen, "out of memory");
    } else if (etcd_call(st->e, "/v3/kv/txn", req, &rep, err, errlen) == 0) {
        if (json_is_true(json_object_get(rep, "succeeded"))) {
            st->state_rev = etcd_revision(rep);
            json_decref(st->stored);
            st->stored = json_incref((json_t *)nss);
            rc = 0;
        } else {
            /* which guard broke: the leader key (deposed) or the state (not seen) */
            const json_t *r0 = json_array_get(json_object_get(rep, "responses"), 0);
            struct etcd_kv kv;
            etcd_kv_from(json_object_get(r0, "response_range"), 0, &kv);
            if (!kv.exists || kv.create_rev != st->guard) {
                st->guard = 0;
                st->lost = 1;
                snprintf(err, errlen, "this shoal-control lost the leader lease before the "
                         "change was stored (another was elected): nothing changed; send the "
                         "change again, it goes to the new leader");
            } else {
                snprintf(err, errlen, "the stored state changed since this leader read it "
                         "(revision %lld, not %lld): nothing changed; send the change again",
                         (long long)etcd_revision(rep), (long long)st->state_rev);
            }
            etcd_kv_release(&kv);
        }
    }
out:
    json_decref(req);
    json_decref(rep);
    pthread_mutex_unlock(&st->mu);
    free(htext);
    return rc;
}

static void etcd_close(struct state_store *s)
{
    struct etcd_store *st = (struct etcd_store *)s;
    etcd_destroy(&st->e);
    pthread_mutex_destroy(&st->mu);
    json_decref(st->stored);
    free(st->bucket_prefix);
    free(st->state_key);
    free(st->leader_key);
    free(st);
}

static const struct state_ops etcd_ops = {etcd_load, etcd_save, etcd_close};

struct state_store *state_etcd_open(const char *endpoints, const char *prefix,
                                    unsigned timeout_ms, char *err, size_t errlen)
{
    struct etcd_store *st = calloc(1, sizeof *st);
    if (st == NULL) return snprintf(err, errlen, "out of memory"), NULL;
    st->base.ops = &etcd_ops;
    pthread_mutex_init(&st->mu, NULL);
    if (asprintf(&st->state_key, "%sstate", prefix) < 0) st->state_key = NULL;
    if (asprintf(&st->leader_key, "%sleader", prefix) < 0) st->leader_key = NULL;
    if (asprintf(&st->bucket_prefix, "%sns/", prefix) < 0) st->bucket_prefix = NULL;
    if (st->state_key == NULL || st->leader_key == NULL || st->bucket_prefix == NULL) {
        snprintf(err, errlen, "out of memory");
    } else if ((st->e = etcd_create(endpoints, timeout_ms, err, errlen)) != NULL) {
        return &st->base;
    }
    etcd_close(&st->base);
    return NULL;
}

void state_etcd_guard(struct state_store *s, int64_t leader_rev)
{
    struct etcd_store *st = (struct etcd_store *)s;
    pthread_mutex_lock(&st->mu);
    st->guard = leader_rev;
    st->lost = 0;
    pthread_mutex_unlock(&st->mu);
}

bool state_etcd_lost(struct state_store *s)
{
    struct etcd_store *st = (struct etcd_store *)s;
    pthread_mutex_lock(&st->mu);
    bool lost = st->lost != 0;
    pthread_mutex_unlock(&st->mu);
    return lost;
}

bool state_etcd_stale(struct state_store *s, int64_t mod_rev)
{
    struct etcd_store *st = (struct etcd_store *)s;
    pthread_mutex_lock(&st->mu);
    /* revisions only grow: an older one is a read made before this store's own last write
     * (the leader's tick racing its saves), not a change made elsewhere; reloading then would
     * cost a whole read and parse of the state per change */
    bool stale = mod_rev > st->state_rev;
    pthread_mutex_unlock(&st->mu);
    return stale;
}

void state_etcd_cancel(struct state_store *s)
{
    etcd_cancel(((struct etcd_store *)s)->e);
}
