/* Standard base64 (RFC 4648 section 4, with padding): the tokens_b64 form of
 * the CacheBlend directory (docs/coordinator.md, "Blend lookup"). */
#ifndef LMC_CORE_BASE64_H
#define LMC_CORE_BASE64_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Characters base64 takes for n bytes (without the NUL). */
static inline size_t lmc_base64_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* Writes lmc_base64_len(n) characters and a NUL into out. */
static inline void lmc_base64_encode(const uint8_t *in, size_t n, char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[o++] = abc[w >> 18 & 63];
        out[o++] = abc[w >> 12 & 63];
        out[o++] = i + 1 < n ? abc[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? abc[w & 63] : '=';
    }
    out[o] = '\0';
}

static inline int lmc_base64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Decodes len characters into out (room for len / 4 * 3 bytes), the byte
 * count in *n; false when the text is not padded standard base64. */
static inline bool lmc_base64_decode(const char *s, size_t len, uint8_t *out, size_t *n)
{
    if (len % 4)
        return false;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4], pad = 0;
        for (int j = 0; j < 4; j++) {
            bool tail = i + 4 == len && j >= 2 && s[i + j] == '=' && (j == 3 || s[i + 3] == '=');
            if (tail) {
                v[j] = 0;
                pad++;
            } else if ((v[j] = lmc_base64_value((unsigned char)s[i + j])) < 0) {
                return false;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    *n = o;
    return true;
}

#endif
