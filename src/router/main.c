/* main.c — shoal-router: a memcached-protocol routing sidecar (the paper's mcrouter).
 *
 * Start-up order: options, topology (--config FILE, or without it the first document of the
 * --control plane; an invalid document stops the process with a message naming the field),
 * listener, workers, admin HTTP, then the control-plane follower (follow.h). SIGHUP re-reads
 * the topology file and swaps it in while requests flow (an invalid or not-newer document is
 * logged and the running one kept); SIGINT/SIGTERM stop in reverse order. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/admin.h"
#include "common/log.h"
#include "common/net.h"
#include "common/options.h"
#include "common/sigs.h"
#include "router/follow.h"
#include "router/report.h"
#include "router/reload.h"
#include "router/router.h"
#include "router/router_admin.h"
#include "router/worker.h"

static struct router router;

/* Re-read the topology file; keep the running table when the new one is not usable. */
static void router_reload(struct router *r)
{
    char err[512];
    struct topo *t;
    if (r->cfg.topology == NULL) {
        log_notice("SIGHUP: no --config file to re-read; the topology follows the control "
                   "plane");
        return;
    }
    if (topo_load_file(r->cfg.topology, &t, err, sizeof err) < 0) {
        router_topology_refused(r, NULL, err);
        return;
    }
    router_apply_topology(r, t, NULL, err, sizeof err);
}

