/* log.c — leveled one-line logging to stderr (see log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static int log_level = LOG_NOTICE;
static const char *log_name = "shoal";

void log_set_level(int level) { __atomic_store_n(&log_level, level, __ATOMIC_RELAXED); }
int log_get_level(void) { return __atomic_load_n(&log_level, __ATOMIC_RELAXED); }
void log_set_name(const char *name) { log_name = name; }

void log_msg(int level, const char *fmt, ...)
{
    if (level > log_get_level()) return;
    static const char *names[] = {"error", "warn", "notice", "info", "debug"};
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s %s: %s\n", ts, log_name, names[level - LOG_ERROR], line);
}
