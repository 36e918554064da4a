/* opts.c — parse and validate shoal-bench's command line, see opts.h. */
#include "bench/opts.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "shoal-bench"

enum {
    OPT_SERVER = 's',
    OPT_THREADS = 't',
    OPT_CONNS = 'c',
    OPT_PIPELINE = 'p',
    OPT_DURATION = 'd',
    OPT_HELP = 'h',
    OPT_RATIO = 256,
    OPT_KEYS,
    OPT_KEY_PREFIX,
    OPT_KEY_SIZE,
    OPT_DIST,
    OPT_ZIPF_THETA,
    OPT_VALUE_SIZE,
    OPT_WARMUP,
    OPT_PREFILL,
    OPT_JSON,
    OPT_SEED,
    OPT_MAX_REQUESTS,
    OPT_REFILL_MIN,
    OPT_MODE,
    OPT_REQUESTS,
    OPT_WARMUP_REQUESTS,
    OPT_SCAN_EVERY,
    OPT_SCAN_LENGTH,
    OPT_SCAN_KEYS,
    OPT_RATE,
    OPT_SPLIT,
};

static const struct option long_opts[] = {
    {"server", required_argument, NULL, OPT_SERVER},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"conns", required_argument, NULL, OPT_CONNS},
    {"pipeline", required_argument, NULL, OPT_PIPELINE},
    {"ratio", required_argument, NULL, OPT_RATIO},
    {"keys", required_argument, NULL, OPT_KEYS},
    {"key-prefix", required_argument, NULL, OPT_KEY_PREFIX},
    {"key-size", required_argument, NULL, OPT_KEY_SIZE},
    {"dist", required_argument, NULL, OPT_DIST},
    {"zipf-theta", required_argument, NULL, OPT_ZIPF_THETA},
    {"value-size", required_argument, NULL, OPT_VALUE_SIZE},
    {"duration", required_argument, NULL, OPT_DURATION},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"prefill", no_argument, NULL, OPT_PREFILL},
    {"json", no_argument, NULL, OPT_JSON},
    {"seed", required_argument, NULL, OPT_SEED},
    {"max-requests", required_argument, NULL, OPT_MAX_REQUESTS},
    {"refill-min", required_argument, NULL, OPT_REFILL_MIN},
    {"mode", required_argument, NULL, OPT_MODE},
    {"requests", required_argument, NULL, OPT_REQUESTS},
    {"warmup-requests", required_argument, NULL, OPT_WARMUP_REQUESTS},
    {"scan-every", required_argument, NULL, OPT_SCAN_EVERY},
    {"scan-length", required_argument, NULL, OPT_SCAN_LENGTH},
    {"scan-keys", required_argument, NULL, OPT_SCAN_KEYS},
    {"rate", required_argument, NULL, OPT_RATE},
    {"split", no_argument, NULL, OPT_SPLIT},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: " PROG " [options]\n"
        "       " PROG " aside-db [options]   (cache-aside with a database stand-in and\n"
        "                                       staleness checks; aside-db --help)\n"
        "Load generator for memcached-text-protocol servers (shoal-node, memcached).\n"
        "Each thread runs an epoll loop over its connections and keeps --pipeline requests\n"
        "in flight on each; latency is measured from a batch's send to each reply (with\n"
        "--rate, from when each request was due).\n"
        "\n"
        "Target and concurrency:\n"
        "  -s, --server HOST:PORT   server to load (default 127.0.0.1:11211; IPv6: [::1]:PORT)\n"
        "  -t, --threads N          client threads, each with its own epoll loop (default 2)\n"
        "  -c, --conns N            connections in total, spread over the threads (default 50)\n"
        "  -p, --pipeline N         requests kept in flight per connection (default 1)\n"
        "      --refill-min N       top a connection up only once N of its --pipeline slots are\n"
        "                           free; 1 keeps exactly --pipeline in flight, more sends\n"
        "                           fewer, bigger batches (default 1; at most --pipeline)\n"
        "      --rate N             open loop: send N requests/s in all, evenly spaced per\n"
        "                           thread, each on a connection with a free --pipeline\n"
        "                           slot; latency counts from when a request was due, so a\n"
        "                           server that falls behind shows its queue (mixed mode;\n"
        "                           default 0: closed loop, a reply frees its slot at once)\n"
        "\n"
        "Workload:\n"
        "      --mode mixed|cache-aside\n"
        "                           mixed: gets and sets by --ratio (default). cache-aside:\n"
        "                           every request is a get, and a miss is followed at once by\n"
        "                           a set of that key (\"load from the database\"), so the hit\n"
        "                           ratio is the one an application sees\n"
        "      --ratio S:G          set:get mix: 1:9 = 10%% sets, 0:1 = gets only (default 1:9;\n"
        "                           mixed mode only)\n"
        "      --keys N             key space: keys are PREFIX + index 0..N-1 (default 100000)\n"
        "      --key-prefix STR     key prefix without spaces or controls (default \"key:\")\n"
        "      --key-size N         pad every key to exactly N bytes by zero-padding the index\n"
        "                           (default: natural length, no padding; at most 250)\n"
        "      --dist uniform|zipf  key popularity (default uniform)\n"
        "      --zipf-theta F       zipf skew, 0 <= F < 1 (default 0.99); popularity ranks are\n"
        "                           scattered over the key space, so hot keys are not adjacent\n"
        "      --value-size N|MIN-MAX\n"
        "                           bytes per value written by sets (default 100, at most\n"
        "                           16 MiB); MIN-MAX (MIN >= 1) gives each key its own size,\n"
        "                           log-uniform over [MIN, MAX] and fixed by the key's index\n"
        "                           alone (not the seed), so a key has the same size in every\n"
        "                           run against every server\n"
        "      --seed N             random seed: same seed, same keys per thread (default 1)\n"
        "\n"
        "Run control:\n"
        "  -d, --duration SECONDS   measured run length, decimals allowed (default 10); 0 with\n"
        "                           --prefill only prefills\n"
        "      --warmup SECONDS     unmeasured load before the measured run (default 1)\n"
        "      --max-requests N     also stop after about N measured replies (default: no bound)\n"
        "      --prefill            set every key once first (32 in flight per connection)\n"
        "\n"
        "Cache-aside runs (--mode cache-aside):\n"
        "      --requests N         measure exactly N gets in total (scan gets included) instead\n"
        "                           of --duration; each thread replays its own seeded sequence,\n"
        "                           so two servers see the same gets; for a run that is\n"
        "                           repeatable in order too, use --threads 1 and few --conns\n"
        "      --warmup-requests N  gets replayed before the N measured ones, to fill the cache\n"
        "                           (default 0; replaces --warmup, needs --requests)\n"
        "      --scan-every N       each thread starts a scan after every N of its key gets\n"
        "                           (non-scan gets); the scan share of gets is L / (N + L)\n"
        "      --scan-length L      gets per scan (needed with --scan-every)\n"
        "      --scan-keys R        the cold table scans read: keys with indexes --keys ..\n"
        "                           --keys+R-1, which nothing else reads (default: --keys). A\n"
        "                           scan reads the next L of them in order, going on where the\n"
        "                           thread's previous scan stopped and wrapping at the end, so\n"
        "                           a key is scanned again only after R/L scans\n"
        "\n"
        "Output:\n"
        "      --json               also print one JSON line with every result\n"
        "      --split              split each latency at the moment the reply reached the\n"
        "                           client's socket (the kernel's receive timestamp): send to\n"
        "                           arrival is the server's part (its wake-up, work and send,\n"
        "                           plus loopback), arrival to read the client's (its own\n"
        "                           wake-up and the replies it handled first). Exact at\n"
        "                           --pipeline 1; deeper, a read's first reply stamps them all\n"
        "  -h, --help               show this help\n"
        "\n"
        "Exit status: 0 on a completed run, 1 if the server cannot be reached or no request\n"
        "completed, 2 on a bad command line, 130 if interrupted (results so far are printed).\n");
}

