/* The EncodedObjectKey JSON object, {chunk_hash_hex, model_name, kv_rank,
 * object_group_id = 0, cache_salt = ""} (docs/http.md, "Cached objects"): parsed
 * and rendered here only, for the HTTP frontend, the L2 key listings, the
 * fleet's reports and the coordinator alike. */
#ifndef LMC_STORAGE_OBJECT_KEY_JSON_H
#define LMC_STORAGE_OBJECT_KEY_JSON_H

#include <jansson.h>

#include "storage/object_key.h"

/* A parsed key; the strings point into the JSON object it came from. */
typedef struct {
    uint8_t chunk_hash[LMC_CHUNK_HASH_MAX];
    uint8_t chunk_hash_len;
    const char *model_name;
    const char *cache_salt;
    uint32_t kv_rank;
    uint32_t object_group_id;
} lmc_object_key_json_fields;

/* What is wrong with a key, in the order the fields are checked; each
 * caller words its own answer (their texts differ, and are kept). */
typedef enum {
    LMC_OBJECT_KEY_JSON_OK = 0,
    LMC_OBJECT_KEY_JSON_NOT_OBJECT,
    LMC_OBJECT_KEY_JSON_HASH_LENGTH, /* missing, or not 1..32 bytes of hex */
    LMC_OBJECT_KEY_JSON_HASH_DIGIT,  /* a digit that is not lower-case hex */
    LMC_OBJECT_KEY_JSON_MODEL,
    LMC_OBJECT_KEY_JSON_SALT,
    LMC_OBJECT_KEY_JSON_RANK_OR_GROUP, /* not u32 integers */
} lmc_object_key_json_error;

lmc_object_key_json_error lmc_object_key_json_parse(const json_t *o,
                                                    lmc_object_key_json_fields *out);

/* The JSON object of a key given by its parts; NULL when out of memory. */
json_t *lmc_object_key_json_of_parts(const uint8_t *chunk_hash, size_t chunk_hash_len,
                                     const char *model_name, uint32_t kv_rank,
                                     uint32_t object_group_id, const char *cache_salt);

static inline json_t *lmc_object_key_json(const lmc_object_key *k)
{
    return lmc_object_key_json_of_parts(k->chunk_hash, k->chunk_hash_len, k->model_name,
                                        k->kv_rank, k->object_group_id, k->cache_salt);
}

#endif
