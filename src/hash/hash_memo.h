/* Hash memo: a bounded, server-wide cache of chain steps
 *     (previous chunk hash, chunk tokens) -> chunk hash
 * shared by every request.  Requests that share a prefix (a system prompt,
 * a long document asked about twice) hash it only once; later lookups of
 * the same prefix cost a table probe and a token comparison per chunk
 * instead of a BLAKE3/SHA-256 computation.
 *
 * An entry is used only when the previous hash and every token match
 * exactly, so a memo hit returns the very bytes the hasher would have
 * computed; the 64-bit tag only picks the slot.  The table is 4-way set
 * associative with round-robin replacement and a fixed size chosen at
 * creation (no growth).  Internal to src/hash: token_hash.c consults it from
 * lmc_hash_chunks_from() and lmc_hash_chunks().
 *
 * Thread-safety: one mutex; it is never held while hashing. */
#ifndef LMC_HASH_HASH_MEMO_H
#define LMC_HASH_HASH_MEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lmc_hash_memo lmc_hash_memo;

/* A memo of at most `budget_bytes` for chunks of `chunk_size` tokens; NULL
 * when the budget holds fewer than 4 entries or memory is short. */
lmc_hash_memo *lmc_hash_memo_new(uint32_t chunk_size, size_t budget_bytes);
void lmc_hash_memo_free(lmc_hash_memo *m);

/* True and *out = the memoized hash of chunk `tokens` after `prev`. */
bool lmc_hash_memo_get(lmc_hash_memo *m, const uint8_t *prev, const uint64_t *tokens,
                       uint8_t *out);
/* Remembers a computed step (tokens must all fit in 32 bits). */
void lmc_hash_memo_put(lmc_hash_memo *m, const uint8_t *prev, const uint64_t *tokens,
                       const uint8_t *hash);

typedef struct {
    uint64_t hits, misses;
    size_t entries, capacity;
} lmc_hash_memo_stats;
lmc_hash_memo_stats lmc_hash_memo_get_stats(lmc_hash_memo *m);

#endif
