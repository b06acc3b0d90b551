#include "modules/transfer/resolve.h"

#include <stdio.h>
#include <stdlib.h>

#include "modules/kv_events.h"
#include "rpc/wire.h"

bool lmc_transfer_instance_arg(lmc_rpc_call *call, size_t index, int64_t *id)
{
    const msgpack_object *o = lmc_rpc_call_arg(call, index);
    return o && o->type != MSGPACK_OBJECT_BOOLEAN && lmc_mp_get_int(o, id);
}

int lmc_transfer_decode_key(lmc_rpc_call *call, uint32_t cs, const char *no_worker,
                            lmc_ipc_key *key, char *err, size_t errlen)
{
    size_t len;
    const uint8_t *frame = lmc_rpc_call_arg_raw(call, 0, &len);
    if (!frame)
        return snprintf(err, errlen, "missing key frame"), -1;
    int rc = lmc_ipc_key_decode_frame(frame, len, cs, key, err, errlen);
    if (rc != 0)
        return rc == -2 ? -2 : -1;
    if (!key->has_worker) {
        lmc_ipc_key_free(key);
        return snprintf(err, errlen, "%s", no_worker), -1;
    }
    return 0;
}

void lmc_transfer_touch(lmc_liveness *lv, int64_t id)
{
    lmc_liveness_touch(lv, id, lmc_monotonic_ms(NULL), false);
}

static lmc_transfer_keys_result build_keys(lmc_key_interner *in, const lmc_ipc_key *key,
                                           const uint8_t *hashes, size_t n, uint32_t groups,
                                           bool intern, lmc_object_key *keys)
{
    if (!intern)
        return lmc_ipc_key_object_keys_find(key, hashes, n, groups, in, keys) == 0
                   ? LMC_TRANSFER_KEYS_BUILT
                   : LMC_TRANSFER_KEYS_UNKNOWN;
    if (lmc_ipc_key_object_keys(key, hashes, n, groups, in, keys) == 0)
        return LMC_TRANSFER_KEYS_BUILT;
    return lmc_key_interner_full(in) ? LMC_TRANSFER_KEYS_FULL : LMC_TRANSFER_KEYS_NO_MEMORY;
}

/* A store's chunks with their tokens, for the KV event log's stored
 * records (docs/kv_events.md, "Tokens"); the parent of the first chunk of a
 * range that starts past the prompt's first comes from the same session
 * chain, which holds it already. */
static void bind_store_tokens(const lmc_module_ctx *ctx, const lmc_ipc_key *key, size_t n,
                              const uint8_t *hashes)
{
    size_t cs = (size_t)ctx->config->mp.chunk_size;
    uint8_t parent[LMC_TOKEN_HASH_LEN];
    bool has_parent = key->start >= cs;
    if (has_parent && lmc_sessions_hash_range(ctx->sessions, key->request_id, key->request_id_len,
                                              key->tokens, key->n_tokens, key->start - cs,
                                              key->start, parent) != LMC_HASH_OK)
        return;
    lmc_kv_events_bind(ctx->kv_events, hashes, n, LMC_TOKEN_HASH_LEN, key->tokens + key->start,
                       cs, has_parent ? parent : NULL, key->start);
}

int lmc_transfer_chunk_keys(const lmc_module_ctx *ctx, const lmc_ipc_key *key, size_t n,
                            uint32_t groups, bool intern, lmc_transfer_keys *out,
                            char *err, size_t errlen)
{
    out->hashes = malloc(n * LMC_TOKEN_HASH_LEN + 1);
    out->keys = malloc((n * groups + 1) * sizeof *out->keys);
    out->result = LMC_TRANSFER_KEYS_UNKNOWN;
    int rc = out->hashes && out->keys
                 ? lmc_sessions_hash_range(ctx->sessions, key->request_id, key->request_id_len,
                                           key->tokens, key->n_tokens, key->start, key->end,
                                           out->hashes)
                 : LMC_HASH_ENOMEM;
    if (rc != LMC_HASH_OK) {
        snprintf(err, errlen, "hashing failed: %s", lmc_hash_strerror(rc));
        return rc == LMC_HASH_ENOMEM ? -2 : -1;
    }
    if (intern && ctx->kv_events)
        bind_store_tokens(ctx, key, n, out->hashes);
    out->result = build_keys(ctx->interner, key, out->hashes, n, groups, intern, out->keys);
    return 0;
}
