/* deliver_drive.c — a test driver for the invalidator's delivery (src/invalidator/deliver*.c)
 * without PostgreSQL: tests/integration/test_deliver.py starts it against real shoal-nodes and
 * routers and hands it commits on stdin, one command a line, each answered with one line:
 *
 *   c <lsn> [key...]        deliver_commit (keys %XX-escaped for bytes a token cannot hold)
 *   p <lsn> [key...]        deliver_commit of one part of a commit (more follow)
 *   f <lsn> [ns...]         deliver_flush
 *   r <cluster|*> <since_s> <slot>...   deliver_replay: "replayed N" or "error ..."
 *   s                       "safe <lsn>"
 *   w <lsn> <ms>            wait until the safe LSN reaches lsn: "safe <lsn>" or "timeout <lsn>"
 *   h                       "healthy 0|1"
 *   m                       the metrics text, then "END"
 *   q                       stop (deliver_destroy) and exit
 * Anything else answers "ok" or "error <why>".
 *
 * Options: --cluster NAME=HOST:PORT[,HOST:PORT...] (repeat), --replica NAME=CONNINFO,
 * --spill-dir DIR, --mem-max BYTES, --spill-max BYTES, --batch-max N, --timeout-ms MS,
 * --window-s S. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "invalidator/deliver.h"

#define MAXC 8
#define MAXR 4

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Decode %XX in place; returns the length. */
static size_t unescape(char *s)
{
    size_t o = 0;
    for (size_t i = 0; s[i]; i++) {
        unsigned v;
        if (s[i] == '%' && s[i + 1] && s[i + 2] && sscanf(s + i + 1, "%2x", &v) == 1) {
            s[o++] = (char)v;
            i += 2;
        } else {
            s[o++] = s[i];
        }
    }
    s[o] = 0;
    return o;
}

int main(int argc, char **argv)
{
    static struct deliver_cluster_cfg cl[MAXC];
    static const char *routers[MAXC][MAXR];
    struct deliver_cfg cfg = {.clusters = cl};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *o = argv[i];
        char *v = argv[i + 1];
        if (!strcmp(o, "--cluster") && cfg.nclusters < MAXC) {
            char *eq = strchr(v, '=');
            if (!eq) return 2;
            *eq = 0;
            struct deliver_cluster_cfg *c = &cl[cfg.nclusters++];
            c->name = v;
            c->routers = routers[cfg.nclusters - 1];
            for (char *save, *t = strtok_r(eq + 1, ",", &save); t && c->nrouters < MAXR;
                 t = strtok_r(NULL, ",", &save))
                routers[cfg.nclusters - 1][c->nrouters++] = t;
        } else if (!strcmp(o, "--replica")) { /* after its --cluster */
            char *eq = strchr(v, '=');
            if (!eq) return 2;
            *eq = 0;
            for (size_t k = 0; k < cfg.nclusters; k++)
                if (!strcmp(cl[k].name, v)) cl[k].replica = eq + 1;
        } else if (!strcmp(o, "--spill-dir")) cfg.spill_dir = v;
        else if (!strcmp(o, "--mem-max")) cfg.mem_max_bytes = strtoull(v, NULL, 10);
        else if (!strcmp(o, "--spill-max")) cfg.spill_max_bytes = strtoull(v, NULL, 10);
        else if (!strcmp(o, "--batch-max")) cfg.batch_max = strtoull(v, NULL, 10);
        else if (!strcmp(o, "--timeout-ms")) cfg.timeout_ms = strtoull(v, NULL, 10);
        else if (!strcmp(o, "--window-s")) cfg.replay_window_s = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "unknown option %s\n", o);
            return 2;
        }
    }
    char err[256];
    struct deliver *d = deliver_create(&cfg, err, sizeof err);
    if (!d) {
        printf("error %s\n", err);
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) > 0) {
        line[strcspn(line, "\r\n")] = 0;
        char *save, *cmd = strtok_r(line, " ", &save);
        if (!cmd) continue;
        if (!strcmp(cmd, "q")) break;
        if (!strcmp(cmd, "c") || !strcmp(cmd, "p") || !strcmp(cmd, "f")) {
            uint64_t lsn = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
            struct deliver_key *keys = calloc(4096, sizeof *keys);
            const char **ns = calloc(4096, sizeof *ns);
            size_t n = 0;
            for (char *t; n < 4096 && (t = strtok_r(NULL, " ", &save)); n++) {
                keys[n].nkey = unescape(t);
                keys[n].key = t;
                /* the namespace is the text before the first ':', shoal's rule */
                char *colon = memchr(t, ':', keys[n].nkey);
                keys[n].ns = colon ? strndup(t, (size_t)(colon - t)) : NULL;
                ns[n] = t;
            }
            int rc = cmd[0] == 'f' ? deliver_flush(d, lsn, now_us(), ns, n)
                                   : deliver_commit(d, lsn, now_us(), keys, n, cmd[0] == 'p');
            printf(rc == 0 ? "ok\n" : "error out of memory\n");
            for (size_t k = 0; k < n; k++) free((char *)keys[k].ns);
            free(keys);
            free(ns);
        } else if (!strcmp(cmd, "r")) {
            const char *cluster = strtok_r(NULL, " ", &save);
            uint64_t since = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
            uint16_t slots[1024];
            size_t n = 0;
            for (char *t; n < 1024 && (t = strtok_r(NULL, " ", &save));)
                slots[n++] = (uint16_t)strtoul(t, NULL, 10);
            long got = deliver_replay(d, strcmp(cluster, "*") ? cluster : NULL, slots, n, since,
                                      err, sizeof err);
            if (got < 0) printf("error %s\n", err);
            else printf("replayed %ld\n", got);
        } else if (!strcmp(cmd, "s")) {
            printf("safe %llu\n", (unsigned long long)deliver_safe_lsn(d));
        } else if (!strcmp(cmd, "w")) {
            uint64_t lsn = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
            long ms = strtol(strtok_r(NULL, " ", &save), NULL, 10);
            for (long i = 0; i < ms && deliver_safe_lsn(d) < lsn; i++) usleep(1000);
            uint64_t s = deliver_safe_lsn(d);
            printf("%s %llu\n", s >= lsn ? "safe" : "timeout", (unsigned long long)s);
        } else if (!strcmp(cmd, "h")) {
            printf("healthy %d\n", deliver_healthy(d));
        } else if (!strcmp(cmd, "m")) {
            struct buf b;
            buf_init(&b);
            deliver_metrics(d, &b);
            fwrite(buf_start(&b), 1, buf_used(&b), stdout);
            printf("END\n");
            buf_release(&b);
        } else {
            printf("error unknown command %s\n", cmd);
        }
        fflush(stdout);
    }
    free(line);
    deliver_destroy(d);
    return 0;
}
