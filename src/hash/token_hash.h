/* Token hashing: chunked, prefix-chained chunk hashes (docs/hashing.md,
 * "1. Chunks and the chain" and "2. Algorithms").
 *
 * Clients send raw token ids; the server cuts them into chunks of
 * `chunk_size` tokens and names chunk i by
 *
 *     H_0 = F(NONE_HASH, tokens[0:cs])
 *     H_i = F(H_{i-1},   tokens[i*cs:(i+1)*cs])
 *
 * so a chunk's hash identifies the whole prefix up to and including it.
 * Only whole chunks are hashed; a trailing partial chunk never gets a hash.
 *
 * Algorithms (all produce 32-byte digests):
 *   "blake3"       F = BLAKE3-256(prefix || each token as 4-byte BE u32).
 *                  NONE_HASH = F(int 0, [0]) = BLAKE3(12 zero bytes), always
 *                  (the seed argument is ignored; see docs/hashing.md).
 *   "sha256_cbor"  F = SHA-256(canonical CBOR [prefix bstr, [tokens], null]).
 *                  NONE_HASH = SHA-256(CBOR text seed) when a seed is given,
 *                  else 32 random bytes drawn once per hasher.
 *   "builtin"      refused: it is CPython's hash() and cannot be reproduced.
 *
 * Tokens arrive as 64-bit integers (msgpack) and must lie in 0..2^32-1.
 *
 * Threading: an lmc_token_hasher is immutable after creation and may be
 * shared by any number of threads.  An lmc_hash_chain is single-owner state
 * (one per request); callers serialise access to it. */
#ifndef LMC_HASH_TOKEN_HASH_H
#define LMC_HASH_TOKEN_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hash/hash_memo.h"

#define LMC_TOKEN_HASH_LEN 32

/* Return codes (0 = success). */
enum {
    LMC_HASH_OK = 0,
    LMC_HASH_ERANGE = -1,  /* start/end not chunk-aligned, start > end, or end > n_tokens */
    LMC_HASH_ETOKEN = -2,  /* a hashed token is outside 0..2^32-1 */
    LMC_HASH_ENOMEM = -3,  /* allocation failed */
    LMC_HASH_ECRYPTO = -4, /* the OpenSSL digest failed */
};

/* Static description of a return code. */
const char *lmc_hash_strerror(int code);

typedef enum {
    LMC_HASH_ALGO_BLAKE3 = 0,
    LMC_HASH_ALGO_SHA256_CBOR = 1,
} lmc_hash_algo;

typedef struct lmc_token_hasher lmc_token_hasher;

/* Creates a hasher.  `algorithm` is "blake3" or "sha256_cbor" (exact,
 * as on the --hash-algorithm command line); chunk_size must be > 0.
 * `python_hash_seed` plays the role of $PYTHONHASHSEED for sha256_cbor
 * (callers pass getenv("PYTHONHASHSEED"); NULL = unset = random NONE_HASH);
 * blake3 ignores it.  Returns 0 and sets *out, or -1 with a one-line reason
 * in err (if err != NULL). */
int lmc_token_hasher_new(const char *algorithm, uint32_t chunk_size,
                         const char *python_hash_seed, lmc_token_hasher **out,
                         char *err, size_t errlen);
void lmc_token_hasher_free(lmc_token_hasher *h);

/* Gives the hasher a memo of chain steps shared by every caller
 * (hash_memo.h) of at most `budget_bytes`; 0 removes it.  Results are the
 * same bytes with or without it.  Call before concurrent use.  0, or -1
 * when the memo could not be allocated (or the budget is too small): the
 * hasher then works without one. */
int lmc_token_hasher_enable_memo(lmc_token_hasher *h, size_t budget_bytes);
/* False without a memo. */
bool lmc_token_hasher_memo_stats(const lmc_token_hasher *h, lmc_hash_memo_stats *out);