static int bad(const char *opt, const char *val, const char *fix)
{
    fprintf(stderr, PROG ": %s '%s' is invalid: %s (see " PROG " --help)\n", opt, val, fix);
    return -1;
}

/* Whole decimal number in [min, max]; `fix` describes a valid value for the error message. */
static int parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char fix[128];
    snprintf(fix, sizeof(fix), "expected a whole number from %llu to %llu", (unsigned long long)min,
             (unsigned long long)max);
    if (*s < '0' || *s > '9') return bad(opt, s, fix);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end != '\0' || v < min || v > max) return bad(opt, s, fix);
    *out = v;
    return 0;
}

static int parse_unsigned(const char *opt, const char *s, unsigned min, unsigned max, unsigned *out)
{
    uint64_t v;
    if (parse_u64(opt, s, min, max, &v) < 0) return -1;
    *out = (unsigned)v;
    return 0;
}

static int parse_seconds(const char *opt, const char *s, double *out)
{
    const char *fix = "expected seconds >= 0, e.g. 10 or 2.5";
    if (!((*s >= '0' && *s <= '9') || *s == '.')) return bad(opt, s, fix);
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    /* A week is far past any sane benchmark and keeps ns arithmetic well inside 64 bits. */
    if (errno || *end != '\0' || !isfinite(v) || v < 0 || v > 7 * 86400.0) return bad(opt, s, fix);
    *out = v;
    return 0;
}

