/* main.c — shoal-control: the control plane (namespaces, pools, slot maps, the versioned
 * topology; issue 13).
 *
 * Start-up order: options, data directory, state (an unreadable or invalid state file stops
 * the process with a message: starting empty would throw acknowledged changes away), the
 * poller and pusher threads, with --etcd the forwarder, the HTTP listener, then (--etcd) the
 * election, which needs the listener's URL; SIGINT/SIGTERM stop in reverse order, changes
 * waiting for the leader and held long polls answered first. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/admin.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/options.h"
#include "common/sigs.h"
#include "control/api.h"
#include "control/control.h"
#include "control/failover.h"
#include "control/forward.h"
#include "control/leader.h"
#include "control/lease.h"
#include "control/model.h"
#include "control/poll.h"
#include "control/push.h"
#include "control/dash.h"
#include "control/sampler.h"
#include "control/render.h"
#include "control/state.h"
#include "control/topodoc.h"

static struct control ctl;

/* Load the stored model, or a new one when none was stored. */
static int load_state(struct control *c, char *err, size_t errlen)
{
    json_t *m = NULL;
    if (state_load(c->store, &m, err, errlen) < 0) return -1;
    if (m == NULL) {
        m = model_new();
        if (m == NULL) return snprintf(err, errlen, "out of memory"), -1;
    } else {
        struct model_err e;
        if (model_check(m, &e) != 0) {
            snprintf(err, errlen, "%s %.200s is not valid (%.60s: %.200s); restore it from a copy",
                     c->cfg.etcd ? "the state in etcd under" : "state file",
                     c->cfg.etcd ? c->cfg.etcd_prefix : c->cfg.state, e.field, e.msg);
            json_decref(m);
            return -1;
        }
    }
    if (control_install(c, m) < 0) {
        json_decref(m);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    return 0;
}

static bool lease_hook(void *t, const char *node, uint64_t now_ms)
{
    return lease_lapsed(t, node, now_ms);
}

static bool lease_begin_hook(void *t, const char *node, uint64_t now_ms)
{
    return lease_promote_begin(t, node, now_ms);
}

static void lease_end_hook(void *t, const char *node) { lease_promote_end(t, node); }

int main(int argc, char **argv)
{
    static const struct opt_program prog = {
        "shoal-control",
        "The control plane: namespaces, pools, slot maps and the versioned topology, over "
        "HTTP/JSON (docs/admin-api.md).",
        "shoal-control " CONTROL_VERSION, NULL, NULL};
    struct opt_def defs[OPTIONS_COUNT(CONTROL_OPTIONS)];
    size_t ndefs = OPTIONS_DEFS(CONTROL_OPTIONS, defs, &ctl.cfg);
    char err[600];
    int exit_now = options_start(&prog, defs, ndefs, argc, argv, NULL);
    if (exit_now >= 0) return exit_now;
    log_set_level((int)(ctl.cfg.verbose > 2 ? 2 : ctl.cfg.verbose));
    if (ctl.cfg.poll_max >= ctl.cfg.admin_conn_max) {
        fprintf(stderr, "shoal-control: --poll-max %llu must be below --admin-conn-max %llu, so "
                        "health checks and changes get through while polls are held\n",
                (unsigned long long)ctl.cfg.poll_max, (unsigned long long)ctl.cfg.admin_conn_max);
        return 2;
    }
    /* pushes to nodes carry this token; read now, so a bad file stops the start */
    if (auth_client_header(ctl.cfg.token_file, &ctl.auth_header, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-control: --token-file: %s\n", err);
        return 2;
    }
    char *state_path = NULL;
    if (ctl.cfg.etcd == NULL && ctl.cfg.state == NULL) {
        if (mkdir(ctl.cfg.data_dir, 0700) < 0 && errno != EEXIST) {
            fprintf(stderr, "shoal-control: cannot create --data-dir %s: %s\n", ctl.cfg.data_dir,
                    strerror(errno));
            return 2;
        }
        if (asprintf(&state_path, "%s/state.json", ctl.cfg.data_dir) < 0) return 2;
        ctl.cfg.state = state_path;
    }
    if (ctl.cfg.etcd && ctl.cfg.advertise == NULL && !strcmp(ctl.cfg.listen, "0.0.0.0")) {
        fprintf(stderr, "shoal-control: with --etcd and --listen 0.0.0.0, say with --advertise "
                        "http://HOST:PORT where the others reach this one\n");
        return 2;
    }
    sigset_t sigs;
    sigs_block(&sigs, 0);
    pthread_mutex_init(&ctl.lock, NULL);
    pthread_mutex_init(&ctl.change_mu, NULL);
    pthread_mutex_init(&ctl.gate, NULL);
    if ((ctl.render = render_create()) == NULL) {
        fprintf(stderr, "shoal-control: out of memory\n");
        return 2;
    }
    pthread_cond_init(&ctl.idle, NULL);
    if (ctl.cfg.etcd) {
        /* the state as etcd holds it now; etcd unreachable at start stops the process, as an
         * unreadable state file does: serving an empty state would send followers back */
        ctl.store = state_etcd_open(ctl.cfg.etcd, ctl.cfg.etcd_prefix,
                                    (unsigned)ctl.cfg.etcd_timeout_ms, err, sizeof err);
        if (ctl.store == NULL || load_state(&ctl, err, sizeof err) < 0) {
            fprintf(stderr, "shoal-control: --etcd %s: %s\n", ctl.cfg.etcd, err);
            return 2;
        }
    } else {
        ctl.store = state_file_open(ctl.cfg.state);
        if (ctl.store == NULL || load_state(&ctl, err, sizeof err) < 0) {
            fprintf(stderr, "shoal-control: %s\n", ctl.store ? err : "out of memory");
            return 2;
        }
    }
    ctl.poll = poll_create(&ctl, err, sizeof err);
    ctl.push = ctl.poll ? push_create(&ctl, err, sizeof err) : NULL;
    if (ctl.push == NULL) {
        fprintf(stderr, "shoal-control: %s\n", err);
        return 2;
    }
    ctl.stats = sampler_create(&ctl, err, sizeof err);
    if (ctl.stats == NULL) {
        fprintf(stderr, "shoal-control: %s\n", err);
        return 2;
    }
    dash_setup(ctl.cfg.chart_js);
    if ((ctl.leases = lease_table_new(ctl.cfg.lease_ms)) == NULL ||
        lease_publish(ctl.leases, ctl.model) < 0) {
        fprintf(stderr, "shoal-control: out of memory\n");
        return 2;
    }
    /* failure detection and promotion (issue 15), promoting only over lapsed leases */
    ctl.fo = failover_create(&ctl, err, sizeof err);
    struct failover_lease_hooks hooks = {lease_hook, lease_begin_hook, lease_end_hook, ctl.leases};
    if (ctl.fo) failover_set_lease(ctl.fo, &hooks);
    if (ctl.fo == NULL || failover_start(ctl.fo, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-control: %s\n", err);
        return 2;
    }
    if (ctl.cfg.etcd) {
        /* with etcd only the leader pushes to nodes: the pusher resumes when this one wins */
        push_pause(ctl.push);
        ctl.ha = ha_create(&ctl, err, sizeof err);
        ctl.fwd = ctl.ha ? forward_create(&ctl, err, sizeof err) : NULL;
        if (ctl.fwd == NULL) {
            fprintf(stderr, "shoal-control: %s\n", err);
            return 2;
        }
    } else {
        CTL_SET(&ctl, leader, 1);
        /* leases from before a restart are unknown: every node counts as renewed now */
        lease_takeover(ctl.leases, clock_mono_ms());
        push_notify(ctl.push); /* nodes get what the stored state says, after a restart too */
    }
    struct admin *admin = api_create(&ctl, err, sizeof err);
    if (admin == NULL) {
        fprintf(stderr, "shoal-control: %s\n", err);
        return 2;
    }
    unsigned port = admin_port(admin);
    if (ctl.cfg.port_file) {
        /* written whole under another name and renamed, so a reader never sees half */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", ctl.cfg.port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 ||
            rename(tmp, ctl.cfg.port_file) != 0) {
            fprintf(stderr, "shoal-control: cannot write --port-file %s: %s\n",
                    ctl.cfg.port_file, strerror(errno));
            return 2;
        }
    }
    char self[600];
    if (ctl.cfg.advertise) snprintf(self, sizeof self, "%s", ctl.cfg.advertise);
    else snprintf(self, sizeof self, "http://%s:%u", ctl.cfg.listen, port);
    while (strlen(self) > 0 && self[strlen(self) - 1] == '/') self[strlen(self) - 1] = 0;
    if (ctl.ha && ha_start(ctl.ha, self, err, sizeof err) < 0) {
        fprintf(stderr, "shoal-control: %s\n", err);
        return 2;
    }
    log_notice("listening on http://%s:%u, state %s%s, topology version %llu (%zu pools, %zu "
               "namespaces)",
               ctl.cfg.listen, port, ctl.cfg.etcd ? "in etcd " : "",
               ctl.cfg.etcd ? ctl.cfg.etcd : ctl.cfg.state, (unsigned long long)ctl.version,
               json_object_size(json_object_get(ctl.model, "pools")),
               json_object_size(json_object_get(ctl.model, "namespaces")));
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    log_notice("signal %d: shutting down", sig);
    control_close_writes(&ctl); /* no write uses ha or fwd once this returns */
    api_stop(&ctl);             /* its queue is empty: every write has left */
    failover_destroy(&ctl.fo);  /* its changes and held drains end before the rest goes */
    forward_destroy(&ctl.fwd); /* answers the changes still waiting for the leader */
    ha_destroy(&ctl.ha);       /* a leader resigns, so another takes over at once */
    poll_stop(ctl.poll); /* held polls answered; new ones refused until the listener is gone */
    admin_destroy(&admin);
    poll_destroy(&ctl.poll);
    push_destroy(&ctl.push);
    sampler_destroy(&ctl.stats);
    lease_table_free(&ctl.leases);
    dash_teardown();
    state_close(&ctl.store);
    json_decref(ctl.model);
    topo_doc_unref(ctl.doc);
    render_destroy(&ctl.render);
    free(state_path);
    free(ctl.auth_header);
    options_release();
    return 0;
}
