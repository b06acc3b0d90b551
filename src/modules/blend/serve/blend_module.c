/* The blend module's face (docs/cacheblend.md, "The blend module"): its
 * handlers, CB_PROTOCOL_HANDSHAKE, the RoPE state of CB_REGISTER_ROPE /
 * CB_UNREGISTER_ROPE, and the STORE hook that registers fingerprints. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/checked.h"
#include "core/errbuf.h"
#include "modules/blend/serve/blend_serve.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/l2/l2_service.h"
#include "storage/storage_manager.h"

/* ---- RoPE state ---------------------------------------------------------- */

static void rope_free(cb_rope *r)
{
    lmc_blend_serve_cuda_rope_release(r);
    for (uint32_t i = 0; i < r->n_caches; i++) {
        free(r->owned[i]);
        if (r->maps[i])
            munmap(r->maps[i], r->map_len[i]);
    }
    free(r);
}

void lmc_blend_serve_rope_put(cb_rope *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1)
        rope_free(r);
}

static ssize_t rope_index_locked(cb_mod *m, int64_t id)
{
    for (size_t i = 0; i < m->n_ropes; i++)
        if (m->ropes[i]->instance_id == id)
            return (ssize_t)i;
    return -1;
}

cb_rope *lmc_blend_serve_rope_get(cb_mod *m, int64_t id)
{
    pthread_mutex_lock(&m->lock);
    ssize_t i = rope_index_locked(m, id);
    cb_rope *r = i < 0 ? NULL : m->ropes[i];
    if (r)
        atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&m->lock);
    return r;
}

/* Removes id's state from the table; true if there was one. */
static bool rope_drop(cb_mod *m, int64_t id)
{
    pthread_mutex_lock(&m->lock);
    ssize_t i = rope_index_locked(m, id);
    cb_rope *r = NULL;
    if (i >= 0) {
        r = m->ropes[i];
        m->ropes[i] = m->ropes[--m->n_ropes];
    }
    pthread_mutex_unlock(&m->lock);
    lmc_blend_serve_rope_put(r);
    return r != NULL;
}

/* Installs r for its instance, replacing an earlier registration. */
static int rope_install(cb_mod *m, cb_rope *r)
{
    pthread_mutex_lock(&m->lock);
    ssize_t i = rope_index_locked(m, r->instance_id);
    cb_rope *old = NULL;
    int rc = 0;
    if (i >= 0) {
        old = m->ropes[i];
        m->ropes[i] = r;
    } else if (m->n_ropes == m->cap_ropes) {
        size_t cap = m->cap_ropes ? 2 * m->cap_ropes : 8;
        cb_rope **grown = realloc(m->ropes, cap * sizeof *grown);
        if (grown) {
            m->ropes = grown;
            m->cap_ropes = cap;
            m->ropes[m->n_ropes++] = r;
        } else {
            rc = -1;
        }
    } else {
        m->ropes[m->n_ropes++] = r;
    }
    pthread_mutex_unlock(&m->lock);
    lmc_blend_serve_rope_put(old);
    return rc;
}

static bool rope_dtype(const char *torch, lmc_kv_rope_dtype *out)
{
    if (strcmp(torch, "float32") == 0)
        *out = LMC_KV_ROPE_F32;
    else if (strcmp(torch, "float16") == 0)
        *out = LMC_KV_ROPE_F16;
    else if (strcmp(torch, "bfloat16") == 0)
        *out = LMC_KV_ROPE_BF16;
    else
        return false;
    return true;
}

/* Maps cache i of the registration (a CPU shared tensor; a CUDA one for an
 * instance of CUDA tensors, blend_cuda.c), checks its shape and divides
 * out an mscale (docs/cacheblend.md, "The cos/sin cache"). */
