/* cluster.c — `shoal up` and `shoal down`: a whole local cluster on embedded defaults.
 *
 * up: shoal-control (state under DIR/control), three shoal-nodes and a gutter node (each with an
 * admin port), registered in the control plane as pool `main` (with their admin addresses, so
 * namespace quotas are pushed to them) and the gutter pool, then a shoal-router following the
 * control plane. Each is started in its own session with its log under DIR/logs and recorded in
 * DIR/cluster.json as soon as it runs, so `shoal down` can stop whatever a failed or killed `up`
 * left. Nodes keep the ports of the last `up` from the same DIR when those are free, so the
 * control plane's stored pools still name them. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "cli/cli.h"
#include "cli/probe.h"
#include "cli/proc.h"

const struct cli_flag cli_up_flags[] = {
    {"port", "PORT", "the router's data port: applications connect here [11211]"},
    {"admin-port", "PORT", "the router's admin HTTP port (/healthz, /metrics) [11411]"},
    {"control-port", "PORT", "shoal-control's port [11500]"},
    {"base-port", "N", "nodes on N+1..N+3, the gutter node on N+9, admin ports 100 above [free "
                       "ports, those of the last `up` from DIR when still free]"},
    {"node-args", "FLAGS", "more flags for every shoal-node, e.g. \"-m 256\""},
    {"foreground", NULL, "stay: stop the cluster on Ctrl-C or SIGTERM, or when a process dies"},
    {"timeout", "S", "seconds each process has to become healthy [30]"},
    {NULL, NULL, NULL},
};

const struct cli_flag cli_down_flags[] = {
    {"timeout", "S", "seconds from SIGTERM to SIGKILL [10]"},
    {NULL, NULL, NULL},
};

enum { M_CONTROL, M_NODE1, M_NODE2, M_NODE3, M_GUTTER, M_ROUTER, M_COUNT };

struct member {
    const char *name, *role;
    char bin[PATH_MAX + 32];
    char addr[64], admin[64];
    char log[PATH_MAX + 16];
    pid_t pid;
};

static volatile sig_atomic_t stop_sig;

static void on_signal(int s) { stop_sig = s; }

static int mkdirs(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) < 0 && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* Exclusive hold on DIR while up or down works on it; -1 (message printed) if another has it. */
static int lock_dir(const char *dir)
{
    char p[PATH_MAX + 8];
    snprintf(p, sizeof p, "%s/lock", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return cli_err("shoal: cannot open %s: %s", p, strerror(errno)), -1;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        close(fd);
        cli_err("shoal: another `shoal up` or `shoal down` is working on %s; wait for it", dir);
        return -1;
    }
    return fd;
}

static bool port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return false;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* A port the kernel reports free now, not one of taken[0..n). */
static int free_port(const int *taken, int n)
{
    for (int tries = 0; tries < 100; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof sa;
        int port = -1;
        if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
            getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
            port = ntohs(sa.sin_port);
        if (fd >= 0) close(fd);
        bool dup = false;
        for (int i = 0; i < n; i++) dup |= taken[i] == port;
        if (port > 0 && !dup) return port;
    }
    return -1;
}

static int addr_port(const char *addr)
{
    const char *c = addr ? strrchr(addr, ':') : NULL;
    return c ? atoi(c + 1) : 0;
}

static void print_log_tail(const char *log)
{
    FILE *f = fopen(log, "r");
    if (f == NULL) return;
    char buf[4096];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    fprintf(stderr, "--- last lines of %s ---\n%s%s---\n", log, buf,
            n && buf[n - 1] != '\n' ? "\n" : "");
}