int main(int argc, char **argv)
{
    static const struct opt_program prog = {
        "shoal-router",
        "A memcached-protocol routing sidecar: routes each key to the node that owns its slot.",
        "shoal-router " ROUTER_VERSION " (memcached protocol 1.6)", "the topology file",
        "the JSON topology document (required unless --control; re-read on SIGHUP; "
        "docs/router.md)"};
    /* read by `stats settings` while the router runs */
    static struct opt_def defs[OPTIONS_COUNT(ROUTER_OPTIONS)];
    size_t ndefs = OPTIONS_DEFS(ROUTER_OPTIONS, defs, &router.cfg);
    router.opts = defs;
    router.nopts = ndefs;
    char err[512];
    int exit_now = options_start(&prog, defs, ndefs, argc, argv, &router.cfg.topology);
    if (exit_now >= 0) return exit_now;
    log_set_level((int)(router.cfg.verbose > 2 ? 2 : router.cfg.verbose));
    if (router.cfg.topology == NULL && router.cfg.control == NULL) {
        fprintf(stderr, "shoal-router: --config FILE or --control URL is required: the topology "
                        "document (docs/router.md) or the control plane that serves it\n");
        return 2;
    }
    if (router.cfg.control && !follow_url_ok(router.cfg.control)) {
        fprintf(stderr, "shoal-router: --control '%s' is not an http:// or https:// URL\n",
                router.cfg.control);
        return 2;
    }
    char host[256] = "";
    const char *id = router.cfg.client_id;
    if (id == NULL) {
        gethostname(host, sizeof host - 1);
        id = host;
    }
    topo_set_replica(slot_crc16(id, strlen(id)));
    struct topo *t;
    if (router.cfg.topology ? topo_load_file(router.cfg.topology, &t, err, sizeof err)
                            : follow_first(&router.cfg, &t, err, sizeof err)) {
        fprintf(stderr, "shoal-router: %s\n", err);
        return 2;
    }

    /* Blocked before any thread starts, so every thread inherits the mask and the main thread
     * collects them with sigwait(). */
    sigset_t sigs;
    sigs_block(&sigs, SIGHUP);

    /* Descriptors for -c clients, the admin listener's, and the node connections of every
     * worker (at most 1024 of them, a generous guess: the topology may change). */
    unsigned long long want = router.cfg.conn_limit + router.cfg.admin_conn_max + 1024,
                       nofile = net_raise_nofile(want);
    if (nofile < router.cfg.conn_limit + 1024)
        log_warn("open-file limit %llu (ulimit -n) is below -c %llu plus node connections: "
                 "clients past about %llu connections are refused",
                 nofile, (unsigned long long)router.cfg.conn_limit,
                 nofile > 1024 ? nofile - 1024 : 0);
    router.listen_fd = net_listen(router.cfg.listen, (unsigned)router.cfg.port,
                                  (int)router.cfg.backlog, err, sizeof err);
    if (router.listen_fd < 0) {
        fprintf(stderr, "shoal-router: %s\n", err);
        return 2;
    }
    router.bound_port = net_local_port(router.listen_fd);
    router.started = time(NULL);
    membudget_setup_allocator();
    membudget_init(&router.budget, router.cfg.buffers_max);
    router.keep = (struct keepbudget){.max = router.cfg.moved_keep_max, .mb = &router.budget};
    pthread_mutex_init(&router.reset_lock, NULL);
    pthread_mutex_init(&router.promo_lock, NULL);
    pthread_mutex_init(&router.apply_lock, NULL);
    connlist_init(&router.conns);
    if (worker_setup(&router, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-router: %s\n", err);
        return 2;
    }
    nodestats_init(&router.nodes, router.cfg.threads);
    if (scopestats_init(&router.scopes, router.cfg.threads) < 0)
        log_error("out of memory for per-pool and per-namespace figures; /metrics omits them");
    uint64_t *seen[256];
    for (uint64_t i = 0; i < router.cfg.threads; i++) seen[i] = &router.workers[i].topo_seen;
    /* for the start-up line: once the admin listener runs, a PUT may replace and free `t` */
    unsigned long long t_version = t->version;
    unsigned t_nodes = t->nnodes, t_pools = t->npools, t_ns = t->nns;
    topo_registry_init(&router.topo, t, seen, router.cfg.threads);
    t = NULL;

    if (router.cfg.control && (router.follow = follow_create(&router, err, sizeof err)) == NULL) {
        fprintf(stderr, "shoal-router: %s\n", err);
        return 2;
    }
    if (router.cfg.auth_file && !router.cfg.admin_port) {
        fprintf(stderr, "shoal-router: --auth-file guards the admin port, which is off: give "
                        "--admin-port too\n");
        return 2;
    }
    struct admin *admin = NULL;
    if (router.cfg.admin_port) {
        admin = router_admin_create(&router, err, sizeof err);
        if (admin == NULL) {
            fprintf(stderr, "shoal-router: %s\n", err);
            return 2;
        }
        router.admin_bound_port = admin_port(admin);
    }
    if (worker_start(&router, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-router: %s\n", err);
        return 2;
    }
    if (router.cfg.port_file) {
        FILE *f = fopen(router.cfg.port_file, "w");
        if (f == NULL || fprintf(f, "%u\n", router.bound_port) < 0 || fclose(f) != 0) {
            fprintf(stderr, "shoal-router: cannot write --port-file %s: %s\n",
                    router.cfg.port_file, strerror(errno));
            return 2;
        }
    }
    log_notice("listening on %s:%u, %llu threads, topology version %llu (%u nodes, %u pools, "
               "%u namespaces)",
               router.cfg.listen && *router.cfg.listen ? router.cfg.listen : "*",
               router.bound_port, (unsigned long long)router.cfg.threads,
               t_version, t_nodes, t_pools, t_ns);
    if (admin) log_notice("admin HTTP on %s:%u", router.cfg.admin_listen, admin_port(admin));
    if (router.follow && follow_run(router.follow, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-router: %s\n", err);
        return 2;
    }
    if (router.cfg.control && reporter_start(&router, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-router: %s\n", err);
        return 2;
    }

    for (;;) {
        int sig = 0;
        if (sigwait(&sigs, &sig) != 0) continue;
        if (sig == SIGHUP) {
            router_reload(&router);
            continue;
        }
        log_notice("signal %d: shutting down", sig);
        break;
    }
    reporter_stop(&router);
    follow_stop(router.follow); /* it publishes tables: before the workers go */
    admin_destroy(&admin);
    follow_free(&router.follow); /* the admin thread read its figures until admin_destroy */
    worker_teardown(&router);
    close(router.listen_fd);
    topo_registry_teardown(&router.topo);
    json_decref(router.applied_doc);
    nodestats_teardown(&router.nodes);
    scopestats_teardown(&router.scopes);
    options_release();
    return 0;
}