static int map_cache(cb_mod *m, cb_rope *r, uint32_t i, sd_ctx *c, const lmc_shared_tensor *t,
                     char *err, size_t errlen)
{
    lmc_kv_rope_dtype dt;
    if (!c->cuda && t->wrapper != LMC_WRAPPER_CPU_SHM)
        return lmc_err(err, errlen, "cos_sin_cache[%u]: a CUDA tensor for an instance of CPU "
                                    "shared tensors", i);
    if (!rope_dtype(t->dtype, &dt))
        return lmc_err(err, errlen, "cos_sin_cache[%u]: dtype %s (float32, float16 or "
                                    "bfloat16)", i, t->dtype);
    if (t->shape[1] <= 0 || t->stride[1] != 1 || t->stride[0] != t->shape[1] ||
        t->storage_offset < 0)
        return lmc_err(err, errlen, "cos_sin_cache[%u]: not a contiguous [max_position, "
                                    "rot_dim] tensor", i);
    if (c->cuda)
        return lmc_blend_serve_cuda_map_cache(m, r, i, c, t, dt, err, errlen);
    if (!(r->maps[i] = lmc_server_driven_map_shm(m->sd, t, err, errlen)))
        return -1;
    r->map_len[i] = t->storage_bytes;
    uint64_t rows = (uint64_t)t->shape[0], cols = (uint64_t)t->shape[1];
    uint64_t off = (uint64_t)t->storage_offset * t->itemsize, bytes;
    if (!lmc_mul_u64(rows * cols, t->itemsize, &bytes) || off > t->storage_bytes ||
        bytes > t->storage_bytes - off)
        return lmc_err(err, errlen, "cos_sin_cache[%u] reaches past its %llu-byte segment", i,
                       (unsigned long long)t->storage_bytes);
    if (lmc_kv_rope_cache_init(&r->caches[i], (uint8_t *)r->maps[i] + off, bytes, dt, rows, cols,
                               err, errlen) != 0)
        return -1;
    return lmc_kv_rope_cache_normalize(&r->caches[i], &r->owned[i], err, errlen);
}

/* Kernel group k's rotation from the registration (docs/cacheblend.md,
 * "Geometry"): which cache, which window, or none. */
static int group_rotation(cb_rope *r, const lmc_blend_register_rope *q, const sd_ctx *c,
                          uint32_t k, char *err, size_t errlen)
{
    const lmc_kv_kernel_group *g = &c->plan.kg[k];
    uint64_t eg = (uint64_t)g->engine_group_id;
    r->rope_on[k] = false;
    if (r->n_caches == 0)
        return 0; /* NoPE */
    uint32_t cache = 0;
    if (q->n_group_to_cache) {
        if (eg >= q->n_group_to_cache)
            return lmc_err(err, errlen, "group_to_cache has %u entries; engine group %llu has "
                                        "none", q->n_group_to_cache, (unsigned long long)eg);
        if ((cache = q->group_to_cache[eg]) == LMC_BLEND_NO_CACHE)
            return 0;
    }
    bool window = q->n_group_rot > 0;
    if (window && eg >= q->n_group_rot)
        return lmc_err(err, errlen, "group_rot has %u entries; engine group %llu has none",
                       q->n_group_rot, (unsigned long long)eg);
    if (window && !q->group_rot[eg].rotate)
        return 0;
    if (!rope_dtype(c->plan.dtype, &r->k_dtype)) {
        if (window)
            return 0; /* a declared map skips rows that cannot be rotated */
        return lmc_err(err, errlen, "kv dtype %s cannot be re-rotated", c->plan.dtype);
    }
    uint32_t off = window ? q->group_rot[eg].offset : 0;
    uint32_t width = window ? q->group_rot[eg].width : 0;
    if (lmc_kv_rope_geometry(&g->geo, q->head_size, q->is_neox, window, off, width,
                             r->caches[cache].rot_dim, &r->geom[k], err, errlen) != 0)
        return -1;
    r->cache_of[k] = cache;
    r->rope_on[k] = true;
    return 0;
}

static int build_rope(cb_mod *m, const lmc_blend_register_rope *q, sd_ctx *c, cb_rope *r,
                      char *err, size_t errlen)
{
    r->instance_id = q->instance_id;
    atomic_init(&r->refs, 1);
    for (uint32_t i = 0; i < q->n_caches; i++) {
        r->n_caches = i + 1; /* what rope_free undoes */
        if (map_cache(m, r, i, c, &q->caches[i], err, errlen) != 0)
            return -1;
    }
    for (uint32_t k = 0; k < c->plan.n_kg; k++)
        if (group_rotation(r, q, c, k, err, errlen) != 0)
            return -1;
    return 0;
}

size_t lmc_blend_serve_frames(lmc_rpc_call *call, lmc_blend_frame *f, size_t max)
{
    size_t i = 0;
    for (; i < max && i < lmc_rpc_call_nargs(call); i++)
        f[i].data = lmc_rpc_call_arg_raw(call, i, &f[i].len);
    return i;
}