/* The record of the cluster (DIR/cluster.json) as it is now. */
static json_t *record(const char *dir, const struct member *m, const char *control,
                      bool foreground, const char *self)
{
    json_t *procs = json_array();
    for (int i = 0; i < M_COUNT; i++) {
        if (!m[i].addr[0]) continue;
        json_array_append_new(procs, json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:s}", "name",
                                               m[i].name, "role", m[i].role, "address", m[i].addr,
                                               "admin", m[i].admin, "argv0", m[i].bin, "pid",
                                               (int)m[i].pid, "log", m[i].log));
    }
    json_t *rec = json_pack("{s:s, s:s, s:s, s:o}", "dir", dir, "control", control, "router",
                            m[M_ROUTER].addr, "processes", procs);
    if (rec && foreground)
        json_object_set_new(rec, "supervisor", json_pack("{s:i, s:s}", "pid", (int)getpid(),
                                                         "argv0", self));
    return rec;
}

static void save(const char *dir, const struct member *m, const char *control, bool fg,
                 const char *self)
{
    json_t *rec = record(dir, m, control, fg, self);
    if (rec == NULL || proc_record_save(dir, rec) < 0)
        fprintf(stderr, "shoal: warning: cannot write %s/cluster.json: %s\n", dir, strerror(errno));
    json_decref(rec);
}

/* Stop every started member, last first; print one line each. */
static void stop_members(struct member *m, unsigned term_ms, bool quiet)
{
    pid_t pids[M_COUNT];
    const char *argv0s[M_COUNT];
    int stopped[M_COUNT], n = 0, idx[M_COUNT];
    for (int i = M_COUNT - 1; i >= 0; i--) {
        if (m[i].pid <= 0) continue;
        idx[n] = i;
        pids[n] = m[i].pid;
        argv0s[n++] = m[i].bin;
    }
    proc_stop_all(pids, argv0s, n, term_ms, stopped);
    for (int k = 0; k < n; k++) {
        if (!quiet && stopped[k])
            printf("%s %-8s (pid %d)%s\n", stopped[k] == 2 ? "killed " : "stopped", m[idx[k]].name,
                   (int)pids[k], stopped[k] == 2 ? ": it did not exit after SIGTERM" : "");
        m[idx[k]].pid = 0;
    }
    fflush(stdout);
}

/* The member's log says a port of its was taken. */
static bool log_says_in_use(const struct member *mb)
{
    FILE *f = fopen(mb->log, "r");
    if (f == NULL) return false;
    char line[1024];
    bool found = false;
    while (fgets(line, sizeof line, f)) found |= strstr(line, "in use") != NULL;
    fclose(f);
    return found;
}

/* Wait until ok(member) or the deadline, a signal, or the member's death; -1 (printed) if not.
 * With `port_retry`, a member that exited because a port was taken gives -2, unprinted: its
 * ports were picked free a moment before, and another process took one meanwhile. */
static int await(struct member *mb, bool (*ok)(const struct member *), const char *what,
                 unsigned timeout_s, bool port_retry)
{
    uint64_t deadline = clock_mono_ms() + (uint64_t)timeout_s * 1000;
    for (;;) {
        if (ok(mb)) return 0;
        if (stop_sig) return cli_err("shoal: interrupted; stopping what was started"), -1;
        if (!proc_alive(mb->pid, mb->bin)) {
            if (port_retry && log_says_in_use(mb)) return -2;
            cli_err("shoal: %s exited at start (log %s)", mb->name, mb->log);
            print_log_tail(mb->log);
            return -1;
        }
        if (clock_mono_ms() >= deadline) {
            cli_err("shoal: %s did not become %s within %u s (log %s); raise --timeout if the "
                    "machine is slow", mb->name, what, timeout_s, mb->log);
            print_log_tail(mb->log);
            return -1;
        }
        usleep(25000);
    }
}

static bool admin_ok(const struct member *mb) { return probe_healthz(mb->admin, 500); }
static bool node_ok(const struct member *mb)
{
    return probe_healthz(mb->admin, 500) && probe_accepts(mb->addr, 500);
}
static bool router_ok(const struct member *mb)
{
    return probe_healthz(mb->admin, 500) && probe_get(mb->addr, 1000);
}

/* Split FLAGS on blanks into argv slots (the string is modified). */
static int split_args(char *s, char **out, int max)
{
    int n = 0;
    for (char *tok = strtok(s, " \t"); tok && n < max; tok = strtok(NULL, " \t")) out[n++] = tok;
    return n;
}

