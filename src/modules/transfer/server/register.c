/* Server-driven transfer: REGISTER_KV_CACHE / UNREGISTER_KV_CACHE, the
 * engine's shared-memory mappings, the layout a registration publishes,
 * how an unregistered or reaped context ends (the instance registry in
 * modules/transfer/instance_registry.h does the rest) and module lifetime
 * (docs/protocol.md, "Server-driven transfer ops").  A registration is read whole (handles, hints, engine groups),
 * planned (kv/kv_plan.h) and mapped before it becomes visible; any
 * refusal is logged with its reason and, as upstream, not answered. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checked.h"
#include "modules/transfer/server/fault_guard.h"
#include "kv/kv_copy.h"
#include "modules/transfer/resolve.h"
#include "modules/transfer/server/server_internal.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/storage_manager.h"

#define MAX_TENSORS LMC_KV_MAX_LAYERS

/* Everything a REGISTER_KV_CACHE carries, decoded. */
typedef struct {
    int64_t instance;
    lmc_shared_tensor *tensors;
    size_t n;
    const char *model;
    size_t model_len;
    int64_t world_size;
    lmc_kv_plan_options opt;
    lmc_engine_group_info *infos;
    uint32_t *layer_pool;
} reg_request;

static void reg_request_free(reg_request *r)
{
    free(r->tensors);
    free(r->infos);
    free(r->layer_pool);
}

/* ---- decoding ----------------------------------------------------------- */

static int decode_tensors(const msgpack_object *list, reg_request *r, char *err, size_t errlen)
{
    if (!list || list->type != MSGPACK_OBJECT_ARRAY || list->via.array.size == 0 ||
        list->via.array.size > MAX_TENSORS)
        return snprintf(err, errlen, "kv_cache must be a list of 1..%d tensor handles",
                        MAX_TENSORS), -1;
    r->n = list->via.array.size;
    r->tensors = calloc(r->n, sizeof *r->tensors);
    if (!r->tensors)
        return snprintf(err, errlen, "out of memory"), -2;
    for (uint32_t i = 0; i < r->n; i++) {
        const msgpack_object *o = &list->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_EXT || o->via.ext.type != 1)
            return snprintf(err, errlen, "kv_cache[%u] is not a msgpack ext type 1", i), -1;
        char why[256];
        int rc = lmc_shared_tensor_decode((const uint8_t *)o->via.ext.ptr, o->via.ext.size,
                                          &r->tensors[i], why, sizeof why);
        if (rc != 0)
            return snprintf(err, errlen, "kv_cache[%u]: %s", i, why), rc;
        if (r->tensors[i].wrapper != r->tensors[0].wrapper)
            return snprintf(err, errlen, "kv_cache[%u] is a %s, kv_cache[0] a %s", i,
                            lmc_tensor_wrapper_name(r->tensors[i].wrapper),
                            lmc_tensor_wrapper_name(r->tensors[0].wrapper)), -1;
    }
    return 0;
}

static lmc_engine_type engine_type(const msgpack_object *o)
{
    if (o && lmc_mp_str_eq(o, "sglang"))
        return LMC_ENGINE_SGLANG;
    if (o && lmc_mp_str_eq(o, "trtllm"))
        return LMC_ENGINE_TRTLLM;
    return LMC_ENGINE_VLLM;   /* "vllm", "atom", "mock", and older revisions' values */
}

static bool int_field(const msgpack_object *map, const char *name, int64_t def, int64_t *out);

/* kv_layout (every engine; only vLLM's detector reads it), kv_list_layout
 * (SGLang), tokens_per_block, num_kv_heads, head_dim (SGLang, TRT-LLM).
 * Unknown keys are ignored, as upstream does. */
