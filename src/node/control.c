/* control.c — shoal-node's control-plane follower: the shared loop (common/follow.h) with the
 * node's hooks, and how a topology document becomes namespaces and slot drops (see control.h).
 *
 * Only the follower thread applies documents; the admin thread reads the figures (atomics). */
#include "node/control.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/follow.h"
#include "common/log.h"
#include "common/nsfields.h"
#include "common/slot.h"
#include "node/fence.h"
#include "node/node.h"
#include "node/repl.h"

struct node_control {
    struct node *n;
    struct follower *f;
    char advertise[300]; /* "host:port": how pools name this node */
    char admin[300];     /* "host:port" of the admin listener, or "" */
    uint8_t *owned;      /* SLOT_COUNT flags; NULL before the first document (owns all) */
    /* read by /metrics: atomics */
    uint64_t version, slots_owned, slot_drops;
};

uint64_t node_control_version(struct node_control *c)
{
    return c ? __atomic_load_n(&c->version, __ATOMIC_ACQUIRE) : 0;
}

static uint64_t nc_version(void *ctx) { return node_control_version(ctx); }

static char *nc_register_body(void *ctx, const char **id)
{
    struct node_control *c = ctx;
    *id = c->advertise;
    json_t *doc = json_pack("{s:s, s:s, s:s?}", "id", c->advertise, "listen", c->advertise,
                            "admin", c->admin[0] ? c->admin : NULL);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return body;
}

static void nc_refused(void *ctx, const char *err)
{
    struct node_control *c = ctx;
    log_error("topology from the control plane refused, keeping version %llu: %s",
              (unsigned long long)node_control_version(c), err);
}

/* Mark in `own` the slots pool `p` (named `pname`) gives this node; `idx` is the node's place
 * in its `nodes`, `nnodes` their count. -1 with err naming the field when `slots` is not a
 * valid list of ranges. */
static int nc_pool_slots(struct node_control *c, const char *pname, json_t *p, size_t idx,
                         size_t nnodes, uint8_t *own, struct repl_plan *plan, char *err,
                         size_t errlen)
{
    const char *mode = json_string_value(json_object_get(p, "mode"));
    json_t *slots = json_object_get(p, "slots");
    if (mode && !strcmp(mode, "replicated")) {
        memset(own, 1, SLOT_COUNT);
        return 0;
    }
    if (slots == NULL || json_is_null(slots)) { /* the default map (docs/router.md) */
        for (uint32_t s = 0; s < SLOT_COUNT; s++)
            if (slot_default_owner(s, (uint32_t)nnodes) == idx) own[s] = 1;
        return 0;
    }
    if (!json_is_array(slots)) {
        snprintf(err, errlen, "pools.%.64s.slots: must be an array of ranges", pname);
        return -1;
    }
    size_t i;
    json_t *r;
    json_array_foreach(slots, i, r) {
        json_t *from = json_object_get(r, "from"), *to = json_object_get(r, "to");
        const char *node = json_string_value(json_object_get(r, "node"));
        const char *replica = json_string_value(json_object_get(r, "replica"));
        if (!json_is_integer(from) || !json_is_integer(to) || node == NULL ||
            json_integer_value(from) < 0 || json_integer_value(to) >= SLOT_COUNT ||
            json_integer_value(from) > json_integer_value(to)) {
            snprintf(err, errlen,
                     "pools.%.64s.slots[%zu]: needs integer from <= to within 0..16383 and a node",
                     pname, i);
            return -1;
        }
        /* owned as primary or replica alike: a switch between the two drops nothing */
        if (strcmp(node, c->advertise) != 0 && (replica == NULL || strcmp(replica, c->advertise)))
            continue;
        repl_plan_range(plan, (unsigned)json_integer_value(from), (unsigned)json_integer_value(to),
                        node, replica);
        for (json_int_t s = json_integer_value(from); s <= json_integer_value(to); s++) own[s] = 1;
    }
    return 0;
}

/* A namespace's node-side settings from the document (ns_config_from_json, as the admin API
 * parses them); false with `why` when one is out of the node's range (the namespace is then
 * left as it is). */
static bool nc_ns_settings(json_t *ns, uint64_t nnodes, struct ns_config *cfg, char *why,
                           size_t whylen)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->eviction = NS_EVICT_DEFAULT;
    if (ns_config_from_json(cfg, ns, NS_JSON_DOC, why, whylen) < 0) return false;
    json_int_t mem = json_integer_value(json_object_get(ns, "memory"));
    cfg->copies = json_integer_value(json_object_get(ns, "copies")) == 2 ? 2 : 1;
    /* as shoal-control pushes it (model_ns_share): with copies 2 a node holds its primary
     * share and as much again as replica */
    uint64_t m = mem > 0 ? (uint64_t)mem : 0;
    cfg->memory = nsf_share(cfg->copies == 2 && m <= UINT64_MAX / 2 ? m * 2 : m, nnodes);
    return true;
}

