/* KV transfer over HTTP (docs/http.md, "KV transfer over HTTP":
 * /api/kv/store, /retrieve, /lookup): whole-request KV tensors
 * [2, num_layers, num_tokens, hidden] with every rank's shard concatenated
 * on the hidden axis, split into and gathered from the per-rank chunk
 * objects the engine-driven path uses. */
#ifndef LMC_SERVER_KV_HTTP_H
#define LMC_SERVER_KV_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "modules/context.h"

/* One request of the /api/kv endpoints, and what it did. */
typedef struct {
    const char *model;
    const char *salt;                  /* "" for none */
    const uint64_t *tokens;
    size_t n_tokens;
} lmc_kv_request;

typedef struct {
    size_t total_tokens, total_chunks;
    size_t done_tokens, done_chunks;   /* hit (lookup/retrieve) or stored */
} lmc_kv_counts;

/* Each returns 0, or -1 with *status (400 unregistered model, bad salt,
 * bad payload; 500) and a one-line err. */
int lmc_kv_http_lookup(lmc_module_ctx *ctx, const lmc_kv_request *rq, lmc_kv_counts *out,
                       unsigned *status, char *err, size_t errlen);
int lmc_kv_http_store(lmc_module_ctx *ctx, const lmc_kv_request *rq, const uint8_t *data,
                      size_t len, lmc_kv_counts *out, unsigned *status, char *err,
                      size_t errlen);
/* *data (malloc'd, may be NULL when nothing hit) holds the hit prefix. */
int lmc_kv_http_retrieve(lmc_module_ctx *ctx, const lmc_kv_request *rq, uint8_t **data,
                         size_t *len, lmc_kv_counts *out, unsigned *status, char *err,
                         size_t errlen);

#endif
