/* etcd.h — a small client of etcd's v3 JSON gateway (POST /v3/kv/range, /v3/kv/txn,
 * /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke) over the shared libcurl client
 * (common/httpc.h), for shoal-control's shared state and leader lease (--etcd).
 *
 * The gateway maps etcd's protobuf messages to JSON: keys and values are base64, 64-bit
 * integers (revisions, lease IDs, TTLs) come back as decimal strings, and fields at their zero
 * value are left out ("succeeded" is absent when a txn's compare failed, "kvs" when a range
 * found nothing). etcd_int reads either form.
 *
 * One struct etcd is used by one thread at a time (it owns one httpc). It knows every member's
 * client URL and sends each request to the one that last answered, moving on to the next when
 * one gives no answer or answers 5xx, so a dead member costs one failed attempt, not an outage;
 * it goes round the members until one answers or three attempt timeouts have passed, so a
 * request rides out etcd electing a new raft leader.
 * A txn retried on another member is safe for the callers here: every write they make is
 * guarded by a compare that fails if the first attempt was applied after all. */
#ifndef SHOAL_CONTROL_ETCD_H
#define SHOAL_CONTROL_ETCD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct etcd;

/* `endpoints`: "URL[,URL...]" (http://host:port; "host:port" gets http://). timeout_ms bounds
 * each attempt, three times it a whole call. NULL with a message when the list is empty or memory ran out. */
struct etcd *etcd_create(const char *endpoints, unsigned timeout_ms, char *err, size_t errlen);
void etcd_destroy(struct etcd **e);
/* From any thread: end the request in progress and every later one at once (shutdown). */
void etcd_cancel(struct etcd *e);
void etcd_uncancel(struct etcd *e);

/* POST `req` to `path` ("/v3/kv/range"...) and parse the reply into *out (a new reference).
 * 0 on HTTP 200; -1 with a message (the last member's failure) when none answered 200 in time. */
int etcd_call(struct etcd *e, const char *path, const json_t *req, json_t **out, char *err,
              size_t errlen);

/* One key as a range returns it. value is NULL for keys_only reads (else malloc'd, len bytes,
 * NUL-terminated; free it with etcd_kv_release). */
struct etcd_kv {
    bool exists;
    int64_t create_rev, mod_rev, lease;
    char *value;
    size_t len;
};
void etcd_kv_release(struct etcd_kv *kv);
/* Fill `kv` from element i of a range reply's "kvs" (absent: exists false). -1 when the value
 * is not valid base64 or memory ran out. */
int etcd_kv_from(const json_t *range_reply, size_t i, struct etcd_kv *kv);
/* Read one key (linearizable). 0, or -1 with a message. */
int etcd_get(struct etcd *e, const char *key, bool keys_only, struct etcd_kv *kv, char *err,
             size_t errlen);

/* A lease of ttl seconds: *id. 0, or -1 with a message. */
int etcd_lease_grant(struct etcd *e, unsigned ttl, int64_t *id, char *err, size_t errlen);
/* Renew lease `id`: *ttl_left is what etcd granted again (0: the lease has expired). */
int etcd_lease_keepalive(struct etcd *e, int64_t id, int64_t *ttl_left, char *err,
                         size_t errlen);
int etcd_lease_revoke(struct etcd *e, int64_t id, char *err, size_t errlen);

/* JSON helpers for building requests and reading replies. */
json_t *etcd_b64(const char *p, size_t n); /* a JSON string of the base64 of p; NULL on memory */
json_t *etcd_i64(int64_t v);                /* a JSON string of the decimal v, as the gateway likes */
int64_t etcd_int(const json_t *v);          /* a string or an integer; 0 when absent */
/* The revision in a reply's header (the store's revision after a write). */
int64_t etcd_revision(const json_t *reply);

#endif
