/* Cached, extendable chunk-hash chains (one per request id).
 *
 * A request's token list usually only grows between calls (prefill, then
 * decode), so re-hashing from chunk 0 every time would be quadratic.  The
 * chain keeps the hashes computed so far together with a 4-byte copy of the
 * tokens they cover; a new call compares its tokens with that copy (cheap
 * next to hashing) and recomputes only from the first chunk that changed. */
#include "hash/token_hash.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct lmc_hash_chain {
    const lmc_token_hasher *h;
    uint8_t *hashes;   /* count * 32 bytes */
    uint32_t *tokens;  /* count * chunk_size tokens covered by `hashes` */
    size_t count;      /* chunks hashed */
    size_t cap;        /* chunks allocated in both arrays */
};

lmc_hash_chain *lmc_hash_chain_new(const lmc_token_hasher *h)
{
    lmc_hash_chain *c = calloc(1, sizeof *c);
    if (c)
        c->h = h;
    return c;
}

void lmc_hash_chain_free(lmc_hash_chain *c)
{
    if (!c)
        return;
    free(c->hashes);
    free(c->tokens);
    free(c);
}

void lmc_hash_chain_reset(lmc_hash_chain *c)
{
    c->count = 0;
}

size_t lmc_hash_chain_count(const lmc_hash_chain *c)
{
    return c->count;
}

const uint8_t *lmc_hash_chain_get(const lmc_hash_chain *c, size_t i)
{
    return i < c->count ? c->hashes + i * LMC_TOKEN_HASH_LEN : NULL;
}

/* Number of leading chunks among the first `k` whose tokens are unchanged. */
static size_t unchanged_chunks(const lmc_hash_chain *c, const uint64_t *tokens, size_t k)
{
    const size_t cs = lmc_token_hasher_chunk_size(c->h);
    for (size_t chunk = 0; chunk < k; chunk++) {
        uint64_t diff = 0;
        for (size_t i = chunk * cs; i < (chunk + 1) * cs; i++)
            diff |= tokens[i] ^ c->tokens[i];
        if (diff)
            return chunk;
    }
    return k;
}

/* Grows both arrays to hold at least `want` chunks (geometrically, so a
 * token list growing one chunk at a time costs amortised O(1) copies). */
static bool reserve(lmc_hash_chain *c, size_t want)
{
    if (want <= c->cap)
        return true;
    const size_t cs = lmc_token_hasher_chunk_size(c->h);
    /* Doubling serves a list that grows a chunk at a time; a first call
     * with a whole prompt gets exactly its size. */
    size_t cap = c->cap ? c->cap * 2 : 4;
    if (cap < want || cap < c->cap)
        cap = want;
    if (cap > SIZE_MAX / LMC_TOKEN_HASH_LEN || cap > SIZE_MAX / sizeof(uint32_t) / cs)
        return false;
    uint8_t *hashes = realloc(c->hashes, cap * LMC_TOKEN_HASH_LEN);
    if (!hashes)
        return false;
    c->hashes = hashes;
    uint32_t *toks = realloc(c->tokens, cap * cs * sizeof(uint32_t));
    if (!toks)
        return false;
    c->tokens = toks;
    c->cap = cap;
    return true;
}

/* Index of the first chunk in [from, to) holding a token >= 2^32, else `to`.
 * Checked a chunk at a time without a per-token branch, so it vectorizes. */
static size_t first_bad_chunk(const uint64_t *tokens, size_t cs, size_t from, size_t to)
{
    for (size_t c = from; c < to; c++) {
        uint64_t high = 0;
        for (size_t i = c * cs; i < (c + 1) * cs; i++)
            high |= tokens[i] >> 32;
        if (high)
            return c;
    }
    return to;
}

/* Hashes chunks count..want-1 and records their tokens.  A bad token stops
 * the chain just before its chunk, so the chain stays a valid prefix. */
static int hash_tail(lmc_hash_chain *c, const uint64_t *tokens, size_t want)
{
    const size_t cs = lmc_token_hasher_chunk_size(c->h);
    const size_t good = first_bad_chunk(tokens, cs, c->count, want);
    const uint8_t *prefix = c->count ? c->hashes + (c->count - 1) * LMC_TOKEN_HASH_LEN
                                     : lmc_token_hasher_none_hash(c->h);
    int rc = lmc_hash_chunks_from(c->h, prefix, tokens + c->count * cs, good - c->count,
                                  c->hashes + c->count * LMC_TOKEN_HASH_LEN);
    if (rc != LMC_HASH_OK)
        return rc; /* count unchanged: the new hashes are simply not adopted */
    for (size_t i = c->count * cs; i < good * cs; i++)
        c->tokens[i] = (uint32_t)tokens[i];
    c->count = good;
    return good == want ? LMC_HASH_OK : LMC_HASH_ETOKEN;
}

int lmc_hash_chain_extend_to(lmc_hash_chain *c, const uint64_t *tokens, size_t n_tokens,
                             size_t end)
{
    const size_t cs = lmc_token_hasher_chunk_size(c->h);
    if (end % cs || end > n_tokens)
        return LMC_HASH_ERANGE;
    const size_t want = end / cs;
    const size_t overlap = want < c->count ? want : c->count;
    const size_t same = unchanged_chunks(c, tokens, overlap);
    if (same < overlap)
        c->count = same; /* everything from the first changed chunk is stale */
    if (want <= c->count)
        return LMC_HASH_OK;
    if (!reserve(c, want))
        return LMC_HASH_ENOMEM;
    return hash_tail(c, tokens, want);
}

int lmc_hash_chain_extend(lmc_hash_chain *c, const uint64_t *tokens, size_t n_tokens)
{
    const size_t cs = lmc_token_hasher_chunk_size(c->h);
    return lmc_hash_chain_extend_to(c, tokens, n_tokens, n_tokens - n_tokens % cs);
}
