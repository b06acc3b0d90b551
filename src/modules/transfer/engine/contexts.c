/* Engine-driven transfer module: registration, unregistration, reaping and
 * module lifetime (the transfer ops are in engine_driven.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/transfer/engine/engine_internal.h"
#include "core/grow.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/storage_manager.h"

typedef struct {
    int64_t instance_id;
    const char *model;
    size_t model_len;
    int64_t world_size, num_layers, hidden_dim;
    const char *dtype;
    size_t dtype_len;
    bool use_mla;
} reg_payload;

static bool get_str_field(const msgpack_object *map, const char *name, const char **s,
                          size_t *len)
{
    const msgpack_object *o = lmc_mp_map_get(map, name);
    return o && lmc_mp_get_str(o, s, len);
}

static bool get_int_field(const msgpack_object *map, const char *name, int64_t *out)
{
    const msgpack_object *o = lmc_mp_map_get(map, name);
    return o && o->type != MSGPACK_OBJECT_BOOLEAN && lmc_mp_get_int(o, out);
}

/* Nil, absent or an empty array. */
static bool empty_or_nil(const msgpack_object *map, const char *name)
{
    const msgpack_object *o = lmc_mp_map_get(map, name);
    return !o || lmc_mp_is_nil(o) || (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 0);
}

static int decode_required(const msgpack_object *o, reg_payload *p)
{
    if (!o || o->type != MSGPACK_OBJECT_MAP) /* no payload frame, or not a map */
        return -1;
    const msgpack_object *mla = lmc_mp_map_get(o, "use_mla");
    if (!get_int_field(o, "instance_id", &p->instance_id) ||
        !get_str_field(o, "model_name", &p->model, &p->model_len) ||
        !get_int_field(o, "world_size", &p->world_size) ||
        !get_int_field(o, "num_layers", &p->num_layers) ||
        !get_int_field(o, "hidden_dim_size", &p->hidden_dim) ||
        !get_str_field(o, "dtype_str", &p->dtype, &p->dtype_len) || !mla ||
        !lmc_mp_get_bool(mla, &p->use_mla))
        return -1;
    return 0;
}

/* Single-group layouts, and multi-group ones described by object-group
 * fields (group_wire.h); quantized and the other layouts are refused with a
 * reason the newest clients surface. */
static const char *unsupported(const msgpack_object *o, const reg_payload *p, uint32_t cs)
{
    const msgpack_object *q = lmc_mp_map_get(o, "enable_l1_kvweave_quant");
    bool quant = false;
    int64_t slots;
    const msgpack_object *gl = lmc_mp_map_get(o, "group_layouts");
    const msgpack_object *gi = lmc_mp_map_get(o, "engine_group_infos");
    if (!lmc_model_name_valid(p->model, p->model_len))
        return LMC_MODEL_NAME_RULE;
    if (p->world_size < 1 || p->world_size > 255)
        return "world_size must be in 1..255";
    if (p->num_layers < 1 || p->num_layers > (1 << 20) || p->hidden_dim < 1 ||
        p->hidden_dim > (1 << 24))
        return "num_layers and hidden_dim_size must be positive";
    if (q && lmc_mp_get_bool(q, &quant) && quant)
        return "enable_l1_kvweave_quant is not supported";
    if (!empty_or_nil(o, "group_layout_descs"))
        return "group_layout_descs (multi-dtype groups) are not supported";
    if (gl && gl->type == MSGPACK_OBJECT_ARRAY && gl->via.array.size > 1)
        return "group_layouts (multi-group layouts of older clients) are not supported";
    if (gi && gi->type == MSGPACK_OBJECT_ARRAY && gi->via.array.size > 1 &&
        !lmc_engine_driven_groups_present(o))
        return "several engine_group_infos need the object-group fields "
               "(object_group_layout_shapes, transfer_metadata_wire)";
    if (get_int_field(o, "num_physical_slots", &slots) && slots != (int64_t)cs)
        return "num_physical_slots different from the chunk size is not supported";
    return NULL;
}

