/* EncodedObjectKeys from JSON documents (docs/coordinator.md, "Key
 * directory"); POST /events bodies are read by coord_events_scan.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "storage/object_key.h"

static int hex_nibble(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static bool u32_field(const json_t *v, uint32_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return false;
    *out = (uint32_t)json_integer_value(v);
    return true;
}

int coordinator_wire_key_parse(const json_t *o, coordinator_wire_key *k, char *why, size_t whylen)
{
    memset(k, 0, sizeof *k);
    if (!json_is_object(o))
        return snprintf(why, whylen, "must be an EncodedObjectKey object"), -1;
    const char *hex = json_string_value(json_object_get(o, "chunk_hash_hex"));
    size_t hl = hex ? strlen(hex) : 0;
    if (!hex || hl == 0 || hl % 2 || hl > 2 * COORD_HASH_MAX)
        return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex of 1..32 bytes"), -1;
    for (size_t i = 0; i < hl / 2; i++) {
        int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex"), -1;
        k->hash[i] = (uint8_t)(hi << 4 | lo);
    }
    k->hash_len = (uint8_t)(hl / 2);
    k->model = json_string_value(json_object_get(o, "model_name"));
    if (!k->model || !lmc_model_name_valid(k->model, strlen(k->model)))
        return snprintf(why, whylen, "model_name must be a str of 1..%d bytes without '@'",
                        COORD_MODEL_MAX), -1;
    json_t *salt = json_object_get(o, "cache_salt");
    k->salt = salt ? json_string_value(salt) : "";
    if (!k->salt || !lmc_cache_salt_valid(k->salt, strlen(k->salt)))
        return snprintf(why, whylen, "cache_salt must be a str of at most %d bytes without "
                                     "'@', '/' or '\\'", COORD_SALT_MAX), -1;
    json_t *group = json_object_get(o, "object_group_id");
    if (!u32_field(json_object_get(o, "kv_rank"), &k->kv_rank) ||
        (group && !u32_field(group, &k->group)))
        return snprintf(why, whylen, "kv_rank and object_group_id must be u32 integers"), -1;
    return 0;
}

bool coordinator_wire_key_resolve(coordinator_state *s, const coordinator_wire_key *w, bool intern, coordinator_key *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->hash, w->hash, w->hash_len);
    out->hash_len = w->hash_len;
    out->kv_rank = w->kv_rank;
    out->group = w->group;
    size_t ml = w->model_len ? w->model_len : strlen(w->model);
    size_t sl = w->salt_len ? w->salt_len : strlen(w->salt);
    out->model = coordinator_names_lookup(&s->models, &s->model_memo, w->model, ml, intern);
    out->salt = coordinator_names_lookup(&s->salts, &s->salt_memo, w->salt, sl, intern);
    return out->model != COORD_NONE && out->salt != COORD_NONE;
}

json_t *coordinator_entry_json(const coordinator_state *s, const coordinator_entry *e)
{
    char hex[2 * COORD_HASH_MAX + 1];
    for (uint8_t i = 0; i < e->hash_len; i++)
        snprintf(hex + 2 * i, 3, "%02x", e->hash[i]);
    hex[2 * e->hash_len] = '\0';
    return json_pack("{s:s, s:s, s:I, s:I, s:s}", "chunk_hash_hex", hex, "model_name",
                     coordinator_names_str(&s->models, e->model), "kv_rank", (json_int_t)e->kv_rank,
                     "object_group_id", (json_int_t)e->group, "cache_salt",
                     coordinator_names_str(&s->salts, e->salt));
}

