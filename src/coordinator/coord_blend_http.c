/* POST /directory/blend-lookup and the feed of the fleet fragment index
 * from the cache-event stream (docs/coordinator.md, "Blend lookup"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_blend.h"
#include "core/base64.h"
#include "core/hex.h"
#include "coordinator/coord_internal.h"
#include "storage/object_key.h"

#define MAX_WORLD_SIZE 255 /* the packed kv_rank holds 8 bits of it */

static coordinator_blend_ns entry_ns(const coordinator_wire_key *k)
{
    uint32_t ws = k->kv_rank >> 24;
    return (coordinator_blend_ns){.model = k->model, .model_len = k->model_len,
                                  .salt = k->salt, .salt_len = k->salt_len,
                                  .world_size = ws};
}

/* A store whose chunk content came with it: exactly chunk_size tokens at
 * a known position (lmcached sends nothing else, docs/fleet.md). */
static void feed_store(lmc_coord *co, const coordinator_event_request *r,
                       const coordinator_event_entry *e)
{
    if (e->num_tokens != co->cfg.chunk_size || e->token_offset < 0)
        return;
    coordinator_blend_ns ns = entry_ns(&e->key);
    coordinator_blend_add(co->blend, &ns, e->key.hash, e->key.hash_len, r->tokens + e->tokens_at,
                          (uint64_t)e->token_offset);
}

/* A delete that left the key without any placement takes its claim away
 * (mu held: the directory is read). */
static void feed_delete(lmc_coord *co, const coordinator_event_entry *e)
{
    coordinator_key k;
    if (coordinator_wire_key_resolve(&co->st, &e->key, false, &k) &&
        coordinator_keys_find(&co->st.keys, &k) != COORD_NONE)
        return;
    coordinator_blend_ns ns = entry_ns(&e->key);
    coordinator_blend_remove(co->blend, &ns, e->key.hash, e->key.hash_len);
}

void coordinator_blend_feed(lmc_coord *co, const coordinator_event_request *r)
{
    if (!co->blend || r->ungated)
        return;
    pthread_mutex_lock(&co->mu);
    for (size_t i = 0; i < r->n; i++) {
        const coordinator_event_batch *b = &r->batches[i];
        for (size_t j = 0; b->admitted && j < b->n; j++) {
            if (b->type == COORD_EV_STORE)
                feed_store(co, r, &b->entries[j]);
            else if (b->type == COORD_EV_DELETE)
                feed_delete(co, &b->entries[j]);
        }
    }
    pthread_mutex_unlock(&co->mu);
}

/* ---- the query ---------------------------------------------------------------- */

/* The query's tokens from tokens_b64 (LE uint32) or token_ids; 0 or -1
 * with why naming the field. */
static int query_tokens(const json_t *body, uint32_t **out, size_t *n, char *why, size_t whylen)
{
    const json_t *b64 = json_object_get(body, "tokens_b64"), *ids = json_object_get(body, "token_ids");
    *out = NULL;
    *n = 0;
    if (b64) {
        size_t len = json_string_length(b64), bytes;
        uint8_t *raw = json_is_string(b64) && len / 4 * 3 <= COORD_MAX_TOKENS * 4 ? malloc(len / 4 * 3 + 1) : NULL;
        if (!raw || !lmc_base64_decode(json_string_value(b64), len, raw, &bytes) || bytes % 4) {
            free(raw);
            return snprintf(why, whylen, "tokens_b64 must be a str: standard base64 of at most "
                                         "%zu little-endian uint32 tokens", COORD_MAX_TOKENS), -1;
        }
        *n = bytes / 4;
        *out = malloc((*n + 1) * sizeof **out);
        for (size_t i = 0; *out && i < *n; i++)
            (*out)[i] = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                        (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
        free(raw);
        return *out ? 0 : (snprintf(why, whylen, "out of memory"), -1);
    }
    if (!json_is_array(ids) || json_array_size(ids) > COORD_MAX_TOKENS)
        return snprintf(why, whylen, "tokens_b64 (base64 of little-endian uint32 tokens) or "
                                     "token_ids (a list of at most %zu ints) is required",
                        COORD_MAX_TOKENS), -1;
    *n = json_array_size(ids);
    if (!(*out = malloc((*n + 1) * sizeof **out)))
        return snprintf(why, whylen, "out of memory"), -1;
    for (size_t i = 0; i < *n; i++) {
        const json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX) {
            free(*out);
            *out = NULL;
            return snprintf(why, whylen, "token_ids[%zu] must be an int in 0..2^32-1", i), -1;
        }
        (*out)[i] = (uint32_t)json_integer_value(v);
    }
    return 0;
}

