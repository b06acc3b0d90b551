#include "modules/services/ipc_key.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/wire.h"

#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -1)
#define MODEL_RULE LMC_MODEL_NAME_RULE
#define SALT_RULE LMC_CACHE_SALT_RULE

/* ---- one-pass decoding from the raw frame ------------------------------- */

typedef struct {
    bool has_model, has_world, has_worker_field, has_tokens, has_start, has_end, has_rid;
    int64_t world_size, worker_id, start, end, readers;
} key_fields;

static bool name_is(const char *name, size_t len, const char *want)
{
    return strlen(want) == len && memcmp(name, want, len) == 0;
}

static int read_tokens(lmc_mp_reader *r, lmc_ipc_key *k, char *err, size_t errlen)
{
    uint32_t n;
    if (!lmc_mpr_array(r, &n))
        return FAIL("token_ids must be an array of ints");
    if (n > LMC_KEY_MAX_TOKENS)
        return FAIL("token_ids has %u ids; a key carries at most %u token ids", n,
                    LMC_KEY_MAX_TOKENS);
    lmc_ipc_key_free(k); /* a repeated key: the last one wins, as in msgspec */
    k->tokens = malloc((n ? n : 1) * sizeof *k->tokens);
    if (!k->tokens)
        return snprintf(err, errlen, "token_ids: out of memory for %u ids", n), -2;
    k->n_tokens = n;
    size_t got = lmc_mpr_uints(r, n, UINT32_MAX, k->tokens);
    if (got < n)
        return FAIL("token_ids[%zu] is not an int in 0..2^32-1", got);
    return 0;
}

/* int | None field: *present false for None. */
static bool read_opt_int(lmc_mp_reader *r, int64_t *out, bool *present)
{
    *present = !lmc_mpr_nil(r);
    return !*present || lmc_mpr_int(r, out);
}

static int read_field(lmc_mp_reader *r, const char *name, size_t len, lmc_ipc_key *k,
                      key_fields *f, char *err, size_t errlen)
{
    bool present;
    if (name_is(name, len, "token_ids"))
        return f->has_tokens = true, read_tokens(r, k, err, errlen);
    if (name_is(name, len, "model_name"))
        return (f->has_model = lmc_mpr_str(r, &k->model_name, &k->model_len)) ? 0
               : FAIL(MODEL_RULE);
    if (name_is(name, len, "request_id"))
        return (f->has_rid = lmc_mpr_str(r, &k->request_id, &k->request_id_len)) ? 0
               : FAIL("request_id must be a str");
    if (name_is(name, len, "cache_salt")) {
        k->cache_salt = "", k->salt_len = 0;
        return lmc_mpr_nil(r) || lmc_mpr_str(r, &k->cache_salt, &k->salt_len)
                   ? 0 : FAIL(SALT_RULE);
    }
    if (name_is(name, len, "world_size"))
        return (f->has_world = lmc_mpr_int(r, &f->world_size)) ? 0
               : FAIL("world_size must be an int in 1..255");
    if (name_is(name, len, "worker_id")) {
        f->has_worker_field = true;
        if (!read_opt_int(r, &f->worker_id, &k->has_worker))
            return FAIL("worker_id must be None or an int in 0..world_size-1");
        return 0;
    }
    if (name_is(name, len, "start"))
        return (f->has_start = lmc_mpr_int(r, &f->start)) ? 0 : FAIL("start and end must be ints");
    if (name_is(name, len, "end"))
        return (f->has_end = lmc_mpr_int(r, &f->end)) ? 0 : FAIL("start and end must be ints");
    if (name_is(name, len, "num_kv_readers"))
        return read_opt_int(r, &f->readers, &present) ? 0
               : FAIL("num_kv_readers must be a non-negative int");
    return lmc_mpr_skip(r, 32) ? 0 : FAIL("malformed value of field '%.*s'", (int)len, name);
}

/* Field presence, ranges and chunk alignment (docs/protocol.md, "Keys";
 * docs/hashing.md, "1. Chunks and the chain").
 * msgspec is strict inside a struct: a bool where an int is declared does
 * not decode, which lmc_mpr_int already enforces. */
