/* follow.h — following shoal-control's topology by long-poll: the loop shared by
 * shoal-router --control and shoal-node --control.
 *
 * A thread of its own long-polls `GET URL/v1/topology?after=V`, V being the version in use
 * (or the newest version refused, so an invalid document is not fetched again and again),
 * and hands every newer document to its owner's `take` hook, which parses it whole and applies
 * it atomically, or refuses it with the running version kept. While the control plane is down
 * or answers errors the owner serves with the version it holds and the loop retries with a
 * backoff of 100 ms doubling up to backoff_max_ms; one line is logged when it goes away and one
 * when it answers again, and the first poll after that catches up.
 *
 * --control may name several shoal-control processes of one group (--etcd), "URL,URL,...":
 * any of them serves the topology (a standby follows the stored state within --etcd-poll-ms
 * and passes changes on to the leader), so the follower polls one and moves to the next when
 * it gives no answer or a 5xx, going round them all before it backs off.
 *
 * Before its first poll, and again each time the control plane comes back, the follower
 * registers: `POST URL<register_path>` with the owner's body ({"id", "listen", "admin"}).
 * Registration is best effort: a control plane without that call (404), or any other answer,
 * does not stop the following. */
#ifndef SHOAL_COMMON_FOLLOW_H
#define SHOAL_COMMON_FOLLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct buf;
struct follower;

/* What a `take` hook did with a document. */
enum follow_take {
    FOLLOW_APPLIED,  /* a newer version is in use now */
    FOLLOW_SAME,     /* not newer than the one in use (a held poll answering the same) */
    FOLLOW_INVALID,  /* the document is not valid: err names the field; the follower logs it
                        through `refused` once and polls after its version */
    FOLLOW_FAILED,   /* valid but could not be applied; the hook logged and counted it */
};

/* The start of every take hook: parse `text` as a topology document. Returns the document
 * (the caller json_decref's it) with *version set, when it is JSON whose "version" is an integer
 * above `in_use`; else NULL with *rc FOLLOW_SAME (not newer) or FOLLOW_INVALID (err says why). */
struct json_t;
struct json_t *follow_doc_parse(const char *text, size_t len, uint64_t in_use, uint64_t *version,
                                enum follow_take *rc, char *err, size_t errlen);

/* The follower's options shared by every daemon with --control (its config struct has a uint64_t
 * field of each number's name and `const char *token_file`); --control itself is each daemon's,
 * since what it follows differs. */
#define FOLLOW_OPTIONS(X)                                                                        \
    X(control_timeout_ms, 0, UINT, "60000", 100, 3600000,                                        \
      "longest a topology long-poll may take before it counts as failed and is sent again: "   \
      "above the control plane's hold time", NULL)                                                \
    X(control_backoff_max_ms, 0, UINT, "2000", 100, 600000,                                      \
      "retries to an unreachable control plane wait 100 ms, doubling up to this", NULL)         \
    X(token_file, 0, STR, NULL, 0, 0,                                                            \
      "file holding the bearer token sent to --control (default: the SHOAL_TOKEN variable)",    \
      NULL)

struct httpc;

struct follow_spec {
    const char *url;           /* the control plane's base URL (http:// or https://) */
    const char *metric_prefix; /* "shoal_router": the figures are <prefix>_control_... */
    const char *register_path; /* "/v1/routers" */
    unsigned timeout_ms;       /* longest wait for one poll's answer */
    unsigned backoff_max_ms;
    const char *token_file;    /* bearer token for a control plane with --auth-file (else the
                                  SHOAL_TOKEN variable; neither: no token) */
    void *ctx;
    /* The version in use (0: none yet). Any thread but a data-path one. */
    uint64_t (*version)(void *ctx);
    /* The registration body, malloc'd JSON (NULL: out of memory); *id names the follower in
     * the log (points into ctx or a static buffer). */
    char *(*register_body)(void *ctx, const char **id);
    /* Parse and apply one 200 answer's document (text, len bytes) if newer than in_use. */
    enum follow_take (*take)(void *ctx, const char *text, size_t len, uint64_t in_use,
                             char *err, size_t errlen);
    /* Log (and count) a refused document: "topology from the control plane refused, keeping
     * version N: <err>". */
    void (*refused)(void *ctx, const char *err);
};

#define FOLLOW_URLS_MAX 8

/* Whether `url` is one --control accepts: up to FOLLOW_URLS_MAX URLs separated by ',', each
 * http:// or https:// with something after it. */
bool follow_url_ok(const char *url);
/* The (first) URL without its trailing '/' (malloc'd; NULL when out of memory). */
char *follow_base(const char *url);
/* Each URL of the list, as follow_base makes it, into out[0..max): their count (0 when out of
 * memory; the list has passed follow_url_ok). */
size_t follow_bases(const char *list, char **out, size_t max);
/* Send token_file's token (or SHOAL_TOKEN's) with every request of `h`, for a control plane
 * that runs with --auth-file. 0, or -1 with err. */
int follow_auth(struct httpc *h, const char *token_file, char *err, size_t errlen);
/* The version a document names, when it is JSON with an integer version; 0 otherwise. */
uint64_t follow_peek_version(const char *text, size_t len);
/* Monotonic milliseconds. */
uint64_t follow_mono_ms(void);

/* A follower, not started yet: made before the admin listener, so that /metrics shows its
 * figures from the first request. The spec is copied (its strings must outlive the follower).
 * NULL with a message when memory ran out. */
struct follower *follower_create(const struct follow_spec *spec, char *err, size_t errlen);
/* Start following. -1 with a message when the thread cannot start. */
int follower_run(struct follower *f, char *err, size_t errlen);
/* Stop the thread if it runs (at once, even in the middle of a long poll) and wait for it.
 * The follower stays readable (follower_metrics) until follower_free; idempotent. */
void follower_stop(struct follower *f);
/* Stop it if it was not, and free everything. Sets *f to NULL. */
void follower_free(struct follower **f);

/* The follower's figures for /metrics: <prefix>_control_up, _polls, _failures, _applied,
 * _last_success_age_seconds. */
void follower_metrics(struct follower *f, struct buf *out);

#endif