static enum follow_take nc_take(void *ctx, const char *text, size_t len, uint64_t in_use,
                                char *err, size_t errlen)
{
    struct node_control *c = ctx;
    enum follow_take rc;
    uint64_t version;
    json_t *root = follow_doc_parse(text, len, in_use, &version, &rc, err, errlen);
    if (root == NULL) return rc;
    rc = FOLLOW_INVALID;
    uint8_t *own = NULL;
    struct ns_want *want = NULL;
    struct repl_plan *plan = NULL;
    json_t *mine = json_object(); /* pool name -> its node count, for the pools listing us */
    json_t *pools = json_object_get(root, "pools"), *nss = json_object_get(root, "namespaces");
    if (!json_is_object(pools) || !json_is_object(nss)) {
        snprintf(err, errlen, "%s: must be an object", json_is_object(pools) ? "namespaces" : "pools");
        goto out;
    }
    own = calloc(SLOT_COUNT, 1);
    want = calloc(json_object_size(nss) + 1, sizeof *want);
    if (c->n->repl && (plan = repl_plan_begin(c->n->repl)) == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = FOLLOW_FAILED;
        goto out;
    }
    if (own == NULL || want == NULL || mine == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = FOLLOW_FAILED;
        goto out;
    }
    const char *pname;
    json_t *p;
    json_object_foreach(pools, pname, p) {
        json_t *nodes = json_object_get(p, "nodes");
        if (!json_is_array(nodes) || json_array_size(nodes) == 0) {
            snprintf(err, errlen, "pools.%.64s.nodes: must be a non-empty array", pname);
            goto out;
        }
        size_t i, idx = SIZE_MAX;
        json_t *nd;
        json_array_foreach(nodes, i, nd) {
            const char *addr = json_string_value(nd);
            if (addr == NULL) addr = json_string_value(json_object_get(nd, "node"));
            if (addr && !strcmp(addr, c->advertise)) idx = i;
        }
        if (idx == SIZE_MAX) continue;
        size_t nn = json_array_size(nodes);
        json_object_set_new(mine, pname, json_integer((json_int_t)nn));
        if (nc_pool_slots(c, pname, p, idx, nn, own, plan, err, errlen) < 0) goto out;
    }
    /* namespaces: those whose pool lists this node */
    size_t nwant = 0;
    char why[256], refused[1024] = "";
    const char *name;
    json_t *ns;
    json_object_foreach(nss, name, ns) {
        json_t *nn = json_object_get(mine, json_string_value(json_object_get(ns, "pool")) ?: "");
        if (nn == NULL) continue;
        if (!nc_ns_settings(ns, (uint64_t)json_integer_value(nn), &want[nwant].cfg, why,
                            sizeof why)) {
            log_error("topology version %llu: namespace %s not applied on this node: %s",
                      (unsigned long long)version, name, why);
            /* keep it as it is: listed with its current settings, or left out when new */
            const struct ns *cur = ns_find(ns_current(&c->n->ns), name, strlen(name));
            if (cur == NULL) continue;
            want[nwant].cfg = cur->cfg;
        }
        want[nwant++].name = name;
    }
    if (nwant > NS_MAX) { /* a fault of the document for this node: no retry can apply it */
        snprintf(err, errlen, "namespaces: %zu are in pools that list this node, which holds at "
                 "most %d (default included)", nwant, NS_MAX);
        goto out;
    }
    bool changed;
    int bad = ns_replace_all(&c->n->ns, want, nwant, &changed, refused, sizeof refused);
    if (bad < 0) {
        snprintf(err, errlen, "namespaces: %s", refused);
        rc = FOLLOW_FAILED;
        log_error("topology version %llu not applied, keeping version %llu: %s",
                  (unsigned long long)version, (unsigned long long)in_use, err);
        goto out;
    }
    if (bad > 0)
        log_error("topology version %llu: not applied on this node: %s",
                  (unsigned long long)version, refused);
    /* slots: drop every one whose ownership changed (before the first document: all owned) */
    uint16_t *changes = malloc(SLOT_COUNT * sizeof *changes);
    size_t nchanges = 0, nowned = 0;
    if (changes == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = FOLLOW_FAILED;
        goto out;
    }
    for (unsigned s = 0; s < SLOT_COUNT; s++) {
        nowned += own[s];
        if (own[s] != (c->owned ? c->owned[s] : 1)) changes[nchanges++] = (uint16_t)s;
    }
    if (store_drop_slots(c->n->store, changes, nchanges, clock_now()) < 0) {
        free(changes);
        snprintf(err, errlen, "out of memory for the slot drop table");
        rc = FOLLOW_FAILED;
        log_error("topology version %llu: %s", (unsigned long long)version, err);
        goto out;
    }
    free(changes);
    repl_plan_commit(c->n->repl, plan); /* roles after the namespaces' copies are in place */
    plan = NULL;
    free(c->owned);
    c->owned = own;
    own = NULL;
    __atomic_store_n(&c->slots_owned, nowned, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->slot_drops, nchanges, __ATOMIC_RELAXED);
    __atomic_store_n(&c->version, version, __ATOMIC_RELEASE);
    if (c->n->fence) fence_apply_doc(c->n->fence, root, c->advertise, version);
    if (json_object_size(mine) == 0)
        log_warn("topology version %llu in use: no pool lists this node as %s, so it owns no "
                 "slot (is --advertise right?)", (unsigned long long)version, c->advertise);
    log_notice("topology version %llu in use (%zu pools with this node, %zu slots owned, %zu "
               "dropped, %zu namespaces%s; from the control plane)",
               (unsigned long long)version, json_object_size(mine), nowned, nchanges, nwant,
               changed ? "" : " unchanged");
    rc = FOLLOW_APPLIED;
out:
    repl_plan_free(plan);
    free(own);
    free(want);
    json_decref(mine);
    json_decref(root);
    return rc;
}

