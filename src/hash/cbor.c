#include "hash/cbor.h"

size_t lmc_cbor_head_len(uint64_t val)
{
    if (val < 24)
        return 1;
    if (val <= 0xff)
        return 2;
    if (val <= 0xffff)
        return 3;
    if (val <= 0xffffffffu)
        return 5;
    return 9;
}

size_t lmc_cbor_put_head(uint8_t *out, unsigned major, uint64_t val)
{
    const uint8_t mt = (uint8_t)((major & 7u) << 5);
    size_t len = lmc_cbor_head_len(val);
    if (len == 1) {
        out[0] = (uint8_t)(mt | val);
        return 1;
    }
    /* Additional info 24/25/26/27 = 1/2/4/8 argument bytes follow, big-endian. */
    static const uint8_t info_for_len[10] = {[2] = 24, [3] = 25, [5] = 26, [9] = 27};
    out[0] = (uint8_t)(mt | info_for_len[len]);
    for (size_t i = len - 1; i >= 1; i--) {
        out[i] = (uint8_t)(val & 0xff);
        val >>= 8;
    }
    return len;
}