static int decode_hints(const msgpack_object *o, reg_request *r, char *err, size_t errlen)
{
    if (!o || lmc_mp_is_nil(o))
        return 0;
    if (o->type != MSGPACK_OBJECT_MAP)
        return snprintf(err, errlen, "layout_hints must be a map"), -1;
    lmc_kv_hints *h = &r->opt.hints;
    if (!int_field(o, "tokens_per_block", 0, &h->tokens_per_block) ||
        !int_field(o, "num_kv_heads", 0, &h->num_kv_heads) ||
        !int_field(o, "head_dim", 0, &h->head_dim))
        return snprintf(err, errlen, "layout_hints tokens_per_block, num_kv_heads and head_dim "
                                     "must be ints"), -1;
    const msgpack_object *kl = lmc_mp_map_get(o, "kv_list_layout");
    if (kl && !lmc_mp_is_nil(kl)) {
        if (lmc_mp_str_eq(kl, "k_v"))
            h->kv_list_layout = LMC_KV_LIST_K_V;
        else if (lmc_mp_str_eq(kl, "unified"))
            h->kv_list_layout = LMC_KV_LIST_UNIFIED;
        else
            return snprintf(err, errlen, "layout_hints.kv_list_layout must be \"k_v\" or "
                                         "\"unified\""), -1;
    }
    const msgpack_object *kv = lmc_mp_map_get(o, "kv_layout");
    const char *s;
    size_t len;
    if (!kv || lmc_mp_is_nil(kv))
        return 0;
    if (!lmc_mp_get_str(kv, &s, &len))
        return snprintf(err, errlen, "layout_hints.kv_layout must be a string"), -1;
    return lmc_kv_layout_parse(s, len, &r->opt.hnd, err, errlen);
}

static bool int_field(const msgpack_object *map, const char *name, int64_t def, int64_t *out)
{
    const msgpack_object *o = lmc_mp_map_get(map, name);
    *out = def;
    return !o || (o->type != MSGPACK_OBJECT_BOOLEAN && lmc_mp_get_int(o, out));
}

static int decode_info(const msgpack_object *o, lmc_engine_group_info *info, uint32_t *pool,
                       size_t *used, char *err, size_t errlen)
{
    int64_t *pbpe = &info->physical_per_engine;
    if (o->type != MSGPACK_OBJECT_MAP || !lmc_mp_map_get(o, "engine_group_id") ||
        !int_field(o, "engine_group_id", 0, &info->engine_group_id) ||
        !int_field(o, "tokens_per_block", 0, &info->tokens_per_block) ||
        !int_field(o, "sw_size_tokens", -1, &info->sw_size_tokens) ||
        !int_field(o, "physical_blocks_per_engine_block", 1, pbpe))
        return snprintf(err, errlen, "an engine group info is not a map of ints with an "
                                     "engine_group_id"), -1;
    if (info->tokens_per_block < 0)
        return snprintf(err, errlen, "tokens_per_block must not be negative"), -1;
    /* Whether p splits tokens_per_block is checked with the plan (kv_plan.c). */
    if (*pbpe < 1)
        return snprintf(err, errlen, "physical_blocks_per_engine_block %lld must be 1, or "
                                     "divide a tokens_per_block above 0 (got %lld)",
                        (long long)*pbpe, (long long)info->tokens_per_block), -1;
    const msgpack_object *rs = lmc_mp_map_get(o, "recurrent_state");   /* SGLang unified */
    if (rs && !lmc_mp_is_nil(rs) && rs->type != MSGPACK_OBJECT_BOOLEAN)
        return snprintf(err, errlen, "recurrent_state must be a bool"), -1;
    info->recurrent_state = rs && rs->type == MSGPACK_OBJECT_BOOLEAN && rs->via.boolean;
    const msgpack_object *nb = lmc_mp_map_get(o, "null_block_id");
    info->has_null_block = !nb || !lmc_mp_is_nil(nb);
    if (nb && info->has_null_block && !int_field(o, "null_block_id", 0, &info->null_block_id))
        return snprintf(err, errlen, "null_block_id must be an int or None"), -1;
    const msgpack_object *li = lmc_mp_map_get(o, "layer_indices");
    uint32_t n = li && li->type == MSGPACK_OBJECT_ARRAY ? li->via.array.size : 0;
    if (li && !lmc_mp_is_nil(li) && li->type != MSGPACK_OBJECT_ARRAY)
        return snprintf(err, errlen, "layer_indices must be a list"), -1;
    if (*used + n > MAX_TENSORS)
        return snprintf(err, errlen, "engine group infos list more than %d layers",
                        MAX_TENSORS), -1;
    info->layers = pool + *used;
    info->n_layers = n;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        if (!lmc_mp_get_uint(&li->via.array.ptr[i], &v) || v >= MAX_TENSORS)
            return snprintf(err, errlen, "layer_indices must be ints in 0..%d",
                            MAX_TENSORS - 1), -1;
        pool[(*used)++] = (uint32_t)v;
    }
    return 0;
}

