/* options.c — table-driven option parsing (see options.h). */
#include "common/options.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"

/* Parse `val` into the option's target. Returns 0 or -1 with a message. */
static int opt_set(const struct opt_def *d, const char *val, char *err, size_t errlen)
{
    switch (d->type) {
    case OPT_STR:
        *(const char **)d->target = val;
        return 0;
    case OPT_COUNT:
        *(uint64_t *)d->target += 1;
        return 0;
    case OPT_BOOL:
        if (val == NULL || !strcmp(val, "1") || !strcasecmp(val, "yes") || !strcasecmp(val, "true") ||
            !strcasecmp(val, "on")) {
            *(bool *)d->target = true;
            return 0;
        }
        if (!strcmp(val, "0") || !strcasecmp(val, "no") || !strcasecmp(val, "false") ||
            !strcasecmp(val, "off")) {
            *(bool *)d->target = false;
            return 0;
        }
        snprintf(err, errlen, "option %s: '%s' is not a boolean; use yes or no", d->name, val);
        return -1;
    case OPT_UINT:
    case OPT_SIZE: {
        if (val == NULL || !isdigit((unsigned char)val[0])) goto bad;
        errno = 0;
        char *end;
        unsigned long long v = strtoull(val, &end, 10);
        if (errno) goto bad;
        if (d->type == OPT_SIZE && *end) {
            unsigned shift = 0;
            switch (tolower((unsigned char)*end)) {
            case 'k': shift = 10; break;
            case 'm': shift = 20; break;
            case 'g': shift = 30; break;
            default: goto bad;
            }
            if (end[1] && !(tolower((unsigned char)end[1]) == 'b' && !end[2])) goto bad;
            if (v > (UINT64_MAX >> shift)) goto bad;
            v <<= shift;
            end += strlen(end);
        }
        if (*end) goto bad;
        if (v < d->lo || v > d->hi) {
            snprintf(err, errlen, "option %s: %llu is out of range; use %llu to %llu", d->name, v,
                     (unsigned long long)d->lo, (unsigned long long)d->hi);
            return -1;
        }
        *(uint64_t *)d->target = v;
        return 0;
    }
    }
bad:
    snprintf(err, errlen, "option %s: '%s' is not a%s number; use e.g. %s%s", d->name,
             val ? val : "", d->type == OPT_SIZE ? " size" : "n unsigned",
             d->def ? d->def : "1", d->type == OPT_SIZE ? " or 64k, 1m" : "");
    return -1;
}

void options_defaults(const struct opt_def *defs, size_t n)
{
    char err[256];
    for (size_t i = 0; i < n; i++) {
        const struct opt_def *d = &defs[i];
        if (d->type == OPT_COUNT) *(uint64_t *)d->target = 0;
        else if (d->type == OPT_BOOL) *(bool *)d->target = d->def && !strcmp(d->def, "yes");
        else if (d->type == OPT_STR) *(const char **)d->target = d->def;
        else if (d->def == NULL) *(uint64_t *)d->target = d->defnum;
        else if (opt_set(d, d->def, err, sizeof err) < 0) *(uint64_t *)d->target = d->lo;
    }
}

/* Match a long name, accepting dashes for underscores and the memcached alias. */
static const struct opt_def *opt_find_long(const struct opt_def *defs, size_t n, const char *name,
                                           size_t len)
{
    for (size_t i = 0; i < n; i++) {
        const char *cands[2] = {defs[i].name, defs[i].alias};
        for (int c = 0; c < 2; c++) {
            const char *s = cands[c];
            if (s == NULL || strlen(s) != len) continue;
            size_t j = 0;
            for (; j < len; j++) {
                char a = name[j] == '-' ? '_' : name[j], b = s[j] == '-' ? '_' : s[j];
                if (a != b) break;
            }
            if (j == len) return &defs[i];
        }
    }
    return NULL;
}

static const struct opt_def *opt_find_short(const struct opt_def *defs, size_t n, char c)
{
    for (size_t i = 0; i < n; i++)
        if (defs[i].shortf == c) return &defs[i];
    return NULL;
}