/* The program's `--help` mentions flag (so a node built with --control is started with it). */
static bool has_flag(const char *bin, const char *flag)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "'%s' --help 2>&1", bin);
    FILE *f = popen(cmd, "r");
    if (f == NULL) return false;
    char line[1024];
    bool found = false;
    size_t fl = strlen(flag);
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, flag);
        if (p && (p[fl] == ' ' || p[fl] == '\n' || p[fl] == '=')) found = true;
    }
    pclose(f);
    return found;
}

/* Make pool `name` hold exactly these nodes: create it, or add and remove nodes. *created says
 * whether it was new. 0, or -1 (printed). */
static int ensure_pool(const char *control, json_t *pools, const char *name, struct member *m,
                       int first, int count, bool gutter, bool *created)
{
    json_t *pool = json_object_get(pools, name);
    *created = pool == NULL;
    if (pool == NULL) {
        json_t *nodes = json_array();
        for (int i = first; i < first + count; i++)
            json_array_append_new(nodes, json_pack("{s:s, s:s}", "node", m[i].addr, "admin",
                                                   m[i].admin));
        json_t *body = json_pack("{s:s, s:o, s:b}", "name", name, "nodes", nodes, "gutter", gutter);
        json_t *r = cli_call(control, "POST", "/v1/pools", body);
        json_decref(body);
        if (r == NULL) return -1;
        json_decref(r);
        printf("  pool %s: %d node%s registered\n", name, count, count == 1 ? "" : "s");
        return 0;
    }
    json_t *have = json_object_get(pool, "nodes");
    for (int i = first; i < first + count; i++) {
        bool found = false;
        size_t k;
        json_t *n;
        json_array_foreach(have, k, n) found |= !strcmp(json_string_value(json_object_get(n, "node")) ?: "", m[i].addr);
        if (found) continue;
        char path[300];
        snprintf(path, sizeof path, "/v1/pools/%s/nodes", name);
        json_t *body = json_pack("{s:s, s:s}", "node", m[i].addr, "admin", m[i].admin);
        json_t *r = cli_call(control, "POST", path, body);
        json_decref(body);
        if (r == NULL) return -1;
        json_decref(r);
        printf("  pool %s: added %s\n", name, m[i].addr);
    }
    size_t k;
    json_t *n;
    json_array_foreach(have, k, n) {
        const char *addr = json_string_value(json_object_get(n, "node"));
        bool ours = false;
        for (int i = first; addr && i < first + count; i++) ours |= !strcmp(addr, m[i].addr);
        if (ours || addr == NULL) continue;
        char path[400];
        snprintf(path, sizeof path, "/v1/pools/%s/nodes/%s", name, addr);
        json_t *r = cli_call(control, "DELETE", path, NULL);
        if (r == NULL) return -1;
        json_decref(r);
        printf("  pool %s: removed %s (a node of an earlier run)\n", name, addr);
    }
    return 0;
}

static int register_pools(const char *control, struct member *m)
{
    json_t *r = cli_call(control, "GET", "/v1/pools", NULL);
    if (r == NULL) return -1;
    json_t *pools = json_object_get(r, "pools");
    bool created_main, created_gutter;
    int rc = ensure_pool(control, pools, "main", m, M_NODE1, 3, false, &created_main);
    if (rc == 0) rc = ensure_pool(control, pools, "gutter", m, M_GUTTER, 1, true, &created_gutter);
    json_decref(r);
    if (rc == 0 && created_main) { /* a fresh control plane: run.sh's example namespace too */
        json_t *body = json_pack("{s:s, s:s, s:i, s:i}", "name", "catalog", "pool", "main",
                                 "default_ttl", 600, "max_ttl", 86400);
        json_t *c = cli_call(control, "POST", "/v1/namespaces", body);
        json_decref(body);
        if (c == NULL) return -1;
        json_decref(c);
        printf("  namespace catalog created (default TTL 600 s, max 1 day)\n");
    }
    return rc;
}