/* model_name, world_size and cache_salt; 0 or -1 with why. */
static int query_ns(const json_t *body, coordinator_blend_ns *ns, char *why, size_t whylen)
{
    const json_t *m = json_object_get(body, "model_name"), *ws = json_object_get(body, "world_size");
    const json_t *salt = json_object_get(body, "cache_salt");
    if (!json_is_string(m) || !lmc_model_name_valid(json_string_value(m), json_string_length(m)))
        return snprintf(why, whylen, "model_name must be a str of 1..%d bytes without '@'",
                        COORD_MODEL_MAX), -1;
    if (!json_is_integer(ws) || json_integer_value(ws) < 1 ||
        json_integer_value(ws) > MAX_WORLD_SIZE)
        return snprintf(why, whylen, "world_size must be an integer in 1..%d", MAX_WORLD_SIZE), -1;
    if (salt && !json_is_null(salt) &&
        (!json_is_string(salt) ||
         !lmc_cache_salt_valid(json_string_value(salt), json_string_length(salt))))
        return snprintf(why, whylen, "cache_salt must be a str of at most %d bytes without "
                                     "'@', '/' or '\\'", COORD_SALT_MAX), -1;
    bool has_salt = json_is_string(salt);
    *ns = (coordinator_blend_ns){.model = json_string_value(m), .model_len = json_string_length(m),
                                 .salt = has_salt ? json_string_value(salt) : "",
                                 .salt_len = has_salt ? json_string_length(salt) : 0,
                                 .world_size = (uint32_t)json_integer_value(ws)};
    return 0;
}

int coordinator_blend_parse_query(const json_t *body, coordinator_blend_ns *ns, uint32_t **tokens,
                                  size_t *n, char *why, size_t whylen)
{
    *tokens = NULL;
    *n = 0;
    if (!json_is_object(body))
        return snprintf(why, whylen, "the body must be a JSON object {tokens_b64 | token_ids, "
                                     "model_name, world_size, cache_salt}"), -1;
    return query_ns(body, ns, why, whylen) != 0 ? -1 : query_tokens(body, tokens, n, why, whylen);
}

static json_t *matches_json(const coordinator_blend_hit *h, size_t n)
{
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++) {
        char hex[2 * COORD_HASH_MAX + 1];
        lmc_hex_encode(h[i].hash, h[i].hash_len, hex);
        json_array_append_new(list, json_pack("{s:s, s:I, s:I}", "chunk_hash", hex, "old_st",
                                              (json_int_t)h[i].old_st, "cur_st",
                                              (json_int_t)h[i].cur_st));
    }
    return list;
}

/* POST /directory/blend-lookup: {"matches": [...]}, empty when the index
 * is off, as upstream answers then (docs/compatibility.md). */
void coordinator_ep_blend_lookup(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                                 const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    json_error_t jerr;
    json_t *body = rq->body ? json_loadb(rq->body, rq->body_len, 0, &jerr) : NULL;
    char why[200];
    coordinator_blend_ns ns;
    uint32_t *tokens = NULL;
    size_t n = 0;
    if (coordinator_blend_parse_query(body, &ns, &tokens, &n, why, sizeof why) != 0)
        goto bad;
    coordinator_blend_hit *hits = NULL;
    size_t n_hits = 0;
    if (co->blend && coordinator_blend_match(co->blend, &ns, tokens, n, &hits, &n_hits) != 0) {
        coordinator_reply_detail(out, 500, "out of memory");
    } else {
        lmc_http_reply_json(out, 200, json_pack("{s:o}", "matches", matches_json(hits, n_hits)));
    }
    free(hits);
    free(tokens);
    json_decref(body);
    return;
bad:
    coordinator_reply_detail(out, 400, "%s", why);
    free(tokens);
    json_decref(body);
}

/* The older /blend/... directory (fingerprints published by the servers) is
 * not implemented: the cache-event stream feeds the index instead. */
void coordinator_ep_blend_legacy(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                                 const char *arg)
{
    (void)rq;
    (void)ctx;
    (void)arg;
    coordinator_reply_detail(out, 501, "the older /blend/* fingerprint directory is not "
                                       "implemented: the fleet fragment index is fed by the "
                                       "cache-event stream and asked with POST "
                                       "/directory/blend-lookup (docs/coordinator.md)");
}
