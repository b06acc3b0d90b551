/* Management module: GET_CHUNK_SIZE, NOOP, PING, CLEAR,
 * REPORT_BLOCK_ALLOCATION, GET_EXPERIMENTAL (docs/protocol.md, "Ops
 * implemented so far"; PING feeds docs/architecture.md, "Reaper"). */
#include <pthread.h>
#include <stdlib.h>

#include "modules/module.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/storage_manager.h"

typedef struct {
    lmc_module_ctx *ctx;
    pthread_mutex_t clear_lock;   /* CLEARs run one at a time */
    uint64_t clears;
} management;

static lmc_handler_result get_chunk_size(void *state, lmc_rpc_call *call)
{
    management *m = state;
    msgpack_pack_int(lmc_rpc_call_reply(call), m->ctx->config->mp.chunk_size);
    return LMC_HANDLER_REPLY;
}

static lmc_handler_result noop(void *state, lmc_rpc_call *call)
{
    (void)state;
    lmc_mp_pack_cstr(lmc_rpc_call_reply(call), "OK");
    return LMC_HANDLER_REPLY;
}

/* Capabilities a worker checks before it sends their ops: an older server
 * drops a connection on an op it does not know (docs/kv_events.md). */
static lmc_handler_result get_experimental(void *state, lmc_rpc_call *call)
{
    management *m = state;
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    if (m->ctx->kv_events) {
        msgpack_pack_array(pk, 1);
        lmc_mp_pack_cstr(pk, "kv_events");
    } else {
        msgpack_pack_array(pk, 0);
    }
    return LMC_HANDLER_REPLY;
}

/* PING(instance_id | None); older clients send no frame at all. */
static lmc_handler_result ping(void *state, lmc_rpc_call *call)
{
    management *m = state;
    if (lmc_rpc_call_nargs(call) >= 1) {
        const msgpack_object *arg = lmc_rpc_call_arg(call, 0);
        int64_t id;
        if (!arg)
            return lmc_rpc_call_fail(call, "DecodeError", "PING: undecodable instance_id");
        if (!lmc_mp_is_nil(arg)) {
            if (arg->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_int(arg, &id))
                return lmc_rpc_call_fail(call, "ValidationError",
                                         "PING: instance_id must be an int or None");
            lmc_liveness_touch(m->ctx->liveness, id, lmc_monotonic_ms(NULL), true);
        }
    }
    msgpack_pack_true(lmc_rpc_call_reply(call));
    return LMC_HANDLER_REPLY;
}

/* CLEAR([force]): no frame means force, as the older server always forced. */
static lmc_handler_result clear(void *state, lmc_rpc_call *call)
{
    management *m = state;
    bool force = true;
    if (lmc_rpc_call_nargs(call) >= 1) {
        const msgpack_object *arg = lmc_rpc_call_arg(call, 0);
        if (!arg || !lmc_mp_get_bool(arg, &force))
            return lmc_rpc_call_fail(call, "ValidationError", "CLEAR: force must be a bool");
    }
    pthread_mutex_lock(&m->clear_lock);
    if (m->ctx->storage)
        lmc_storage_manager_clear(m->ctx->storage, force);
    m->clears++;
    pthread_mutex_unlock(&m->clear_lock);
    LMC_INFO("cache cleared (force=%s)", force ? "true" : "false");
    return LMC_HANDLER_VOID;
}

static json_t *block_records_to_json(const msgpack_object *records);

/* REPORT_BLOCK_ALLOCATION(instance_id, model_name, records): observability
 * only; republished as an event. */
