/* Lower-case hex, the form chunk hashes take in JSON, in file names and
 * in logs (docs/http.md, "Cached objects").  Upper case is refused on purpose: a key
 * has one spelling, so that two spellings never name two objects. */
#ifndef LMC_CORE_HEX_H
#define LMC_CORE_HEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The value of a lower-case hex digit, or -1. */
static inline int lmc_hex_nibble(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Decodes 2*n hex digits into out[0..n); false, with out partly written,
 * at the first digit that is not lower-case hex. */
static inline bool lmc_hex_decode(const char *hex, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = lmc_hex_nibble(hex[2 * i]), lo = lmc_hex_nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* Writes in[0..n) as 2*n lower-case digits and a NUL into out. */
static inline void lmc_hex_encode(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 0xf];
    }
    out[2 * n] = '\0';
}

#endif