static void pack_register_reply(engine_mod *m, msgpack_packer *pk, const char *error)
{
    const lmc_l1_arena_desc *a = lmc_storage_manager_l1_arena(m->ctx->storage);
    bool shm = !error && a && a->shm_name && a->shm_name[0];
    msgpack_pack_map(pk, error ? 3 : 2);
    lmc_mp_pack_cstr(pk, "shm_name");
    lmc_mp_pack_cstr(pk, shm ? a->shm_name : "");
    lmc_mp_pack_cstr(pk, "pool_size");
    msgpack_pack_uint64(pk, shm ? a->size : 0);
    if (error) {
        lmc_mp_pack_cstr(pk, "error");
        lmc_mp_pack_cstr(pk, error);
    }
}

static int add_ctx_locked(engine_mod *m, ed_ctx *c)
{
    if (lmc_grow_array(&m->ctxs, &m->cap_ctxs, m->n_ctxs + 1, sizeof *m->ctxs, 8) != 0)
        return -1;
    m->ctxs[m->n_ctxs++] = c;
    return 0;
}

static void free_ctx(ed_ctx *c)
{
    lmc_engine_driven_groups_unref(c->groups);
    lmc_intern_release(c->model);
    free(c);
}

/* The context's layout: the flat fields', or the object groups' of a
 * multi-group payload.  0, or -1 with the reason in err. */
static int build_layout(engine_mod *m, ed_ctx *c, const msgpack_object *o,
                        const reg_payload *p, char *err, size_t errlen)
{
    if (lmc_engine_driven_groups_present(o)) {
        c->groups = lmc_engine_driven_groups_decode(o, m->cs, &c->layout, err, errlen);
        return c->groups ? 0 : -1;
    }
    if (lmc_layout_build(&c->layout, m->cs, (uint32_t)p->num_layers, (uint32_t)p->hidden_dim,
                         p->dtype, p->dtype_len, p->use_mla, err, errlen) != 0)
        return snprintf(err, errlen, "unsupported dtype_str"), -1;
    return 0;
}

/* Creates the context of a new instance; returns NULL, or why not in err. */
static const char *create_ctx(engine_mod *m, const msgpack_object *o, const reg_payload *p,
                              char *err, size_t errlen)
{
    ed_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return "out of memory";
    c->instance_id = p->instance_id;
    c->world_size = (uint32_t)p->world_size;
    c->model = lmc_intern(m->ctx->interner, p->model, p->model_len);
    snprintf(c->tag, sizeof c->tag, "ed:%lld", (long long)p->instance_id);
    if (!c->model) {
        free_ctx(c);
        return lmc_key_interner_full(m->ctx->interner)
                   ? "too many distinct model names and cache salts (--max-interned-strings)"
                   : "out of memory";
    }
    if (build_layout(m, c, o, p, err, errlen) != 0) {
        free_ctx(c);
        return err;
    }
    if (lmc_layout_registry_acquire(m->ctx->layouts, c->model, c->world_size, &c->layout) != 0) {
        free_ctx(c);
        return "layout conflicts with another registration of this model and world size";
    }
    pthread_mutex_lock(&m->lock);
    /* Two racing registrations of one id cannot happen: both are SYNC. */
    int rc = add_ctx_locked(m, c);
    pthread_mutex_unlock(&m->lock);
    if (rc != 0) {
        lmc_layout_registry_release(m->ctx->layouts, c->model, c->world_size);
        free_ctx(c);
        return "out of memory";
    }
    return NULL;
}

/* REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT(payload) -> {shm_name, pool_size[, error]} */
lmc_handler_result lmc_engine_driven_register(void *state, lmc_rpc_call *call)
{
    engine_mod *m = state;
    const msgpack_object *o = lmc_rpc_call_arg(call, 0);
    reg_payload p = {0};
    char err[256];
    if (decode_required(o, &p) != 0)
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "REGISTER_ENGINE_DRIVEN_CONTEXT: malformed payload");
    pthread_mutex_lock(&m->lock);
    bool known = false;
    for (size_t i = 0; i < m->n_ctxs && !known; i++)
        known = m->ctxs[i]->instance_id == p.instance_id;
    pthread_mutex_unlock(&m->lock);
    const char *error = known ? NULL : unsupported(o, &p, m->cs);
    if (!known && !error)
        error = create_ctx(m, o, &p, err, sizeof err);
    if (error)
        LMC_WARN_LIMITED("engine-driven registration of instance %lld refused: %s",
                         (long long)p.instance_id, error);
    else
        lmc_liveness_register(m->ctx->liveness, p.instance_id, lmc_monotonic_ms(NULL));
    if (!known && !error)
        LMC_INFO("engine-driven instance %lld registered (%.*s, world size %lld%s)",
                 (long long)p.instance_id, (int)p.model_len, p.model, (long long)p.world_size,
                 lmc_engine_driven_groups_present(o) ? ", object groups" : "");
    pack_register_reply(m, lmc_rpc_call_reply(call), error);
    return LMC_HANDLER_REPLY;
}

