/* UTF-8 well-formedness (RFC 3629): what every name a client gives must be
 * before it goes anywhere (keys, logs, JSON to the coordinator), and what
 * the log writes as is.  Header-only. */
#ifndef LMC_CORE_UTF8_H
#define LMC_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the well-formed UTF-8 sequence that starts s (at most n
 * bytes): 1 for ASCII, 2 to 4 otherwise; 0 if s does not start one
 * (a stray continuation byte, an overlong form, a surrogate, a code point
 * past U+10FFFF, a sequence cut short). */
static inline size_t lmc_utf8_sequence(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) ||
        (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

static inline bool lmc_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t len = lmc_utf8_sequence(p + i, n - i);
        if (len == 0)
            return false;
        i += len;
    }
    return true;
}

#endif