static int parse_port_flag(const struct cli_cmd *cmd, const struct cli_args *a, const char *name,
                           int def, int *out)
{
    const char *v = cli_flag(cmd, a, name);
    uint64_t x;
    if (v == NULL) return *out = def, 0;
    if (cli_parse_uint(v, &x) < 0 || x > 65535 || (x == 0 && strcmp(name, "base-port")))
        return cli_err("shoal up: --%s %s is not a port (1..65535)", name, v), -1;
    *out = (int)x;
    return 0;
}

static void print_table(const struct member *m, const char *dir, const char *control)
{
    struct cli_table *t = cli_table_new(6, "process", "address", "admin", "pid", "role", "log");
    for (int i = 0; i < M_COUNT; i++) {
        char pid[16];
        snprintf(pid, sizeof pid, "%d", (int)m[i].pid);
        cli_table_row(t, m[i].name, m[i].addr, m[i].admin, pid, m[i].role, m[i].log);
    }
    printf("\nshoal local cluster is up — applications connect to %s (memcached protocol)\n\n",
           m[M_ROUTER].addr);
    cli_table_print(t, 2);
    cli_table_free(&t);
    int rp = addr_port(m[M_ROUTER].addr);
    printf("\n  control plane: %s   (state in %s/control)\n", control, dir);
    printf("  dashboard:     %s/   (open it in a browser)\n", control);
    printf("  try:   printf 'set greeting 0 0 2\\r\\nhi\\r\\nget greeting\\r\\n' | nc -q1 127.0.0.1 %d\n", rp);
    printf("         python3 -c \"from pymemcache.client.base import Client; c = Client(('127.0.0.1', "
           "%d)); c.set('k', 'hi'); print(c.get('k'))\"\n", rp);
    printf("  watch: shoal status, shoal top       manage: shoal ns create NAME --memory 64m\n");
    printf("         (SHOAL_DIR=%s or --dir finds this cluster from elsewhere)\n", dir);
    printf("  stop:  shoal down --dir %s\n\n", dir);
    fflush(stdout);
}

/* --foreground: until a signal (0) or a member's death (1). */
static int supervise(struct member *m)
{
    while (!stop_sig) {
        for (int i = 0; i < M_COUNT; i++) {
            int st;
            if (waitpid(m[i].pid, &st, WNOHANG) != m[i].pid) continue;
            char how[64];
            if (WIFEXITED(st)) snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
            else snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(st));
            fprintf(stderr, "shoal: %s (pid %d) %s; stopping the cluster (log %s)\n", m[i].name,
                    (int)m[i].pid, how, m[i].log);
            m[i].pid = 0;
            stop_members(m, 10000, false);
            return 1;
        }
        struct timespec ts = {0, 100 * 1000000};
        nanosleep(&ts, NULL);
    }
    printf("shoal: stopping the cluster (signal %d)\n", (int)stop_sig);
    stop_members(m, 10000, false);
    return 0;
}

