/* state_etcd.c — the shared state store (--etcd): the model lives in one etcd key,
 * <prefix>state, as the same JSON the embedded store writes to its file (see state.h).
 *
 * Only the leader writes it (leader.h), and every write is one txn guarded twice:
 *   - the leader key <prefix>leader still has the create_revision it had when this process
 *     won the election, so a deposed leader (its lease expired while it was stopped or cut
 *     off, another process elected since) has its write refused by etcd itself, whatever it
 *     believes;
 *   - the state key's mod_revision is still the one this process last read or wrote, so a
 *     write never replaces a state it has not seen.
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
};

static int etcd_load(struct state_store *s, json_t **out, char *err, size_t errlen)
{
    struct etcd_store *st = (struct etcd_store *)s;
    *out = NULL;
    struct etcd_kv kv;
    pthread_mutex_lock(&st->mu);
    int rc = etcd_get(st->e, st->state_key, false, &kv, err, errlen);
    if (rc == 0) {
        if (kv.exists) {
            json_error_t je;
            *out = json_loadb(kv.value, kv.len, JSON_REJECT_DUPLICATES, &je);
            if (*out == NULL) {
                snprintf(err, errlen, "etcd key %s is not valid JSON: %s (line %d); restore "
                         "it from a copy", st->state_key, je.text, je.line);
                rc = -1;
            }
        }
        if (rc == 0) st->state_rev = kv.exists ? kv.mod_rev : 0;
    }
    pthread_mutex_unlock(&st->mu);
    etcd_kv_release(&kv);
    return rc;
}

static int etcd_save(struct state_store *s, const json_t *m, const char *text, size_t len,
                     char *err, size_t errlen)
{
    struct etcd_store *st = (struct etcd_store *)s;
    pthread_mutex_lock(&st->mu);
    int rc = -1;
    if (st->guard == 0) {
        snprintf(err, errlen, "this shoal-control is not the leader (any more): send the "
                 "change again, it goes to the leader");
        goto out;
    }
    json_t *lk = etcd_b64(st->leader_key, strlen(st->leader_key));
    json_t *sk = etcd_b64(st->state_key, strlen(st->state_key));
    json_t *req = json_pack(
        "{s:[{s:O,s:s,s:o},{s:O,s:s,s:o}],s:[{s:{s:O,s:o}}],s:[{s:{s:O,s:b}}]}",
        "compare", "key", lk, "target", "CREATE", "create_revision", etcd_i64(st->guard),
        "key", sk, "target", "MOD", "mod_revision", etcd_i64(st->state_rev),
        "success", "request_put", "key", sk, "value", etcd_b64(text, len),
        "failure", "request_range", "key", lk, "keys_only", 1);
    json_decref(lk);
    json_decref(sk);
    json_t *rep = NULL;
    if (req == NULL) {
        snprintf(err, errlen, "out of memory");
    } else if (etcd_call(st->e, "/v3/kv/txn", req, &rep, err, errlen) == 0) {
        if (json_is_true(json_object_get(rep, "succeeded"))) {
            st->state_rev = etcd_revision(rep);
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
    json_decref(req);
    json_decref(rep);
out:
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void etcd_close(struct state_store *s)
{
    struct etcd_store *st = (struct etcd_store *)s;
    etcd_destroy(&st->e);
    pthread_mutex_destroy(&st->mu);
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
    if (st->state_key == NULL || st->leader_key == NULL) {
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
    bool stale = st->state_rev != mod_rev;
    pthread_mutex_unlock(&st->mu);
    return stale;
}

void state_etcd_cancel(struct state_store *s)
{
    etcd_cancel(((struct etcd_store *)s)->e);
}
