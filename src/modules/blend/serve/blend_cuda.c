/* CacheBlend's GPU path (docs/cacheblend.md, "The GPU path"): the cos/sin
 * caches of an instance registered with CUDA tensors, opened from their
 * CUDA IPC handles through the server-driven transfer's plugin, and
 * CB_RETRIEVE_PRE_COMPUTED's plan enqueued on the instance's stream
 * (liblmcached_cuda.so's blend_execute, src/kv/cuda_transfer.h).  The
 * steps before the plan (repeat guard, allocation gate, keys, plan) are
 * blend_retrieve.c's, shared with the CPU path. */
#include <stdlib.h>

#include "core/checked.h"
#include "core/errbuf.h"
#include "modules/blend/serve/blend_serve.h"
#include "obs/log.h"

/* ---- the cos/sin caches ---------------------------------------------------- */

/* Cache i's shape and mscale from a host copy (the plugin's read); a cache
 * that bakes a magnitude in is divided there and the copy uploaded, owned
 * by r (docs/cacheblend.md, "The GPU path").  caches[i] keeps the shape,
 * without data. */
static int check_cache(cb_mod *m, cb_rope *r, uint32_t i, lmc_kv_rope_dtype dt, uint64_t rows,
                       uint64_t cols, uint64_t bytes, char *err, size_t errlen)
{
    void *host = malloc(bytes ? bytes : 1);
    if (!host)
        return lmc_err(err, errlen, "cos_sin_cache[%u]: out of memory for its %llu bytes", i,
                       (unsigned long long)bytes);
    lmc_kv_rope_cache *cache = &r->caches[i];
    int rc = lmc_server_driven_cuda_read(m->sd, r->cu_ctx, r->cu_cache[i], host, bytes, err,
                                         errlen);
    if (rc == 0)
        rc = lmc_kv_rope_cache_init(cache, host, bytes, dt, rows, cols, err, errlen);
    void *owned = NULL;
    if (rc == 0)
        rc = lmc_kv_rope_cache_normalize(cache, &owned, err, errlen);
    if (rc == 0 && owned &&
        (rc = lmc_server_driven_cuda_upload(m->sd, r->cu_ctx, owned, bytes, &r->cu_owned[i],
                                            err, errlen)) == 0)
        r->cu_cache[i] = r->cu_owned[i];
    cache->data = NULL;
    free(owned);
    free(host);
    return rc;
}

int lmc_blend_serve_cuda_map_cache(cb_mod *m, cb_rope *r, uint32_t i, sd_ctx *c,
                                   const lmc_shared_tensor *t, lmc_kv_rope_dtype dt,
                                   char *err, size_t errlen)
{
    if (!r->cu_ctx) { /* held until the caches are closed */
        sd_ctx *held = lmc_server_driven_get(m->sd, c->instance_id);
        if (held != c) {
            if (held)
                lmc_server_driven_put(m->sd, held);
            return lmc_err(err, errlen, "instance %lld registered again meanwhile",
                           (long long)c->instance_id);
        }
        r->sd = m->sd;
        r->cu_ctx = c;
    }
    uint64_t rows = (uint64_t)t->shape[0], cols = (uint64_t)t->shape[1], bytes;
    if (!lmc_mul_u64(rows * cols, t->itemsize, &bytes))
        return lmc_err(err, errlen, "cos_sin_cache[%u]: too large", i);
    char why[256];
    if (lmc_server_driven_cuda_open(m->sd, c, t, bytes, &r->cu_cache[i], &r->cu_opened[i], why,
                                    sizeof why) != 0)
        return lmc_err(err, errlen, "cos_sin_cache[%u]: %s", i, why);
    return check_cache(m, r, i, dt, rows, cols, bytes, err, errlen);
}

void lmc_blend_serve_cuda_rope_release(cb_rope *r)
{
    if (!r->cu_ctx)
        return;
    /* Plans enqueued by earlier retrieves may still read the caches. */
    lmc_server_driven_cuda_sync(r->sd, r->cu_ctx);
    for (uint32_t i = 0; i < r->n_caches; i++) {
        lmc_server_driven_cuda_free_device(r->sd, r->cu_ctx, r->cu_owned[i]);
        lmc_server_driven_cuda_close_mem(r->sd, r->cu_ctx, r->cu_opened[i]);
    }
    lmc_server_driven_put(r->sd, r->cu_ctx);
}

/* ---- CB_RETRIEVE_PRE_COMPUTED ------------------------------------------------ */

int lmc_blend_serve_cuda_execute(cb_mod *m, sd_ctx *c, const cb_rope *r,
                                 const lmc_kv_blend_input *in, const lmc_kv_blend_plan *plan,
                                 const uint8_t *const *objects, const uint8_t *event,
                                 size_t event_len, char *err, size_t errlen)
{
    const lmc_cuda_ops *ops = m->sd->cuda.ops;
    lmc_cuda_blend_group groups[LMC_KV_MAX_KERNEL_GROUPS];
    for (uint32_t g = 0; g < plan->n_groups; g++) {
        uint32_t k = plan->groups[g];
        bool on = in->rope_on && in->rope_on[k];
        const lmc_kv_rope_cache *cache = &r->caches[r->cache_of[k]];
        groups[g] = (lmc_cuda_blend_group){
            .g = &c->plan.kg[k], .tensors = c->cu.tensors[k],
            .cos_sin = on ? r->cu_cache[r->cache_of[k]] : 0,
            .cache_rows = on ? cache->max_position : 0,
            .cache_dtype = on ? cache->dtype : LMC_KV_ROPE_F32,
            .rope = r->geom[k], .k_dtype = r->k_dtype};
    }
    lmc_cuda_blend b = {.plan = plan, .groups = groups, .objects = objects,
                        .n_read = in->n_read, .n_chunks = in->n_chunks,
                        .max_batch = in->max_batch};
    if (ops->wait_event(c->cu.stream, event, event_len, err, errlen) != 0)
        return -1;
    return ops->blend_execute(c->cu.stream, &b, err, errlen);
}

void lmc_blend_serve_cuda_give_back_after(cb_mod *m, sd_ctx *c, lmc_object_key *keys,
                                          lmc_lease *leases, size_t n)
{
    sd_op op = {.c = c};
    lmc_server_driven_cuda_give_back_after(m->sd, &op, keys, leases, n);
}

void lmc_blend_serve_cuda_reply(cb_mod *m, sd_ctx *c, lmc_rpc_call *call, bool ran)
{
    uint8_t h[LMC_CUDA_EVENT_HANDLE_BYTES];
    sd_op op = {.c = c};
    bool have = lmc_server_driven_cuda_failure_event(m->sd, &op, h);
    if (!have)
        LMC_WARN_LIMITED("CB_RETRIEVE_PRE_COMPUTED: instance %lld: no event to reply with",
                         (long long)c->instance_id);
    /* Without an event the client has nothing to order its forward after. */
    lmc_blend_encode_retrieve_reply(lmc_rpc_call_reply(call), h, have ? sizeof h : 0,
                                    ran && have);
}
