/* The caller's error buffer: a function that refuses writes its reason
 * into (err, errlen) and returns -1, so that `return lmc_err(err, errlen,
 * "...", ...)` is the whole of a refusal.  A NULL or empty buffer is
 * allowed: the reason is then dropped, the -1 kept. */
#ifndef LMC_CORE_ERRBUF_H
#define LMC_CORE_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline int lmc_verr(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static inline int lmc_verr(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    return -1;
}

static inline int lmc_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int lmc_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lmc_verr(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

#endif