/* CB_REGISTER_ROPE(instance_id, caches, head_size, is_neox[, group_to_cache[,
 * group_rot]]) -> void */
static lmc_handler_result register_rope(void *state, lmc_rpc_call *call)
{
    cb_mod *m = state;
    lmc_blend_frame f[8];
    size_t n = lmc_blend_serve_frames(call, f, 8);
    lmc_blend_register_rope q;
    char err[384];
    int rc = lmc_blend_decode_register_rope(f, n, &q, err, sizeof err);
    if (rc != 0) {
        atomic_fetch_add(&m->ropes_refused, 1);
        return lmc_rpc_call_fail(call, rc == -2 ? "MemoryError" : "ValidationError",
                                 "CB_REGISTER_ROPE: %s", err);
    }
    sd_ctx *c = lmc_server_driven_get(m->sd, q.instance_id);
    cb_rope *r = calloc(1, sizeof *r);
    rc = -1;
    if (!c)
        snprintf(err, sizeof err, "instance %lld is not registered (REGISTER_KV_CACHE first)",
                 (long long)q.instance_id);
    else if (!r)
        snprintf(err, sizeof err, "out of memory");
    else if ((rc = build_rope(m, &q, c, r, err, sizeof err)) == 0 &&
             (rc = rope_install(m, r)) != 0)
        snprintf(err, sizeof err, "out of memory");
    lmc_server_driven_put(m->sd, c);
    int64_t id = q.instance_id;
    uint32_t caches = q.n_caches;
    lmc_blend_register_rope_free(&q);
    if (rc != 0) {
        if (r)
            rope_free(r);
        atomic_fetch_add(&m->ropes_refused, 1);
        return lmc_rpc_call_fail(call, "ValidationError", "CB_REGISTER_ROPE %lld: %s",
                                 (long long)id, err);
    }
    atomic_fetch_add(&m->ropes_registered, 1);
    LMC_INFO("blend: instance %lld registered %u cos/sin cache(s)", (long long)id, caches);
    return LMC_HANDLER_VOID;
}

/* CB_UNREGISTER_ROPE(instance_id) -> void, known or not. */
static lmc_handler_result unregister_rope(void *state, lmc_rpc_call *call)
{
    cb_mod *m = state;
    lmc_blend_frame f[2];
    size_t n = lmc_blend_serve_frames(call, f, 2);
    int64_t id;
    char err[256];
    if (lmc_blend_decode_unregister_rope(f, n, &id, err, sizeof err) != 0)
        return lmc_rpc_call_fail(call, "ValidationError", "CB_UNREGISTER_ROPE: %s", err);
    if (!rope_drop(m, id))
        LMC_WARN_LIMITED("CB_UNREGISTER_ROPE: instance %lld has no rope state", (long long)id);
    return LMC_HANDLER_VOID;
}

/* CB_PROTOCOL_HANDSHAKE(client_version) -> [1, compatible] */
static lmc_handler_result handshake(void *state, lmc_rpc_call *call)
{
    cb_mod *m = state;
    lmc_blend_frame f[2];
    size_t n = lmc_blend_serve_frames(call, f, 2);
    int64_t v;
    char err[256];
    if (lmc_blend_decode_handshake(f, n, &v, err, sizeof err) != 0)
        return lmc_rpc_call_fail(call, "ValidationError", "CB_PROTOCOL_HANDSHAKE: %s", err);
    if (!lmc_blend_handshake_compatible(v, err, sizeof err))
        LMC_WARN_LIMITED("CB_PROTOCOL_HANDSHAKE: %s", err);
    atomic_fetch_add(&m->handshakes, 1);
    if (lmc_blend_encode_handshake_reply(lmc_rpc_call_reply(call), v) != 0)
        return lmc_rpc_call_fail(call, "MemoryError", "CB_PROTOCOL_HANDSHAKE: out of memory");
    return LMC_HANDLER_REPLY;
}

/* ---- the STORE hook ------------------------------------------------------- */

lmc_blend_ns lmc_blend_serve_ns(const lmc_object_key *k, uint32_t world_size)
{
    return (lmc_blend_ns){k->model_name, k->cache_salt, world_size};
}

bool lmc_blend_serve_key_ns_init(cb_key_ns *out, const lmc_ipc_key *k)
{
    if (k->model_len >= sizeof out->model || k->salt_len >= sizeof out->salt)
        return false;
    memcpy(out->model, k->model_name, k->model_len);
    out->model[k->model_len] = '\0';
    memcpy(out->salt, k->cache_salt, k->salt_len);
    out->salt[k->salt_len] = '\0';
    return true;
}