static lmc_handler_result report_block_allocation(void *state, lmc_rpc_call *call)
{
    management *m = state;
    const msgpack_object *id_o = lmc_rpc_call_arg(call, 0);
    const msgpack_object *model_o = lmc_rpc_call_arg(call, 1);
    const msgpack_object *records = lmc_rpc_call_arg(call, 2);
    int64_t id;
    const char *model;
    size_t model_len;
    if (!id_o || !model_o || !records || !lmc_mp_get_int(id_o, &id) ||
        !lmc_mp_get_str(model_o, &model, &model_len) || records->type != MSGPACK_OBJECT_ARRAY)
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "REPORT_BLOCK_ALLOCATION: expected (int, str, list)");
    json_t *recs = block_records_to_json(records);
    if (!recs)
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "REPORT_BLOCK_ALLOCATION: malformed BlockAllocationRecord");
    if (m->ctx->events) {
        json_t *meta = json_pack("{s:I, s:s%, s:o}", "instance_id", (json_int_t)id,
                                 "model_name", model, model_len, "records", recs);
        lmc_event_bus_publish(m->ctx->events, "REPORT_BLOCK_ALLOCATION", NULL, meta);
    } else {
        json_decref(recs);
    }
    return LMC_HANDLER_VOID;
}

static json_t *int_array_to_json(const msgpack_object *o)
{
    if (!o || o->type != MSGPACK_OBJECT_ARRAY)
        return NULL;
    json_t *arr = json_array();
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        int64_t v;
        if (!lmc_mp_get_int(&o->via.array.ptr[i], &v)) {
            json_decref(arr);
            return NULL;
        }
        json_array_append_new(arr, json_integer(v));
    }
    return arr;
}

/* BlockAllocationRecord = {req_id: str, new_block_ids: [int], new_token_ids: [int]} */
static json_t *block_records_to_json(const msgpack_object *records)
{
    json_t *out = json_array();
    for (uint32_t i = 0; i < records->via.array.size; i++) {
        const msgpack_object *r = &records->via.array.ptr[i];
        const msgpack_object *req = lmc_mp_map_get(r, "req_id");
        const char *req_id;
        size_t req_len;
        json_t *blocks = int_array_to_json(lmc_mp_map_get(r, "new_block_ids"));
        json_t *tokens = int_array_to_json(lmc_mp_map_get(r, "new_token_ids"));
        if (!req || !lmc_mp_get_str(req, &req_id, &req_len) || !blocks || !tokens) {
            json_decref(blocks);
            json_decref(tokens);
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, json_pack("{s:s%, s:o, s:o}", "req_id", req_id, req_len,
                                             "new_block_ids", blocks, "new_token_ids", tokens));
    }
    return out;
}

static const lmc_rpc_handler_spec management_handlers[] = {
    {LMC_OP_GET_CHUNK_SIZE, NULL, LMC_POOL_SYNC, get_chunk_size, false, NULL, NULL, false},
    {LMC_OP_NOOP, NULL, LMC_POOL_SYNC, noop, false, NULL, NULL, false},
    {LMC_OP_GET_EXPERIMENTAL, NULL, LMC_POOL_SYNC, get_experimental, false, NULL, NULL, false},
    {LMC_OP_PING, NULL, LMC_POOL_NORMAL, ping, .quick = true},
    {LMC_OP_CLEAR, NULL, LMC_POOL_NORMAL, clear, false, NULL, NULL, false},
    {LMC_OP_REPORT_BLOCK_ALLOCATION, NULL, LMC_POOL_NORMAL, report_block_allocation, false, NULL, NULL, false},
};

static int management_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    management *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "management: out of memory");
        return -1;
    }
    m->ctx = ctx;
    pthread_mutex_init(&m->clear_lock, NULL);
    *state = m;
    return 0;
}

static json_t *management_status(void *state)
{
    management *m = state;
    pthread_mutex_lock(&m->clear_lock);
    json_int_t clears = (json_int_t)m->clears;
    pthread_mutex_unlock(&m->clear_lock);
    return json_pack("{s:b, s:I, s:I}", "is_healthy", 1, "clear_count", clears,
                     "tracked_instances", (json_int_t)lmc_liveness_count(m->ctx->liveness));
}

static void management_close(void *state)
{
    management *m = state;
    pthread_mutex_destroy(&m->clear_lock);
    free(m);
}

const lmc_module_def lmc_management_module = {
    .name = "management",
    .create = management_create,
    .handlers = management_handlers,
    .n_handlers = sizeof management_handlers / sizeof management_handlers[0],
    .report_status = management_status,
    .close = management_close,
};