static int decode_infos(const msgpack_object *o, reg_request *r, char *err, size_t errlen)
{
    if (!o || lmc_mp_is_nil(o) || (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 0))
        return 0;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > LMC_KV_MAX_KERNEL_GROUPS)
        return snprintf(err, errlen, "engine_group_infos must be a list of at most %d",
                        LMC_KV_MAX_KERNEL_GROUPS), -1;
    r->infos = calloc(o->via.array.size, sizeof *r->infos);
    r->layer_pool = malloc(MAX_TENSORS * sizeof *r->layer_pool);
    if (!r->infos || !r->layer_pool)
        return snprintf(err, errlen, "out of memory"), -2;
    size_t used = 0;
    for (uint32_t i = 0; i < o->via.array.size; i++)
        if (decode_info(&o->via.array.ptr[i], &r->infos[i], r->layer_pool, &used, err,
                        errlen) != 0)
            return -1;
    r->opt.infos = r->infos;
    r->opt.n_infos = o->via.array.size;
    return 0;
}

/* Frames: instance_id, kv_caches[, model_name, world_size[, engine_type,
 * layout_hints, engine_group_infos]] (2, 4 or 7 of them). */
static int decode_request(sd_mod *m, lmc_rpc_call *call, reg_request *r, char *err,
                          size_t errlen)
{
    size_t nargs = lmc_rpc_call_nargs(call);
    /* Blend reads a chunk's every slot of every layer into any position:
     * one object group, windows not trimmed (docs/cacheblend.md). */
    bool blend = strcmp(m->ctx->config->mp.engine_type, "blend") == 0;
    r->opt = (lmc_kv_plan_options){.chunk_size = m->cs,
                                   .separate_object_groups =
                                       m->ctx->config->mp.separate_object_groups && !blend,
                                   .full_sw_kv = blend};
    r->world_size = 1;
    if (nargs >= 4) {
        if (!lmc_mp_get_str(lmc_rpc_call_arg(call, 2), &r->model, &r->model_len) ||
            !lmc_model_name_valid(r->model, r->model_len))
            return snprintf(err, errlen, "%s", LMC_MODEL_NAME_RULE), -1;
        const msgpack_object *ws = lmc_rpc_call_arg(call, 3);
        if (!ws || ws->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_int(ws, &r->world_size) ||
            r->world_size < 1 || r->world_size > 255)
            return snprintf(err, errlen, "world_size must be an int in 1..255"), -1;
    }
    r->opt.engine = engine_type(nargs >= 5 ? lmc_rpc_call_arg(call, 4) : NULL);
    int rc = decode_tensors(lmc_rpc_call_arg(call, 1), r, err, errlen);
    /* A GPU server reads CUDA tensors as the hint says (docs/protocol.md). */
    r->opt.force_hnd = m->force_hnd && r->opt.engine == LMC_ENGINE_VLLM && rc == 0 &&
                       r->tensors[0].wrapper == LMC_WRAPPER_CPU_SHM;
    if (rc == 0 && nargs >= 6)
        rc = decode_hints(lmc_rpc_call_arg(call, 5), r, err, errlen);
    if (rc == 0 && nargs >= 7)
        rc = decode_infos(lmc_rpc_call_arg(call, 6), r, err, errlen);
    return rc;
}

/* ---- mappings ----------------------------------------------------------- */

/* Cache servers name their L1 pools so (upstream and lmcached alike):
 * copying to or from one would read or overwrite another server's
 * tenants (docs/security.md). */
#define L1_POOL_PREFIX "lmcache_l1_pool_"

