/* log.h — one line per event worth knowing, to stderr, with a level and a timestamp.
 *
 * The level is set once at start (-v, -vv) and may be changed by the `verbosity` command;
 * reading it is a relaxed atomic so workers never lock to decide whether to log. */
#ifndef SHOAL_COMMON_LOG_H
#define SHOAL_COMMON_LOG_H

#include <stddef.h>

/* Shown by default: error, warn, notice (start, stop, configuration changes). -v adds info,
 * -vv debug. */
enum log_level { LOG_ERROR = -2, LOG_WARN = -1, LOG_NOTICE = 0, LOG_INFO = 1, LOG_DEBUG = 2 };

void log_set_level(int level);
int log_get_level(void);
void log_set_name(const char *name);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Copy n bytes of s into dst (cap > 0 bytes, NUL-terminated, cut short to fit) for a log line:
 * bytes below 0x20, '\\', DEL and above are written as \xNN, so a client's key with control bytes
 * cannot forge log lines or drive a terminal. Returns dst. */
char *log_escape(char *dst, size_t cap, const char *s, size_t n);

/* A log line's message (after the timestamp, name and level) is at most LOG_LINE_MAX bytes:
 * log_msg escapes every byte below 0x20, DEL and above as \xNN (backslashes stay, so the
 * output of log_escape passes unchanged) and cuts a longer message to end in
 * "... (N more bytes)", within LOG_CUT_ROOM of the limit. */
#define LOG_LINE_MAX 1024
#define LOG_CUT_ROOM 40

/* Copy n bytes of s into dst (cap > 0 bytes, NUL-terminated) as log_msg writes a message:
 * bytes below 0x20, DEL and above as \xNN, stopping before an escape or byte that would not
 * fit. Returns how many bytes of s were written. */
size_t log_clean(char *dst, size_t cap, const char *s, size_t n);

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* For events a peer can repeat at will (a node sending garbage on every reconnect): at most
 * LOG_LIMIT_LINES lines per LOG_LIMIT_SECONDS from one call site; the first line after a
 * window that dropped some says how many. One static state per call site, shared by threads. */
#define LOG_LIMIT_LINES 5
#define LOG_LIMIT_SECONDS 10
struct log_limit {
    long long window; /* start of the current window, seconds */
    unsigned lines, dropped;
};
void log_limited(struct log_limit *l, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define log_warn_limited(...)                                                                    \
    do {                                                                                         \
        static struct log_limit log_limit_;                                                      \
        log_limited(&log_limit_, LOG_WARN, __VA_ARGS__);                                         \
    } while (0)
#define log_info_limited(...)                                                                    \
    do {                                                                                         \
        static struct log_limit log_limit_;                                                      \
        log_limited(&log_limit_, LOG_INFO, __VA_ARGS__);                                         \
    } while (0)

#endif
