/* vLLM block hashes for the KV event publisher (docs/kv_events.md, "vLLM
 * block hashes"): the hashes a vLLM engine started with
 * --prefix-caching-hash-algo sha256_cbor, PYTHONHASHSEED=seed and
 * --block-size N gives the same tokens, so that a router keyed by them
 * finds lmcached's chunks.
 *
 * A stored chunk of the KV event log is cut into N-token blocks, hashed
 * by the sha256_cbor chain of src/hash (docs/hashing.md, "sha256_cbor"),
 * which is vLLM's hash_block_tokens with extra_keys None: the first
 * block's parent is the last block of the chunk before it, which this
 * view remembers per LMCache chunk hash in a bounded 4-way set-associative
 * table (the least recently used of a set goes first), with the 64-bit
 * ints of every block for the BlockRemoved of that chunk.
 *
 * Thread-safety: single owner (the publisher's thread), except
 * lmc_kv_events_vllm_get_stats, which any thread may call. */
#ifndef LMC_MODULES_KV_EVENTS_VLLM_H
#define LMC_MODULES_KV_EVENTS_VLLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Chunks remembered at most, and the bytes their table may take (fewer
 * chunks when chunk_size / block_size is large). */
#define LMC_KV_EVENTS_VLLM_MAX_CHUNKS 65536
#define LMC_KV_EVENTS_VLLM_MAX_BYTES (64u << 20)

typedef struct lmc_kv_events_vllm lmc_kv_events_vllm;

/* block_size >= 1 tokens, a divisor of chunk_size (the LMCache chunk);
 * `seed` plays PYTHONHASHSEED, never NULL (vLLM's random NONE_HASH could
 * not be reproduced by anyone).  NULL with a reason in err (out of
 * memory, the digest unavailable). */
lmc_kv_events_vllm *lmc_kv_events_vllm_new(uint32_t block_size, uint32_t chunk_size,
                                           const char *seed, char *err, size_t errlen);
void lmc_kv_events_vllm_free(lmc_kv_events_vllm *v);

/* vLLM's int of a 32-byte block hash (maybe_convert_block_hash): its low
 * 64 bits, i.e. the last 8 bytes read big-endian. */
uint64_t lmc_kv_events_vllm_int(const uint8_t *hash, size_t len);

/* What a stored chunk publishes. */
typedef struct {
    const uint64_t *hashes;  /* n ints, valid until the next call on v */
    size_t n;                /* whole blocks: n_tokens / block_size */
    bool has_parent;         /* false: the chunk starts a sequence */
    uint64_t parent;         /* the int of the block before the first */
} lmc_kv_events_vllm_blocks;

/* The blocks of a stored chunk (`parent`: the LMCache hash of the chunk
 * before it, NULL for a prompt's first chunk); tokens past the last whole
 * block are left out, as vLLM never hashes a partial block.  1 with *out
 * set; 0 when the chunk is skipped: its parent's vLLM hash is not
 * remembered (counted in `unchained`), it has no whole block or more
 * tokens than a chunk, or hashing failed. */
int lmc_kv_events_vllm_stored(lmc_kv_events_vllm *v, const uint8_t *chunk_hash,
                              size_t hash_len, const uint8_t *parent, const uint32_t *tokens,
                              size_t n_tokens, lmc_kv_events_vllm_blocks *out);

/* The block ints of a removed chunk, NULL when not remembered (counted in
 * `unknown_removed`).  Valid until the next call on v. */
const uint64_t *lmc_kv_events_vllm_removed(lmc_kv_events_vllm *v, const uint8_t *chunk_hash,
                                           size_t hash_len, size_t *n);

typedef struct {
    uint64_t chunks;          /* remembered now */
    uint64_t unchained;       /* stored chunks skipped: parent unknown */
    uint64_t unknown_removed; /* removed chunks not remembered */
} lmc_kv_events_vllm_stats;

void lmc_kv_events_vllm_get_stats(lmc_kv_events_vllm *v, lmc_kv_events_vllm_stats *out);

#endif