static int check_fields(const key_fields *f, uint32_t cs, lmc_ipc_key *k, char *err,
                        size_t errlen)
{
    if (!f->has_model || !lmc_model_name_valid(k->model_name, k->model_len))
        return FAIL(MODEL_RULE);
    if (!f->has_rid)
        return FAIL("request_id must be a str");
    if (k->request_id_len > LMC_REQUEST_ID_MAX)
        return FAIL("request_id must be at most %d bytes", LMC_REQUEST_ID_MAX);
    if (!lmc_cache_salt_valid(k->cache_salt, k->salt_len))
        return FAIL(SALT_RULE);
    if (!f->has_world || f->world_size < 1 || f->world_size > 255)
        return FAIL("world_size must be an int in 1..255");
    k->world_size = (uint32_t)f->world_size;
    if (!f->has_worker_field)
        return FAIL("worker_id is required (int or None)");
    if (k->has_worker && (f->worker_id < 0 || f->worker_id >= f->world_size))
        return FAIL("worker_id must be None or an int in 0..world_size-1");
    k->worker_id = k->has_worker ? (uint32_t)f->worker_id : 0;
    if (f->readers < 0)
        return FAIL("num_kv_readers must be a non-negative int");
    /* 0 = "field not sent" by older clients: one reader per object. */
    k->num_kv_readers = f->readers == 0 ? 1 : (f->readers > 128 ? 128 : (uint32_t)f->readers);
    if (!f->has_tokens)
        return FAIL("token_ids must be an array of ints");
    if (!f->has_start || !f->has_end)
        return FAIL("start and end must be ints");
    if (f->start < 0 || f->start > f->end || (uint64_t)f->end > k->n_tokens)
        return FAIL("need 0 <= start (%lld) <= end (%lld) <= len(token_ids) (%zu)",
                    (long long)f->start, (long long)f->end, k->n_tokens);
    if (f->start % cs != 0 || f->end % cs != 0)
        return FAIL("start (%lld) and end (%lld) must be multiples of the chunk size %u",
                    (long long)f->start, (long long)f->end, cs);
    k->start = (size_t)f->start;
    k->end = (size_t)f->end;
    return 0;
}

int lmc_ipc_key_decode_frame(const uint8_t *data, size_t len, uint32_t cs, lmc_ipc_key *out,
                             char *err, size_t errlen)
{
    *out = (lmc_ipc_key){.cache_salt = ""};
    key_fields f = {0};
    lmc_mp_reader r;
    uint32_t n;
    int rc = -1;
    lmc_mpr_init(&r, data, len);
    if (!data || !lmc_mpr_map(&r, &n))
        return FAIL("key must be a map (IPCCacheServerKey)");
    for (uint32_t i = 0; i < n; i++) {
        const char *name;
        size_t nlen;
        if (!lmc_mpr_str(&r, &name, &nlen)) {
            snprintf(err, errlen, "key field names must be str");
            goto fail;
        }
        if ((rc = read_field(&r, name, nlen, out, &f, err, errlen)) != 0)
            goto fail;
    }
    if (!lmc_mpr_at_end(&r)) {
        snprintf(err, errlen, "trailing bytes after the key");
        goto fail;
    }
    if ((rc = check_fields(&f, cs, out, err, errlen)) != 0)
        goto fail;
    return 0;
fail:
    /* The caller gets nothing to free and nothing that looks decoded.  rc
     * may still be a field's 0 when a later check failed. */
    lmc_ipc_key_free(out);
    *out = (lmc_ipc_key){.cache_salt = ""};
    return rc == -2 ? -2 : -1;
}

void lmc_ipc_key_free(lmc_ipc_key *k)
{
    free(k->tokens);
    k->tokens = NULL;
    k->n_tokens = 0;
}

static void fill_keys(const lmc_ipc_key *k, const uint8_t *hashes, size_t n_chunks,
                      uint32_t groups, const char *model, const char *salt, lmc_object_key *out)
{
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
                ok->interned = 1;
            }
        }
    }
}

/* Fills `out`, gives every key its references and returns the two the
 * interner handed out. */
static void fill_held_keys(const lmc_ipc_key *k, const uint8_t *hashes, size_t n_chunks,
                           uint32_t groups, const char *model, const char *salt,
                           lmc_object_key *out)
{
    fill_keys(k, hashes, n_chunks, groups, model, salt, out);
    lmc_keys_hold(out, n_chunks * groups * lmc_ipc_key_num_ranks(k));
    lmc_intern_release(model);
    lmc_intern_release(salt);
}

int lmc_ipc_key_object_keys(const lmc_ipc_key *k, const uint8_t *hashes, size_t n_chunks,
                            uint32_t groups, lmc_key_interner *in, lmc_object_key *out)
{
    const char *model = lmc_intern(in, k->model_name, k->model_len);
    const char *salt = model ? lmc_intern(in, k->cache_salt, k->salt_len) : NULL;
    if (!model || !salt) {
        lmc_intern_release(model);
        return -1;
    }
    fill_held_keys(k, hashes, n_chunks, groups, model, salt, out);
    return 0;
}

int lmc_ipc_key_object_keys_find(const lmc_ipc_key *k, const uint8_t *hashes, size_t n_chunks,
                                 uint32_t groups, lmc_key_interner *in, lmc_object_key *out)
{
    const char *model = lmc_intern_find(in, k->model_name, k->model_len);
    const char *salt = model ? lmc_intern_find(in, k->cache_salt, k->salt_len) : NULL;
    if (!model || !salt) {
        lmc_intern_release(model);
        return 1;
    }
    fill_held_keys(k, hashes, n_chunks, groups, model, salt, out);
    return 0;
}
