/* EncodedObjectKeys from JSON documents (docs/coordinator.md, "Key
 * directory"); POST /events bodies are read by coord_events_scan.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "storage/object_key_json.h"

int coordinator_wire_key_parse(const json_t *o, coordinator_wire_key *k, char *why, size_t whylen)
{
    memset(k, 0, sizeof *k);
    lmc_object_key_json_fields f;
    switch (lmc_object_key_json_parse(o, &f)) {
    case LMC_OBJECT_KEY_JSON_OK:
        break;
    case LMC_OBJECT_KEY_JSON_NOT_OBJECT:
        return snprintf(why, whylen, "must be an EncodedObjectKey object"), -1;
    case LMC_OBJECT_KEY_JSON_HASH_LENGTH:
        return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex of 1..32 bytes"), -1;
    case LMC_OBJECT_KEY_JSON_HASH_DIGIT:
        return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex"), -1;
    case LMC_OBJECT_KEY_JSON_MODEL:
        return snprintf(why, whylen, "model_name must be a str of 1..%d bytes without '@'",
                        COORD_MODEL_MAX), -1;
    case LMC_OBJECT_KEY_JSON_SALT:
        return snprintf(why, whylen, "cache_salt must be a str of at most %d bytes without "
                                     "'@', '/' or '\\'", COORD_SALT_MAX), -1;
    case LMC_OBJECT_KEY_JSON_RANK_OR_GROUP:
        return snprintf(why, whylen, "kv_rank and object_group_id must be u32 integers"), -1;
    }
    memcpy(k->hash, f.chunk_hash, f.chunk_hash_len);
    k->hash_len = f.chunk_hash_len;
    k->model = f.model_name;
    k->salt = f.cache_salt;
    k->kv_rank = f.kv_rank;
    k->group = f.object_group_id;
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
    return lmc_object_key_json_of_parts(e->hash, e->hash_len,
                                        coordinator_names_str(&s->models, e->model), e->kv_rank,
                                        e->group, coordinator_names_str(&s->salts, e->salt));
}

