/* proc.c — starting daemons detached from the terminal, telling whether a recorded pid is still
 * the process we started, stopping them within a bound, and the cluster record file. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "cli/proc.h"

pid_t proc_spawn(char *const argv[], const char *log, char *err, size_t errlen)
{
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open the log file %s: %s", log, strerror(errno));
        return -1;
    }
    int pipefd[2]; /* carries exec's errno back; closed (empty) when exec succeeds */
    if (pipe2(pipefd, O_CLOEXEC) < 0) {
        close(fd);
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        close(fd);
        close(pipefd[0]);
        close(pipefd[1]);
        return -1;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
        setsid();
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        int e = errno;
        if (write(pipefd[1], &e, sizeof e) < 0) _exit(127);
        _exit(127);
    }
    close(fd);
    close(pipefd[1]);
    int e = 0;
    ssize_t n;
    do n = read(pipefd[0], &e, sizeof e);
    while (n < 0 && errno == EINTR);
    close(pipefd[0]);
    if (n == (ssize_t)sizeof e) {
        waitpid(pid, NULL, 0);
        snprintf(err, errlen, "cannot run %s: %s", argv[0], strerror(e));
        return -1;
    }
    return pid;
}

bool proc_alive(pid_t pid, const char *argv0)
{
    if (pid <= 0) return false;
    int st;
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) return false;
    char path[64], buf[PATH_MAX + 1];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    if (rp == NULL || rp[1] != ' ' || rp[2] == 'Z' || rp[2] == 'X') return false;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) return false;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* A child of ours whose exec is still loading the program has an empty command line for a
     * moment (the kernel sets it after the point where our exec pipe closes): it is alive. */
    if (n == 0 && w == 0) return true;
    return strcmp(buf, argv0) == 0;
}

/* Wait until none of the flagged processes runs, or deadline; true when all are gone. */
static bool wait_gone(const pid_t *pids, const char *const *argv0s, int n, const int *flag,
                      uint64_t deadline)
{
    for (;;) {
        bool any = false;
        for (int i = 0; i < n; i++)
            if (flag[i] && proc_alive(pids[i], argv0s[i])) any = true;
        if (!any) return true;
        if (clock_mono_ms() >= deadline) return false;
        usleep(20000);
    }
}

void proc_stop_all(const pid_t *pids, const char *const *argv0s, int n, unsigned term_ms,
                   int *stopped)
{
    for (int i = 0; i < n; i++) {
        stopped[i] = proc_alive(pids[i], argv0s[i]) ? 1 : 0;
        if (stopped[i]) kill(pids[i], SIGTERM);
    }
    if (wait_gone(pids, argv0s, n, stopped, clock_mono_ms() + term_ms)) return;
    for (int i = 0; i < n; i++)
        if (stopped[i] && proc_alive(pids[i], argv0s[i])) {
            kill(pids[i], SIGKILL);
            stopped[i] = 2;
        }
    wait_gone(pids, argv0s, n, stopped, clock_mono_ms() + 5000);
}

json_t *proc_record_load(const char *dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/cluster.json", dir);
    return json_load_file(path, 0, NULL);
}

int proc_record_save(const char *dir, json_t *rec)
{
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/cluster.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(rec, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) < 0) return -1;
    return rename(tmp, path);
}
