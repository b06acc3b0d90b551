#include "hash/poly_fingerprint.h"

uint64_t lmc_hash_poly_fingerprint(const uint64_t *tokens, size_t k)
{
    uint64_t h = 0;
    for (size_t i = 0; i < k; i++)
        h = h * LMC_HASH_POLY_BASE + tokens[i];
    return h;
}

uint64_t lmc_hash_poly_pow(size_t e)
{
    uint64_t r = 1, b = LMC_HASH_POLY_BASE;
    for (; e; e >>= 1, b *= b)
        if (e & 1)
            r *= b;
    return r;
}

int lmc_hash_poly_rolling(const uint64_t *tokens, size_t n, size_t k, uint64_t *out)
{
    if (!tokens || !out || k == 0 || n < k)
        return -1;
    uint64_t pow = lmc_hash_poly_pow(k - 1);
    uint64_t h = lmc_hash_poly_fingerprint(tokens, k);
    out[0] = h;
    for (size_t p = 1; p + k <= n; p++) {
        h = (h - tokens[p - 1] * pow) * LMC_HASH_POLY_BASE + tokens[p + k - 1];
        out[p] = h;
    }
    return 0;
}