/* Maps (or finds) the segment of CPU tensor t; NULL with the reason. */
void *lmc_server_driven_map_shm(sd_mod *m, const lmc_shared_tensor *t, char *err, size_t errlen)
{
    const lmc_l1_arena_desc *a = lmc_storage_manager_l1_arena(m->ctx->storage);
    if (t->shm_name[0] != '/' || strchr(t->shm_name + 1, '/') || t->storage_bytes == 0 ||
        (a && a->shm_name[0] && strcmp(t->shm_name + 1, a->shm_name) == 0) ||
        strncmp(t->shm_name + 1, L1_POOL_PREFIX, strlen(L1_POOL_PREFIX)) == 0)
        return snprintf(err, errlen, "shm_name '%s' does not name an engine's segment (it is "
                                     "this server's L1 pool or named as a cache server's)",
                        t->shm_name), NULL;
    int fd = shm_open(t->shm_name, O_RDWR, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < t->storage_bytes) {
        if (fd >= 0)
            close(fd);
        return snprintf(err, errlen, "cannot open segment %s of %llu bytes: %s", t->shm_name,
                        (unsigned long long)t->storage_bytes,
                        fd < 0 ? strerror(errno) : "it is smaller"), NULL;
    }
    /* Not populated here: registration runs on the socket thread, and a
     * large cache would stall every client; populate_later() does it. */
    void *addr = mmap(NULL, t->storage_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (addr == MAP_FAILED)
        return snprintf(err, errlen, "cannot map segment %s: %s", t->shm_name,
                        strerror(errno)), NULL;
    return addr;
}

static sd_mapping *map_segment(sd_mod *m, sd_ctx *c, const lmc_shared_tensor *t, char *err,
                               size_t errlen)
{
    for (size_t i = 0; i < c->n_maps; i++)
        if (strcmp(c->maps[i].name, t->shm_name) == 0)
            return &c->maps[i];
    void *addr = lmc_server_driven_map_shm(m, t, err, errlen);
    if (!addr)
        return NULL;
    sd_mapping *mp = &c->maps[c->n_maps++];
    snprintf(mp->name, sizeof mp->name, "%s", t->shm_name);
    mp->addr = addr;
    mp->len = t->storage_bytes;
    return mp;
}

/* Maps every tensor the plan copies and checks that each kernel group's
 * formulas stay inside its tensor's segment. */
static int map_tensors(sd_mod *m, sd_ctx *c, const reg_request *r, char *err, size_t errlen)
{
    c->maps = calloc(r->n, sizeof *c->maps);
    c->bases = calloc(c->plan.n_kg, sizeof *c->bases);
    if (!c->maps || !c->bases)
        return snprintf(err, errlen, "out of memory"), -2;
    for (uint32_t k = 0; k < c->plan.n_kg; k++) {
        const lmc_kv_kernel_group *g = &c->plan.kg[k];
        if (!(c->bases[k] = calloc(g->n_tensors, sizeof *c->bases[k])))
            return snprintf(err, errlen, "out of memory"), -2;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
            const lmc_shared_tensor *t = &r->tensors[g->tensors[i]];
            sd_mapping *mp = map_segment(m, c, t, err, errlen);
            if (!mp)
                return -1;
            uint64_t off;
            if (!lmc_u64_of_i64(t->storage_offset, &off) || !lmc_mul_u64(off, t->itemsize, &off) ||
                off > mp->len || g->span_bytes > mp->len - off)
                return snprintf(err, errlen, "kv_cache[%u] reaches past its %zu-byte segment",
                                g->tensors[i], mp->len), -1;
            c->bases[k][i] = mp->addr + off;
        }
    }
    return 0;
}

/* ---- contexts ----------------------------------------------------------- */

static void ctx_destroy(sd_mod *m, sd_ctx *c)
{
    if (c->cuda)
        lmc_server_driven_cuda_release(m, c);
    if (c->layout_held)
        lmc_layout_registry_release(m->ctx->layouts, c->model, c->world_size);
    for (size_t i = 0; i < c->n_maps; i++)
        munmap(c->maps[i].addr, c->maps[i].len);
    for (uint32_t k = 0; c->bases && k < c->plan.n_kg; k++)
        free(c->bases[k]);
    free(c->bases);
    free(c->maps);
    lmc_kv_plan_free(&c->plan);
    lmc_intern_release(c->model);
    free(c);
}

sd_ctx *lmc_server_driven_get(sd_mod *m, int64_t id)
{
    pthread_mutex_lock(&m->instances.lock);
    sd_ctx *c = lmc_transfer_registry_find_locked(&m->instances, id);
    if (c)
        atomic_fetch_add(&c->refs, 1);
    pthread_mutex_unlock(&m->instances.lock);
    return c;
}

void lmc_server_driven_put(sd_mod *m, sd_ctx *c)
{
    if (c && atomic_fetch_sub(&c->refs, 1) == 1)
        ctx_destroy(m, c);
}