static int parse_server(struct bench_opts *o, const char *s)
{
    const char *fix = "expected HOST:PORT, e.g. 127.0.0.1:11211 or [::1]:11211";
    const char *host = s, *port;
    size_t hlen;
    if (*s == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') return bad("--server", s, fix);
        host = s + 1;
        hlen = (size_t)(rb - host);
        port = rb + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon) return bad("--server", s, fix);
        hlen = (size_t)(colon - s);
        port = colon + 1;
    }
    if (hlen == 0 || hlen >= sizeof(o->host)) return bad("--server", s, fix);
    uint64_t p;
    char *end;
    errno = 0;
    p = strtoull(port, &end, 10);
    if (*port < '0' || *port > '9' || errno || *end || p < 1 || p > 65535)
        return bad("--server", s,
                   "the port must be a number from 1 to 65535, e.g. 127.0.0.1:11211");
    memcpy(o->host, host, hlen);
    o->host[hlen] = '\0';
    snprintf(o->port, sizeof(o->port), "%u", (unsigned)p);
    return 0;
}

static int parse_ratio(struct bench_opts *o, const char *s)
{
    const char *fix = "expected SETS:GETS with whole numbers, not both 0, e.g. 1:9";
    char *end;
    if (*s < '0' || *s > '9') return bad("--ratio", s, fix);
    errno = 0;
    unsigned long sets = strtoul(s, &end, 10);
    if (errno || *end != ':' || end[1] < '0' || end[1] > '9') return bad("--ratio", s, fix);
    unsigned long gets = strtoul(end + 1, &end, 10);
    if (errno || *end || sets > 1000000 || gets > 1000000 || sets + gets == 0)
        return bad("--ratio", s, fix);
    o->ratio_set = (unsigned)sets;
    o->ratio_get = (unsigned)gets;
    return 0;
}

/* "N" (value_min = value_size = N) or "MIN-MAX" with 1 <= MIN <= MAX. */
static int parse_value_size(struct bench_opts *o, const char *s)
{
    const char *dash = strchr(s, '-');
    uint64_t lo, hi;
    if (!dash) {
        if (parse_u64("--value-size", s, 0, BENCH_MAX_VALUE_SIZE, &hi) < 0) return -1;
        o->value_min = o->value_size = (size_t)hi;
        return 0;
    }
    char fix[128];
    snprintf(fix, sizeof(fix), "expected N or MIN-MAX with 1 <= MIN <= MAX <= %u, e.g. 100-2048",
             BENCH_MAX_VALUE_SIZE);
    char lo_s[24];
    size_t n = (size_t)(dash - s);
    if (n == 0 || n >= sizeof(lo_s)) return bad("--value-size", s, fix);
    memcpy(lo_s, s, n);
    lo_s[n] = '\0';
    char *end;
    errno = 0;
    if (lo_s[0] < '0' || lo_s[0] > '9' || dash[1] < '0' || dash[1] > '9')
        return bad("--value-size", s, fix);
    lo = strtoull(lo_s, &end, 10);
    if (errno || *end) return bad("--value-size", s, fix);
    hi = strtoull(dash + 1, &end, 10);
    if (errno || *end || lo < 1 || lo > hi || hi > BENCH_MAX_VALUE_SIZE)
        return bad("--value-size", s, fix);
    o->value_min = (size_t)lo;
    o->value_size = (size_t)hi;
    return 0;
}

