/* proc.h — the processes `shoal up` starts and `shoal down` stops, and the record of them kept
 * in DIR/cluster.json (the pid file): who runs where, with which pid and log. */
#ifndef SHOAL_CLI_PROC_H
#define SHOAL_CLI_PROC_H

#include <stdbool.h>
#include <sys/types.h>

#include <jansson.h>

/* Start argv (argv[0] an absolute path) in a new session, stdin /dev/null, stdout and stderr
 * appended to `log`, with every signal unblocked and default. Returns the pid, or -1 with a
 * message in err. */
pid_t proc_spawn(char *const argv[], const char *log, char *err, size_t errlen);
/* True while `pid` runs the program `argv0` (its /proc cmdline starts with it): a reused pid,
 * or a zombie, is not alive. Reaps it first if it is our child and has exited. */
bool proc_alive(pid_t pid, const char *argv0);
/* Stop these processes: SIGTERM to all, up to term_ms for them to exit, then SIGKILL. For
 * each, `stopped[i]` is 1 (exited after SIGTERM), 2 (killed) or 0 (was not running). */
void proc_stop_all(const pid_t *pids, const char *const *argv0s, int n, unsigned term_ms,
                   int *stopped);

/* DIR/cluster.json, or NULL when absent or unreadable. */
json_t *proc_record_load(const char *dir);
/* Write it atomically (temporary file, rename). 0 or -1. */
int proc_record_save(const char *dir, json_t *rec);

#endif
