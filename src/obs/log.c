#include "obs/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "core/utf8.h"

static atomic_int log_threshold = LMC_LOG_INFO;
static atomic_int log_format = LMC_LOG_TEXT;

void lmc_log_set_format(lmc_log_format format)
{
    atomic_store_explicit(&log_format, (int)format, memory_order_relaxed);
}

bool lmc_log_format_parse(const char *text, lmc_log_format *out)
{
    if (strcasecmp(text, "text") == 0)
        *out = LMC_LOG_TEXT;
    else if (strcasecmp(text, "json") == 0)
        *out = LMC_LOG_JSON;
    else
        return false;
    return true;
}

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

/* Copies src into dst (cap bytes, NUL-terminated), printable ASCII and
 * valid UTF-8 as they are, every other byte as \xNN. */
static void escape(char *dst, size_t cap, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)src;
    size_t n = strlen(src), o = 0;
    for (size_t i = 0; i < n && o + 5 < cap;) {
        size_t len = lmc_utf8_sequence(s + i, n - i);
        if (len > 1) {
            if (o + len + 1 > cap)
                break;
            memcpy(dst + o, s + i, len);
            o += len, i += len;
        } else if (s[i] >= 0x20 && s[i] < 0x7f) {
            dst[o++] = (char)s[i++];
        } else {
            dst[o++] = '\\', dst[o++] = 'x', dst[o++] = hex[s[i] >> 4];
            dst[o++] = hex[s[i++] & 15];
        }
    }
    dst[o] = '\0';
}

bool lmc_log_limit_pass(lmc_log_limit *l, unsigned long long *suppressed_before)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    long long start = atomic_load_explicit(&l->window_ms, memory_order_relaxed);
    *suppressed_before = 0;
    if (start == 0 || now - start >= LMC_LOG_LIMIT_WINDOW_MS) {
        /* One thread opens the new window; the others count into it. */
        if (atomic_compare_exchange_strong(&l->window_ms, &start, now)) {
            atomic_store(&l->in_window, 0);
            *suppressed_before = atomic_exchange(&l->suppressed, 0);
        }
    }
    if (atomic_fetch_add(&l->in_window, 1) < LMC_LOG_LIMIT_BURST)
        return true;
    atomic_fetch_add(&l->suppressed, 1);
    *suppressed_before = 0;
    return false;
}

/* ISO 8601 local time with milliseconds and the zone's offset,
 * "2026-12-05T06:40:00.123+01:00": a log read in another zone, or merged
 * with the engine's, still orders right. */
static void iso8601_now(char *out, size_t cap)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char date[32], zone[8];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
    strftime(zone, sizeof zone, "%z", &tm); /* "+0100" */
    unsigned ms = (unsigned)(tv.tv_usec / 1000) % 1000u;
    snprintf(out, cap, "%s.%03u%.3s:%.2s", date, ms, zone, zone[0] ? zone + 3 : "00");
}

/* The escaped message inside a JSON string: escape() left only printable
 * ASCII and valid UTF-8, so '"' and '\' are all that JSON still needs. */
static void json_quote(char *dst, size_t cap, const char *src)
{
    size_t o = 0;
    for (; *src && o + 3 < cap; src++) {
        if (*src == '"' || *src == '\\')
            dst[o++] = '\\';
        dst[o++] = *src;
    }
    dst[o] = '\0';
}

void lmc_log_write(lmc_log_level level, const char *file, int line, const char *fmt, ...)
{
    char raw[2048], message[2048], stamp[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    escape(message, sizeof message, raw);
    iso8601_now(stamp, sizeof stamp);

    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    /* One fprintf per record keeps lines from different threads whole. */
    if (atomic_load_explicit(&log_format, memory_order_relaxed) == LMC_LOG_JSON) {
        char quoted[4096], source[256];
        json_quote(quoted, sizeof quoted, message);
        json_quote(source, sizeof source, base);
        fprintf(stderr, "{\"time\":\"%s\",\"level\":\"%s\",\"source\":\"%s:%d\",\"message\":\"%s\"}\n",
                stamp, lmc_log_level_name(level), source, line, quoted);
        return;
    }
    fprintf(stderr, "[%s] %-7s %s:%d: %s\n", stamp, lmc_log_level_name(level), base, line,
            message);
}
