#include "server/kv_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/services/ipc_key.h"
#include "modules/services/layout_registry.h"
#include "storage/storage_manager.h"

#define WRITER_TAG "http_kv"

/* Everything one request needs: layout geometry and the expanded keys
 * (chunk-major: chunk -> rank, one object group). */
typedef struct {
    lmc_layout layout;
    uint32_t ws, cs;
    size_t n_chunks, per, n_keys;
    size_t row_bytes;          /* one token of one rank: hidden_dim * itemsize */
    lmc_object_key *keys;
    size_t n_held;             /* keys holding their string references */
    lmc_lease *held;           /* lock_hits: READ leases of the hit run */
} kv_plan;

static void plan_free(kv_plan *p)
{
    if (p->keys)
        lmc_keys_drop(p->keys, p->n_held);
    free(p->keys);
    free(p->held);
}

static int fail(unsigned *status, unsigned code, char *err, size_t errlen, const char *what)
{
    *status = code;
    snprintf(err, errlen, "%s", what);
    return -1;
}

/* Only a store interns the names: a lookup or retrieve of names never
 * interned finds no object (docs/storage.md, "Interned strings") and gets
 * an empty plan (n_keys 0). */
static int plan(lmc_module_ctx *ctx, const lmc_kv_request *rq, bool store, kv_plan *p,
                unsigned *status, char *err, size_t errlen)
{
    *p = (kv_plan){.cs = lmc_token_hasher_chunk_size(ctx->hasher)};
    if (!lmc_layout_registry_find_model(ctx->layouts, rq->model, strlen(rq->model), &p->ws,
                                        &p->layout)) {
        *status = 400;
        snprintf(err, errlen, "model_name '%s' is not registered with this engine", rq->model);
        return -1;
    }
    if (p->layout.use_mla || p->layout.num_groups != 1)
        return fail(status, 400, err, errlen, "only single-group non-MLA layouts over HTTP");
    if (!lmc_cache_salt_valid(rq->salt, strlen(rq->salt)))
        return fail(status, 400, err, errlen, "invalid cache_salt");
    /* object [2, L, cs, H]: one token row of one rank */
    p->row_bytes = p->layout.object_size / (2ull * p->layout.num_layers * p->cs);
    p->n_chunks = rq->n_tokens / p->cs;
    p->per = p->ws;
    p->n_keys = p->n_chunks * p->per;
    if (p->n_chunks == 0)
        return 0;
    uint8_t *hashes = malloc(p->n_chunks * LMC_TOKEN_HASH_LEN);
    p->keys = malloc(p->n_keys * sizeof *p->keys);
    lmc_ipc_key k = {.model_name = rq->model, .model_len = strlen(rq->model),
                     .world_size = p->ws, .cache_salt = rq->salt, .salt_len = strlen(rq->salt)};
    int rc = hashes && p->keys ? lmc_hash_chunks(ctx->hasher, rq->tokens, rq->n_tokens, 0,
                                                 p->n_chunks * p->cs, hashes)
                               : LMC_HASH_ENOMEM;
    int krc = 0;
    if (rc == LMC_HASH_OK)
        krc = store ? lmc_ipc_key_object_keys(&k, hashes, p->n_chunks, 1, ctx->interner, p->keys)
                    : lmc_ipc_key_object_keys_find(&k, hashes, p->n_chunks, 1, ctx->interner,
                                                   p->keys);
    free(hashes);
    if (rc == LMC_HASH_OK && krc == 0)
        p->n_held = p->n_keys;
    if (krc > 0)
        p->n_keys = 0;
    if (krc < 0 && lmc_key_interner_full(ctx->interner)) {
        free(p->keys);
        p->keys = NULL;
        return fail(status, 503, err, errlen,
                    "too many distinct model names and cache salts (--max-interned-strings)");
    }
    if (krc < 0)
        rc = LMC_HASH_ENOMEM;
    if (rc != LMC_HASH_OK) {
        free(p->keys);
        p->keys = NULL;
        *status = rc == LMC_HASH_ETOKEN ? 400 : 500;
        snprintf(err, errlen, "%s", lmc_hash_strerror(rc));
        return -1;
    }
    return 0;
}

static void counts(const kv_plan *p, const lmc_kv_request *rq, size_t done_chunks,
                   lmc_kv_counts *out)
{
    *out = (lmc_kv_counts){rq->n_tokens, p->n_chunks, done_chunks * p->cs, done_chunks};
}

/* Copies token rows between the whole-request tensor [2, L, T, ws*H] and one
 * rank's chunk object [2, L, cs, H]; to_object picks the direction. */
static void copy_chunk(const kv_plan *p, uint8_t *whole, size_t total_tokens, uint8_t *object,
                       size_t chunk, uint32_t rank, bool to_object)
{
    size_t full_row = p->row_bytes * p->ws;
    for (size_t kv_layer = 0; kv_layer < 2ull * p->layout.num_layers; kv_layer++) {
        for (size_t t = 0; t < p->cs; t++) {
            uint8_t *w = whole + (kv_layer * total_tokens + chunk * p->cs + t) * full_row +
                         rank * p->row_bytes;
            uint8_t *o = object + (kv_layer * p->cs + t) * p->row_bytes;
            memcpy(to_object ? o : w, to_object ? w : o, p->row_bytes);
        }
    }
}

/* Leading chunks whose every rank is resident at this layout's object
 * size, under READ leases (1 share) in p->held; 0 when memory ran out. */
