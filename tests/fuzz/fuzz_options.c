/* fuzz_options.c — libFuzzer target for the config-file parser (options_load_text).
 *
 * Any bytes must yield 0 or an error message naming a line; never a crash, an over-read or a
 * leak. The option table covers every option type. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/options.h"

static uint64_t f_port, f_size, f_count;
static bool f_bool;
static const char *f_str;
static const struct opt_def defs[] = {
    {"port", 'p', OPT_UINT, "11211", 0, 1, 65535, "port", &f_port, "tcp-port"},
    {"item_max", 'I', OPT_SIZE, NULL, 1 << 20, 1024, 1ull << 30, "size", &f_size, NULL},
    {"verbose", 'v', OPT_COUNT, NULL, 0, 0, 0, "count", &f_count, NULL},
    {"fast", 0, OPT_BOOL, "no", 0, 0, 0, "flag", &f_bool, NULL},
    {"name", 0, OPT_STR, "x", 0, 0, 0, "text", &f_str, NULL},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    err[0] = 0;
    options_defaults(defs, sizeof defs / sizeof defs[0]);
    int rc = options_load_text(defs, sizeof defs / sizeof defs[0], (const char *)data, size,
                               "fuzz", err, sizeof err);
    if (rc != 0 && (err[0] == 0 || strncmp(err, "fuzz", 4) != 0)) __builtin_trap();
    if (rc == 0 && (f_port < 1 || f_port > 65535 || f_size < 1024 || f_size > (1ull << 30)))
        __builtin_trap(); /* a value outside its bounds was accepted */
    if (f_str) (void)strlen(f_str);
    options_release();
    return 0;
}
