/* The EncodedObjectKey JSON codec (docs/http.md, "Cached objects"). */
#include "storage/object_key_json.h"

#include <string.h>

#include "core/hex.h"

static bool u32_field(const json_t *v, uint32_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return false;
    *out = (uint32_t)json_integer_value(v);
    return true;
}

lmc_object_key_json_error lmc_object_key_json_parse(const json_t *o,
                                                    lmc_object_key_json_fields *out)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(o))
        return LMC_OBJECT_KEY_JSON_NOT_OBJECT;
    const char *hex = json_string_value(json_object_get(o, "chunk_hash_hex"));
    size_t hex_len = hex ? strlen(hex) : 0;
    if (hex_len == 0 || hex_len % 2 || hex_len > 2 * LMC_CHUNK_HASH_MAX)
        return LMC_OBJECT_KEY_JSON_HASH_LENGTH;
    if (!lmc_hex_decode(hex, hex_len / 2, out->chunk_hash))
        return LMC_OBJECT_KEY_JSON_HASH_DIGIT;
    out->chunk_hash_len = (uint8_t)(hex_len / 2);
    out->model_name = json_string_value(json_object_get(o, "model_name"));
    if (!out->model_name || !lmc_model_name_valid(out->model_name, strlen(out->model_name)))
        return LMC_OBJECT_KEY_JSON_MODEL;
    const json_t *salt = json_object_get(o, "cache_salt");
    out->cache_salt = salt ? json_string_value(salt) : "";
    if (!out->cache_salt || !lmc_cache_salt_valid(out->cache_salt, strlen(out->cache_salt)))
        return LMC_OBJECT_KEY_JSON_SALT;
    const json_t *group = json_object_get(o, "object_group_id");
    if (!u32_field(json_object_get(o, "kv_rank"), &out->kv_rank) ||
        (group && !u32_field(group, &out->object_group_id)))
        return LMC_OBJECT_KEY_JSON_RANK_OR_GROUP;
    return LMC_OBJECT_KEY_JSON_OK;
}

json_t *lmc_object_key_json_of_parts(const uint8_t *chunk_hash, size_t chunk_hash_len,
                                     const char *model_name, uint32_t kv_rank,
                                     uint32_t object_group_id, const char *cache_salt)
{
    char hex[2 * LMC_CHUNK_HASH_MAX + 1];
    if (chunk_hash_len > LMC_CHUNK_HASH_MAX)
        chunk_hash_len = LMC_CHUNK_HASH_MAX;
    lmc_hex_encode(chunk_hash, chunk_hash_len, hex);
    return json_pack("{s:s, s:s, s:I, s:I, s:s}", "chunk_hash_hex", hex, "model_name", model_name,
                     "kv_rank", (json_int_t)kv_rank, "object_group_id",
                     (json_int_t)object_group_id, "cache_salt", cache_salt);
}