/* Registers a STORE's chunks with the matcher (docs/cacheblend.md, "The
 * STORE hook"): rank 0's only, and never chunk 0 of a range from 0 (a
 * prompt beginning with it is a plain prefix hit). */
static void after_store(void *user, const sd_op *op)
{
    cb_mod *m = user;
    const lmc_ipc_key *k = &op->key;
    if ((k->has_worker && k->worker_id != 0) || op->n == 0 || !op->keys)
        return;
    uint8_t *hashes = malloc(op->n * LMC_BLEND_HASH_BYTES);
    if (!hashes)
        return;
    uint32_t n_og = op->c->plan.n_og;
    for (size_t c = 0; c < op->n; c++)
        memcpy(hashes + c * LMC_BLEND_HASH_BYTES, op->keys[c * n_og].chunk_hash,
               LMC_BLEND_HASH_BYTES);
    lmc_blend_ns ns = lmc_blend_serve_ns(&op->keys[0], k->world_size);
    size_t added = 0;
    int rc = lmc_blend_matcher_register(m->matcher, &ns, k->tokens + k->start, k->end - k->start,
                                        hashes, op->n, k->start == 0 ? 1 : 0, k->start, &added);
    free(hashes);
    if (rc == LMC_BLEND_EFULL)
        LMC_WARN_LIMITED("blend: the matcher holds --blend-max-chunks chunks; a STORE's "
                         "chunks were not registered");
    else if (rc == LMC_BLEND_OK)
        atomic_fetch_add(&m->fingerprinted_stores, 1);
}

static void instance_dropped(void *user, int64_t id)
{
    rope_drop(user, id);
}

/* ---- the module ----------------------------------------------------------- */

static const lmc_rpc_handler_spec cb_handlers[] = {
    {LMC_OP_CB_REGISTER_ROPE, NULL, LMC_POOL_SYNC, register_rope, false, NULL, NULL, false},
    {LMC_OP_CB_UNREGISTER_ROPE, NULL, LMC_POOL_SYNC, unregister_rope, false, NULL, NULL, false},
    {LMC_OP_CB_RETRIEVE_PRE_COMPUTED, NULL, LMC_POOL_AFFINITY, lmc_blend_serve_retrieve, false, NULL, NULL,
     false},
    {LMC_OP_CB_UNIFIED_LOOKUP, NULL, LMC_POOL_NORMAL, lmc_blend_serve_unified_lookup, false, NULL, NULL,
     false},
    {LMC_OP_CB_PROTOCOL_HANDSHAKE, NULL, LMC_POOL_SYNC, handshake, false, NULL, NULL, false},
};

/* With --coordinator-url the fleet's fragment index answers the matches
 * (docs/cacheblend.md, "Coordinator directory"). */
static int start_coord(cb_mod *m, const lmc_config *cfg, char *err, size_t errlen)
{
    lmc_blend_coord_opts o = {.url = cfg->coordinator.url,
                              .auth_token = cfg->coordinator.auth_token,
                              .max_outstanding = LMC_BLEND_COORD_DEFAULT_OUTSTANDING};
    if (lmc_blend_coord_env(&o.timeout_s, &o.concurrency, err, errlen) != 0 ||
        !(m->coord = lmc_blend_coord_new(&o, err, errlen)))
        return -1;
    LMC_INFO("blend: matches come from the coordinator's index at %s (timeout %.3f s)",
             o.url, o.timeout_s);
    return 0;
}

