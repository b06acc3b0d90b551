/* IPCCacheServerKey (docs/protocol.md, "Keys"): decoding, validation and
 * resolution into ObjectKeys.
 *
 * A decoded key borrows its strings from the frame it came from (valid
 * until the RPC call completes) and owns a copy of the token ids
 * widened to uint64_t, because the hasher wants a flat array. */
#ifndef LMC_MODULES_SERVICES_IPC_KEY_H
#define LMC_MODULES_SERVICES_IPC_KEY_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hash/token_hash.h"
#include "storage/object_key.h"

/* Bounds on a key (docs/protocol.md, "Keys" and "Bounds"): the most token
 * ids one key carries (a 16M-token context; 80 MiB on the wire at 5 bytes
 * an id) and the longest request id (sessions and jobs keep a copy). */
#define LMC_KEY_MAX_TOKENS (1u << 24)
#define LMC_REQUEST_ID_MAX 1024

typedef struct {
    const char *model_name;
    size_t model_len;
    uint32_t world_size;        /* 1..255 */
    bool has_worker;            /* false: worker_id None (all ranks) */
    uint32_t worker_id;         /* < world_size when has_worker */
    uint64_t *tokens;           /* owned */
    size_t n_tokens;
    size_t start, end;          /* token positions, chunk-aligned */
    const char *request_id;
    size_t request_id_len;
    const char *cache_salt;     /* "" when absent */
    size_t salt_len;
    uint32_t num_kv_readers;    /* >= 1 (0 on the wire means 1) */
} lmc_ipc_key;

/* Decodes and validates the raw msgpack frame of a key against chunk size
 * `cs` in one pass (no msgpack object tree: a 32k-token key costs a
 * fraction of validating plus unpacking it).  Unknown fields are skipped; a
 * repeated field takes its last value.  Strings are borrowed from `data`.
 * 0, or -1 with a one-line reason in err (nothing to free); -2 instead
 * when that reason is memory, not the key (a MemoryError, not a
 * ValidationError, for the client). */
int lmc_ipc_key_decode_frame(const uint8_t *data, size_t len, uint32_t cs, lmc_ipc_key *out,
                             char *err, size_t errlen);
void lmc_ipc_key_free(lmc_ipc_key *k);

static inline size_t lmc_ipc_key_first_chunk(const lmc_ipc_key *k, uint32_t cs)
{
    return k->start / cs;
}
static inline size_t lmc_ipc_key_num_chunks(const lmc_ipc_key *k, uint32_t cs)
{
    return (k->end - k->start) / cs;
}
static inline uint32_t lmc_ipc_key_num_ranks(const lmc_ipc_key *k)
{
    return k->has_worker ? 1 : k->world_size;
}

/* Builds the ObjectKeys of n_chunks chunks whose hashes are `hashes`
 * (32 bytes each, contiguous), for `groups` object groups and the key's
 * ranks, chunk-major (chunk -> group -> rank): out[(c*groups + g)*R + r].
 * Strings are interned in `in`.  `out` must hold n_chunks*groups*R keys,
 * each of which holds its references: give them back with lmc_keys_drop()
 * (docs/storage.md, "Interned strings").
 * 0, or -1 when interning fails (no memory, or `in` is full). */
int lmc_ipc_key_object_keys(const lmc_ipc_key *k, const uint8_t *hashes, size_t n_chunks,
                            uint32_t groups, lmc_key_interner *in, lmc_object_key *out);
/* The same for a request that only reads or asks: the strings are looked
 * up, never interned (docs/storage.md, "Interned strings").  0, or 1 with
 * `out` untouched when the model name or salt was never interned: then no
 * object has these keys.  Keys hold references as above. */
int lmc_ipc_key_object_keys_find(const lmc_ipc_key *k, const uint8_t *hashes, size_t n_chunks,
                                 uint32_t groups, lmc_key_interner *in, lmc_object_key *out);

#endif
