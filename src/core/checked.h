/* Overflow-checked size arithmetic: the one way every size, offset and
 * count derived from a client's input is computed (docs/security.md,
 * "Sizes from the wire").  Each helper returns false, leaving *out
 * untouched, when the exact result does not fit; callers refuse the input
 * with a reason then.  Header-only and free of anything else, so that any
 * subsystem can use it. */
#ifndef LMC_CORE_CHECKED_H
#define LMC_CORE_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool lmc_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return false;
    *out = r;
    return true;
}

static inline bool lmc_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return false;
    *out = r;
    return true;
}

/* a * b + c */
static inline bool lmc_muladd_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t r;
    return lmc_mul_u64(a, b, &r) && lmc_add_u64(r, c, out);
}

/* The product of n factors (1 for n == 0). */
static inline bool lmc_product_u64(const uint64_t *f, size_t n, uint64_t *out)
{
    uint64_t r = 1;
    for (size_t i = 0; i < n; i++)
        if (!lmc_mul_u64(r, f[i], &r))
            return false;
    *out = r;
    return true;
}

/* A signed value from the wire as a count: false when negative. */
static inline bool lmc_u64_of_i64(int64_t v, uint64_t *out)
{
    if (v < 0)
        return false;
    *out = (uint64_t)v;
    return true;
}

#endif