int cli_up(const struct cli_cmd *cmd, struct cli_args *a)
{
    const char *dir = cli_dir(cmd, a);
    bool fg = cli_switch(cmd, a, "foreground");
    int rport, aport, cport, base = 0;
    uint64_t timeout = 30;
    if (parse_port_flag(cmd, a, "port", 11211, &rport) < 0 ||
        parse_port_flag(cmd, a, "admin-port", 11411, &aport) < 0 ||
        parse_port_flag(cmd, a, "control-port", 11500, &cport) < 0 ||
        parse_port_flag(cmd, a, "base-port", 0, &base) < 0)
        return 2;
    if (base > 65535 - 110) return cli_err("shoal up: --base-port %d leaves no room for the admin ports", base), 2;
    if (cli_flag(cmd, a, "timeout") &&
        (cli_parse_uint(cli_flag(cmd, a, "timeout"), &timeout) < 0 || timeout == 0 || timeout > 3600))
        return cli_err("shoal up: --timeout takes seconds, 1..3600"), 2;

    if (mkdirs(dir) < 0) return cli_err("shoal up: cannot create %s: %s", dir, strerror(errno));
    int lock = lock_dir(dir);
    if (lock < 0) return 1;

    /* refuse when a cluster from this DIR still runs */
    json_t *prev = proc_record_load(dir);
    json_t *procs = prev ? json_object_get(prev, "processes") : NULL;
    size_t k;
    json_t *p;
    json_array_foreach(procs, k, p) {
        if (proc_alive((pid_t)json_integer_value(json_object_get(p, "pid")),
                       json_string_value(json_object_get(p, "argv0")) ?: "")) {
            cli_err("shoal up: a cluster is already running from %s (%s is pid %d); `shoal "
                    "status` shows it, `shoal down --dir %s` stops it", dir,
                    json_string_value(json_object_get(p, "name")) ?: "a process",
                    (int)json_integer_value(json_object_get(p, "pid")), dir);
            json_decref(prev);
            return 1;
        }
    }

    char self[PATH_MAX - 32], bindir[PATH_MAX - 32];
    ssize_t sl = readlink("/proc/self/exe", bindir, sizeof bindir - 1);
    if (sl <= 0) return cli_err("shoal up: cannot find my own binary: %s", strerror(errno));
    bindir[sl] = 0;
    *strrchr(bindir, '/') = 0;
    /* a foreground shoal is recognised, like the daemons, by the argv[0] it runs with */
    FILE *cf = fopen("/proc/self/cmdline", "r");
    size_t cl = cf ? fread(self, 1, sizeof self - 1, cf) : 0;
    if (cf) fclose(cf);
    self[cl] = 0;

    struct member m[M_COUNT] = {
        [M_CONTROL] = {.name = "control", .role = "control plane"},
        [M_NODE1] = {.name = "node1", .role = "pool main"},
        [M_NODE2] = {.name = "node2", .role = "pool main"},
        [M_NODE3] = {.name = "node3", .role = "pool main"},
        [M_GUTTER] = {.name = "gutter", .role = "gutter pool"},
        [M_ROUTER] = {.name = "router", .role = "router, follows the control plane"},
    };
    const char *progs[M_COUNT] = {"shoal-control", "shoal-node", "shoal-node", "shoal-node",
                                  "shoal-node", "shoal-router"};
    for (int i = 0; i < M_COUNT; i++) {
        snprintf(m[i].bin, sizeof m[i].bin, "%s/%s", bindir, progs[i]);
        if (access(m[i].bin, X_OK) < 0) {
            json_decref(prev);
            return cli_err("shoal up: %s is missing (%s): build it with `make`", m[i].bin,
                           strerror(errno));
        }
        snprintf(m[i].log, sizeof m[i].log, "%s/logs/%s.log", dir, m[i].name);
    }

    /* ports: fixed ones must be free; nodes keep an earlier run's ports when free */
    int taken[32], nt = 0;
    struct { int port; const char *flag; } fixed[] = {
        {cport, "--control-port"}, {rport, "--port"}, {aport, "--admin-port"}};
    for (size_t i = 0; i < 3; i++) {
        if (!port_free(fixed[i].port)) {
            json_decref(prev);
            return cli_err("shoal up: port %d on 127.0.0.1 is in use: stop what holds it, or pick "
                           "another with %s", fixed[i].port, fixed[i].flag);
        }
        taken[nt++] = fixed[i].port;
    }
    static const int offs[] = {0, 1, 2, 3, 9};
    for (int i = M_NODE1; i <= M_GUTTER; i++) {
        int dp = 0, ap = 0;
        if (base) {
            dp = base + offs[i];
            ap = dp + 100;
            if (!port_free(dp) || !port_free(ap)) {
                json_decref(prev);
                return cli_err("shoal up: port %d or %d on 127.0.0.1 is in use: pick another "
                               "--base-port, or leave it out for free ports", dp, ap);
            }
        } else {
            json_array_foreach(procs, k, p) {
                if (strcmp(json_string_value(json_object_get(p, "name")) ?: "", m[i].name)) continue;
                dp = addr_port(json_string_value(json_object_get(p, "address")));
                ap = addr_port(json_string_value(json_object_get(p, "admin")));
            }
            bool clash = false;
            for (int j = 0; j < nt; j++) clash |= taken[j] == dp || taken[j] == ap;
            if (dp <= 0 || ap <= 0 || clash || !port_free(dp) || !port_free(ap)) {
                dp = free_port(taken, nt);
                taken[nt++] = dp;
                ap = free_port(taken, nt);
            } else {
                taken[nt++] = dp;
            }
            if (dp < 0 || ap < 0) return cli_err("shoal up: no free port on 127.0.0.1"), 1;
        }
        taken[nt++] = ap;
        snprintf(m[i].addr, sizeof m[i].addr, "127.0.0.1:%d", dp);
        snprintf(m[i].admin, sizeof m[i].admin, "127.0.0.1:%d", ap);
    }
    json_decref(prev);
    snprintf(m[M_CONTROL].addr, sizeof m[M_CONTROL].addr, "127.0.0.1:%d", cport);
    snprintf(m[M_CONTROL].admin, sizeof m[M_CONTROL].admin, "127.0.0.1:%d", cport);
    snprintf(m[M_ROUTER].addr, sizeof m[M_ROUTER].addr, "127.0.0.1:%d", rport);
    snprintf(m[M_ROUTER].admin, sizeof m[M_ROUTER].admin, "127.0.0.1:%d", aport);
    char control[96], logs[PATH_MAX + 8], cdata[PATH_MAX + 16];
    snprintf(control, sizeof control, "http://127.0.0.1:%d", cport);
    snprintf(logs, sizeof logs, "%s/logs", dir);
    snprintf(cdata, sizeof cdata, "%s/control", dir);
    if (mkdirs(logs) < 0) return cli_err("shoal up: cannot create %s: %s", logs, strerror(errno));

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    /* the local cluster's admin token: every daemon requires it for changes (--auth-file) */
    char token[300], authf[PATH_MAX + 16], tokf[PATH_MAX + 16], terr[PATH_MAX + 200];
    const char *token_where = NULL;
    if (cli_token_for_up(dir, token, sizeof token, &token_where, terr, sizeof terr) < 0)
        return cli_err("shoal up: %s", terr);
    setenv("SHOAL_TOKEN", token, 1); /* this run's own calls (pools) send it */
    memset(token, 0, sizeof token);
    snprintf(authf, sizeof authf, "%s/auth.json", dir);
    snprintf(tokf, sizeof tokf, "%s/token", dir);
    printf("starting a local cluster in %s\n", dir);
    fflush(stdout);
    char err[512], cp[16], rp[16], ap_[16], dp[16], nap[16];
    bool node_follows = has_flag(m[M_NODE1].bin, "--control") &&
                        has_flag(m[M_NODE1].bin, "--advertise");
    bool node_token = node_follows && has_flag(m[M_NODE1].bin, "--token-file");
    int rc = 1;

    /* 1. the control plane */
    snprintf(cp, sizeof cp, "%d", cport);
    char *cargv[] = {m[M_CONTROL].bin, "-p", cp, "-l", "127.0.0.1", "--data-dir", cdata,
                     "--auth-file", authf, "--token-file", tokf, NULL};
    m[M_CONTROL].pid = proc_spawn(cargv, m[M_CONTROL].log, err, sizeof err);
    if (m[M_CONTROL].pid < 0) {
        m[M_CONTROL].pid = 0;
        cli_err("shoal up: %s", err);
        goto fail;
    }
    save(dir, m, control, fg, self);
    if (await(&m[M_CONTROL], admin_ok, "healthy", (unsigned)timeout, false) < 0) goto fail;
    printf("  started control at %s (pid %d): healthy\n", control, (int)m[M_CONTROL].pid);
    fflush(stdout);

    /* 2. the nodes */
    int tries = 0;
    for (int i = M_NODE1; i <= M_GUTTER; i++) {
        char *nargv[64], nodeargs[1024] = "";
        int n = 0;
        nargv[n++] = m[i].bin;
        snprintf(dp, sizeof dp, "%d", addr_port(m[i].addr));
        snprintf(nap, sizeof nap, "%d", addr_port(m[i].admin));
        nargv[n++] = "-l";
        nargv[n++] = "127.0.0.1";
        nargv[n++] = "-p";
        nargv[n++] = dp;
        nargv[n++] = "--admin-port";
        nargv[n++] = nap;
        nargv[n++] = "--auth-file";
        nargv[n++] = authf;
        if (node_follows) {
            nargv[n++] = "--control";
            nargv[n++] = control;
            nargv[n++] = "--advertise";
            nargv[n++] = m[i].addr;
            if (node_token) {
                nargv[n++] = "--token-file";
                nargv[n++] = tokf;
            }
        }
        if (cli_flag(cmd, a, "node-args"))
            snprintf(nodeargs, sizeof nodeargs, "%s", cli_flag(cmd, a, "node-args"));
        n += split_args(nodeargs, nargv + n, 60 - n);
        nargv[n] = NULL;
        m[i].pid = proc_spawn(nargv, m[i].log, err, sizeof err);
        if (m[i].pid < 0) {
            m[i].pid = 0;
            cli_err("shoal up: %s", err);
            goto fail;
        }
        save(dir, m, control, fg, self);
        int w = await(&m[i], node_ok, "healthy", (unsigned)timeout, !base && tries < 3);
        if (w == -2) { /* a port picked free was taken meanwhile: pick others */
            m[i].pid = 0;
            int np = free_port(taken, nt);
            if (np < 0) goto fail;
            taken[nt++] = np;
            int na = free_port(taken, nt);
            if (na < 0) goto fail;
            taken[nt++] = na;
            printf("  %s: port %s or %s was taken meanwhile; trying %d and %d\n", m[i].name,
                   m[i].addr, m[i].admin, np, na);
            snprintf(m[i].addr, sizeof m[i].addr, "127.0.0.1:%d", np);
            snprintf(m[i].admin, sizeof m[i].admin, "127.0.0.1:%d", na);
            tries++;
            i--;
            continue;
        }
        if (w < 0) goto fail;
        printf("  started %s at %s (pid %d, admin %s): healthy\n", m[i].name, m[i].addr,
               (int)m[i].pid, m[i].admin);
        fflush(stdout);
    }

    /* 3. pools in the control plane */
    if (register_pools(control, m) < 0) goto fail;

    /* 4. the router, following the control plane */
    {
        char *rargv[96];
        int n = 0;
        snprintf(rp, sizeof rp, "%d", rport);
        snprintf(ap_, sizeof ap_, "%d", aport);
        rargv[n++] = m[M_ROUTER].bin;
        rargv[n++] = "-l";
        rargv[n++] = "127.0.0.1";
        rargv[n++] = "-p";
        rargv[n++] = rp;
        rargv[n++] = "--admin-port";
        rargv[n++] = ap_;
        rargv[n++] = "--control";
        rargv[n++] = control;
        rargv[n++] = "--auth-file";
        rargv[n++] = authf;
        rargv[n++] = "--token-file";
        rargv[n++] = tokf;
        for (int i = 0; i < a->nrest && n < 94; i++) rargv[n++] = a->rest[i];
        rargv[n] = NULL;
        m[M_ROUTER].pid = proc_spawn(rargv, m[M_ROUTER].log, err, sizeof err);
        if (m[M_ROUTER].pid < 0) {
            m[M_ROUTER].pid = 0;
            cli_err("shoal up: %s", err);
            goto fail;
        }
        save(dir, m, control, fg, self);
        if (await(&m[M_ROUTER], router_ok, "healthy and serving", (unsigned)timeout, false) < 0)
            goto fail;
        printf("  started router at %s (pid %d): healthy and serving\n", m[M_ROUTER].addr,
               (int)m[M_ROUTER].pid);
    }
    print_table(m, dir, control);
    printf("  admin token: %s%s (the shoal CLI sends it; other clients: Authorization: Bearer "
           "<token>)\n\n", token_where, strcmp(token_where, "SHOAL_TOKEN") ? "" : " (as set)");
    fflush(stdout);
    close(lock);
    if (!fg) return 0;
    printf("Ctrl-C stops the cluster.\n");
    fflush(stdout);
    rc = supervise(m);
    save(dir, m, control, false, self);
    return rc;

fail:
    stop_members(m, 5000, false);
    save(dir, m, control, false, self);
    close(lock);
    return stop_sig ? 130 : rc;
}