/* The object layout LOOKUP and the HTTP routes read: for a plain model
 * exactly what the engine-driven path registers, so both paths share
 * objects; otherwise object group 0's first kernel group's shape. */
static int plan_layout(sd_mod *m, const lmc_kv_plan *p, lmc_layout *out, char *err,
                       size_t errlen)
{
    const lmc_kv_kernel_group *g = &p->kg[p->og[0].members[0]];
    bool plain = p->n_og == 1 && p->og[0].n_members == 1 && g->slots == m->cs;
    uint64_t sizes[LMC_LAYOUT_MAX_GROUPS];
    int32_t sw[LMC_LAYOUT_MAX_GROUPS];
    for (uint32_t i = 0; i < p->n_og && i < LMC_LAYOUT_MAX_GROUPS; i++) {
        sizes[i] = p->og[i].object_size;
        sw[i] = p->og[i].chunks_in_sw;
    }
    return lmc_layout_for_groups(out, m->cs, plain, g->geo.kv_size, g->geo.nl, g->slots,
                                 g->geo.nh * g->geo.hs, p->dtype, p->n_og, sizes, sw, err,
                                 errlen);
}

static int acquire_layout(sd_mod *m, sd_ctx *c, char *err, size_t errlen)
{
    if (lmc_layout_registry_acquire(m->ctx->layouts, c->model, c->world_size, &c->layout) != 0)
        return snprintf(err, errlen, "its layout conflicts with another registration of %s "
                                     "(world size %u)", c->model, c->world_size), -1;
    c->layout_held = true;
    return 0;
}

bool lmc_server_driven_bind_model(sd_mod *m, sd_ctx *c, const char *model, size_t len, uint32_t ws)
{
    pthread_mutex_lock(&m->instances.lock);
    if (!c->model) {
        char err[160];
        c->model = lmc_intern(m->ctx->interner, model, len);
        c->world_size = ws;
        if (c->model && acquire_layout(m, c, err, sizeof err) != 0)
            LMC_WARN_LIMITED("server-driven instance %lld: %s", (long long)c->instance_id, err);
    }
    bool same = c->model && c->world_size == ws && strlen(c->model) == len &&
                memcmp(c->model, model, len) == 0;
    pthread_mutex_unlock(&m->instances.lock);
    return same;
}

