/* CacheBlend fingerprint matcher (docs/cacheblend.md, "Matcher").
 *
 * Finds chunks of stored KV whose `chunk_size` tokens reappear at any
 * position of a later prompt.  A stored chunk is registered under its
 * chained chunk hash (the ordinary storage key) with the 64-bit polynomial
 * fingerprint of its tokens and the position it was stored at; a match
 * probes the fingerprint of every window of the prompt and returns the
 * chunk keys found, each with its stored and its new position.
 *
 * Namespaces: one matcher serves every model and tenant; an entry belongs
 * to one (model name, cache salt, world size) and is found, deduplicated,
 * struck and removed only under that namespace.
 *
 * Memory: fixed at creation.  A table of 2^20 uint32 slots (4 MiB) plus,
 * per chunk of `max_chunks`, LMC_BLEND_ENTRY_BYTES of entry and one index
 * bucket (4 bytes, the bucket count being max_chunks rounded up to a power
 * of two) -- at most 72 bytes per registered chunk;
 * lmc_blend_matcher_bytes() gives the exact total.  Pages are calloc'ed, so
 * only those of used entries become resident.  A registration that would
 * take more than `max_chunks` live chunks registers nothing and is counted.
 *
 * Thread safety: a rwlock.  Matching (and stats) take it shared, so request
 * threads match in parallel; registration, removal and strikes take it
 * exclusive.  Fingerprints are computed before the lock is taken. */
#ifndef LMC_MODULES_BLEND_BLEND_MATCHER_H
#define LMC_MODULES_BLEND_BLEND_MATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hash/poly_fingerprint.h"

#define LMC_BLEND_BASE LMC_HASH_POLY_BASE
#define LMC_BLEND_TABLE_BITS 20
#define LMC_BLEND_MAX_CHUNKS (1u << LMC_BLEND_TABLE_BITS)
#define LMC_BLEND_HASH_MAX 32
#define LMC_BLEND_ENTRY_BYTES 64 /* checked against the struct in blend_matcher.c */
#define LMC_BLEND_STRIKES 2      /* stale lookups in a row that remove a chunk */

enum {
    LMC_BLEND_OK = 0,
    LMC_BLEND_EINVAL = -1, /* a NULL, zero or out-of-range argument */
    LMC_BLEND_EFULL = -2,  /* registration would pass max_chunks: nothing registered */
    LMC_BLEND_ENOMEM = -3,
};

typedef struct lmc_blend_matcher lmc_blend_matcher;

typedef struct {
    uint32_t chunk_size; /* tokens per fingerprint window, >= 1 */
    size_t hash_len;     /* bytes of a chained chunk hash, 1..LMC_BLEND_HASH_MAX */
    size_t max_chunks;   /* live registered chunks, 1..LMC_BLEND_MAX_CHUNKS */
    bool dedup_content;  /* --enable-dedup-content: same text registered once */
} lmc_blend_matcher_opts;

/* The namespace of an entry; a NULL cache_salt is the same as "". */
typedef struct {
    const char *model_name;
    const char *cache_salt;
    uint32_t world_size;
} lmc_blend_ns;

typedef struct {
    uint64_t old_st; /* stored position (a multiple of chunk_size plus the store's offset) */
    uint64_t cur_st; /* position in the query; both ranges are chunk_size long */
    uint8_t hash[LMC_BLEND_HASH_MAX]; /* the first hash_len bytes are the chunk key */
} lmc_blend_candidate;

typedef struct {
    size_t live, max_chunks;
    uint64_t registered, refused, removed; /* chunk counts since creation */
    bool near_full;                        /* live > 80 % of max_chunks */
} lmc_blend_matcher_stats;

/* Fingerprint of one window of k tokens (src/hash/poly_fingerprint.h,
 * which the coordinator's fleet directory shares). */
static inline uint64_t lmc_blend_fingerprint(const uint64_t *tokens, size_t k)
{
    return lmc_hash_poly_fingerprint(tokens, k);
}
/* Fingerprints of every window start 0..n-k into out[n-k+1], in O(n);
 * LMC_BLEND_EINVAL when k == 0 or n < k. */
static inline int lmc_blend_rolling(const uint64_t *tokens, size_t n, size_t k, uint64_t *out)
{
    return lmc_hash_poly_rolling(tokens, n, k, out) == 0 ? LMC_BLEND_OK : LMC_BLEND_EINVAL;
}

/* Bytes a matcher of max_chunks takes (0 when max_chunks is out of range). */
size_t lmc_blend_matcher_bytes(size_t max_chunks);

/* -1 with the reason (naming the option) in err on bad options or no memory. */
int lmc_blend_matcher_new(const lmc_blend_matcher_opts *o, lmc_blend_matcher **out, char *err,
                          size_t errlen);
void lmc_blend_matcher_free(lmc_blend_matcher *m);

/* Registers the stored range `tokens[0..n_tokens)` (stored at position
 * `position_offset`): window i = tokens[i*cs, (i+1)*cs) under hashes[i]
 * (n_hashes >= n_tokens / cs, hash_len bytes each) for i >= start_chunk.
 * *n_registered = chunks newly registered. */
int lmc_blend_matcher_register(lmc_blend_matcher *m, const lmc_blend_ns *ns,
                               const uint64_t *tokens, size_t n_tokens, const uint8_t *hashes,
                               size_t n_hashes, size_t start_chunk, uint64_t position_offset,
                               size_t *n_registered);

/* The registered chunks of `ns` found in tokens[0..n), ascending cur_st,
 * each once (its first occurrence); overlapping ranges possible.  *out is
 * malloc'ed (free() it), NULL when *n_out == 0. */
int lmc_blend_matcher_match(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint64_t *tokens,
                            size_t n, lmc_blend_candidate **out, size_t *n_out);

/* Removes a chunk (its object left every tier); true if it was registered. */
bool lmc_blend_matcher_remove(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint8_t *hash);

/* The lookup's verdict on a matched chunk: found resets its strikes; stale
 * adds one and removes the chunk at LMC_BLEND_STRIKES (true then).  The
 * caller does not strike chunks whose registration is still in flight. */
void lmc_blend_matcher_found(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint8_t *hash);
bool lmc_blend_matcher_stale(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint8_t *hash);

lmc_blend_matcher_stats lmc_blend_matcher_get_stats(lmc_blend_matcher *m);

#endif
