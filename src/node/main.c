/* main.c — shoal-node: a memcached-compatible cache server.
 *
 * Start-up order: options, clock, store, listener, workers, admin HTTP; SIGINT/SIGTERM stop in
 * reverse. A bad option stops the process before anything listens, with a message naming the
 * option and the fix. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/admin.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/net.h"
#include "common/options.h"
#include "common/sigs.h"
#include "node/control.h"
#include "node/fence.h"
#include "node/node.h"
#include "node/repl.h"
#include "node/node_admin.h"
#include "node/worker.h"

static struct node node;

/* Short flags and memcached long names for the engine's options. */
static char store_short(const char *name, const char **alias)
{
    if (!strcmp(name, "memory_mb")) return *alias = "memory-limit", 'm';
    if (!strcmp(name, "item_max")) return *alias = "max-item-size", 'I';
    *alias = NULL;
    return 0;
}

/* The registry's `published` hook: each namespace's stale_ttl is the store's grace for the
 * items tagged with its id (expired items served stale to lease-aware readers); ids no
 * namespace holds get none. */
static void node_ns_published(void *ctx, const struct ns_table *t)
{
    struct store *st = ctx;
    for (int id = 0; id < NS_MAX; id++)
        store_set_grace(st, (uint16_t)id, t->byid[id] ? (uint32_t)t->byid[id]->cfg.stale_ttl : 0);
}

/* The options table: shoal-node's own, then the engine's (whose X-macro has no short flags or
 * aliases: store_short gives them). */
