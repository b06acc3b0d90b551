/* The fleet CacheBlend fragment index (docs/coordinator.md, "Blend
 * lookup"): which stored chunks hold which exact chunk_size tokens, fed
 * from the token-bearing STORE entries of the cache-event stream, asked
 * by POST /directory/blend-lookup for chunks found anywhere in a prompt.
 *
 * One content (its tokens, under the polynomial fingerprint of
 * src/hash/poly_fingerprint.h) may be held by several chunk hashes (the
 * same text stored after different prefixes); each (namespace, chunk hash)
 * is one claim, with the position the chunk was stored at.  A fingerprint
 * hit is confirmed token by token, so a collision never matches.
 *
 * Memory: at most max_chunks claims (a store past it is refused and
 * counted); per claim its names and, per distinct content, chunk_size
 * uint32 tokens.  Memory only: a restart starts empty.
 *
 * Thread safety: one mutex of its own; the coordinator's lock is never
 * held while it is taken, except by the feed of the cache events,
 * which reads the directory (coordinator lock, then this one). */
#ifndef LMC_COORDINATOR_COORD_BLEND_H
#define LMC_COORDINATOR_COORD_BLEND_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/coord_state.h"

#define COORD_BLEND_DEFAULT_MAX_CHUNKS 131072u
#define COORD_BLEND_MAX_MAX_CHUNKS (1u << 24)

typedef struct coordinator_blend coordinator_blend;

typedef struct {
    uint32_t chunk_size;   /* tokens per content, >= 1 */
    uint32_t probe_stride; /* query positions between probes, >= 1 */
    size_t max_chunks;     /* live claims, 1..COORD_BLEND_MAX_MAX_CHUNKS */
    uint64_t fp_mask;      /* tests only: fingerprints & mask (0 = all 64 bits) */
} coordinator_blend_opts;

/* A retrieval namespace: names need not be NUL-terminated. */
typedef struct {
    const char *model, *salt;
    size_t model_len, salt_len;
    uint32_t world_size;
} coordinator_blend_ns;

typedef struct {
    uint8_t hash[COORD_HASH_MAX];
    uint8_t hash_len;
    uint64_t old_st, cur_st;
} coordinator_blend_hit;

typedef struct {
    uint64_t contents, chunks, max_chunks;
    uint64_t added, removed, refused;
} coordinator_blend_stats;

/* NULL on bad options or out of memory. */
coordinator_blend *coordinator_blend_new(const coordinator_blend_opts *o);
void coordinator_blend_free(coordinator_blend *b);

enum { COORD_BLEND_ADDED = 1, COORD_BLEND_KNOWN = 0, COORD_BLEND_FULL = -1, COORD_BLEND_NOMEM = -2 };
/* Records that ns stores chunk `hash` holding tokens[0..chunk_size) at
 * old_st; a claim already there is moved to this content and position. */
int coordinator_blend_add(coordinator_blend *b, const coordinator_blend_ns *ns, const uint8_t *hash,
                          size_t hash_len, const uint32_t *tokens, uint64_t old_st);
/* Forgets ns's claim on hash; true when there was one. */
bool coordinator_blend_remove(coordinator_blend *b, const coordinator_blend_ns *ns,
                              const uint8_t *hash, size_t hash_len);
/* The chunks of ns found in tokens[0..n), ascending cur_st, each chunk
 * hash once (its first position).  *out malloc'ed (NULL when none).
 * 0, or -1 out of memory. */
int coordinator_blend_match(coordinator_blend *b, const coordinator_blend_ns *ns,
                            const uint32_t *tokens, size_t n, coordinator_blend_hit **out,
                            size_t *n_out);
coordinator_blend_stats coordinator_blend_get_stats(coordinator_blend *b);

/* POST /directory/blend-lookup's body, decoded (coord_blend_http.c): the
 * namespace (borrowing body's strings) and the tokens (malloc'ed, free()
 * them, also on failure).  0, or -1 with why naming the field. */
int coordinator_blend_parse_query(const json_t *body, coordinator_blend_ns *ns, uint32_t **tokens,
                                  size_t *n, char *why, size_t whylen);

#endif