lmc_hash_algo lmc_token_hasher_algo(const lmc_token_hasher *h);
/* "blake3" or "sha256_cbor". */
const char *lmc_token_hasher_name(const lmc_token_hasher *h);
uint32_t lmc_token_hasher_chunk_size(const lmc_token_hasher *h);
/* Always LMC_TOKEN_HASH_LEN (32): the length of every chunk hash. */
size_t lmc_token_hasher_digest_len(const lmc_token_hasher *h);
/* The chain seed, digest_len bytes, valid for the hasher's lifetime. */
const uint8_t *lmc_token_hasher_none_hash(const lmc_token_hasher *h);

/* Number of whole chunks in n_tokens tokens (n_tokens / chunk_size). */
size_t lmc_hash_num_chunks(const lmc_token_hasher *h, size_t n_tokens);

/* Hashes the chunk range [start, end) of `tokens` (token positions, both
 * multiples of chunk_size, start <= end <= n_tokens), computing the chain
 * from chunk 0, and writes the (end-start)/chunk_size hashes of that range
 * to `out` (32 bytes each, contiguous).  Only tokens[0:end] are read and
 * validated.  On error `out` may be partly written. */
int lmc_hash_chunks(const lmc_token_hasher *h, const uint64_t *tokens, size_t n_tokens,
                    size_t start, size_t end, uint8_t *out);

/* Continues a chain: hashes n_chunks consecutive whole chunks of `tokens`
 * (n_chunks * chunk_size tokens), the first one chained onto `prefix` (the
 * previous chunk's hash, or the NONE_HASH for chunk 0).  `out` receives
 * n_chunks * 32 bytes; it may alias `prefix`.  On error, the hashes of the
 * chunks before the failing one are already in `out`. */
int lmc_hash_chunks_from(const lmc_token_hasher *h, const uint8_t *prefix,
                         const uint64_t *tokens, size_t n_chunks, uint8_t *out);

/* ---- Cached, extendable chains (one per request) ------------------------ */

/* The hashes of a token sequence's whole chunks, plus a copy of the tokens
 * they cover so that a later call can tell which part is still valid. */
typedef struct lmc_hash_chain lmc_hash_chain;

/* NULL on allocation failure.  The hasher must outlive the chain. */
lmc_hash_chain *lmc_hash_chain_new(const lmc_token_hasher *h);
void lmc_hash_chain_free(lmc_hash_chain *c);
/* Forgets all hashes (keeps the allocations). */
void lmc_hash_chain_reset(lmc_hash_chain *c);

/* Makes the chain cover tokens[0:end] (end a multiple of chunk_size,
 * end <= n_tokens; `tokens` is the full sequence from position 0).
 * Tokens already hashed are compared with the stored copy; from the first
 * chunk that differs on, hashes are dropped and recomputed, so the result
 * always equals lmc_hash_chunks() over the same tokens.  If `tokens` is a
 * shorter but consistent prefix of what was hashed before, the longer chain
 * is kept (count() may exceed end / chunk_size).
 * On error the chain still holds a valid prefix: after LMC_HASH_ETOKEN every
 * chunk before the one holding the bad token; after ENOMEM/ECRYPTO the
 * unchanged chunks it already had.  LMC_HASH_ERANGE changes nothing. */
int lmc_hash_chain_extend_to(lmc_hash_chain *c, const uint64_t *tokens, size_t n_tokens,
                             size_t end);
/* Same, for all whole chunks of tokens[0:n_tokens]. */
int lmc_hash_chain_extend(lmc_hash_chain *c, const uint64_t *tokens, size_t n_tokens);

/* Number of chunk hashes held. */
size_t lmc_hash_chain_count(const lmc_hash_chain *c);
/* Hash of chunk i (i < count), 32 bytes.  The hashes are stored contiguously,
 * so get(a) addresses chunks a..count-1 as one array.  Pointers stay valid
 * until the next extend/reset/free of this chain. */
const uint8_t *lmc_hash_chain_get(const lmc_hash_chain *c, size_t i);

#endif
