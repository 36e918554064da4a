/* token.c — the CLI's bearer token: where it comes from, and the local cluster's admin token
 * that `shoal up` makes.
 *
 * The CLI sends SHOAL_TOKEN when set, else the first line of its token file,
 * $XDG_CONFIG_HOME/shoal/token (~/.config/shoal/token). `shoal up` uses SHOAL_TOKEN as the
 * local cluster's admin token when set; otherwise the token file's, made (random, mode 0600) on
 * the first `up` and kept after, so every local cluster and every later CLI call share it. The
 * daemons it starts get DIR/auth.json (--auth-file, that one token as admin) and DIR/token
 * (--token-file, for control's pushes and the followers), both 0600. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/auth.h"

static char path_buf[PATH_MAX];

const char *cli_token_path(void)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(path_buf, sizeof path_buf, "%s/shoal/token", xdg);
    else snprintf(path_buf, sizeof path_buf, "%s/.config/shoal/token", home && *home ? home : "/tmp");
    return path_buf;
}

/* The first line of `path`, trimmed, into out; 0, or -1 when absent or empty. */
static int read_token(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    if (fgets(out, (int)len, f) == NULL) out[0] = 0;
    fclose(f);
    size_t n = strlen(out);
    while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' ')) out[--n] = 0;
    return n ? 0 : -1;
}

const char *cli_token(const char **from)
{
    static char tok[AUTH_TOKEN_MAX + 2];
    const char *env = getenv("SHOAL_TOKEN");
    if (env && *env) {
        *from = "SHOAL_TOKEN";
        return env;
    }
    *from = cli_token_path();
    return read_token(*from, tok, sizeof tok) == 0 ? tok : NULL;
}

/* Write `text` to `path` whole with mode 0600 (a temporary file renamed over it). */
static int write_private(const char *path, const char *text, char *err, size_t errlen)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t n = strlen(text);
    if (fd < 0 || fchmod(fd, 0600) < 0 || write(fd, text, n) != (ssize_t)n || fsync(fd) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    if (rename(tmp, path) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* mkdir -p with mode 0700 for the directories it makes. */
static int mkdirs_private(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0700) < 0 && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0700) < 0 && errno != EEXIST ? -1 : 0;
}

int cli_token_for_up(const char *dir, char *tok, size_t len, const char **where, char *err,
                     size_t errlen)
{
    const char *env = getenv("SHOAL_TOKEN");
    const char *path = cli_token_path();
    if (env && *env) {
        if (strlen(env) < AUTH_TOKEN_MIN || strlen(env) > AUTH_TOKEN_MAX) {
            snprintf(err, errlen, "SHOAL_TOKEN is set but is no usable admin token (%d to %d "
                     "characters); unset it and `shoal up` makes one in %s", AUTH_TOKEN_MIN,
                     AUTH_TOKEN_MAX, path);
            return -1;
        }
        for (const char *c = env; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                  strchr("-._~+/=", *c))) {
                snprintf(err, errlen, "SHOAL_TOKEN holds a character a token cannot (letters, "
                         "digits and - . _ ~ + / = only)");
                return -1;
            }
        snprintf(tok, len, "%s", env);
        *where = "SHOAL_TOKEN";
    } else if (read_token(path, tok, len) == 0 && strlen(tok) >= AUTH_TOKEN_MIN) {
        *where = path;
    } else {
        char fresh[44], d[PATH_MAX];
        if (auth_new_token(fresh) < 0) {
            snprintf(err, errlen, "no randomness for a token: %s", strerror(errno));
            return -1;
        }
        snprintf(d, sizeof d, "%s", path);
        *strrchr(d, '/') = 0;
        char line[64];
        snprintf(line, sizeof line, "%s\n", fresh);
        if (mkdirs_private(d) < 0) {
            snprintf(err, errlen, "cannot create %s: %s", d, strerror(errno));
            return -1;
        }
        if (write_private(path, line, err, errlen) < 0) return -1;
        snprintf(tok, len, "%s", fresh);
        *where = path;
    }
    /* the daemons' copies, under DIR */
    char af[PATH_MAX + 16], tf[PATH_MAX + 16], text[AUTH_TOKEN_MAX + 128];
    snprintf(af, sizeof af, "%s/auth.json", dir);
    snprintf(tf, sizeof tf, "%s/token", dir);
    snprintf(text, sizeof text,
             "{\"tokens\": [{\"token\": \"%s\", \"role\": \"admin\", \"name\": \"local-admin\"}]}\n",
             tok);
    if (write_private(af, text, err, errlen) < 0) return -1;
    snprintf(text, sizeof text, "%s\n", tok);
    return write_private(tf, text, err, errlen);
}
