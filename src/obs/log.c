#include "obs/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

static atomic_int log_threshold = LMC_LOG_INFO;

void lmc_log_set_level(lmc_log_level level)
{
    atomic_store_explicit(&log_threshold, (int)level, memory_order_relaxed);
}

lmc_log_level lmc_log_get_level(void)
{
    return (lmc_log_level)atomic_load_explicit(&log_threshold, memory_order_relaxed);
}

bool lmc_log_enabled(lmc_log_level level)
{
    return (int)level >= atomic_load_explicit(&log_threshold, memory_order_relaxed);
}

static const struct {
    const char *name;
    lmc_log_level level;
} level_names[] = {
    {"DEBUG", LMC_LOG_DEBUG}, {"INFO", LMC_LOG_INFO},   {"WARNING", LMC_LOG_WARNING},
    {"WARN", LMC_LOG_WARNING}, {"ERROR", LMC_LOG_ERROR}, {"OFF", LMC_LOG_OFF},
};

bool lmc_log_level_parse(const char *text, lmc_log_level *out)
{
    for (size_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++) {
        if (strcasecmp(text, level_names[i].name) == 0) {
            *out = level_names[i].level;
            return true;
        }
    }
    return false;
}

const char *lmc_log_level_name(lmc_log_level level)
{
    switch (level) {
    case LMC_LOG_DEBUG: return "DEBUG";
    case LMC_LOG_INFO: return "INFO";
    case LMC_LOG_WARNING: return "WARNING";
    case LMC_LOG_ERROR: return "ERROR";
    case LMC_LOG_OFF: return "OFF";
    }
    return "INFO";
}

void lmc_log_write(lmc_log_level level, const char *file, int line, const char *fmt, ...)
{
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);

    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    /* One fprintf per record keeps lines from different threads whole. */
    fprintf(stderr, "[%s.%03ld] %-7s %s:%d: %s\n", stamp, (long)(tv.tv_usec / 1000),
            lmc_log_level_name(level), base, line, message);
}
