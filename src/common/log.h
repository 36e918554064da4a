/* log.h — one line per event worth knowing, to stderr, with a level and a timestamp.
 *
 * The level is set once at start (-v, -vv) and may be changed by the `verbosity` command;
 * reading it is a relaxed atomic so workers never lock to decide whether to log. */
#ifndef SHOAL_COMMON_LOG_H
#define SHOAL_COMMON_LOG_H

/* Shown by default: error, warn, notice (start, stop, configuration changes). -v adds info,
 * -vv debug. */
enum log_level { LOG_ERROR = -2, LOG_WARN = -1, LOG_NOTICE = 0, LOG_INFO = 1, LOG_DEBUG = 2 };

void log_set_level(int level);
int log_get_level(void);
void log_set_name(const char *name);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