/* Unlinks and cleans one instance up; false if it was not registered. */
static bool drop_instance(engine_mod *m, int64_t id)
{
    pthread_mutex_lock(&m->lock);
    ed_ctx *c = NULL;
    for (size_t i = 0; i < m->n_ctxs && !c; i++) {
        if (m->ctxs[i]->instance_id == id) {
            c = m->ctxs[i];
            m->ctxs[i] = m->ctxs[--m->n_ctxs];
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (!c)
        return false;
    lmc_engine_driven_ctx_destroy(m, c);
    lmc_liveness_forget(m->ctx->liveness, id);
    return true;
}

/* UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT(instance_id) -> void */
lmc_handler_result lmc_engine_driven_unregister(void *state, lmc_rpc_call *call)
{
    engine_mod *m = state;
    const msgpack_object *o = lmc_rpc_call_arg(call, 0);
    int64_t id;
    if (!o || o->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_int(o, &id))
        return lmc_rpc_call_fail(call, "ValidationError", "instance_id must be an int");
    if (!drop_instance(m, id))
        LMC_WARN_LIMITED("unregister: engine-driven instance %lld is not registered",
                         (long long)id);
    return LMC_HANDLER_VOID;
}

static size_t list_ids(void *user, int64_t *ids, size_t cap)
{
    engine_mod *m = user;
    pthread_mutex_lock(&m->lock);
    size_t n = m->n_ctxs;
    for (size_t i = 0; i < n && i < cap; i++)
        ids[i] = m->ctxs[i]->instance_id;
    pthread_mutex_unlock(&m->lock);
    return n;
}

static void reap_one(void *user, int64_t id)
{
    engine_mod *m = user;
    if (drop_instance(m, id)) {
        atomic_fetch_add(&m->reaped, 1);
        LMC_WARN("reaped engine-driven instance %lld (silent too long)", (long long)id);
    }
}

int lmc_engine_driven_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    engine_mod *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "engine_driven_transfer: out of memory");
        return -1;
    }
    m->ctx = ctx;
    m->cs = (uint32_t)ctx->config->mp.chunk_size;
    pthread_mutex_init(&m->lock, NULL);
    m->cfg_reap_s = ctx->config->mp.worker_reap_timeout_seconds;
    m->cfg_grace_s = ctx->config->mp.worker_registration_grace_seconds;
    lmc_reaper_options ro = {.liveness = ctx->liveness, .list = list_ids, .reap = reap_one,
                             .user = m, .start_thread = true};
    lmc_reaper_set_timeouts(&ro, m->cfg_reap_s, m->cfg_grace_s);
    m->reap_timeout_ms = ro.timeout_ms;
    m->grace_ms = ro.grace_ms;
    m->reaper = lmc_reaper_new(&ro);
    if (!m->reaper) {
        pthread_mutex_destroy(&m->lock);
        free(m);
        snprintf(err, errlen, "engine_driven_transfer: cannot start the reaper");
        return -1;
    }
    *state = m;
    return 0;
}

void lmc_engine_driven_close(void *state)
{
    engine_mod *m = state;
    lmc_reaper_free(m->reaper);
    /* Pending writes are dropped unpublished, as on unregister. */
    while (m->n_ctxs)
        lmc_engine_driven_ctx_destroy(m, m->ctxs[--m->n_ctxs]);
    free(m->ctxs);
    pthread_mutex_destroy(&m->lock);
    free(m);
}
