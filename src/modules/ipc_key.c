#include "modules/ipc_key.h"

#include <stdio.h>
#include <stdlib.h>

#include "rpc/wire.h"

#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -1)

/* Required int field that must not be a bool (msgspec is strict inside a
 * struct: a bool where an int is declared does not decode). */
static int get_strict_int(const msgpack_object *map, const char *name, int64_t *out)
{
    const msgpack_object *o = lmc_mp_map_get(map, name);
    if (!o || o->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_int(o, out))
        return -1;
    return 0;
}

static int decode_tokens(const msgpack_object *arr, lmc_ipc_key *k, char *err, size_t errlen)
{
    if (!arr || arr->type != MSGPACK_OBJECT_ARRAY)
        return FAIL("token_ids must be an array of ints");
    k->n_tokens = arr->via.array.size;
    k->tokens = malloc((k->n_tokens ? k->n_tokens : 1) * sizeof *k->tokens);
    if (!k->tokens)
        return FAIL("out of memory");
    for (size_t i = 0; i < k->n_tokens; i++) {
        const msgpack_object *t = &arr->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
            return FAIL("token_ids[%zu] is not an int in 0..2^32-1", i);
        k->tokens[i] = t->via.u64;
    }
    return 0;
}

static int decode_strings(const msgpack_object *o, lmc_ipc_key *k, char *err, size_t errlen)
{
    const msgpack_object *m = lmc_mp_map_get(o, "model_name");
    if (!m || !lmc_mp_get_str(m, &k->model_name, &k->model_len) ||
        !lmc_model_name_valid(k->model_name, k->model_len))
        return FAIL("model_name must be a non-empty str without '@'");
    const msgpack_object *r = lmc_mp_map_get(o, "request_id");
    if (!r || !lmc_mp_get_str(r, &k->request_id, &k->request_id_len))
        return FAIL("request_id must be a str");
    const msgpack_object *s = lmc_mp_map_get(o, "cache_salt");
    k->cache_salt = "";
    k->salt_len = 0;
    if (s && !lmc_mp_is_nil(s) &&
        (!lmc_mp_get_str(s, &k->cache_salt, &k->salt_len) ||
         !lmc_cache_salt_valid(k->cache_salt, k->salt_len)))
        return FAIL("cache_salt must be a str of at most 128 chars without '@/\\'");
    return 0;
}

static int decode_ranks(const msgpack_object *o, lmc_ipc_key *k, char *err, size_t errlen)
{
    int64_t ws, wid, readers = 0;
    if (get_strict_int(o, "world_size", &ws) != 0 || ws < 1 || ws > 255)
        return FAIL("world_size must be an int in 1..255");
    k->world_size = (uint32_t)ws;
    const msgpack_object *w = lmc_mp_map_get(o, "worker_id");
    if (!w)
        return FAIL("worker_id is required (int or None)");
    k->has_worker = !lmc_mp_is_nil(w);
    if (k->has_worker) {
        if (get_strict_int(o, "worker_id", &wid) != 0 || wid < 0 || wid >= ws)
            return FAIL("worker_id must be None or an int in 0..world_size-1");
        k->worker_id = (uint32_t)wid;
    }
    const msgpack_object *nr = lmc_mp_map_get(o, "num_kv_readers");
    if (nr && !lmc_mp_is_nil(nr) &&
        (get_strict_int(o, "num_kv_readers", &readers) != 0 || readers < 0))
        return FAIL("num_kv_readers must be a non-negative int");
    /* 0 = "field not sent" by older clients: one reader per object. */
    k->num_kv_readers = readers == 0 ? 1 : (readers > 128 ? 128 : (uint32_t)readers);
    return 0;
}

static int decode_range(const msgpack_object *o, uint32_t cs, lmc_ipc_key *k, char *err,
                        size_t errlen)
{
    int64_t start, end;
    if (get_strict_int(o, "start", &start) != 0 || get_strict_int(o, "end", &end) != 0)
        return FAIL("start and end must be ints");
    if (start < 0 || start > end || (uint64_t)end > k->n_tokens)
        return FAIL("need 0 <= start (%lld) <= end (%lld) <= len(token_ids) (%zu)",
                    (long long)start, (long long)end, k->n_tokens);
    if (start % cs != 0 || end % cs != 0)
        return FAIL("start (%lld) and end (%lld) must be multiples of the chunk size %u",
                    (long long)start, (long long)end, cs);
    k->start = (size_t)start;
    k->end = (size_t)end;
    return 0;
}

int lmc_ipc_key_decode(const msgpack_object *o, uint32_t cs, lmc_ipc_key *out, char *err,
                       size_t errlen)
{
    *out = (lmc_ipc_key){0};
    if (!o || o->type != MSGPACK_OBJECT_MAP)
        return FAIL("key must be a map (IPCCacheServerKey)");
    if (decode_strings(o, out, err, errlen) != 0 || decode_ranks(o, out, err, errlen) != 0 ||
        decode_tokens(lmc_mp_map_get(o, "token_ids"), out, err, errlen) != 0 ||
        decode_range(o, cs, out, err, errlen) != 0) {
        lmc_ipc_key_free(out);
        return -1;
    }
    return 0;
}

void lmc_ipc_key_free(lmc_ipc_key *k)
{
    free(k->tokens);
    k->tokens = NULL;
}

int lmc_ipc_key_object_keys(const lmc_ipc_key *k, const uint8_t *hashes, size_t n_chunks,
                            uint32_t groups, lmc_key_interner *in, lmc_object_key *out)
{
    const char *model = lmc_intern(in, k->model_name, k->model_len);
    const char *salt = lmc_intern(in, k->cache_salt, k->salt_len);
    if (!model || !salt)
        return -1;
    uint32_t nranks = lmc_ipc_key_num_ranks(k);
    size_t i = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        for (uint32_t g = 0; g < groups; g++) {
            for (uint32_t r = 0; r < nranks; r++, i++) {
                lmc_object_key *ok = &out[i];
                uint32_t rank = k->has_worker ? k->worker_id : r;
                memcpy(ok->chunk_hash, hashes + c * LMC_TOKEN_HASH_LEN, LMC_TOKEN_HASH_LEN);
                ok->chunk_hash_len = LMC_TOKEN_HASH_LEN;
                ok->kv_rank = lmc_kv_rank_for_worker(k->world_size, rank);
                ok->object_group_id = g;
                ok->model_name = model;
                ok->cache_salt = salt;
            }
        }
    }
    return 0;
}