struct node_control *node_control_create(struct node *n, char *err, size_t errlen)
{
    if (!follow_url_ok(n->cfg.control)) {
        snprintf(err, errlen, "--control '%s' is not an http:// or https:// URL", n->cfg.control);
        return NULL;
    }
    struct node_control *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "--control: out of memory");
        return NULL;
    }
    c->n = n;
    struct follow_spec spec = {
        .url = n->cfg.control,
        .metric_prefix = "shoal_node",
        .register_path = "/v1/nodes",
        .timeout_ms = (unsigned)n->cfg.control_timeout_ms,
        .backoff_max_ms = (unsigned)n->cfg.control_backoff_max_ms,
        .token_file = n->cfg.token_file,
        .ctx = c,
        .version = nc_version,
        .register_body = nc_register_body,
        .take = nc_take,
        .refused = nc_refused,
    };
    if ((n->repl = repl_create(n, err, errlen)) == NULL) {
        free(c);
        return NULL;
    }
    if ((c->f = follower_create(&spec, err, errlen)) == NULL) {
        repl_free(&n->repl);
        free(c);
        return NULL;
    }
    return c;
}

int node_control_run(struct node_control *c, char *err, size_t errlen)
{
    const struct node_config *cfg = &c->n->cfg;
    if (cfg->advertise && *cfg->advertise) {
        snprintf(c->advertise, sizeof c->advertise, "%s", cfg->advertise);
    } else {
        const char *host = cfg->listen;
        char name[256] = "";
        if (host == NULL || !*host || !strcmp(host, "0.0.0.0") || !strcmp(host, "::")) {
            gethostname(name, sizeof name - 1);
            host = name;
        }
        bool v6 = strchr(host, ':') != NULL;
        snprintf(c->advertise, sizeof c->advertise, "%s%.256s%s:%u", v6 ? "[" : "", host,
                 v6 ? "]" : "", c->n->bound_port);
    }
    if (cfg->admin_port)
        snprintf(c->admin, sizeof c->admin, "%.256s:%llu", cfg->admin_listen,
                 (unsigned long long)cfg->admin_port);
    repl_set_advertise(c->n->repl, c->advertise);
    log_notice("following the control plane %s as %s", cfg->control, c->advertise);
    return follower_run(c->f, err, errlen);
}

void node_control_stop(struct node_control *c)
{
    if (c) follower_stop(c->f);
}

void node_control_free(struct node_control **cp)
{
    struct node_control *c = *cp;
    if (c == NULL) return;
    follower_free(&c->f);
    repl_free(&c->n->repl); /* after the workers, which append to its backlog */
    free(c->owned);
    free(c);
    *cp = NULL;
}

void node_control_metrics(struct node_control *c, struct buf *out)
{
    follower_metrics(c->f, out);
    buf_printf(out,
               "# HELP shoal_node_slots_owned slots of the topology in use this node owns, over "
               "the pools that list it\n# TYPE shoal_node_slots_owned gauge\n"
               "shoal_node_slots_owned %llu\n",
               (unsigned long long)__atomic_load_n(&c->slots_owned, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP shoal_node_slot_drops_total slots dropped because this node lost or won "
               "them back\n# TYPE shoal_node_slot_drops_total counter\n"
               "shoal_node_slot_drops_total %llu\n",
               (unsigned long long)__atomic_load_n(&c->slot_drops, __ATOMIC_RELAXED));
    buf_printf(out,
               "# HELP shoal_node_slot_items_dropped_total items removed because their slot was "
               "dropped\n# TYPE shoal_node_slot_items_dropped_total counter\n"
               "shoal_node_slot_items_dropped_total %llu\n",
               (unsigned long long)store_dropped_items(c->n->store));
    buf_printf(out,
               "# HELP shoal_node_slot_drop_pending 1 while dropped slots' items may remain (reads "
               "check slots)\n# TYPE shoal_node_slot_drop_pending gauge\n"
               "shoal_node_slot_drop_pending %d\n",
               store_drop_pending(c->n->store) ? 1 : 0);
}

const char *node_control_advertise(struct node_control *c) { return c->advertise; }
