/* Server-driven ("lmcache_driven") transfer module (docs/protocol.md,
 * "Server-driven transfer ops").  Built so far: REGISTER_KV_CACHE reads and
 * checks the engine's tensor handles (modules/shared_tensor.h) and then
 * refuses the registration with a log line that says why and what to run
 * instead, since the copies are not built yet; UNREGISTER_KV_CACHE answers
 * as upstream does for an instance it does not know.  STORE and RETRIEVE
 * have no handler yet (dropped, as any op without one). */
#include <msgpack.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "modules/module.h"
#include "modules/shared_tensor.h"
#include "obs/log.h"
#include "rpc/wire.h"

typedef struct {
    lmc_module_ctx *ctx;
    atomic_uint_fast64_t registrations_refused, tensors_decoded, unregisters;
} lmcache_driven;

#define MAX_TENSORS 4096   /* per registration: layers x engine groups */

static void describe(const lmc_shared_tensor *t, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s %s [", lmc_tensor_wrapper_name(t->wrapper), t->dtype);
    for (uint32_t d = 0; d < t->ndim && n > 0 && (size_t)n < cap; d++)
        n += snprintf(out + n, cap - (size_t)n, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (n > 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, "]");
}

/* Decodes every handle of frame 1; 0, or -1 with the reason in err. */
static int decode_tensors(lmcache_driven *m, const msgpack_object *list, char *first,
                          size_t first_cap, char *err, size_t errlen)
{
    if (!list || list->type != MSGPACK_OBJECT_ARRAY || list->via.array.size == 0 ||
        list->via.array.size > MAX_TENSORS)
        return snprintf(err, errlen, "kv_cache must be a list of 1..%d tensor handles",
                        MAX_TENSORS), -1;
    for (uint32_t i = 0; i < list->via.array.size; i++) {
        const msgpack_object *o = &list->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_EXT || o->via.ext.type != 1)
            return snprintf(err, errlen, "kv_cache[%u] is not a msgpack ext type 1", i), -1;
        lmc_shared_tensor t;
        char why[256];
        if (lmc_shared_tensor_decode((const uint8_t *)o->via.ext.ptr, o->via.ext.size, &t, why,
                                     sizeof why) != 0)
            return snprintf(err, errlen, "kv_cache[%u]: %s", i, why), -1;
        if (i == 0)
            describe(&t, first, first_cap);
        atomic_fetch_add(&m->tensors_decoded, 1);
    }
    return 0;
}

/* REGISTER_KV_CACHE(instance_id, kv_cache, model_name, world_size, ...).
 * Upstream answers a registration it cannot serve with nothing (its
 * handler raises); the engine's call then times out.  The log says which. */
static lmc_handler_result register_kv_cache(void *state, lmc_rpc_call *call)
{
    lmcache_driven *m = state;
    int64_t instance;
    char err[384], first[160] = "";
    atomic_fetch_add(&m->registrations_refused, 1);
    if (!lmc_mp_get_int(lmc_rpc_call_arg(call, 0), &instance))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "REGISTER_KV_CACHE: instance_id must be an int");
    const msgpack_object *list = lmc_rpc_call_arg(call, 1);
    if (decode_tensors(m, list, first, sizeof first, err, sizeof err) != 0)
        return lmc_rpc_call_fail(call, "ValidationError", "REGISTER_KV_CACHE %lld: %s",
                                 (long long)instance, err);
    return lmc_rpc_call_fail(call, "NotImplementedError",
                             "REGISTER_KV_CACHE %lld: %u tensors (%s, ...) read, but lmcached "
                             "does not copy server-driven yet; start the engine with the "
                             "engine-driven transfer mode",
                             (long long)instance, list->via.array.size, first);
}

/* UNREGISTER_KV_CACHE(instance_id): a worker sends it at shutdown and waits
 * for the reply, so an instance this server never registered is answered
 * (void) with a warning, as upstream does. */
static lmc_handler_result unregister_kv_cache(void *state, lmc_rpc_call *call)
{
    lmcache_driven *m = state;
    int64_t instance;
    if (!lmc_mp_get_int(lmc_rpc_call_arg(call, 0), &instance))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "UNREGISTER_KV_CACHE: instance_id must be an int");
    atomic_fetch_add(&m->unregisters, 1);
    LMC_WARN("UNREGISTER_KV_CACHE: instance %lld is not registered", (long long)instance);
    return LMC_HANDLER_VOID;
}

static const lmc_rpc_handler_spec lmcache_driven_handlers[] = {
    {LMC_OP_REGISTER_KV_CACHE, NULL, LMC_POOL_SYNC, register_kv_cache, false},
    {LMC_OP_UNREGISTER_KV_CACHE, NULL, LMC_POOL_SYNC, unregister_kv_cache, false},
};

static int lmcache_driven_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    lmcache_driven *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "lmcache_driven_transfer: out of memory");
        return -1;
    }
    m->ctx = ctx;
    *state = m;
    return 0;
}

static json_t *lmcache_driven_status(void *state)
{
    lmcache_driven *m = state;
    return json_pack("{s:b, s:b, s:I, s:I, s:I}", "is_healthy", 1, "copies_implemented", 0,
                     "registrations_refused",
                     (json_int_t)atomic_load(&m->registrations_refused), "tensors_decoded",
                     (json_int_t)atomic_load(&m->tensors_decoded), "unregisters",
                     (json_int_t)atomic_load(&m->unregisters));
}

static void lmcache_driven_close(void *state)
{
    free(state);
}

const lmc_module_def lmc_lmcache_driven_module = {
    .name = "lmcache_driven_transfer",
    .create = lmcache_driven_create,
    .handlers = lmcache_driven_handlers,
    .n_handlers = sizeof lmcache_driven_handlers / sizeof lmcache_driven_handlers[0],
    .report_status = lmcache_driven_status,
    .close = lmcache_driven_close,
};