/* memcached flags we accept and ignore, with whether they take an argument. */
static const struct { char f; bool arg; } ignored_flags[] = {
    {'u', true}, {'o', true}, {'A', false}, {'k', false}, {'L', false}, {'r', false},
    {'S', false}, {'d', false}, {'M', false}, {'C', false}, {'n', true}, {'f', true},
    {'R', true}, {'b', true}, {'B', true}, {'P', true}, {'a', true}, {'D', true},
    {'F', false}, {'X', false}, {'W', false}, {'Y', true}, {'e', true}, {'s', true},
};

/* Strings from config files: options point into these for the life of the process. */
static char **kept;
static size_t nkept;

static char *keep_string(const char *s, size_t n)
{
    char *copy = strndup(s, n);
    if (copy == NULL) return NULL;
    char **grown = realloc(kept, (nkept + 1) * sizeof *kept);
    if (grown == NULL) {
        free(copy);
        return NULL;
    }
    kept = grown;
    kept[nkept++] = copy;
    return copy;
}

void options_release(void)
{
    for (size_t i = 0; i < nkept; i++) free(kept[i]);
    free(kept);
    kept = NULL;
    nkept = 0;
}

static bool is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; }

int options_load_text(const struct opt_def *defs, size_t n, const char *text, size_t len,
                      const char *origin, char *err, size_t errlen)
{
    int lineno = 0;
    for (size_t pos = 0; pos < len;) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - line) : len - pos;
        pos += ll + (nl != NULL);
        lineno++;
        const char *hash = memchr(line, '#', ll);
        if (hash) ll = (size_t)(hash - line);
        size_t b = 0, e = ll;
        while (b < e && is_blank(line[b])) b++;
        while (e > b && is_blank(line[e - 1])) e--;
        if (b == e) continue;
        if (memchr(line + b, 0, e - b)) {
            snprintf(err, errlen, "%s line %d: NUL byte; the file must be text", origin, lineno);
            return -1;
        }
        const char *eq = memchr(line + b, '=', e - b);
        size_t kb = b, ke = eq ? (size_t)(eq - line) : e;
        while (ke > kb && is_blank(line[ke - 1])) ke--;
        const struct opt_def *d = opt_find_long(defs, n, line + kb, ke - kb);
        if (d == NULL) {
            snprintf(err, errlen, "%s line %d: unknown option '%.*s'; see --help", origin, lineno,
                     (int)(ke - kb > 64 ? 64 : ke - kb), line + kb);
            return -1;
        }
        const char *val = NULL;
        if (eq) {
            size_t vb = (size_t)(eq - line) + 1;
            while (vb < e && is_blank(line[vb])) vb++;
            val = keep_string(line + vb, e - vb);
            if (val == NULL) {
                snprintf(err, errlen, "%s: out of memory", origin);
                return -1;
            }
        } else if (d->type != OPT_BOOL && d->type != OPT_COUNT) {
            snprintf(err, errlen, "%s line %d: option %s needs '= value'", origin, lineno,
                     d->name);
            return -1;
        }
        char msg[256];
        if (opt_set(d, val, msg, sizeof msg) < 0) {
            snprintf(err, errlen, "%s line %d: %s", origin, lineno, msg);
            return -1;
        }
    }
    return 0;
}

#define CONFIG_MAX_BYTES (1 << 20)

static int config_load(const struct opt_def *defs, size_t n, const char *path, char *err,
                       size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "config file %s: %s; check the path given to --config", path,
                 strerror(errno));
        return -1;
    }
    char *text = malloc(CONFIG_MAX_BYTES + 1);
    size_t len = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (text == NULL || len > CONFIG_MAX_BYTES) {
        free(text);
        snprintf(err, errlen, "config file %s: larger than %d bytes or out of memory", path,
                 CONFIG_MAX_BYTES);
        return -1;
    }
    char origin[300];
    snprintf(origin, sizeof origin, "config file %s", path);
    int rc = options_load_text(defs, n, text, len, origin, err, errlen);
    free(text);
    return rc;
}

