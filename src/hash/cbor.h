/* Minimal canonical CBOR (RFC 8949 §4.2.1 "core deterministic") writer.
 *
 * Only what sha256_cbor token hashing needs (docs/hashing.md,
 * "sha256_cbor"): the initial bytes ("heads") of unsigned ints, byte
 * strings, text strings and arrays, always in their shortest form, plus the
 * null simple value.  Heads
 * are at most 9 bytes, so callers can reserve LMC_CBOR_HEAD_MAX per item and
 * encode into fixed stack buffers without bounds checks per byte. */
#ifndef LMC_HASH_CBOR_H
#define LMC_HASH_CBOR_H

#include <stddef.h>
#include <stdint.h>

#define LMC_CBOR_HEAD_MAX 9

enum {
    LMC_CBOR_UINT = 0,  /* major type 0 */
    LMC_CBOR_BYTES = 2, /* major type 2 */
    LMC_CBOR_TEXT = 3,  /* major type 3 */
    LMC_CBOR_ARRAY = 4, /* major type 4 */
};

#define LMC_CBOR_NULL 0xf6

/* Number of bytes the shortest head for argument `val` takes (1, 2, 3, 5, 9). */
size_t lmc_cbor_head_len(uint64_t val);

/* Writes the shortest head of major type `major` (0..7) with argument `val`
 * to `out` (room for LMC_CBOR_HEAD_MAX bytes) and returns its length. */
size_t lmc_cbor_put_head(uint8_t *out, unsigned major, uint64_t val);

/* An unsigned integer item is just its head. */
static inline size_t lmc_cbor_put_uint(uint8_t *out, uint64_t val)
{
    return lmc_cbor_put_head(out, LMC_CBOR_UINT, val);
}

#endif
