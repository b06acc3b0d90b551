/* vLLM block hashes for the KV event publisher (docs/kv_events.md, "vLLM
 * block hashes").  The chain itself is src/hash's sha256_cbor with the
 * chunk size set to vLLM's block size: the same bytes as vLLM's
 * hash_block_tokens (docs/compatibility.md, "KV event publisher"). */
#include "modules/kv_events_vllm.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fnv.h"
#include "hash/token_hash.h"
#include "storage/object_key.h"

#define WAYS 4

typedef struct {
    uint64_t stamp;          /* last use; 0 = empty */
    uint8_t key[LMC_CHUNK_HASH_MAX];
    uint32_t key_len, n;
    bool has_parent;
    uint64_t parent;
    uint8_t last[LMC_TOKEN_HASH_LEN]; /* the chunk's last block: the next chunk's parent */
} slot;

struct lmc_kv_events_vllm {
    lmc_token_hasher *hasher;
    uint32_t block_size, max_blocks;
    size_t n_sets;           /* a power of two */
    slot *slots;             /* n_sets * WAYS */
    uint64_t *ints;          /* max_blocks per slot */
    uint64_t clock;
    uint64_t *tokens;        /* scratch: one chunk's tokens */
    uint8_t *digests;        /* scratch: one chunk's block hashes */
    atomic_uint_fast64_t chunks, unchained, unknown_removed;
};

uint64_t lmc_kv_events_vllm_int(const uint8_t *hash, size_t len)
{
    uint64_t v = 0;
    for (size_t i = len > 8 ? len - 8 : 0; i < len; i++)
        v = v << 8 | hash[i];
    return v;
}

/* Sets of WAYS slots within LMC_KV_EVENTS_VLLM_MAX_BYTES, a power of two. */
static size_t table_sets(uint32_t max_blocks)
{
    size_t per_set = WAYS * (sizeof(slot) + (size_t)max_blocks * sizeof(uint64_t));
    size_t sets = LMC_KV_EVENTS_VLLM_MAX_CHUNKS / WAYS;
    while (sets > 1 && sets * per_set > LMC_KV_EVENTS_VLLM_MAX_BYTES)
        sets /= 2;
    return sets;
}

lmc_kv_events_vllm *lmc_kv_events_vllm_new(uint32_t block_size, uint32_t chunk_size,
                                           const char *seed, char *err, size_t errlen)
{
    lmc_kv_events_vllm *v = calloc(1, sizeof *v);
    if (!v || block_size == 0 || chunk_size % block_size != 0 || chunk_size == 0) {
        snprintf(err, errlen, "--kv-events-block-size: %s",
                 v ? "must divide --chunk-size" : "out of memory");
        free(v);
        return NULL;
    }
    v->block_size = block_size;
    v->max_blocks = chunk_size / block_size;
    v->n_sets = table_sets(v->max_blocks);
    v->slots = calloc(v->n_sets * WAYS, sizeof *v->slots);
    v->ints = calloc(v->n_sets * WAYS * v->max_blocks, sizeof *v->ints);
    v->tokens = calloc(chunk_size, sizeof *v->tokens);
    v->digests = calloc(v->max_blocks, LMC_TOKEN_HASH_LEN);
    if (!v->slots || !v->ints || !v->tokens || !v->digests) {
        snprintf(err, errlen, "--kv-events-block-size: out of memory");
        goto fail;
    }
    char why[256] = "";
    if (lmc_token_hasher_new("sha256_cbor", block_size, seed, &v->hasher, why, sizeof why) != 0) {
        snprintf(err, errlen, "--kv-events-block-size: %s", why);
        goto fail;
    }
    return v;
fail:
    lmc_kv_events_vllm_free(v);
    return NULL;
}

void lmc_kv_events_vllm_free(lmc_kv_events_vllm *v)
{
    if (!v)
        return;
    lmc_token_hasher_free(v->hasher);
    free(v->slots);
    free(v->ints);
    free(v->tokens);
    free(v->digests);
    free(v);
}

static slot *set_of(lmc_kv_events_vllm *v, const uint8_t *key, size_t len)
{
    uint64_t h = lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, key, len);
    return &v->slots[(size_t)(h & (v->n_sets - 1)) * WAYS];
}

static slot *find(lmc_kv_events_vllm *v, const uint8_t *key, size_t len)
{
    slot *set = set_of(v, key, len);
    for (int w = 0; w < WAYS; w++) {
        slot *s = &set[w];
        if (s->stamp && s->key_len == len && memcmp(s->key, key, len) == 0) {
            s->stamp = ++v->clock;
            return s;
        }
    }
    return NULL;
}