/* Walk argv once; when `apply` is false only --config/-h/-V are noted. */
static int options_walk(const struct opt_def *defs, size_t n, int argc, char **argv,
                        struct opt_extra *extra, bool apply, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == 0) {
            snprintf(err, errlen, "unexpected argument '%s'; options start with - (see --help)", a);
            return -1;
        }
        if (a[1] == '-') { /* --name[=value] */
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            const char *val = eq ? eq + 1 : NULL;
            if (len == 4 && !strncmp(name, "help", 4)) { extra->help = true; continue; }
            if (len == 7 && !strncmp(name, "version", 7)) { extra->version = true; continue; }
            if (len == 6 && !strncmp(name, "config", 6)) {
                if (val == NULL && i + 1 < argc) val = argv[++i];
                if (val == NULL) {
                    snprintf(err, errlen, "--config needs a file name");
                    return -1;
                }
                extra->config = val;
                continue;
            }
            const struct opt_def *d = opt_find_long(defs, n, name, len);
            if (d == NULL) {
                snprintf(err, errlen, "unknown option '--%.*s'; see --help", (int)len, name);
                return -1;
            }
            if (val == NULL && d->type != OPT_BOOL && d->type != OPT_COUNT) {
                if (i + 1 >= argc) {
                    snprintf(err, errlen, "option --%.*s needs a value", (int)len, name);
                    return -1;
                }
                val = argv[++i];
            }
            if (apply && opt_set(d, val, err, errlen) < 0) return -1;
            continue;
        }
        /* -x, -xVALUE, -x VALUE, -vv */
        for (const char *p = a + 1; *p; p++) {
            char c = *p;
            if (c == 'h') { extra->help = true; continue; }
            if (c == 'V') { extra->version = true; continue; }
            const struct opt_def *d = opt_find_short(defs, n, c);
            if (d && (d->type == OPT_COUNT || d->type == OPT_BOOL)) {
                if (apply) opt_set(d, NULL, err, errlen);
                continue;
            }
            const char *val = NULL;
            bool takes_arg = d != NULL;
            size_t k = 0;
            for (; !d && k < sizeof ignored_flags / sizeof ignored_flags[0]; k++)
                if (ignored_flags[k].f == c) break;
            if (!d) {
                if (k == sizeof ignored_flags / sizeof ignored_flags[0]) {
                    snprintf(err, errlen, "unknown option '-%c'; see --help", c);
                    return -1;
                }
                takes_arg = ignored_flags[k].arg;
            }
            if (takes_arg) {
                if (p[1]) val = p + 1;
                else if (i + 1 < argc) val = argv[++i];
                else {
                    snprintf(err, errlen, "option -%c needs a value", c);
                    return -1;
                }
            }
            if (d) {
                if (apply && opt_set(d, val, err, errlen) < 0) return -1;
            } else if (apply) {
                log_warn("option -%c%s%s is accepted for memcached compatibility and ignored", c,
                         val ? " " : "", val ? val : "");
            }
            if (takes_arg) break;
        }
    }
    return 0;
}

int options_parse(const struct opt_def *defs, size_t n, int argc, char **argv,
                  struct opt_extra *extra, char *err, size_t errlen)
{
    memset(extra, 0, sizeof *extra);
    options_defaults(defs, n);
    if (options_walk(defs, n, argc, argv, extra, false, err, errlen) < 0) return -1;
    if (extra->config && config_load(defs, n, extra->config, err, errlen) < 0)
        return -1;
    /* argv is applied after the file so the command line wins */
    return options_walk(defs, n, argc, argv, extra, true, err, errlen);
}

void options_usage(const struct opt_def *defs, size_t n, const char *prog, const char *summary)
{
    options_usage_config(defs, n, prog, summary, NULL);
}