static size_t build_options(struct opt_def *defs, struct node_config *cfg)
{
    size_t n = OPTIONS_DEFS(NODE_OPTIONS, defs, cfg);
#define X(name_, type_, def_, lo_, hi_, help_)                                                   \
    defs[n] = (struct opt_def){#name_, 0, OPT_##type_, NULL, def_, lo_, hi_, help_,              \
                               &cfg->store.name_, NULL};                                         \
    defs[n].shortf = store_short(#name_, &defs[n].alias);                                        \
    n++;
    STORE_OPTIONS(X)
#undef X
    return n;
}

int main(int argc, char **argv)
{
    static const struct opt_program prog = {
        "shoal-node", "A memcached-compatible cache node: text and meta protocol, leases.",
        "shoal-node " SHOAL_VERSION " (memcached protocol 1.6)", NULL, NULL};
    struct opt_def defs[OPTIONS_COUNT(NODE_OPTIONS) + OPTIONS_COUNT(STORE_OPTIONS)];
    size_t ndefs = build_options(defs, &node.cfg);
    char err[512];
    int exit_now = options_start(&prog, defs, ndefs, argc, argv, NULL);
    if (exit_now >= 0) return exit_now;
    log_set_level((int)(node.cfg.verbose > 2 ? 2 : node.cfg.verbose));
    if (node.cfg.inflight_max == 0) { /* auto: a share of -m, but room for the largest item */
        uint64_t share = node.cfg.store.memory_mb * (1024 * 1024 / 8);
        uint64_t floor = node.cfg.store.item_max > (1 << 20) ? node.cfg.store.item_max : 1 << 20;
        node.cfg.inflight_max = share > floor ? share : floor;
    } else if (node.cfg.inflight_max < node.cfg.store.item_max) {
        log_warn("--inflight-max %llu is below -I %llu: larger values are stored only when "
                 "they have all arrived by the time their command line is read",
                 (unsigned long long)node.cfg.inflight_max,
                 (unsigned long long)node.cfg.store.item_max);
    }
    if (node.cfg.udp_port != 0)
        log_warn("UDP is not supported; -U %llu ignored, UDP stays off",
                 (unsigned long long)node.cfg.udp_port);

    /* SIGINT and SIGTERM are blocked before any thread starts, so every thread inherits the
     * mask and the main thread collects them with sigwait() below; one that arrives early
     * (even before the port opens) stays pending instead of killing the process. */
    sigset_t stop;
    sigs_block(&stop, 0);
    clock_setup();
    membudget_setup_allocator();
    membudget_init(&node.budget, node.cfg.buffers_max);
    detail_init(&node.detail);
    if (store_create(&node.store, &node.cfg.store, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }
    node.leases = lease_table_create((size_t)node.cfg.lease_keys);
    if (node.leases == NULL) {
        fprintf(stderr, "shoal-node: out of memory creating the lease table (--lease-keys)\n");
        return 2;
    }
    /* Descriptors for -c clients, the admin listener's connections and our own files; past
     * the limit in force clients are refused by net_accept. */
    unsigned long long want = node.cfg.conn_limit + node.cfg.admin_conn_max + 64,
                       nofile = net_raise_nofile(want);
    if (nofile < node.cfg.conn_limit + 64)
        log_warn("open-file limit %llu (ulimit -n) is below -c %llu: clients past about %llu "
                 "connections are refused",
                 nofile, (unsigned long long)node.cfg.conn_limit, nofile > 64 ? nofile - 64 : 0);
    node.listen_fd = net_listen(node.cfg.listen, (unsigned)node.cfg.port, (int)node.cfg.backlog,
                                err, sizeof err);
    if (node.listen_fd < 0) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }
    node.bound_port = net_local_port(node.listen_fd);
    node.started = time(NULL);
    connlist_init(&node.conns);

    if (worker_setup(&node, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }
    uint64_t *seen[256];
    for (uint64_t i = 0; i < node.cfg.threads; i++) seen[i] = &node.workers[i].ns_seen;
    if (ns_registry_init(&node.ns, seen, node.cfg.threads) < 0) {
        fprintf(stderr, "shoal-node: out of memory creating the namespace table\n");
        return 2;
    }
    node.ns.sum_metrics = node_ns_metrics_sum;
    node.ns.sum_ctx = &node;
    if (ns_registry_set_apply(&node.ns, node_ns_apply, &node, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }
    node.ns.published = node_ns_published;
    node.ns.published_ctx = node.store;
    if (node.cfg.namespaces &&
        ns_load_file(&node.ns, node.cfg.namespaces, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }
    if (node.cfg.auth_file && !node.cfg.admin_port) {
        fprintf(stderr, "shoal-node: --auth-file guards the admin port, which is off: give "
                        "--admin-port too\n");
        return 2;
    }
    if (node.cfg.control && ((node.control = node_control_create(&node, err, sizeof err)) == NULL ||
                             (node.fence = fence_create(&node, err, sizeof err)) == NULL)) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }
    struct admin *admin = NULL;
    if (node.cfg.admin_port) {
        admin = node_admin_create(&node, err, sizeof err);
        if (admin == NULL) {
            fprintf(stderr, "shoal-node: %s\n", err);
            return 2;
        }
    }
    if (worker_start(&node, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }
    if (node.cfg.port_file) {
        FILE *f = fopen(node.cfg.port_file, "w");
        if (f == NULL || fprintf(f, "%u\n", node.bound_port) < 0 || fclose(f) != 0) {
            fprintf(stderr, "shoal-node: cannot write --port-file %s: %s\n", node.cfg.port_file,
                    strerror(errno));
            return 2;
        }
    }
    log_msg(LOG_NOTICE,
            "listening on %s:%u, %llu MB, %llu threads, item max %llu bytes, %u namespaces",
            node.cfg.listen && *node.cfg.listen ? node.cfg.listen : "*", node.bound_port,
            (unsigned long long)node.cfg.store.memory_mb, (unsigned long long)node.cfg.threads,
            (unsigned long long)node.cfg.store.item_max, ns_current(&node.ns)->count);
    if (admin) log_msg(LOG_NOTICE, "admin HTTP on %s:%u", node.cfg.admin_listen, admin_port(admin));
    if (node.control && (node_control_run(node.control, err, sizeof err) < 0 ||
                         fence_start(node.fence, node_control_advertise(node.control), err,
                                     sizeof err) < 0)) {
        fprintf(stderr, "shoal-node: %s\n", err);
        return 2;
    }

    int sig = 0;
    sigwait(&stop, &sig);
    log_msg(LOG_NOTICE, "signal %d: shutting down", sig);
    /* it publishes namespace tables, which waits for the workers: before they go */
    node_control_stop(node.control);
    /* /metrics reads the workers' counters and the follower's figures, and an admin write
     * publishes tables (waiting for the workers): the admin thread goes before either, once
     * no handoff holds a request (the listener may not stop with one held) */
    repl_handoffs_end(node.repl);
    admin_destroy(&admin);
    worker_teardown(&node);
    node_control_free(&node.control);
    fence_free(&node.fence);
    close(node.listen_fd);
    ns_registry_teardown(&node.ns);
    store_destroy(&node.store);
    lease_table_destroy(&node.leases);
    detail_teardown(&node.detail);
    return 0;
}
