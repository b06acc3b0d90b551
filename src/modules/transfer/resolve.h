/* The steps both transfer modes take to resolve a transfer op
 * (docs/protocol.md, "Engine-driven transfer ops" and "Server-driven
 * transfer ops"): the instance id and IPC key frames decoded, the worker's
 * liveness touched, the key's chunks hashed and their object keys built.
 * Each mode calls them in its own order around its own context lookup, and
 * answers their failures with its own replies. */
#ifndef LMC_MODULES_TRANSFER_RESOLVE_H
#define LMC_MODULES_TRANSFER_RESOLVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/module.h"
#include "modules/services/ipc_key.h"

/* Frame `index` as an instance id: an int, not a bool. */
bool lmc_transfer_instance_arg(lmc_rpc_call *call, size_t index, int64_t *id);

/* Frame 0, the op's IPC key, for chunk size cs; a key without a worker id
 * is refused with the reason `no_worker`.  0, or -1 / -2 (memory, not the
 * key) with the reason in err and nothing to free. */
int lmc_transfer_decode_key(lmc_rpc_call *call, uint32_t cs, const char *no_worker,
                            lmc_ipc_key *key, char *err, size_t errlen);

/* An op of `id` says its worker is alive (modules/services/reaper.h). */
void lmc_transfer_touch(lmc_liveness *lv, int64_t id);

typedef enum {
    LMC_TRANSFER_KEYS_BUILT,      /* every key holds its string references */
    LMC_TRANSFER_KEYS_UNKNOWN,    /* looked up: a name never interned, no object has them */
    LMC_TRANSFER_KEYS_FULL,       /* interned: the interner is full (--max-interned-strings) */
    LMC_TRANSFER_KEYS_NO_MEMORY,  /* interned: memory ran out */
} lmc_transfer_keys_result;

/* One op's chunk hashes and object keys; both arrays are the caller's to
 * free, whatever the outcome. */
typedef struct {
    uint8_t *hashes;              /* n x LMC_TOKEN_HASH_LEN */
    lmc_object_key *keys;         /* n x groups, chunk-major; filled when BUILT */
    lmc_transfer_keys_result result;
} lmc_transfer_keys;

/* Hashes the key's n chunks (the request's token hashes) and builds their
 * object keys for `groups` object groups: interned when `intern`, else
 * only looked up (docs/storage.md, "Interned strings").  0, with out->result
 * saying what became of the keys; or -1 / -2 (memory) with "hashing
 * failed: ..." in err. */
int lmc_transfer_chunk_keys(const lmc_module_ctx *ctx, const lmc_ipc_key *key, size_t n,
                            uint32_t groups, bool intern, lmc_transfer_keys *out,
                            char *err, size_t errlen);

#endif