static int build_ctx(sd_mod *m, const reg_request *r, sd_ctx **out, char *err, size_t errlen)
{
    sd_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return snprintf(err, errlen, "out of memory"), -2;
    atomic_init(&c->refs, 1);
    c->instance_id = r->instance;
    c->world_size = (uint32_t)r->world_size;
    c->n_tensors = (uint32_t)r->n;
    snprintf(c->tag, sizeof c->tag, "sd:%lld", (long long)r->instance);
    bool cpu = r->tensors[0].wrapper == LMC_WRAPPER_CPU_SHM;
    int rc = lmc_kv_plan_build(r->tensors, r->n, &r->opt, &c->plan, err, errlen);
    if (rc == -2)
        snprintf(err, errlen, "out of memory");
    if (rc == 0)
        rc = cpu ? map_tensors(m, c, r, err, errlen)
                 : lmc_server_driven_cuda_register(m, c, r->tensors, r->n, err, errlen);
    if (rc == 0)
        rc = plan_layout(m, &c->plan, &c->layout, err, errlen);
    if (rc == 0 && r->model) {
        c->model = lmc_intern(m->ctx->interner, r->model, r->model_len);
        bool full = !c->model && lmc_key_interner_full(m->ctx->interner);
        if (c->model)
            rc = acquire_layout(m, c, err, errlen);
        else
            snprintf(err, errlen, "%s", full ? "too many distinct model names and cache salts "
                                               "(--max-interned-strings)"
                                             : "out of memory");
        if (!c->model)
            rc = full ? -1 : -2;
    }
    if (rc != 0) {
        ctx_destroy(m, c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Fills the page tables of a CPU context's mappings on a thread of its
 * own, holding a reference: the engine's cache lives as long as the
 * engine, and a fault per 4 KiB on the first copies would cost them
 * several times the copy itself (BENCHMARKS.md). */
typedef struct {
    sd_mod *m;
    sd_ctx *c;
} populate_job;

static void *populate(void *arg)
{
    populate_job *j = arg;
    sd_mod *m = j->m;
    for (size_t i = 0; i < j->c->n_maps; i++)
        (void)madvise(j->c->maps[i].addr, j->c->maps[i].len, MADV_POPULATE_WRITE);
    lmc_server_driven_put(m, j->c);
    free(j);
    pthread_mutex_lock(&m->instances.lock);   /* lmc_server_driven_close waits for this */
    if (--m->populating == 0)
        pthread_cond_broadcast(&m->populated);
    pthread_mutex_unlock(&m->instances.lock);
    return NULL;
}

static void populate_later(sd_mod *m, sd_ctx *c)
{
    populate_job *j = malloc(sizeof *j);
    pthread_t th;
    pthread_attr_t attr;
    if (!j || c->cuda || c->n_maps == 0) {
        free(j);
        return;
    }
    *j = (populate_job){.m = m, .c = c};
    atomic_fetch_add(&c->refs, 1);
    pthread_mutex_lock(&m->instances.lock);
    m->populating++;
    pthread_mutex_unlock(&m->instances.lock);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, populate, j) != 0) {   /* faults on first use then */
        atomic_fetch_sub(&c->refs, 1);
        free(j);
        pthread_mutex_lock(&m->instances.lock);
        m->populating--;
        pthread_mutex_unlock(&m->instances.lock);
    }
    pthread_attr_destroy(&attr);
}

static void log_registered(const sd_ctx *c)
{
    const lmc_kv_plan *p = &c->plan;
    LMC_INFO("server-driven instance %lld registered: %s, %u kernel group(s), %u object "
             "group(s), first %s (%u layers, %u slots per chunk), %llu bytes per chunk",
             (long long)c->instance_id, c->model ? c->model : "(model named by its ops)",
             p->n_kg, p->n_og, lmc_kv_format_name(p->kg[0].geo.format), p->kg[0].geo.nl,
             p->kg[0].slots, (unsigned long long)c->layout.object_size);
}

/* REGISTER_KV_CACHE -> void (nothing at all when refused, as upstream). */
lmc_handler_result lmc_server_driven_register(void *state, lmc_rpc_call *call)
{
    sd_mod *m = state;
    reg_request r = {0};
    char err[384];
    if (!lmc_transfer_instance_arg(call, 0, &r.instance))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "REGISTER_KV_CACHE: instance_id must be an int");
    sd_ctx *known = lmc_server_driven_get(m, r.instance);
    if (known) {   /* a re-registration only says the worker is alive */
        lmc_server_driven_put(m, known);
        lmc_transfer_touch(m->ctx->liveness, r.instance);
        return LMC_HANDLER_VOID;
    }
    sd_ctx *c = NULL;
    int rc = decode_request(m, call, &r, err, sizeof err);
    if (rc == 0)
        rc = build_ctx(m, &r, &c, err, sizeof err);
    if (rc == 0)
        populate_later(m, c);   /* holds its own reference */
    if (rc == 0 && lmc_transfer_registry_add(&m->instances, c->instance_id, c) != 0) {
        lmc_server_driven_put(m, c);
        rc = -2;
        snprintf(err, sizeof err, "out of memory");
    }
    reg_request_free(&r);
    if (rc != 0) {
        atomic_fetch_add(&m->registrations_refused, 1);
        return lmc_rpc_call_fail(call, rc == -2 ? "MemoryError" : "ValidationError",
                                 "REGISTER_KV_CACHE %lld: %s", (long long)r.instance, err);
    }
    atomic_fetch_add(&m->registrations, 1);
    lmc_liveness_register(m->ctx->liveness, r.instance, lmc_monotonic_ms(NULL));
    log_registered(c);
    return LMC_HANDLER_VOID;
}

/* An unregistered or reaped instance: its liveness is forgotten and its
 * model's layout given back at once; its memory goes once the last op in
 * flight (or its page-fill thread, which may run for a while on a large
 * cache) is done.  Those keep the context's own copy of the layout, and
 * the same model registering again meanwhile, with another layout, must
 * not be refused as a conflict with an instance that is gone. */
