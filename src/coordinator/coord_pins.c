/* The token form of requests (model, world size, token ids, salt -> keys,
 * hashed as the servers do with CHUNK_SIZE and HASH_ALGORITHM) and the
 * pins built on it (docs/coordinator.md, "Pins"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_internal.h"
#include "storage/object_key.h"

#define MAX_WORLD_SIZE 255 /* the packed kv_rank holds 8 bits of it */
#define MAX_PIN_KEYS ((size_t)1 << 20)

int coordinator_token_query_parse(const json_t *b, coordinator_token_query *q, char *why, size_t whylen)
{
    memset(q, 0, sizeof *q);
    q->model = json_string_value(json_object_get(b, "model_name"));
    json_t *salt = json_object_get(b, "cache_salt"), *ws = json_object_get(b, "world_size");
    json_t *toks = json_object_get(b, "token_ids");
    q->salt = salt && !json_is_null(salt) ? json_string_value(salt) : "";
    if (!q->model || !lmc_model_name_valid(q->model, strlen(q->model)))
        return snprintf(why, whylen, "model_name must be a str of 1..256 bytes without '@'"), -1;
    if (!q->salt || !lmc_cache_salt_valid(q->salt, strlen(q->salt)))
        return snprintf(why, whylen, "cache_salt must be a str of at most 128 bytes without "
                                     "'@', '/' or '\\'"), -1;
    if (!json_is_integer(ws) || json_integer_value(ws) < 1 ||
        json_integer_value(ws) > MAX_WORLD_SIZE)
        return snprintf(why, whylen, "world_size must be an integer in 1..%d", MAX_WORLD_SIZE),
               -1;
    q->world_size = (uint32_t)json_integer_value(ws);
    if (!json_is_array(toks) || json_array_size(toks) > COORD_MAX_TOKENS)
        return snprintf(why, whylen, "token_ids must be a list of at most %zu ints",
                        COORD_MAX_TOKENS), -1;
    q->n_tokens = json_array_size(toks);
    q->tokens = malloc((q->n_tokens + 1) * sizeof *q->tokens);
    if (!q->tokens)
        return snprintf(why, whylen, "out of memory"), -1;
    for (size_t i = 0; i < q->n_tokens; i++) {
        json_t *t = json_array_get(toks, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > UINT32_MAX) {
            coordinator_token_query_free(q);
            return snprintf(why, whylen, "token_ids[%zu] must be an int in 0..2^32-1", i), -1;
        }
        q->tokens[i] = (uint64_t)json_integer_value(t);
    }
    return 0;
}

void coordinator_token_query_free(coordinator_token_query *q)
{
    free(q->tokens);
    q->tokens = NULL;
}

int coordinator_token_query_hash(lmc_coord *co, const coordinator_token_query *q, uint8_t **hashes,
                           size_t *n_chunks, char *why, size_t whylen)
{
    *n_chunks = lmc_hash_num_chunks(co->hasher, q->n_tokens);
    *hashes = malloc(*n_chunks * LMC_TOKEN_HASH_LEN + 1);
    if (!*hashes)
        return snprintf(why, whylen, "out of memory"), -1;
    int rc = lmc_hash_chunks(co->hasher, q->tokens, q->n_tokens, 0,
                             *n_chunks * co->cfg.chunk_size, *hashes);
    if (rc != LMC_HASH_OK) {
        free(*hashes);
        *hashes = NULL;
        return snprintf(why, whylen, "token hashing failed: %s", lmc_hash_strerror(rc)), -1;
    }
    return 0;
}

bool coordinator_token_key(coordinator_state *s, const coordinator_token_query *q, const uint8_t *hash,
                     uint32_t rank, bool intern, coordinator_key *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->hash, hash, LMC_TOKEN_HASH_LEN);
    out->hash_len = LMC_TOKEN_HASH_LEN;
    out->kv_rank = lmc_kv_rank_for_worker(q->world_size, rank);
    out->model = intern ? coordinator_names_intern(&s->models, q->model)
                        : coordinator_names_find(&s->models, q->model);
    out->salt = intern ? coordinator_names_intern(&s->salts, q->salt)
                       : coordinator_names_find(&s->salts, q->salt);
    return out->model != COORD_NONE && out->salt != COORD_NONE;
}

