/* options.h — command-line and config-file options from one table per program.
 *
 * A program lists each option once (name, short flag, type, default, bounds, help, where to
 * store it). From that table come the defaults, `--help`, `--name=value` and memcached-style
 * `-p 11211` parsing, a `name = value` config file (--config), and bounds checks whose errors
 * name the option, the bad value and the accepted range. Command-line values override the
 * config file whatever their order. */
#ifndef SHOAL_COMMON_OPTIONS_H
#define SHOAL_COMMON_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum opt_type {
    OPT_UINT,  /* decimal unsigned, bounded by lo..hi */
    OPT_SIZE,  /* like UINT, with an optional k/m/g suffix (powers of 1024) */
    OPT_BOOL,  /* flag; "--name=false" or "name = no" in a config file turns it off */
    OPT_STR,   /* text */
    OPT_COUNT, /* each occurrence adds one (-v, -vv) */
};

struct opt_def {
    const char *name;    /* long name with underscores; --name-with-dashes on the command line */
    char shortf;         /* memcached-style short flag, or 0 */
    enum opt_type type;
    const char *def;     /* default, as text (NULL: use defnum) */
    uint64_t defnum;     /* numeric default when def is NULL */
    uint64_t lo, hi;     /* bounds for UINT/SIZE */
    const char *help;
    void *target;        /* uint64_t* for numbers, bool* for BOOL, const char** for STR */
    const char *alias;   /* another accepted long name (memcached's), or NULL */
};

/* What options_parse() found besides the table's options. */
struct opt_extra {
    bool help;
    bool version;
    const char *config; /* --config FILE, or NULL */
};

/* Set every target to its default. */
void options_defaults(const struct opt_def *defs, size_t n);
/* Parse argv (and the config file it names). Unknown memcached flags that tools commonly pass
 * (-o list, -u user, -A, -k, -L, -r, -S...) are accepted with a warning. Returns 0, or -1 with a
 * message in err naming the option and the fix. */
int options_parse(const struct opt_def *defs, size_t n, int argc, char **argv,
                  struct opt_extra *extra, char *err, size_t errlen);
/* Apply `name = value` lines from `text` (a config file's contents). `origin` names the source
 * in error messages ("config file x.conf"). Returns 0, or -1 with a message naming the line. */
int options_load_text(const struct opt_def *defs, size_t n, const char *text, size_t len,
                      const char *origin, char *err, size_t errlen);
/* Free the strings kept for STR options read from config text. */
void options_release(void);
struct buf;
/* Append "STAT <name> <value>\r\n" for each option, with the value in use (numbers in plain
 * units, sizes in bytes; yes/no; text, or NULL when unset): a program's `stats settings`.
 * 0, or -1 when memory ran out. */
int options_write_stats(struct buf *b, const struct opt_def *defs, size_t n);
/* Print usage: one line per option with its flags, default, range and help. */
void options_usage(const struct opt_def *defs, size_t n, const char *prog, const char *summary);
/* The same for a program whose --config FILE means something else (shoal-router's topology):
 * `config_help` describes it, and no `name = value` file is mentioned. NULL: as above. */
void options_usage_config(const struct opt_def *defs, size_t n, const char *prog,
                          const char *summary, const char *config_help);

/* The struct opt_def of each entry of TABLE, an options X-macro table whose entries are
 * X(name, short flag, type, default, lo, hi, help, alias), written to defs[0..] with each
 * option's value in the same-named field of *cfg. Evaluates to the number written, which is
 * OPTIONS_COUNT(TABLE): size defs with that. */
#define OPTIONS_DEFS(TABLE, defs, cfg)                                                           \
    __extension__({                                                                              \
        struct opt_def *opt_defs_ = (defs);                                                      \
        __typeof__(cfg) opt_cfg_ = (cfg);                                                        \
        size_t opt_n_ = 0;                                                                       \
        TABLE(OPTION_DEF_)                                                                       \
        opt_n_;                                                                                  \
    })
#define OPTION_DEF_(name_, short_, type_, def_, lo_, hi_, help_, alias_)                         \
    opt_defs_[opt_n_++] = (struct opt_def){#name_, short_,        OPT_##type_, def_, 0, lo_, hi_, \
                                           help_,  &opt_cfg_->name_, alias_};
/* How many entries an X-macro table has (a constant expression). */
#define OPTIONS_COUNT(TABLE) (0 TABLE(OPTION_ONE_))
#define OPTION_ONE_(...) +1

/* What a program says about itself to options_start(). */
struct opt_program {
    const char *name;    /* "shoal-router": log lines, messages, --help */
    const char *summary; /* --help's line under the usage */
    const char *version; /* --version's line, e.g. "shoal-router 0.1.0 (memcached protocol 1.6)" */
    /* NULL: --config FILE holds `name = value` options. Otherwise --config FILE names the
     * program's own document (options_take_config; --options FILE is then the options file):
     * config_doc is its name in messages ("the topology file"), config_help its --help text. */
    const char *config_doc;
    const char *config_help;
};

/* A daemon's start: name its log lines, parse argv (with --config taken out into *config
 * first when p->config_doc), answer --help and --version on stdout. Returns -1 to go on with
 * the options set, or the status to exit with now: 2 after a message on stderr naming the bad
 * option, 0 after --help or --version. */
int options_start(const struct opt_program *p, const struct opt_def *defs, size_t n, int argc,
                  char **argv, const char **config);

/* For a program whose --config names its own document (shoal-router's topology,
 * shoal-invalidator's tables): take --config FILE out of argv into *path (NULL when absent) and
 * turn --options FILE into the --config FILE options_parse() reads as `name = value` lines.
 * Returns the new argc, or -1 when --config or --options lacks its argument. */
int options_take_config(int argc, char **argv, const char **path);

#endif
