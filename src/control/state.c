/* state.c — the embedded state store: one JSON file replaced atomically (see state.h). */
#include "control/state.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct file_store {
    struct state_store base;
    char *path, *tmp, *dir;
};

static int file_load(struct state_store *s, json_t **out, char *err, size_t errlen)
{
    struct file_store *f = (struct file_store *)s;
    *out = NULL;
    if (access(f->path, F_OK) != 0 && errno == ENOENT) return 0;
    json_error_t je;
    json_t *m = json_load_file(f->path, JSON_REJECT_DUPLICATES, &je);
    if (m == NULL) {
        snprintf(err, errlen, "state file %s: %s (line %d); restore it from a copy or move it "
                 "away to start empty", f->path, je.text, je.line);
        return -1;
    }
    *out = m;
    return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int file_save(struct state_store *s, const json_t *m, const char *text, size_t len,
                     char *err, size_t errlen)
{
    struct file_store *f = (struct file_store *)s;
    const char *step = "create";
    int fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        step = "write";
        int bad = write_all(fd, text, len) < 0 || write_all(fd, "\n", 1) < 0;
        if (!bad) step = "fsync";
        bad = bad || fsync(fd) < 0;
        if (close(fd) < 0) bad = 1;
        if (!bad) {
            step = "rename";
            if (rename(f->tmp, f->path) == 0) {
                step = "fsync the directory of";
                int dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd >= 0 && fsync(dfd) == 0) {
                    close(dfd);
                    return 0;
                }
                if (dfd >= 0) close(dfd);
            }
        }
    }
    snprintf(err, errlen, "cannot %s state file %s: %s", step, f->tmp, strerror(errno));
    unlink(f->tmp);
    return -1;
}

static void file_close(struct state_store *s)
{
    struct file_store *f = (struct file_store *)s;
    free(f->path);
    free(f->tmp);
    free(f->dir);
    free(f);
}

static const struct state_ops file_ops = {file_load, file_save, file_close};

struct state_store *state_file_open(const char *path)
{
    struct file_store *f = calloc(1, sizeof *f);
    if (f == NULL) return NULL;
    f->base.ops = &file_ops;
    f->path = strdup(path);
    char *copy = strdup(path);
    if (f->path && copy && asprintf(&f->tmp, "%s.tmp", path) >= 0) {
        f->dir = strdup(dirname(copy));
        free(copy);
        if (f->dir) return &f->base;
    } else {
        free(copy);
        f->tmp = NULL;
    }
    file_close(&f->base);
    return NULL;
}