int cli_down(const struct cli_cmd *cmd, struct cli_args *a)
{
    const char *dir = cli_dir(cmd, a);
    uint64_t timeout = 10;
    if (cli_flag(cmd, a, "timeout") &&
        (cli_parse_uint(cli_flag(cmd, a, "timeout"), &timeout) < 0 || timeout > 3600))
        return cli_err("shoal down: --timeout takes seconds, 0..3600"), 2;
    json_t *rec = proc_record_load(dir);
    if (rec == NULL) {
        printf("no cluster was started from %s (no cluster.json there): nothing to stop\n", dir);
        return 0;
    }
    int lock = lock_dir(dir);
    if (lock < 0) {
        json_decref(rec);
        return 1;
    }
    /* a foreground `shoal up` stops its own cluster: ask it first */
    json_t *sup = json_object_get(rec, "supervisor");
    pid_t spid = (pid_t)json_integer_value(json_object_get(sup, "pid"));
    const char *sargv0 = json_string_value(json_object_get(sup, "argv0"));
    bool supervised = sargv0 && spid > 0 && proc_alive(spid, sargv0);
    if (supervised) {
        printf("stopping the foreground `shoal up` (pid %d)...\n", (int)spid);
        fflush(stdout);
        pid_t pids[1] = {spid};
        const char *a0[1] = {sargv0};
        int st[1];
        proc_stop_all(pids, a0, 1, (unsigned)(timeout + 15) * 1000, st);
    }
    json_t *procs = json_object_get(rec, "processes");
    size_t n = json_array_size(procs);
    pid_t pids[16];
    const char *argv0s[16];
    int stopped[16], cnt = 0;
    for (size_t i = n; i-- > 0 && cnt < 16;) { /* last started first */
        json_t *p = json_array_get(procs, i);
        pids[cnt] = (pid_t)json_integer_value(json_object_get(p, "pid"));
        argv0s[cnt++] = json_string_value(json_object_get(p, "argv0")) ?: "";
    }
    bool any = false;
    for (int i = 0; i < cnt; i++) any |= proc_alive(pids[i], argv0s[i]);
    if (!any && supervised) {
        printf("stopped the foreground `shoal up` (pid %d), and the cluster with it\n", (int)spid);
    } else if (!any) {
        printf("no cluster is running from %s: nothing to stop\n", dir);
    } else {
        printf("stopping the cluster in %s...\n", dir);
        fflush(stdout);
        proc_stop_all(pids, argv0s, cnt, (unsigned)timeout * 1000, stopped);
        for (int i = 0; i < cnt; i++) {
            json_t *p = json_array_get(procs, n - 1 - (size_t)i);
            if (stopped[i])
                printf("%s %-8s (pid %d)%s\n", stopped[i] == 2 ? "killed " : "stopped",
                       json_string_value(json_object_get(p, "name")) ?: "?", (int)pids[i],
                       stopped[i] == 2 ? ": it did not exit after SIGTERM" : "");
        }
    }
    json_array_foreach(procs, n, sup) json_object_set_new(sup, "pid", json_integer(0));
    json_object_del(rec, "supervisor");
    proc_record_save(dir, rec);
    json_decref(rec);
    close(lock);
    return 0;
}
