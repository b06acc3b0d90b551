/* POST /events bodies and EncodedObjectKeys, checked field by field
 * (docs/coordinator.md, "Cache events"). */
#include <math.h>
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

int coord_wire_key_parse(const json_t *o, coord_wire_key *k, char *why, size_t whylen)
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

bool coord_wire_key_resolve(coord_state *s, const coord_wire_key *w, bool intern, coord_key *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->hash, w->hash, w->hash_len);
    out->hash_len = w->hash_len;
    out->kv_rank = w->kv_rank;
    out->group = w->group;
    out->model = intern ? coord_names_intern(&s->models, w->model)
                        : coord_names_find(&s->models, w->model);
    out->salt = intern ? coord_names_intern(&s->salts, w->salt)
                       : coord_names_find(&s->salts, w->salt);
    return out->model != COORD_NONE && out->salt != COORD_NONE;
}

json_t *coord_entry_json(const coord_state *s, const coord_entry *e)
{
    char hex[2 * COORD_HASH_MAX + 1];
    for (uint8_t i = 0; i < e->hash_len; i++)
        snprintf(hex + 2 * i, 3, "%02x", e->hash[i]);
    hex[2 * e->hash_len] = '\0';
    return json_pack("{s:s, s:s, s:I, s:I, s:s}", "chunk_hash_hex", hex, "model_name",
                     coord_names_str(&s->models, e->model), "kv_rank", (json_int_t)e->kv_rank,
                     "object_group_id", (json_int_t)e->group, "cache_salt",
                     coord_names_str(&s->salts, e->salt));
}

/* ---- batches ----------------------------------------------------------------- */

static bool nonneg_int(const json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = json_integer_value(v);
    return true;
}

/* An optional non-negative integer field (absent = 0). */
static bool opt_nonneg(const json_t *b, const char *name, uint64_t *out)
{
    json_t *v = json_object_get(b, name);
    int64_t x = 0;
    if (v && !nonneg_int(v, &x))
        return false;
    *out = (uint64_t)x;
    return true;
}

static int parse_type(const char *t, coord_event_type *out)
{
    static const char *const names[] = {"store", "delete", "access", "config"};
    for (int i = 0; t && i < 4; i++)
        if (strcmp(t, names[i]) == 0)
            return *out = (coord_event_type)i, 0;
    return -1;
}

static int parse_entry(const json_t *o, coord_event_type type, coord_event_entry *e, char *why,
                       size_t whylen)
{
    if (!json_is_object(o))
        return snprintf(why, whylen, "must be an object"), -1;
    char kwhy[160];
    if (coord_wire_key_parse(json_object_get(o, "key"), &e->key, kwhy, sizeof kwhy) != 0)
        return snprintf(why, whylen, "key: %s", kwhy), -1;
    json_t *size = json_object_get(o, "size_bytes");
    int64_t sz = 0;
    if ((size || type == COORD_EV_STORE) && !nonneg_int(size, &sz))
        return snprintf(why, whylen, "size_bytes must be a non-negative integer%s",
                        type == COORD_EV_STORE ? " (required for store)" : ""), -1;
    e->size = (uint64_t)sz;
    json_t *toks = json_object_get(o, "token_ids"), *off = json_object_get(o, "token_offset");
    if (toks && (!json_is_array(toks) || json_array_size(toks) > COORD_MAX_TOKENS_PER_ENTRY))
        return snprintf(why, whylen, "token_ids must be a list of at most %d ints",
                        COORD_MAX_TOKENS_PER_ENTRY), -1;
    for (size_t i = 0; toks && i < json_array_size(toks); i++) {
        json_t *t = json_array_get(toks, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > UINT32_MAX)
            return snprintf(why, whylen, "token_ids[%zu] must be an int in 0..2^32-1", i), -1;
    }
    if (off && (!json_is_integer(off) || json_integer_value(off) < -1))
        return snprintf(why, whylen, "token_offset must be an int >= -1"), -1;
    e->num_tokens = toks ? (uint32_t)json_array_size(toks) : 0;
    return 0;
}

