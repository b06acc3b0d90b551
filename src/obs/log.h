/* Logging: one line per record with wall time, level, source location.
 *
 * The level threshold is the single piece of process-wide state outside the
 * server context: it is set once at start-up, before any thread exists, and
 * only read afterwards (relaxed atomic). */
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

#endif