/* One key's pin count up (pin) or down; whether its pinned state changed.
 * -1 when the key could not be recorded. */
static int pin_one(coordinator_state *s, coordinator_db *db, const coordinator_key *k, bool pin)
{
    uint32_t idx = pin ? coordinator_keys_get(&s->keys, k) : coordinator_keys_find(&s->keys, k);
    if (idx == COORD_NONE)
        return pin ? -1 : 0;
    coordinator_entry *e = &s->keys.e[idx];
    if (!pin && !e->pins)
        return 0;
    if (pin && e->pins == UINT32_MAX)
        return 0;
    e->pins = pin ? e->pins + 1 : e->pins - 1;
    bool changed = pin ? e->pins == 1 : e->pins == 0;
    coordinator_db_put_pin(db, s, idx);
    coordinator_keys_release(&s->keys, idx);
    return changed;
}

static int pin_all(lmc_coord *co, const coordinator_token_query *q, const uint8_t *hashes,
                   size_t n_chunks, bool pin, size_t *affected)
{
    coordinator_state *s = &co->st;
    int rc = 0;
    coordinator_db_begin(co->db);
    for (size_t c = 0; c < n_chunks && rc == 0; c++) {
        for (uint32_t r = 0; r < q->world_size && rc == 0; r++) {
            coordinator_key k;
            if (!coordinator_token_key(s, q, hashes + c * LMC_TOKEN_HASH_LEN, r, pin, &k)) {
                rc = pin ? -1 : 1; /* unpinning an unknown model or salt: nothing is pinned */
                break;
            }
            int changed = pin_one(s, co->db, &k, pin);
            if (changed < 0)
                rc = -1;
            else
                *affected += (size_t)changed;
        }
    }
    coordinator_db_commit(co->db);
    return rc < 0 ? -1 : 0;
}

void coordinator_ep_pins(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                         const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    json_t *b = coordinator_body_object(rq, out);
    if (!b)
        return;
    bool pin = strcmp(rq->method, "POST") == 0;
    coordinator_token_query q;
    char why[200];
    uint8_t *hashes = NULL;
    size_t n_chunks = 0, affected = 0;
    if (coordinator_token_query_parse(b, &q, why, sizeof why) != 0) {
        coordinator_reply_detail(out, 422, "%s", why);
        goto done;
    }
    if (coordinator_token_query_hash(co, &q, &hashes, &n_chunks, why, sizeof why) != 0) {
        coordinator_reply_detail(out, 500, "%s", why);
        goto done;
    }
    if (n_chunks * q.world_size > MAX_PIN_KEYS) {
        coordinator_reply_detail(out, 400, "at most %zu keys per request", MAX_PIN_KEYS);
        goto done;
    }
    pthread_mutex_lock(&co->mu);
    int rc = pin_all(co, &q, hashes, n_chunks, pin, &affected);
    pthread_mutex_unlock(&co->mu);
    if (rc != 0)
        coordinator_reply_detail(out, 503, "out of memory, too many distinct models/salts, or the key "
                                     "directory is full (LMCACHE_MP_COORDINATOR_MAX_KEYS); %zu "
                                     "keys were pinned before it ran out", affected);
    else
        lmc_http_reply_json(out, 200, json_pack("{s:I, s:I, s:s}", "requested",
                                             (json_int_t)(n_chunks * q.world_size), "affected",
                                             (json_int_t)affected, "status",
                                             pin ? "pinned" : "unpinned"));
done:
    free(hashes);
    coordinator_token_query_free(&q);
    json_decref(b);
}
