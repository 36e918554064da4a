/* follow.c — the control-plane follower of shoal-router (see follow.h): the shared loop of
 * src/common/follow.h with the router's hooks (topology parse, publish, registration body),
 * plus the wait for a first document at start. */
#include "router/follow.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/follow.h"
#include "common/httpc.h"
#include "common/log.h"
#include "router/reload.h"

#define FOLLOW_BACKOFF_MIN_MS 100
/* Polls that bring nothing new are paced to at most one per this many ms, in case a control
 * plane answers `after=V` at once instead of holding it. */
#define FOLLOW_IDLE_PACE_MS 100

struct follow {
    struct router *r;
    struct follower *f;
    char id[256];
};

#define mono_ms follow_mono_ms

/* Parse a reply's document; on failure err says why (naming the field). */
static int follow_parse(const struct httpc_reply *rep, struct topo **out, char *err,
                        size_t errlen)
{
    return topo_parse(buf_start(&rep->body), buf_used(&rep->body), 0, out, err, errlen);
}

int follow_first(const struct router_config *cfg, struct topo **out, char *err, size_t errlen)
{
    *out = NULL;
    char *bases[FOLLOW_URLS_MAX];
    size_t nbases = follow_bases(cfg->control, bases, FOLLOW_URLS_MAX), cur = 0;
    const char *base = nbases ? bases[0] : NULL;
    struct httpc *h = httpc_create(0);
    if (nbases == 0 || h == NULL) {
        while (nbases > 0) free(bases[--nbases]);
        httpc_destroy(&h);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (follow_auth(h, cfg->token_file, err, errlen) < 0) {
        while (nbases > 0) free(bases[--nbases]);
        httpc_destroy(&h);
        return -1;
    }
    struct httpc_reply rep;
    httpc_reply_init(&rep);
    uint64_t deadline = mono_ms() + cfg->control_wait_ms, after = 0, backoff = 0;
    char url[1100], msg[512];
    bool told = false;
    int rc = -1;
    snprintf(err, errlen, "no answer within --control-wait-ms %llu",
             (unsigned long long)cfg->control_wait_ms);
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= deadline) break;
        uint64_t left = deadline - now;
        if (after)
            snprintf(url, sizeof url, "%.1000s/v1/topology?after=%llu", base,
                     (unsigned long long)after);
        else
            snprintf(url, sizeof url, "%.1000s/v1/topology", base);
        int got = httpc_get(h, url, (unsigned)left, &rep, msg, sizeof msg);
        if (got == 0 && rep.status == 200) {
            if (follow_parse(&rep, out, msg, sizeof msg) == 0) {
                rc = 0;
                break;
            }
            /* an invalid document: wait for a newer one (the last error is reported) */
            snprintf(err, errlen, "topology from %s: %s", base, msg);
            uint64_t v = follow_peek_version(buf_start(&rep.body), buf_used(&rep.body));
            if (v > after) {
                after = v;
                log_error("topology from the control plane refused, waiting for a newer one: %s",
                          msg);
                continue;
            }
        } else if (got == 0 && rep.status == 304) {
            /* no newer version yet: ask again, paced in case the server does not hold */
            uint64_t took = mono_ms() - now;
            if (took < FOLLOW_IDLE_PACE_MS) usleep((useconds_t)(FOLLOW_IDLE_PACE_MS - took) * 1000);
            continue;
        } else {
            if (rep.status) snprintf(msg, sizeof msg, "%.400s answered HTTP %ld", url, rep.status);
            snprintf(err, errlen, "control plane %s: %s", base, msg);
            if (!told) log_notice("waiting for the control plane at %s: %s", base, msg);
            told = true;
            if (nbases > 1) { /* the next member of --control's list, at once */
                base = bases[cur = (cur + 1) % nbases];
                if (cur != 0) continue;
            }
        }
        backoff = backoff ? backoff * 2 : FOLLOW_BACKOFF_MIN_MS;
        if (backoff > cfg->control_backoff_max_ms) backoff = cfg->control_backoff_max_ms;
        now = mono_ms();
        if (now >= deadline) break;
        uint64_t nap = backoff < deadline - now ? backoff : deadline - now;
        usleep((useconds_t)(nap * 1000));
    }
    httpc_reply_release(&rep);
    httpc_destroy(&h);
    while (nbases > 0) free(bases[--nbases]);
    return rc;
}

static uint64_t rf_version(void *ctx)
{
    struct follow *f = ctx;
    return router_topology_version(f->r);
}

static char *rf_register_body(void *ctx, const char **idp)
{
    struct follow *f = ctx;
    const struct router_config *cfg = &f->r->cfg;
    char listen[300], admin[300];
    if (cfg->client_id) {
        snprintf(f->id, sizeof f->id, "%s", cfg->client_id);
    } else {
        f->id[0] = 0;
        gethostname(f->id, sizeof f->id - 1);
    }
    *idp = f->id;
    snprintf(listen, sizeof listen, "%.256s:%u", cfg->listen ? cfg->listen : "", f->r->bound_port);
    snprintf(admin, sizeof admin, "%.256s:%u", cfg->admin_listen ? cfg->admin_listen : "",
             f->r->admin_bound_port);
    json_t *doc = json_pack("{s:s, s:s, s:s?}", "id", f->id, "listen", listen, "admin",
                            f->r->admin_bound_port ? admin : NULL);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return body;
}

static enum follow_take rf_take(void *ctx, const char *text, size_t len, uint64_t in_use,
                                char *err, size_t errlen)
{
    struct follow *f = ctx;
    struct topo *t;
    if (topo_parse(text, len, 0, &t, err, errlen) < 0) return FOLLOW_INVALID;
    if (t->version <= in_use) { /* held until its timeout: the same version again */
        topo_destroy(&t);
        return FOLLOW_SAME;
    }
    if (router_apply_topology(f->r, t, "the control plane", err, errlen) == 0)
        return FOLLOW_APPLIED;
    return FOLLOW_FAILED;
}

static void rf_refused(void *ctx, const char *err)
{
    struct follow *f = ctx;
    router_topology_refused(f->r, "the control plane", err);
}

struct follow *follow_create(struct router *r, char *err, size_t errlen)
{
    struct follow *f = calloc(1, sizeof *f);
    if (f == NULL) {
        snprintf(err, errlen, "--control: out of memory");
        return NULL;
    }
    f->r = r;
    struct follow_spec spec = {
        .url = r->cfg.control,
        .metric_prefix = "shoal_router",
        .register_path = "/v1/routers",
        .timeout_ms = (unsigned)r->cfg.control_timeout_ms,
        .backoff_max_ms = (unsigned)r->cfg.control_backoff_max_ms,
        .token_file = r->cfg.token_file,
        .ctx = f,
        .version = rf_version,
        .register_body = rf_register_body,
        .take = rf_take,
        .refused = rf_refused,
    };
    if ((f->f = follower_create(&spec, err, errlen)) == NULL) {
        free(f);
        return NULL;
    }
    return f;
}

int follow_run(struct follow *f, char *err, size_t errlen)
{
    return follower_run(f->f, err, errlen);
}

void follow_stop(struct follow *f)
{
    if (f) follower_stop(f->f);
}

void follow_free(struct follow **fp)
{
    struct follow *f = *fp;
    if (f == NULL) return;
    follower_free(&f->f);
    free(f);
    *fp = NULL;
}

void follow_metrics(struct follow *f, struct buf *out) { follower_metrics(f->f, out); }