static int cb_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    if (!ctx->server_driven || !ctx->lookup)
        return lmc_err(err, errlen, "blend: needs the lookup module and the server-driven "
                                    "transfer (--supported-transfer-mode lmcache_driven or "
                                    "auto)");
    cb_mod *m = calloc(1, sizeof *m);
    if (!m)
        return lmc_err(err, errlen, "blend: out of memory");
    m->ctx = ctx;
    m->sd = ctx->server_driven;
    m->cs = (uint32_t)ctx->config->mp.chunk_size;
    m->segmented = ctx->config->mp.enable_segmented_prefix;
    lmc_blend_matcher_opts o = {.chunk_size = m->cs, .hash_len = LMC_BLEND_HASH_BYTES,
                                .max_chunks = (size_t)ctx->config->mp.blend_max_chunks,
                                .dedup_content = ctx->config->mp.enable_dedup_content};
    if (lmc_blend_matcher_new(&o, &m->matcher, err, errlen) != 0 ||
        lmc_blend_serve_applied_init(&m->applied, 65536) != 0) {
        lmc_blend_matcher_free(m->matcher);
        free(m);
        return err[0] ? -1 : lmc_err(err, errlen, "blend: out of memory");
    }
    if (ctx->config->coordinator.url[0] && start_coord(m, ctx->config, err, errlen) != 0) {
        lmc_blend_serve_applied_free(&m->applied);
        lmc_blend_matcher_free(m->matcher);
        free(m);
        return -1;
    }
    pthread_mutex_init(&m->lock, NULL);
    m->sd->hook_user = m;
    m->sd->instance_dropped = instance_dropped;
    m->sd->after_store = after_store;
    LMC_INFO("blend: CacheBlend engine, matcher of %d chunks (%zu bytes)%s%s",
             ctx->config->mp.blend_max_chunks, lmc_blend_matcher_bytes(o.max_chunks),
             m->segmented ? ", segmented prefix" : "", o.dedup_content ? ", dedup content" : "");
    *state = m;
    return 0;
}

#define COUNT(name) (json_int_t)atomic_load(&m->name)

static json_t *cb_status(void *state)
{
    cb_mod *m = state;
    lmc_blend_matcher_stats st = lmc_blend_matcher_get_stats(m->matcher);
    pthread_mutex_lock(&m->lock);
    size_t ropes = m->n_ropes, jobs = m->n_jobs;
    pthread_mutex_unlock(&m->lock);
    return json_pack(
        "{s:b, s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I, s:I, "
        "s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:b}",
        "is_healthy", 1, "registered_chunks", (json_int_t)st.live, "max_chunks",
        (json_int_t)st.max_chunks, "matcher_bytes", (json_int_t)lmc_blend_matcher_bytes(st.max_chunks),
        "chunks_refused", (json_int_t)st.refused, "chunks_removed", (json_int_t)st.removed,
        "near_full", st.near_full, "segmented_prefix", m->segmented, "rope_instances",
        (json_int_t)ropes, "lookups_in_flight", (json_int_t)jobs, "counts", "handshakes",
        COUNT(handshakes), "ropes_registered", COUNT(ropes_registered), "ropes_refused",
        COUNT(ropes_refused), "fingerprinted_stores", COUNT(fingerprinted_stores), "lookups",
        COUNT(lookups), "lookups_done", COUNT(lookups_done), "matches_found",
        COUNT(matches_found), "matches_stale", COUNT(matches_stale), "matches_removed",
        COUNT(matches_removed), "prefix_tokens", COUNT(prefix_tokens), "segmented_chunks",
        COUNT(segmented_chunks), "retrieves_ok", COUNT(retrieves_ok), "retrieves_failed",
        COUNT(retrieves_failed), "retrieves_deferred", COUNT(retrieves_deferred),
        "retrieves_repeated", COUNT(retrieves_repeated), "chunks_scattered",
        COUNT(chunks_scattered), "jobs_dropped", COUNT(jobs_dropped), "l2_loads",
        COUNT(l2_loads), "coordinator_matches", COUNT(coordinator_matches),
        "coordinator_failures", COUNT(coordinator_failures), "coordinator", m->coord != NULL);
}

static void cb_close(void *state)
{
    cb_mod *m = state;
    /* The reaper and the sparse legs' L2 loads call into m: both stop now
     * (the server-driven module's close stops its reaper again, harmlessly). */
    lmc_transfer_registry_stop(&m->sd->instances);
    lmc_l2_stop_prefetch(m->ctx->storage);
    m->sd->after_store = NULL;
    m->sd->instance_dropped = NULL;
    lmc_blend_serve_jobs_close(m);
    lmc_blend_coord_free(m->coord);
    for (size_t i = 0; i < m->n_ropes; i++)
        lmc_blend_serve_rope_put(m->ropes[i]);
    free(m->ropes);
    lmc_blend_serve_applied_free(&m->applied);
    lmc_blend_matcher_free(m->matcher);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

const lmc_module_def lmc_blend_serve_module = {
    .name = "blend",
    .create = cb_create,
    .handlers = cb_handlers,
    .n_handlers = sizeof cb_handlers / sizeof cb_handlers[0],
    .report_status = cb_status,
    .close = cb_close,
};
