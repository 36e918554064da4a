/* httpc.c — the HTTP/JSON client of httpc.h over libcurl.
 *
 * libcurl is opened with dlopen at the first httpc_create, not linked: shoal-node links this
 * file for --control, and a linked libcurl (with its TLS stack) costs every node about 3 MB of
 * resident memory at start whether it follows a control plane or not (resident memory is issue
 * 11's measure). The functions used are looked up once into `lc`; the macros below keep the
 * code reading as plain libcurl calls.
 *
 * Each client drives its one easy handle through its own multi handle rather than with
 * curl_easy_perform: curl_multi_poll can be woken from another thread (curl_multi_wakeup), which
 * is what lets httpc_cancel end a long poll at once instead of at the server's leisure. */
#include "common/httpc.h"

#define CURL_DISABLE_TYPECHECK /* the calls go through pointers (see below) */
#include <curl/curl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define HTTPC_CURL_FUNCS(X)                                                                      \
    X(global_init, CURLcode, (long))                                                             \
    X(easy_init, CURL *, (void))                                                                 \
    X(easy_cleanup, void, (CURL *))                                                              \
    X(easy_reset, void, (CURL *))                                                                \
    X(easy_setopt, CURLcode, (CURL *, CURLoption, ...))                                          \
    X(easy_getinfo, CURLcode, (CURL *, CURLINFO, ...))                                           \
    X(easy_strerror, const char *, (CURLcode))                                                   \
    X(slist_append, struct curl_slist *, (struct curl_slist *, const char *))                    \
    X(slist_free_all, void, (struct curl_slist *))                                               \
    X(multi_init, CURLM *, (void))                                                               \
    X(multi_cleanup, CURLMcode, (CURLM *))                                                       \
    X(multi_add_handle, CURLMcode, (CURLM *, CURL *))                                            \
    X(multi_remove_handle, CURLMcode, (CURLM *, CURL *))                                         \
    X(multi_perform, CURLMcode, (CURLM *, int *))                                                \
    X(multi_poll, CURLMcode, (CURLM *, struct curl_waitfd *, unsigned, int, int *))              \
    X(multi_wakeup, CURLMcode, (CURLM *))                                                        \
    X(multi_info_read, CURLMsg *, (CURLM *, int *))

static struct {
#define X(name, ret, args) ret(*name) args;
    HTTPC_CURL_FUNCS(X)
#undef X
} lc;

#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_global_init lc.global_init
#define curl_easy_init lc.easy_init
#define curl_easy_cleanup lc.easy_cleanup
#define curl_easy_reset lc.easy_reset
#define curl_easy_setopt lc.easy_setopt
#define curl_easy_getinfo lc.easy_getinfo
#define curl_easy_strerror lc.easy_strerror
#define curl_slist_append lc.slist_append
#define curl_slist_free_all lc.slist_free_all
#define curl_multi_init lc.multi_init
#define curl_multi_cleanup lc.multi_cleanup
#define curl_multi_add_handle lc.multi_add_handle
#define curl_multi_remove_handle lc.multi_remove_handle
#define curl_multi_perform lc.multi_perform
#define curl_multi_poll lc.multi_poll
#define curl_multi_wakeup lc.multi_wakeup
#define curl_multi_info_read lc.multi_info_read

/* Open libcurl and find every function. false (logged once) when it cannot. */
static bool httpc_load(void)
{
    void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        log_error("HTTP client unavailable: cannot load libcurl.so.4 (%s); install libcurl4",
                  dlerror());
        return false;
    }