/* The set's empty slot or its least recently used one, now holding key. */
static slot *claim(lmc_kv_events_vllm *v, const uint8_t *key, size_t len)
{
    slot *set = set_of(v, key, len), *s = &set[0];
    for (int w = 1; w < WAYS && s->stamp; w++)
        if (set[w].stamp < s->stamp)
            s = &set[w];
    if (!s->stamp)
        atomic_fetch_add(&v->chunks, 1);
    memset(s, 0, sizeof *s);
    memcpy(s->key, key, len);
    s->key_len = (uint32_t)len;
    s->stamp = ++v->clock;
    return s;
}

static uint64_t *ints_of(lmc_kv_events_vllm *v, const slot *s)
{
    return &v->ints[(size_t)(s - v->slots) * v->max_blocks];
}

static void describe(lmc_kv_events_vllm *v, const slot *s, lmc_kv_events_vllm_blocks *out)
{
    *out = (lmc_kv_events_vllm_blocks){ints_of(v, s), s->n, s->has_parent, s->parent};
}

/* Hashes n blocks of tokens onto `prefix` into a slot for key. */
static slot *hash_blocks(lmc_kv_events_vllm *v, const uint8_t *key, size_t len,
                         const uint8_t *prefix, const uint32_t *tokens, uint32_t n)
{
    size_t n_tokens = (size_t)n * v->block_size;
    for (size_t i = 0; i < n_tokens; i++)
        v->tokens[i] = tokens[i];
    if (lmc_hash_chunks_from(v->hasher, prefix, v->tokens, n, v->digests) != LMC_HASH_OK)
        return NULL;
    slot *s = claim(v, key, len);
    s->n = n;
    uint64_t *ints = ints_of(v, s);
    for (uint32_t i = 0; i < n; i++)
        ints[i] = lmc_kv_events_vllm_int(v->digests + (size_t)i * LMC_TOKEN_HASH_LEN,
                                         LMC_TOKEN_HASH_LEN);
    memcpy(s->last, v->digests + (size_t)(n - 1) * LMC_TOKEN_HASH_LEN, LMC_TOKEN_HASH_LEN);
    return s;
}

int lmc_kv_events_vllm_stored(lmc_kv_events_vllm *v, const uint8_t *chunk_hash,
                              size_t hash_len, const uint8_t *parent, const uint32_t *tokens,
                              size_t n_tokens, lmc_kv_events_vllm_blocks *out)
{
    size_t n = n_tokens / v->block_size;
    if (n == 0 || n > v->max_blocks || hash_len == 0 || hash_len > LMC_CHUNK_HASH_MAX)
        return 0;
    slot *s = find(v, chunk_hash, hash_len);
    if (s) {   /* the same chunk hash names the same prefix: the same blocks */
        describe(v, s, out);
        return 1;
    }
    uint8_t prefix[LMC_TOKEN_HASH_LEN];
    bool has_parent = parent != NULL;
    uint64_t parent_int = 0;
    if (has_parent) {
        const slot *p = find(v, parent, hash_len);
        if (!p) {
            atomic_fetch_add(&v->unchained, 1);
            return 0;
        }
        memcpy(prefix, p->last, sizeof prefix);   /* claim() may reuse p's slot */
        parent_int = ints_of(v, p)[p->n - 1];
    } else {
        memcpy(prefix, lmc_token_hasher_none_hash(v->hasher), sizeof prefix);
    }
    s = hash_blocks(v, chunk_hash, hash_len, prefix, tokens, (uint32_t)n);
    if (!s)
        return 0;
    s->has_parent = has_parent;
    s->parent = parent_int;
    describe(v, s, out);
    return 1;
}

const uint64_t *lmc_kv_events_vllm_removed(lmc_kv_events_vllm *v, const uint8_t *chunk_hash,
                                           size_t hash_len, size_t *n)
{
    const slot *s = hash_len <= LMC_CHUNK_HASH_MAX ? find(v, chunk_hash, hash_len) : NULL;
    if (!s) {
        atomic_fetch_add(&v->unknown_removed, 1);
        *n = 0;
        return NULL;
    }
    *n = s->n;
    return ints_of(v, s);
}

void lmc_kv_events_vllm_get_stats(lmc_kv_events_vllm *v, lmc_kv_events_vllm_stats *out)
{
    out->chunks = atomic_load(&v->chunks);
    out->unchained = atomic_load(&v->unchained);
    out->unknown_removed = atomic_load(&v->unknown_removed);
}