static void drop_instance(void *user, void *ctx, int64_t id)
{
    sd_mod *m = user;
    sd_ctx *c = ctx;
    lmc_liveness_forget(m->ctx->liveness, id);
    if (m->instance_dropped)
        m->instance_dropped(m->hook_user, id);
    pthread_mutex_lock(&m->instances.lock);
    if (c->layout_held) {
        lmc_layout_registry_release(m->ctx->layouts, c->model, c->world_size);
        c->layout_held = false;
    }
    pthread_mutex_unlock(&m->instances.lock);
    lmc_server_driven_put(m, c);
}

/* UNREGISTER_KV_CACHE(instance_id) -> void, known or not (a worker waits
 * for this reply at shutdown). */
lmc_handler_result lmc_server_driven_unregister(void *state, lmc_rpc_call *call)
{
    sd_mod *m = state;
    int64_t id;
    if (!lmc_transfer_instance_arg(call, 0, &id))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "UNREGISTER_KV_CACHE: instance_id must be an int");
    if (lmc_transfer_registry_drop(&m->instances, id)) {
        atomic_fetch_add(&m->unregisters, 1);
        LMC_INFO("server-driven instance %lld unregistered", (long long)id);
    } else {
        LMC_WARN_LIMITED("UNREGISTER_KV_CACHE: instance %lld is not registered", (long long)id);
    }
    return LMC_HANDLER_VOID;
}

/* ---- reaping and lifetime ----------------------------------------------- */

json_t *lmc_server_driven_contexts_json(sd_mod *m)
{
    json_t *a = json_array();
    pthread_mutex_lock(&m->instances.lock);
    for (size_t i = 0; a && i < m->instances.n; i++) {
        const sd_ctx *c = m->instances.items[i].ctx;
        json_array_append_new(a, json_pack("{s:I, s:s?, s:i, s:i, s:i, s:I, s:i}",
                                           "instance_id", (json_int_t)c->instance_id,
                                           "model_name", c->model, "world_size",
                                           (int)c->world_size, "kernel_groups",
                                           (int)c->plan.n_kg, "object_groups",
                                           (int)c->plan.n_og, "object_size",
                                           (json_int_t)c->layout.object_size, "segments",
                                           (int)c->n_maps));
    }
    pthread_mutex_unlock(&m->instances.lock);
    return a;
}

int lmc_server_driven_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    sd_mod *m = calloc(1, sizeof *m);
    if (!m)
        return snprintf(err, errlen, "lmcache_driven_transfer: out of memory"), -1;
    m->ctx = ctx;
    m->cs = (uint32_t)ctx->config->mp.chunk_size;
    m->copy = lmc_copy_method_default();
    /* Without a GPU this server is CPU-only: vLLM's CPU attention stores
     * HND whatever its hint says (docs/protocol.md). */
    m->force_hnd = strcmp(ctx->config->mp.cpu_kv_layout, "hint") != 0;
    pthread_cond_init(&m->populated, NULL);
    lmc_server_driven_cuda_init(&m->cuda);
    if (lmc_fault_guard_install() != 0)
        LMC_WARN("lmcache_driven_transfer: no SIGBUS handler: an engine that shrinks its "
                 "segments can crash this server");
    lmc_transfer_registry_ops ops = {.mode = "server-driven", .drop = drop_instance, .user = m};
    if (lmc_transfer_registry_init(&m->instances, &ops, ctx->liveness,
                                   ctx->config->mp.worker_reap_timeout_seconds,
                                   ctx->config->mp.worker_registration_grace_seconds) != 0) {
        lmc_server_driven_cuda_close(m);
        pthread_cond_destroy(&m->populated);
        free(m);
        return snprintf(err, errlen, "lmcache_driven_transfer: cannot start the reaper"), -1;
    }
    ctx->server_driven = m;
    *state = m;
    return 0;
}

void lmc_server_driven_close(void *state)
{
    sd_mod *m = state;
    lmc_transfer_registry_stop(&m->instances);
    sd_ctx *c;
    while ((c = lmc_transfer_registry_pop(&m->instances)))
        lmc_server_driven_put(m, c);
    pthread_mutex_lock(&m->instances.lock);   /* the last references may be theirs */
    while (m->populating)
        pthread_cond_wait(&m->populated, &m->instances.lock);
    pthread_mutex_unlock(&m->instances.lock);
    lmc_server_driven_cuda_close(m);   /* the streams are gone: no completion can come */
    pthread_cond_destroy(&m->populated);
    lmc_transfer_registry_destroy(&m->instances);
    free(m);
}
