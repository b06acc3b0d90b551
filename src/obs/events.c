/* Event metadata helpers (events.h). */
#include "obs/events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fnv.h"
#include "core/hex.h"

static json_t *hex_array(const uint8_t *hashes, size_t n, size_t len)
{
    json_t *arr = json_array();
    char *hex = malloc(2 * len + 1);
    for (size_t i = 0; arr && hex && i < n; i++) {
        lmc_hex_encode(hashes + i * len, len, hex);
        json_array_append_new(arr, json_stringn_nocheck(hex, 2 * len)); /* ASCII */
    }
    free(hex);
    return arr;
}

json_t *lmc_event_lookup_metadata(const lmc_lookup_event_info *in)
{
    json_t *meta = json_pack(
        "{s:s%, s:s%, s:s%, s:I, s:I, s:I, s:I, s:I}", "request_id",
        in->request_id ? in->request_id : "", in->request_id ? in->request_id_len : 0,
        "model_name", in->model_name ? in->model_name : "", in->model_name ? in->model_len : 0,
        "cache_salt", in->cache_salt ? in->cache_salt : "", in->cache_salt ? in->salt_len : 0,
        "requested_tokens", (json_int_t)in->requested_tokens, "hit_tokens",
        (json_int_t)in->hit_tokens, "hit_tokens_l2", (json_int_t)in->hit_tokens_l2,
        "requested_chunks", (json_int_t)in->requested_chunks, "hit_chunks",
        (json_int_t)in->hit_chunks);
    if (!meta)
        return NULL;
    if (in->hashes && in->n_hashes && in->hash_len)
        json_object_set_new(meta, "chunk_hashes",
                            hex_array(in->hashes, in->n_hashes, in->hash_len));
    if (in->early_exit)
        json_object_set_new(meta, "early_exit", json_string(in->early_exit));
    return meta;
}

lmc_lookup_event_info *lmc_event_lookup_info_dup(const lmc_lookup_event_info *in)
{
    size_t hash_bytes = in->hashes ? in->n_hashes * in->hash_len : 0;
    size_t rid = in->request_id ? in->request_id_len : 0, model = in->model_name ? in->model_len : 0,
           salt = in->cache_salt ? in->salt_len : 0;
    lmc_lookup_event_info *out = malloc(sizeof *out + hash_bytes + rid + model + salt);
    if (!out)
        return NULL;
    *out = *in;
    char *tail = (char *)(out + 1);
    if (hash_bytes)
        out->hashes = memcpy(tail, in->hashes, hash_bytes);
    tail += hash_bytes;
    out->request_id = rid ? memcpy(tail, in->request_id, rid) : NULL;
    tail += rid;
    out->model_name = model ? memcpy(tail, in->model_name, model) : NULL;
    tail += model;
    out->cache_salt = salt ? memcpy(tail, in->cache_salt, salt) : NULL;
    return out; /* early_exit points at a string literal */
}

json_t *lmc_event_lookup_build(void *info_copy)
{
    json_t *meta = lmc_event_lookup_metadata(info_copy);
    free(info_copy);
    return meta;
}

/* FNV-1a, then a 64-bit finaliser so that nearby keys spread evenly. */
static uint64_t key_hash(const char *key)
{
    uint64_t h = lmc_fnv1a64_str(LMC_FNV1A64_OFFSET_BASIS, key);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

bool lmc_obs_sampled(const char *key, double rate)
{
    if (rate >= 1)
        return true;
    if (!(rate > 0) || !key)
        return false;
    double u = (double)(key_hash(key) >> 11) * 0x1p-53; /* uniform in [0, 1) */
    return u < rate;
}

const char *lmc_event_str(const json_t *meta, const char *key)
{
    const char *s = json_string_value(json_object_get(meta, key));
    return s ? s : "";
}

double lmc_event_num(const json_t *meta, const char *key)
{
    const json_t *v = json_object_get(meta, key);
    return json_is_number(v) ? json_number_value(v) : 0;
}

const char *lmc_event_label(const json_t *meta, const char *key, char *buf, size_t len)
{
    const json_t *v = json_object_get(meta, key);
    if (json_is_integer(v)) {
        snprintf(buf, len, "%lld", (long long)json_integer_value(v));
        return buf;
    }
    return lmc_event_str(meta, key);
}
