/* The 64-bit polynomial content fingerprint of CacheBlend
 * (docs/cacheblend.md, "Matcher"): shared by the server's matcher and the
 * coordinator's fleet directory, which must agree on it bit for bit. */
#ifndef LMC_HASH_POLY_FINGERPRINT_H
#define LMC_HASH_POLY_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#define LMC_HASH_POLY_BASE 0x9E3779B97F4A7C15ULL

/* Fingerprint of one window of k tokens: h = h*BASE + x_i from 0, mod 2^64. */
uint64_t lmc_hash_poly_fingerprint(const uint64_t *tokens, size_t k);
/* BASE^e mod 2^64: what the rolling update takes off the leaving token. */
uint64_t lmc_hash_poly_pow(size_t e);
/* Fingerprints of every window start 0..n-k into out[n-k+1], in O(n);
 * -1 when k == 0, n < k or a pointer is NULL. */
int lmc_hash_poly_rolling(const uint64_t *tokens, size_t n, size_t k, uint64_t *out);

#endif
