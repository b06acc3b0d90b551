/* Logging: one line per record with wall time, level, source location.
 * Every record is written with its control bytes and any byte that is not
 * part of valid UTF-8 escaped as \xNN, so that a string a client chose (a
 * model name, a request id) can never forge a line or a terminal sequence.
 *
 * The level threshold and the format are the only process-wide state
 * outside the server context: set once at start-up, before any thread
 * exists, and only read afterwards (relaxed atomics). */
#ifndef LMC_OBS_LOG_H
#define LMC_OBS_LOG_H

#include <stdbool.h>

typedef enum {
    LMC_LOG_DEBUG = 10,
    LMC_LOG_INFO = 20,
    LMC_LOG_WARNING = 30,
    LMC_LOG_ERROR = 40,
    LMC_LOG_OFF = 100,
} lmc_log_level;

void lmc_log_set_level(lmc_log_level level);
lmc_log_level lmc_log_get_level(void);
bool lmc_log_enabled(lmc_log_level level);

/* Accepts DEBUG, INFO, WARNING (or WARN), ERROR, OFF in any case.
 * Returns false for anything else. */
bool lmc_log_level_parse(const char *text, lmc_log_level *out);
const char *lmc_log_level_name(lmc_log_level level);

/* text: "[2026-12-05T06:40:00.123+00:00] INFO    file.c:12: message";
 * json: one object per line, {"time","level","source","message"}
 * (docs/observability.md, "Logging").  Set once at start, like the level. */
typedef enum { LMC_LOG_TEXT, LMC_LOG_JSON } lmc_log_format;

void lmc_log_set_format(lmc_log_format format);
/* Accepts "text" and "json" in any case; false for anything else. */
bool lmc_log_format_parse(const char *text, lmc_log_format *out);

void lmc_log_write(lmc_log_level level, const char *file, int line,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define LMC_LOG(level, ...)                                         \
    do {                                                            \
        if (lmc_log_enabled(level))                                 \
            lmc_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#define LMC_DEBUG(...) LMC_LOG(LMC_LOG_DEBUG, __VA_ARGS__)
#define LMC_INFO(...)  LMC_LOG(LMC_LOG_INFO, __VA_ARGS__)
#define LMC_WARN(...)  LMC_LOG(LMC_LOG_WARNING, __VA_ARGS__)
#define LMC_ERROR(...) LMC_LOG(LMC_LOG_ERROR, __VA_ARGS__)

/* Rate limit of one call site (docs/observability.md, "Logging"): at most
 * LMC_LOG_LIMIT_BURST lines per LMC_LOG_LIMIT_WINDOW_MS; the first line of
 * the next window says how many were suppressed.  For warnings a client
 * can cause at will (a bad request per message), so that no client can
 * fill the disk.  The state is one static per call site: like the level
 * threshold, process-wide by nature, and only touched atomically. */
#define LMC_LOG_LIMIT_BURST 20u
#define LMC_LOG_LIMIT_WINDOW_MS 10000
typedef struct lmc_log_limit {
    _Atomic long long window_ms;         /* start of the current window; 0: none yet */
    _Atomic unsigned in_window;
    _Atomic unsigned long long suppressed;
} lmc_log_limit;

/* Whether a line at this site may be written now; *suppressed_before is
 * the number dropped since the last written one (to be reported first). */
bool lmc_log_limit_pass(lmc_log_limit *l, unsigned long long *suppressed_before);

#define LMC_WARN_LIMITED(...)                                                           \
    do {                                                                                \
        static lmc_log_limit lmc_limit_;                                                \
        unsigned long long lmc_dropped_;                                                \
        if (lmc_log_enabled(LMC_LOG_WARNING) &&                                         \
            lmc_log_limit_pass(&lmc_limit_, &lmc_dropped_)) {                           \
            if (lmc_dropped_)                                                           \
                lmc_log_write(LMC_LOG_WARNING, __FILE__, __LINE__,                      \
                              "%llu more lines like the next were suppressed",          \
                              lmc_dropped_);                                            \
            lmc_log_write(LMC_LOG_WARNING, __FILE__, __LINE__, __VA_ARGS__);            \
        }                                                                               \
    } while (0)

#endif