static unsigned digits_u64(uint64_t v)
{
    unsigned d = 1;
    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

/* Options that belong to one mode, and the run-length options that exclude each other. */
static int check_modes(struct bench_opts *o, bool ratio_given, bool duration_given,
                       bool warmup_given, bool scan_keys_given)
{
    if (o->mode == BENCH_MODE_MIXED) {
        const char *only = o->requests ? "--requests"
            : o->warmup_requests       ? "--warmup-requests"
            : o->scan_every            ? "--scan-every"
            : o->scan_length           ? "--scan-length"
            : scan_keys_given          ? "--scan-keys"
                                       : NULL;
        if (only) {
            fprintf(stderr,
                    PROG ": %s only applies to --mode cache-aside; add --mode cache-aside, or use "
                         "--duration / --max-requests for a mixed run\n",
                    only);
            return -1;
        }
        return 0;
    }
    if (ratio_given) {
        fprintf(stderr, PROG ": --ratio is for --mode mixed; in cache-aside mode every request is "
                             "a get and each miss is followed by a set\n");
        return -1;
    }
    if (o->rate) {
        fprintf(stderr, PROG ": --rate is for --mode mixed; a cache-aside run replays its gets "
                             "as fast as the server answers\n");
        return -1;
    }
    if (o->max_requests) {
        fprintf(stderr, PROG ": --max-requests is for --mode mixed; in cache-aside mode use "
                             "--requests N (exactly N measured gets)\n");
        return -1;
    }
    if (o->requests && duration_given) {
        fprintf(stderr, PROG ": give either --requests or --duration, not both\n");
        return -1;
    }
    if (o->requests && warmup_given) {
        fprintf(stderr, PROG ": with --requests the warm-up is counted in gets too: use "
                             "--warmup-requests N instead of --warmup\n");
        return -1;
    }
    if (o->warmup_requests && !o->requests) {
        fprintf(stderr, PROG ": --warmup-requests needs --requests; for a timed run use "
                             "--warmup SECONDS\n");
        return -1;
    }
    if (o->requests) o->warmup = 0;
    if (!o->scan_every != !o->scan_length || (scan_keys_given && !o->scan_every)) {
        fprintf(stderr, PROG ": scans need both --scan-every N and --scan-length L (and "
                             "optionally --scan-keys R), e.g. --scan-every 100000 "
                             "--scan-length 30000\n");
        return -1;
    }
    if (o->scan_every) {
        if (!scan_keys_given) o->scan_keys = o->keys;
        if (o->scan_keys < o->scan_length) {
            fprintf(stderr,
                    PROG ": --scan-keys %llu is smaller than --scan-length %llu, so one scan "
                         "would read keys twice; raise --scan-keys or lower --scan-length\n",
                    (unsigned long long)o->scan_keys, (unsigned long long)o->scan_length);
            return -1;
        }
        if (o->keys + o->scan_keys > BENCH_MAX_KEYS) {
            fprintf(stderr, PROG ": --keys plus --scan-keys is over %llu keys; lower either\n",
                    (unsigned long long)BENCH_MAX_KEYS);
            return -1;
        }
    }
    return 0;
}

int bench_opts_parse(struct bench_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    strcpy(o->host, "127.0.0.1");
    strcpy(o->port, "11211");
    o->threads = 2;
    o->conns = 50;
    o->pipeline = 1;
    o->refill_min = 1;
    o->ratio_set = 1;
    o->ratio_get = 9;
    o->keys = 100000;
    o->key_prefix = "key:";
    o->dist = BENCH_DIST_UNIFORM;
    o->zipf_theta = 0.99;
    o->value_size = o->value_min = 100;
    o->duration = 10;
    o->warmup = 1;
    o->seed = 1;

    bool conns_given = false, threads_given = false, ratio_given = false;
    bool duration_given = false, warmup_given = false, scan_keys_given = false;
    uint64_t v;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":s:t:c:p:d:h", long_opts, NULL)) != -1) {
        const char *name = argv[optind - 1];
        switch (c) {
        case OPT_SERVER:
            if (parse_server(o, optarg) < 0) return -1;
            break;
        case OPT_THREADS:
            if (parse_unsigned("--threads", optarg, 1, BENCH_MAX_THREADS, &o->threads) < 0)
                return -1;
            threads_given = true;
            break;
        case OPT_CONNS:
            if (parse_unsigned("--conns", optarg, 1, BENCH_MAX_CONNS, &o->conns) < 0) return -1;
            conns_given = true;
            break;
        case OPT_PIPELINE:
            if (parse_unsigned("--pipeline", optarg, 1, BENCH_MAX_PIPELINE, &o->pipeline) < 0)
                return -1;
            break;
        case OPT_RATIO:
            if (parse_ratio(o, optarg) < 0) return -1;
            ratio_given = true;
            break;
        case OPT_MODE:
            if (strcmp(optarg, "mixed") == 0)
                o->mode = BENCH_MODE_MIXED;
            else if (strcmp(optarg, "cache-aside") == 0)
                o->mode = BENCH_MODE_CACHE_ASIDE;
            else
                return bad("--mode", optarg, "expected mixed or cache-aside");
            break;
        case OPT_REQUESTS:
            if (parse_u64("--requests", optarg, 1, UINT64_MAX / 4, &o->requests) < 0) return -1;
            break;
        case OPT_WARMUP_REQUESTS:
            if (parse_u64("--warmup-requests", optarg, 0, UINT64_MAX / 4, &o->warmup_requests) < 0)
                return -1;
            break;
        case OPT_SCAN_EVERY:
            if (parse_u64("--scan-every", optarg, 1, UINT64_MAX / 4, &o->scan_every) < 0) return -1;
            break;
        case OPT_SCAN_LENGTH:
            if (parse_u64("--scan-length", optarg, 1, UINT64_MAX / 4, &o->scan_length) < 0)
                return -1;
            break;
        case OPT_SCAN_KEYS:
            if (parse_u64("--scan-keys", optarg, 1, BENCH_MAX_KEYS, &o->scan_keys) < 0) return -1;
            scan_keys_given = true;
            break;
        case OPT_KEYS:
            if (parse_u64("--keys", optarg, 1, BENCH_MAX_KEYS, &o->keys) < 0) return -1;
            break;
        case OPT_KEY_PREFIX:
            for (const char *p = optarg; *p; p++)
                if ((unsigned char)*p <= ' ' || *p == 0x7f)
                    return bad("--key-prefix", optarg,
                               "memcached keys cannot contain spaces or control characters");
            if (strlen(optarg) > 200) return bad("--key-prefix", optarg, "at most 200 characters");
            o->key_prefix = optarg;
            break;
        case OPT_KEY_SIZE:
            if (parse_u64("--key-size", optarg, 1, BENCH_MAX_KEY_LEN, &v) < 0) return -1;
            o->key_size = (size_t)v;
            break;
        case OPT_DIST:
            if (strcmp(optarg, "uniform") == 0)
                o->dist = BENCH_DIST_UNIFORM;
            else if (strcmp(optarg, "zipf") == 0)
                o->dist = BENCH_DIST_ZIPF;
            else
                return bad("--dist", optarg, "expected uniform or zipf");
            break;
        case OPT_ZIPF_THETA: {
            char *end;
            errno = 0;
            double t = strtod(optarg, &end);
            if (errno || *end || end == optarg || !(t >= 0.0 && t < 1.0))
                return bad("--zipf-theta", optarg,
                           "expected a number with 0 <= theta < 1, e.g. 0.99 (the sampler "
                           "does not support theta >= 1)");
            o->zipf_theta = t;
            break;
        }
        case OPT_VALUE_SIZE:
            if (parse_value_size(o, optarg) < 0) return -1;
            break;
        case OPT_DURATION:
            if (parse_seconds("--duration", optarg, &o->duration) < 0) return -1;
            duration_given = true;
            break;
        case OPT_WARMUP:
            if (parse_seconds("--warmup", optarg, &o->warmup) < 0) return -1;
            warmup_given = true;
            break;
        case OPT_PREFILL:
            o->prefill = true;
            break;
        case OPT_JSON:
            o->json = true;
            break;
        case OPT_SPLIT:
            o->split = true;
            break;
        case OPT_SEED:
            if (parse_u64("--seed", optarg, 0, UINT64_MAX, &o->seed) < 0) return -1;
            break;
        case OPT_REFILL_MIN:
            if (parse_unsigned("--refill-min", optarg, 1, BENCH_MAX_PIPELINE, &o->refill_min) < 0)
                return -1;
            break;
        case OPT_RATE:
            if (parse_u64("--rate", optarg, 0, BENCH_MAX_RATE, &o->rate) < 0) return -1;
            break;
        case OPT_MAX_REQUESTS:
            if (parse_u64("--max-requests", optarg, 1, UINT64_MAX, &o->max_requests) < 0) return -1;
            break;
        case OPT_HELP:
            usage(stdout);
            return 1;
        case ':':
            fprintf(stderr,
                    PROG ": option '%s' needs a value, e.g. '%s VALUE' (see " PROG " --help)\n",
                    name, name);
            return -1;
        default:
            if (optopt)
                fprintf(stderr, PROG ": unknown option '-%c'; run " PROG " --help for the list\n",
                        optopt);
            else
                fprintf(stderr, PROG ": unknown option '%s'; run " PROG " --help for the list\n",
                        name);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr,
                PROG ": unexpected argument '%s'; every setting is an option, e.g. "
                     "--server HOST:PORT (see " PROG " --help)\n",
                argv[optind]);
        return -1;
    }

    if (o->refill_min > o->pipeline) {
        fprintf(stderr,
                PROG ": --refill-min %u is larger than --pipeline %u, so no connection "
                     "would ever be refilled; pass --refill-min %u or less\n",
                o->refill_min, o->pipeline, o->pipeline);
        return -1;
    }
    if (o->conns < o->threads) {
        if (threads_given && conns_given) {
            fprintf(stderr,
                    PROG ": --conns %u is fewer than --threads %u; every thread needs a "
                         "connection, so raise --conns or lower --threads\n",
                    o->conns, o->threads);
            return -1;
        }
        o->threads = o->conns; /* only one of them was chosen: follow the user's choice */
    }
    if (check_modes(o, ratio_given, duration_given, warmup_given, scan_keys_given) < 0) return -1;
    uint64_t top = bench_opts_all_keys(o) - 1;
    size_t natural = strlen(o->key_prefix) + digits_u64(top);
    if (o->key_size && o->key_size < natural) {
        fprintf(stderr,
                PROG ": --key-size %zu is too small: the prefix '%s' plus the largest "
                     "index %llu need %zu bytes; pass --key-size %zu or more, or shorten "
                     "--key-prefix\n",
                o->key_size, o->key_prefix, (unsigned long long)top, natural, natural);
        return -1;
    }
    if (!o->key_size && natural > BENCH_MAX_KEY_LEN) {
        fprintf(stderr,
                PROG ": keys would be %zu bytes, over memcached's 250; shorten "
                     "--key-prefix\n",
                natural);
        return -1;
    }
    if (o->duration == 0 && !o->prefill && !o->requests) {
        fprintf(stderr,
                PROG ": --duration 0 only makes sense with --prefill (prefill only); "
                     "give a positive --duration\n");
        return -1;
    }
    return 0;
}