static int parse_header(const json_t *b, coord_event_batch *out, char *why, size_t whylen)
{
    if (!json_is_object(b))
        return snprintf(why, whylen, "must be a CacheEventBatch object"), -1;
    out->instance_id = json_string_value(json_object_get(b, "instance_id"));
    size_t idl = out->instance_id ? strlen(out->instance_id) : 0;
    if (!idl || idl > COORD_INSTANCE_ID_MAX)
        return snprintf(why, whylen, "instance_id must be a non-empty str of at most %d bytes",
                        COORD_INSTANCE_ID_MAX), -1;
    if (!nonneg_int(json_object_get(b, "incarnation"), &out->incarnation))
        return snprintf(why, whylen, "incarnation must be a non-negative integer"), -1;
    if (!nonneg_int(json_object_get(b, "seq"), &out->seq) || out->seq < 1)
        return snprintf(why, whylen, "seq must be an integer >= 1"), -1;
    if (parse_type(json_string_value(json_object_get(b, "event_type")), &out->type) != 0)
        return snprintf(why, whylen, "event_type must be store, delete, access or config"), -1;
    const char *tier = json_string_value(json_object_get(b, "tier"));
    if (!tier || (strcmp(tier, "l1") && strcmp(tier, "l2")))
        return snprintf(why, whylen, "tier must be l1 or l2"), -1;
    out->l2 = strcmp(tier, "l2") == 0;
    json_t *backend = json_object_get(b, "backend");
    out->backend = backend ? json_string_value(backend) : NULL;
    if ((backend && !out->backend) || (!backend && out->type != COORD_EV_ACCESS) ||
        (out->backend && strlen(out->backend) > COORD_BACKEND_MAX))
        return snprintf(why, whylen, "backend must be a str of at most %d bytes (required "
                                     "except for access)", COORD_BACKEND_MAX), -1;
    if (!out->backend)
        out->backend = "";
    json_t *shared = json_object_get(b, "shared"), *ts = json_object_get(b, "ts");
    if (shared && !json_is_boolean(shared))
        return snprintf(why, whylen, "shared must be a bool"), -1;
    out->shared = json_is_true(shared);
    if (ts && (!json_is_number(ts) || !isfinite(json_number_value(ts)) || json_number_value(ts) < 0))
        return snprintf(why, whylen, "ts must be a finite number >= 0"), -1;
    if (!opt_nonneg(b, "capacity_bytes", &out->capacity_bytes) ||
        !opt_nonneg(b, "capacity_revision", &out->capacity_revision))
        return snprintf(why, whylen, "capacity_bytes and capacity_revision must be "
                                     "non-negative integers"), -1;
    return 0;
}

static int parse_batch(const json_t *b, coord_event_batch *out, coord_event_entry *pool,
                       size_t *used, char *why, size_t whylen)
{
    if (parse_header(b, out, why, whylen) != 0)
        return -1;
    json_t *entries = json_object_get(b, "entries");
    if (entries && !json_is_array(entries))
        return snprintf(why, whylen, "entries must be a list"), -1;
    out->n = json_array_size(entries);
    if (out->type == COORD_EV_CONFIG && out->n)
        return snprintf(why, whylen, "a config batch has no entries"), -1;
    if (out->n > COORD_MAX_ENTRIES - *used)
        return snprintf(why, whylen, "more than %d entries in one request", COORD_MAX_ENTRIES), -1;
    out->entries = pool + *used;
    for (size_t i = 0; i < out->n; i++) {
        char ewhy[200];
        if (parse_entry(json_array_get(entries, i), out->type, &out->entries[i], ewhy,
                        sizeof ewhy) != 0)
            return snprintf(why, whylen, "entries[%zu]: %s", i, ewhy), -1;
    }
    *used += out->n;
    return 0;
}

static size_t count_entries(const json_t *batches)
{
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(batches); i++)
        n += json_array_size(json_object_get(json_array_get(batches, i), "entries"));
    return n;
}

int coord_events_parse(const json_t *body, coord_event_request *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    json_t *batches = json_object_get(body, "batches");
    if (!json_is_object(body) || !json_is_array(batches))
        return snprintf(why, whylen, "body must be {\"batches\": [CacheEventBatch]}"), -1;
    if (json_array_size(batches) > COORD_MAX_BATCHES)
        return snprintf(why, whylen, "more than %d batches in one request", COORD_MAX_BATCHES), -1;
    size_t total = count_entries(batches);
    if (total > COORD_MAX_ENTRIES)
        return snprintf(why, whylen, "more than %d entries in one request", COORD_MAX_ENTRIES), -1;
    out->batches = calloc(json_array_size(batches) + 1, sizeof *out->batches);
    out->pool = calloc(total + 1, sizeof *out->pool);
    if (!out->batches || !out->pool) {
        coord_events_request_free(out);
        return snprintf(why, whylen, "out of memory"), -1;
    }
    size_t used = 0;
    for (size_t i = 0; i < json_array_size(batches); i++) {
        char bwhy[300];
        if (parse_batch(json_array_get(batches, i), &out->batches[i], out->pool, &used, bwhy,
                        sizeof bwhy) != 0) {
            coord_events_request_free(out);
            return snprintf(why, whylen, "batches[%zu]: %s", i, bwhy), -1;
        }
    }
    out->n = json_array_size(batches);
    return 0;
}

void coord_events_request_free(coord_event_request *r)
{
    free(r->batches);
    free(r->pool);
    memset(r, 0, sizeof *r);
}
