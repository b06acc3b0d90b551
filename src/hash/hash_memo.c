#include "hash/hash_memo.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "hash/token_hash.h"

#define WAYS 4

/* One slot: fixed header, then chunk_size uint32 tokens. */
typedef struct {
    uint64_t tag;            /* 0 = empty (tags are forced non-zero) */
    uint8_t prev[LMC_TOKEN_HASH_LEN];
    uint8_t hash[LMC_TOKEN_HASH_LEN];
    uint32_t tokens[];
} memo_slot;

struct lmc_hash_memo {
    pthread_mutex_t mutex;   /* guards everything below */
    uint32_t chunk_size;
    size_t slot_bytes;
    size_t num_sets;         /* power of two */
    uint8_t *slots;          /* num_sets * WAYS slots, slots_len bytes mapped */
    size_t slots_len;
    uint8_t *next_victim;    /* per set, round robin */
    uint64_t hits, misses;
    size_t entries;
};

lmc_hash_memo *lmc_hash_memo_new(uint32_t chunk_size, size_t budget_bytes)
{
    size_t slot_bytes = sizeof(memo_slot) + (size_t)chunk_size * sizeof(uint32_t);
    slot_bytes = (slot_bytes + 7) & ~(size_t)7;
    size_t sets = 1;
    while (sets * 2 * WAYS * slot_bytes <= budget_bytes)
        sets *= 2;
    if (chunk_size == 0 || sets * WAYS * slot_bytes > budget_bytes)
        return NULL;
    lmc_hash_memo *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->chunk_size = chunk_size;
    m->slot_bytes = slot_bytes;
    m->num_sets = sets;
    /* Before anything can fail: lmc_hash_memo_free() destroys it. */
    pthread_mutex_init(&m->mutex, NULL);
    /* Faulted in now, written: the slots are read before they are first
     * written, so lazily mapped zero pages would each take a copy-on-write
     * fault later, whose TLB flush interrupts every other CPU the server
     * runs on (a few % of a transfer's copy time until the memo is full,
     * BENCHMARKS.md "Server-driven transfers"). */
    m->slots_len = sets * WAYS * slot_bytes;
    void *slots = mmap(NULL, m->slots_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    m->slots = slots == MAP_FAILED ? NULL : slots;
    m->next_victim = calloc(sets, 1);
    if (!m->slots || !m->next_victim) {
        lmc_hash_memo_free(m);
        return NULL;
    }
    return m;
}

void lmc_hash_memo_free(lmc_hash_memo *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mutex);
    if (m->slots)
        munmap(m->slots, m->slots_len);
    free(m->next_victim);
    free(m);
}

static uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* A quick 64-bit mix of prev and 16 tokens spread over the chunk.  It only
 * selects a set and rejects most mismatches early: equality is always
 * verified over every token, so chunks that agree on the sampled tokens
 * merely share a set (4 ways).  Sampling keeps a memo hit at one pass over
 * the tokens (the compare) instead of two. */
static uint64_t tag_of(const uint8_t *prev, const uint64_t *tokens, uint32_t n)
{
    const uint64_t k = 0x9e3779b97f4a7c15ULL;
    uint64_t h = load64(prev) ^ load64(prev + 8) * 3 ^ load64(prev + 16) * 5 ^ load64(prev + 24) * 7;
    uint32_t step = n >= 16 ? n / 16 : 1;
    for (uint32_t i = 0; i < n; i += step)
        h = (h ^ tokens[i]) * k;
    h ^= tokens[n - 1];
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return h ? h : 1;
}

static memo_slot *slot_at(const lmc_hash_memo *m, size_t set, size_t way)
{
    return (memo_slot *)(m->slots + (set * WAYS + way) * m->slot_bytes);
}

static bool same_step(const lmc_hash_memo *m, const memo_slot *s, uint64_t tag,
                      const uint8_t *prev, const uint64_t *tokens)
{
    if (s->tag != tag || memcmp(s->prev, prev, LMC_TOKEN_HASH_LEN) != 0)
        return false;
    uint64_t diff = 0;   /* no early exit: a tag match is almost always a hit */
    for (uint32_t i = 0; i < m->chunk_size; i++)
        diff |= s->tokens[i] ^ tokens[i];
    return diff == 0;
}

bool lmc_hash_memo_get(lmc_hash_memo *m, const uint8_t *prev, const uint64_t *tokens,
                       uint8_t *out)
{
    uint64_t tag = tag_of(prev, tokens, m->chunk_size);
    size_t set = tag & (m->num_sets - 1);
    bool hit = false;
    pthread_mutex_lock(&m->mutex);
    for (size_t w = 0; w < WAYS && !hit; w++) {
        const memo_slot *s = slot_at(m, set, w);
        if (same_step(m, s, tag, prev, tokens)) {
            memcpy(out, s->hash, LMC_TOKEN_HASH_LEN);
            hit = true;
        }
    }
    hit ? m->hits++ : m->misses++;
    pthread_mutex_unlock(&m->mutex);
    return hit;
}

void lmc_hash_memo_put(lmc_hash_memo *m, const uint8_t *prev, const uint64_t *tokens,
                       const uint8_t *hash)
{
    for (uint32_t i = 0; i < m->chunk_size; i++)
        if (tokens[i] > UINT32_MAX)
            return;
    uint64_t tag = tag_of(prev, tokens, m->chunk_size);
    size_t set = tag & (m->num_sets - 1);
    pthread_mutex_lock(&m->mutex);
    size_t way = WAYS;
    for (size_t w = 0; w < WAYS && way == WAYS; w++) {
        memo_slot *s = slot_at(m, set, w);
        if (s->tag == 0 || same_step(m, s, tag, prev, tokens))
            way = w;   /* a free slot, or a racing thread stored it already */
    }
    if (way == WAYS) {
        way = m->next_victim[set];
        m->next_victim[set] = (uint8_t)((way + 1) % WAYS);
    }
    memo_slot *s = slot_at(m, set, way);
    m->entries += s->tag == 0;
    s->tag = tag;
    memcpy(s->prev, prev, LMC_TOKEN_HASH_LEN);
    memcpy(s->hash, hash, LMC_TOKEN_HASH_LEN);
    for (uint32_t i = 0; i < m->chunk_size; i++)
        s->tokens[i] = (uint32_t)tokens[i];
    pthread_mutex_unlock(&m->mutex);
}

lmc_hash_memo_stats lmc_hash_memo_get_stats(lmc_hash_memo *m)
{
    pthread_mutex_lock(&m->mutex);
    lmc_hash_memo_stats st = {m->hits, m->misses, m->entries, m->num_sets * WAYS};
    pthread_mutex_unlock(&m->mutex);
    return st;
}