static size_t lock_hits(lmc_module_ctx *ctx, kv_plan *p)
{
    if (!p->n_keys || !(p->held = malloc(p->n_keys * sizeof *p->held)))
        return 0;
    lmc_object_sizes want = {&p->layout.object_size, 1, 1};
    size_t locked = lmc_storage_manager_lease_read(ctx->storage, p->keys, p->n_keys, 1, true,
                                                   &want, p->held, NULL);
    size_t full = locked / p->per * p->per;
    lmc_storage_manager_give_back(ctx->storage, p->keys + full, p->held + full, locked - full);
    return full / p->per;
}

int lmc_kv_http_lookup(lmc_module_ctx *ctx, const lmc_kv_request *rq, lmc_kv_counts *out,
                       unsigned *status, char *err, size_t errlen)
{
    kv_plan p;
    if (plan(ctx, rq, false, &p, status, err, errlen) != 0)
        return -1;
    size_t hits = lock_hits(ctx, &p);
    lmc_storage_manager_give_back(ctx->storage, p.keys, p.held, hits * p.per);
    counts(&p, rq, hits, out);
    plan_free(&p);
    return 0;
}

/* The leading chunks whose every rank is in L1 now: written and published
 * by this request, or there already (NOT_WRITABLE); a write that a forced
 * clear voided before its publish is not stored. */
static size_t leading_stored_chunks(const kv_plan *p, const lmc_l1_result *reserved,
                                    const lmc_l1_result *published)
{
    size_t c = 0;
    for (; c < p->n_chunks; c++) {
        for (uint32_t r = 0; r < p->ws; r++) {
            size_t i = c * p->per + r;
            if (reserved[i] == LMC_L1_SUCCESS ? published[i] != LMC_L1_SUCCESS
                                              : reserved[i] != LMC_L1_KEY_NOT_WRITABLE)
                return c;
        }
    }
    return c;
}

int lmc_kv_http_store(lmc_module_ctx *ctx, const lmc_kv_request *rq, const uint8_t *data,
                      size_t len, lmc_kv_counts *out, unsigned *status, char *err,
                      size_t errlen)
{
    kv_plan p;
    if (plan(ctx, rq, true, &p, status, err, errlen) != 0)
        return -1;
    size_t expect = 2ull * p.layout.num_layers * rq->n_tokens * p.row_bytes * p.ws;
    if (len != expect) {
        plan_free(&p);
        *status = 400;
        snprintf(err, errlen,
                 "payload is %zu bytes; [2, %u, %zu tokens, %u ranks x hidden] of %s needs %zu",
                 len, p.layout.num_layers, rq->n_tokens, p.ws, p.layout.dtype, expect);
        return -1;
    }
    lmc_lease *leases = calloc(p.n_keys + 1, sizeof *leases);
    lmc_l1_result *res = calloc(p.n_keys + 1, sizeof *res);
    lmc_l1_result *published = calloc(p.n_keys + 1, sizeof *published);
    if (!leases || !res || !published ||
        lmc_storage_manager_lease_write(ctx->storage, p.keys, p.n_keys, p.layout.object_size,
                                        false, WRITER_TAG, leases, res) != 0) {
        free(leases), free(res), free(published), plan_free(&p);
        return fail(status, 503, err, errlen, "out of memory");
    }
    uint8_t *base = lmc_storage_manager_l1_arena(ctx->storage)->base;
    for (size_t i = 0; i < p.n_keys; i++)
        if (res[i] == LMC_L1_SUCCESS)
            copy_chunk(&p, (uint8_t *)data, rq->n_tokens, base + leases[i].offset, i / p.per,
                       (uint32_t)(i % p.per), true);
    if (lmc_storage_manager_publish_writes(ctx->storage, p.keys, leases, p.n_keys, 0,
                                           published) != 0) {
        lmc_storage_manager_give_back(ctx->storage, p.keys, leases, p.n_keys);
        free(leases), free(res), free(published), plan_free(&p);
        return fail(status, 503, err, errlen, "out of memory");
    }
    counts(&p, rq, leading_stored_chunks(&p, res, published), out);
    free(leases);
    free(res);
    free(published);
    plan_free(&p);
    return 0;
}

int lmc_kv_http_retrieve(lmc_module_ctx *ctx, const lmc_kv_request *rq, uint8_t **data,
                         size_t *len, lmc_kv_counts *out, unsigned *status, char *err,
                         size_t errlen)
{
    kv_plan p;
    *data = NULL;
    *len = 0;
    if (plan(ctx, rq, false, &p, status, err, errlen) != 0)
        return -1;
    size_t hits = lock_hits(ctx, &p), n = hits * p.per;
    lmc_lease *copies = calloc(n + 1, sizeof *copies);
    size_t tokens = hits * p.cs;
    *len = 2ull * p.layout.num_layers * tokens * p.row_bytes * p.ws;
    *data = *len ? malloc(*len) : NULL;
    lmc_object_sizes want = {&p.layout.object_size, 1, 1};
    bool ok = copies && (!*len || *data) &&
              lmc_storage_manager_lease_copy(ctx->storage, p.keys, n, LMC_COPY_TAKES_SHARE, true,
                                             &want, copies, NULL) == n;
    uint8_t *base = lmc_storage_manager_l1_arena(ctx->storage)->base;
    for (size_t i = 0; ok && i < n; i++)
        copy_chunk(&p, *data, tokens, base + copies[i].offset, i / p.per,
                   (uint32_t)(i % p.per), false);
    if (copies)
        lmc_storage_manager_give_back(ctx->storage, p.keys, copies, n);
    lmc_storage_manager_give_back(ctx->storage, p.keys, p.held, n);
    free(copies);
    plan_free(&p);
    if (!ok) {
        free(*data);
        *data = NULL;
        *len = 0;
        return fail(status, 500, err, errlen, "out of memory");
    }
    counts(&p, rq, hits, out);
    return 0;
}