#define X(name, ret, args)                                                                       \
    if ((*(void **)&lc.name = dlsym(lib, "curl_" #name)) == NULL) {                              \
        log_error("HTTP client unavailable: libcurl.so.4 has no curl_" #name);                   \
        return false;                                                                            \
    }
    HTTPC_CURL_FUNCS(X)
#undef X
    return true; /* kept open for the life of the process */
}

struct httpc {
    CURLM *multi;
    CURL *easy;
    size_t body_max;
    unsigned connect_ms; /* httpc_set_connect_timeout's, or 0 */
    bool compressed;     /* httpc_set_compressed's */
    int cancelled;      /* atomic: set by httpc_cancel from any thread */
    struct buf *sink;   /* the reply body being read */
    bool over;          /* the reply was longer than body_max */
    bool no_memory;
    struct curl_slist *extra; /* httpc_add_header's lines */
    char cerr[CURL_ERROR_SIZE]; /* libcurl's detail on a failure; it keeps the pointer */
};

static pthread_once_t httpc_once = PTHREAD_ONCE_INIT;
static CURLcode httpc_global_rc = CURLE_FAILED_INIT;

static void httpc_global_init(void)
{
    if (httpc_load()) httpc_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct httpc *httpc_create(size_t body_max)
{
    pthread_once(&httpc_once, httpc_global_init);
    if (httpc_global_rc != CURLE_OK) return NULL;
    struct httpc *h = calloc(1, sizeof *h);
    if (h == NULL) return NULL;
    h->body_max = body_max ? body_max : HTTPC_BODY_MAX_DEFAULT;
    h->multi = curl_multi_init();
    h->easy = curl_easy_init();
    if (h->multi == NULL || h->easy == NULL) {
        httpc_destroy(&h);
        return NULL;
    }
    return h;
}

void httpc_destroy(struct httpc **hp)
{
    struct httpc *h = *hp;
    if (h == NULL) return;
    if (h->easy) curl_easy_cleanup(h->easy);
    curl_slist_free_all(h->extra);
    if (h->multi) curl_multi_cleanup(h->multi);
    free(h);
    *hp = NULL;
}

int httpc_add_header(struct httpc *h, const char *line)
{
    struct curl_slist *l = curl_slist_append(h->extra, line);
    if (l == NULL) return -1;
    h->extra = l;
    return 0;
}

/* A copy of the client's own header lines, to which a request's are added (a request's list
 * is freed after it, the client's kept). NULL with *ok false when memory ran out. */
static struct curl_slist *httpc_headers(const struct httpc *h, bool *ok)
{
    struct curl_slist *out = NULL;
    *ok = true;
    for (const struct curl_slist *l = h->extra; l; l = l->next) {
        struct curl_slist *n = curl_slist_append(out, l->data);
        if (n == NULL) {
            curl_slist_free_all(out);
            *ok = false;
            return NULL;
        }
        out = n;
    }
    return out;
}

void httpc_set_connect_timeout(struct httpc *h, unsigned ms) { h->connect_ms = ms; }
void httpc_set_compressed(struct httpc *h, bool on) { h->compressed = on; }

void httpc_cancel(struct httpc *h)
{
    __atomic_store_n(&h->cancelled, 1, __ATOMIC_SEQ_CST);
    curl_multi_wakeup(h->multi);
}

void httpc_uncancel(struct httpc *h) { __atomic_store_n(&h->cancelled, 0, __ATOMIC_SEQ_CST); }

bool httpc_cancelled(const struct httpc *h)
{
    return __atomic_load_n(&h->cancelled, __ATOMIC_SEQ_CST) != 0;
}

void httpc_reply_init(struct httpc_reply *r)
{
    r->status = 0;
    buf_init(&r->body);
}

void httpc_reply_release(struct httpc_reply *r)
{
    buf_release(&r->body);
    r->status = 0;
}

static size_t httpc_write(char *p, size_t size, size_t n, void *ctx)
{
    struct httpc *h = ctx;
    size_t len = size * n;
    if (buf_used(h->sink) + len > h->body_max) {
        h->over = true;
        return 0; /* libcurl ends the transfer with CURLE_WRITE_ERROR */
    }
    if (buf_append(h->sink, p, len) < 0) {
        h->no_memory = true;
        return 0;
    }
    return len;
}

static int httpc_fail(char *err, size_t errlen, const char *fmt, const char *a, const char *b)
{
    snprintf(err, errlen, fmt, a, b);
    return -1;
}

int httpc_request(struct httpc *h, const char *method, const char *url, const char *body,
                  size_t len, unsigned timeout_ms, struct httpc_reply *reply, char *err,
                  size_t errlen)
{
    return httpc_request_hdr(h, method, url, NULL, body, len, timeout_ms, reply, err, errlen);
}

int httpc_request_hdr(struct httpc *h, const char *method, const char *url, const char *line,
                      const char *body, size_t len, unsigned timeout_ms,
                      struct httpc_reply *reply, char *err, size_t errlen)
{
    CURL *e = h->easy;
    char *cerr = h->cerr;
    struct curl_slist *hdrs = NULL;
    reply->status = 0;
    reply->body.off = reply->body.len = 0;
    h->sink = &reply->body;
    h->over = h->no_memory = false;
    cerr[0] = 0;
    if (httpc_cancelled(h)) return httpc_fail(err, errlen, "%s %s: cancelled", method, url);
    bool ok;
    hdrs = httpc_headers(h, &ok);
    if (!ok) return httpc_fail(err, errlen, "%s %s: out of memory", method, url);
    if (line) {
        struct curl_slist *more = curl_slist_append(hdrs, line);
        if (more == NULL) {
            curl_slist_free_all(hdrs);
            return httpc_fail(err, errlen, "%s %s: out of memory", method, url);
        }
        hdrs = more;
    }

    /* reset keeps the live connection, so a follower's polls reuse one TCP connection */
    curl_easy_reset(e);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    /* control traffic is between shoal's own processes: never through a proxy named in the
     * environment (http_proxy, ALL_PROXY, ...); "" disables libcurl's use of those */
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    unsigned connect_ms = h->connect_ms ? h->connect_ms : 5000;
    if (connect_ms > timeout_ms) connect_ms = timeout_ms;
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)connect_ms);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, httpc_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "shoal-httpc");
    if (h->compressed) curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, ""); /* "": all it decodes */
    if (strcmp(method, "GET") != 0) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
        if (body != NULL || strcmp(method, "DELETE") != 0) {
            curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
            curl_easy_setopt(e, CURLOPT_POSTFIELDS, body ? body : "");
            /* no "Expect: 100-continue" round trip before larger bodies */
            static const char *const lines[] = {"Content-Type: application/json", "Expect:"};
            for (size_t i = 0; i < 2; i++) {
                struct curl_slist *more = curl_slist_append(hdrs, lines[i]);
                if (more == NULL) {
                    curl_slist_free_all(hdrs);
                    return httpc_fail(err, errlen, "%s %s: out of memory", method, url);
                }
                hdrs = more;
            }
        }
    }
    if (hdrs) curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);

    CURLcode rc = CURLE_OK;
    if (curl_multi_add_handle(h->multi, e) != CURLM_OK) {
        curl_slist_free_all(hdrs);
        return httpc_fail(err, errlen, "%s %s: cannot start the request", method, url);
    }
    bool cancelled = false;
    for (;;) {
        int running = 0;
        if (curl_multi_perform(h->multi, &running) != CURLM_OK) {
            rc = CURLE_FAILED_INIT;
            break;
        }
        if (running == 0) {
            int left;
            CURLMsg *m;
            while ((m = curl_multi_info_read(h->multi, &left)) != NULL)
                if (m->msg == CURLMSG_DONE) rc = m->data.result;
            break;
        }
        if (httpc_cancelled(h)) {
            cancelled = true;
            break;
        }
        /* woken early by data, by the transfer's own timers, or by httpc_cancel */
        curl_multi_poll(h->multi, NULL, 0, 1000, NULL);
        if (httpc_cancelled(h)) {
            cancelled = true;
            break;
        }
    }
    curl_multi_remove_handle(h->multi, e);
    curl_slist_free_all(hdrs);
    if (cancelled) return httpc_fail(err, errlen, "%s %s: cancelled", method, url);
    if (rc != CURLE_OK) {
        if (h->over)
            snprintf(err, errlen, "%s %s: reply larger than %zu bytes", method, url, h->body_max);
        else if (h->no_memory)
            snprintf(err, errlen, "%s %s: out of memory for the reply", method, url);
        else
            snprintf(err, errlen, "%s %s: %s", method, url, *cerr ? cerr : curl_easy_strerror(rc));
        return -1;
    }
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &reply->status);
    return 0;
}