void options_usage_config(const struct opt_def *defs, size_t n, const char *prog,
                          const char *summary, const char *config_help)
{
    if (config_help)
        printf("Usage: %s [options]\n%s\n\nOptions:\n", prog, summary);
    else
        printf("Usage: %s [options]\n%s\n\nOptions (config file: --config FILE with name = "
               "value lines; the command line wins):\n",
               prog, summary);
    for (size_t i = 0; i < n; i++) {
        const struct opt_def *d = &defs[i];
        char flags[96], name[64];
        size_t j = 0;
        for (; d->name[j] && j < sizeof name - 1; j++) name[j] = d->name[j] == '_' ? '-' : d->name[j];
        name[j] = 0;
        if (d->shortf) snprintf(flags, sizeof flags, "-%c, --%s", d->shortf, name);
        else snprintf(flags, sizeof flags, "    --%s", name);
        printf("  %-28s %s", flags, d->help);
        if ((d->type == OPT_UINT || d->type == OPT_SIZE) && d->def == NULL)
            printf(" [default %llu, %llu..%llu]", (unsigned long long)d->defnum,
                   (unsigned long long)d->lo, (unsigned long long)d->hi);
        else if (d->type == OPT_UINT || d->type == OPT_SIZE)
            printf(" [default %s, %llu..%llu]", d->def, (unsigned long long)d->lo,
                   (unsigned long long)d->hi);
        else if (d->def)
            printf(" [default %s]", d->def);
        printf("\n");
    }
    printf("  %-28s %s\n  %-28s %s\n  %-28s %s\n", "    --config FILE",
           config_help ? config_help : "read options from FILE", "-h, --help", "print this help", "-V, --version",
           "print the version");
    printf("  memcached flags -u, -o, -A, -k, -L, -r and others are accepted with a warning.\n");
}

int options_write_stats(struct buf *b, const struct opt_def *defs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct opt_def *d = &defs[i];
        int rc;
        if (d->type == OPT_STR) {
            const char *v = *(const char *const *)d->target;
            rc = buf_printf(b, "STAT %s %s\r\n", d->name, v && *v ? v : "NULL");
        } else if (d->type == OPT_BOOL) {
            rc = buf_printf(b, "STAT %s %s\r\n", d->name, *(const bool *)d->target ? "yes" : "no");
        } else {
            rc = buf_printf(b, "STAT %s %llu\r\n", d->name,
                            (unsigned long long)*(const uint64_t *)d->target);
        }
        if (rc < 0) return -1;
    }
    return 0;
}

/* See options.h. */
int options_take_config(int argc, char **argv, const char **path)
{
    int out = 1;
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return -1;
            *path = argv[++i];
            continue;
        }
        if (!strncmp(argv[i], "--config=", 9)) {
            *path = argv[i] + 9;
            continue;
        }
        if (!strcmp(argv[i], "--options")) {
            if (i + 1 >= argc) return -1;
            argv[out++] = "--config";
            argv[out++] = argv[++i];
            continue;
        }
        if (!strncmp(argv[i], "--options=", 10)) {
            /* "--options=F" becomes "--config=F" in place, one byte in (no copy, no length cap) */
            memcpy(argv[i] + 1, "--config=", 9);
            argv[out++] = argv[i] + 1;
            continue;
        }
        argv[out++] = argv[i];
    }
    argv[out] = NULL;
    return out;
}

/* See options.h. */
int options_start(const struct opt_program *p, const struct opt_def *defs, size_t n, int argc,
                  char **argv, const char **config)
{
    char err[800];
    struct opt_extra extra;
    log_set_name(p->name);
    if (p->config_doc) {
        argc = options_take_config(argc, argv, config);
        if (argc < 0) {
            fprintf(stderr, "%s: --config needs %s's name, --options the options file's\n",
                    p->name, p->config_doc);
            return 2;
        }
    }
    if (options_parse(defs, n, argc, argv, &extra, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", p->name, err);
        return 2;
    }
    if (extra.help) {
        char help[1024];
        if (p->config_doc)
            snprintf(help, sizeof help,
                     "%s\n      --options FILE           read the options above from FILE: "
                     "`name = value` lines (names with _ for -, # comments); the command line "
                     "wins",
                     p->config_help);
        options_usage_config(defs, n, p->name, p->summary, p->config_doc ? help : NULL);
        return 0;
    }
    if (extra.version) {
        printf("%s\n", p->version);
        return 0;
    }
    return -1;
}
