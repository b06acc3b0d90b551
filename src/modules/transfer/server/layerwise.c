/* Layerwise RETRIEVE (docs/protocol.md, "RETRIEVE_LAYERWISE"): the same
 * copy as RETRIEVE, done a batch of --layerwise-batch layers at a time, with
 * one streamed reply per batch as soon as its layers are in the engine's
 * blocks, so the engine can run layer 0 while later layers still copy.
 *
 *   REGISTER_LAYERWISE_IPC_EVENT_POOL   SYNC      -> [batch, [event handle...]]
 *   RETRIEVE_LAYERWISE                  AFFINITY  -> [payload, false, false] per batch,
 *                                                    then [b"", true, ok]
 *
 * Objects keep the layout every other path reads and writes ([kv][layer]
 * per kernel group): a batch copies its layers' K rows and V rows.  On CPU
 * shared tensors a batch's reply leaves once its bytes are in the blocks;
 * on CUDA once its copies are enqueued and the pool event of its first
 * layer recorded after them (cuda_plugin.c), which the engine waits on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_copy.h"
#include "kv/kv_layerwise.h"
#include "modules/transfer/resolve.h"
#include "modules/transfer/server/server_internal.h"
#include "modules/transfer/transfer.h"
#include "config/config.h"
#include "obs/events.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/storage_events.h"
#include "storage/storage_manager.h"

#define EVENT_HANDLE_BYTES 64

static uint32_t batch_setting(const sd_mod *m)
{
    return (uint32_t)m->ctx->config->mp.layerwise_batch;
}

/* The context's pool handles (layers * 64 bytes, malloc'd): a CUDA
 * context's exported events, a CPU context's 64 zero bytes each, nothing
 * to wait for (the form a CUDA-less upstream server sends for RETRIEVE's
 * event).  NULL when none can be made. */
static uint8_t *pool_handles(sd_mod *m, sd_ctx *c, uint32_t layers)
{
    char err[256];
    uint8_t *h = calloc(layers, EVENT_HANDLE_BYTES);
    if (h && c->cuda &&
        lmc_server_driven_cuda_event_pool(m, c, layers, h, err, sizeof err) != 0) {
        LMC_WARN_LIMITED("REGISTER_LAYERWISE_IPC_EVENT_POOL %lld: %s; layerwise off for it",
                         (long long)c->instance_id, err);
        free(h);
        return NULL;
    }
    return h;
}

/* REGISTER_LAYERWISE_IPC_EVENT_POOL(instance_id) -> [batch, handles]: pool
 * index i is the event of the batch whose first layer has index i.  [0, []]
 * (layerwise off for this worker, so an upstream worker sends plain
 * RETRIEVE) when the flag is 0, the instance is not registered, or its
 * CUDA events cannot be made. */
lmc_handler_result lmc_server_driven_register_layerwise_pool(void *state, lmc_rpc_call *call)
{
    sd_mod *m = state;
    int64_t id;
    if (!lmc_transfer_instance_arg(call, 0, &id))
        return lmc_rpc_call_fail(call, "TypeError", "instance_id must be an int");
    sd_ctx *c = lmc_server_driven_get(m, id);
    uint32_t batch = batch_setting(m);
    uint32_t layers = c && batch ? lmc_kv_layer_pool_size(&c->plan) : 0;
    uint8_t *handles = layers ? pool_handles(m, c, layers) : NULL;
    if (!handles)
        layers = 0;
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    msgpack_pack_array(pk, 2);
    msgpack_pack_uint32(pk, layers ? batch : 0);
    msgpack_pack_array(pk, layers);
    for (uint32_t i = 0; i < layers; i++) {
        msgpack_pack_bin(pk, EVENT_HANDLE_BYTES);
        msgpack_pack_bin_body(pk, handles + (size_t)i * EVENT_HANDLE_BYTES, EVENT_HANDLE_BYTES);
    }
    free(handles);
    if (c)
        lmc_server_driven_put(m, c);
    return LMC_HANDLER_REPLY;
}

/* [payload, is_final, succeeded] into `pk`. */
static void pack_frame(msgpack_packer *pk, const uint8_t *payload, size_t len, bool final,
                       bool ok)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_bin(pk, len);
    if (len)
        msgpack_pack_bin_body(pk, payload, len);
    final ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    ok ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

/* Streams the frame of one landed batch.  A client that is gone or not
 * reading loses it (ZMQ drops it); the copy goes on either way. */
static bool send_batch(lmc_rpc_call *call, const lmc_kv_layer_ref *refs, size_t n)
{
    uint8_t *payload = malloc(LMC_KV_LAYERWISE_FRAME_MAX(n));
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    bool ok = payload != NULL;
    if (ok) {
        pack_frame(&pk, payload, lmc_kv_layerwise_frame(refs, n, payload), false, false);
        ok = sb.data && lmc_rpc_call_send_partial(call, sb.data, sb.size) == 0;
    }
    msgpack_sbuffer_destroy(&sb);
    free(payload);
    return ok;
}

static uint32_t member_of(const lmc_kv_object_group *o, uint32_t kg)
{
    uint32_t k = 0;
    while (k + 1 < o->n_members && o->members[k] != kg)
        k++;
    return k;
}

/* Scatters the batch's layers of chunks first + [from, to) of its object
 * group, one layer run per kernel group at a time. */
static bool scatter_batch_items(const sd_split *sp, size_t from, size_t to)
{
    sd_mod *m = sp->m;
    const sd_op *op = sp->op;
    const lmc_kv_plan *p = &op->c->plan;
    const lmc_kv_layer_ref *refs = sp->refs;
    size_t n = sp->n_refs, first = sp->first;
    uint32_t og = sp->og;
    for (size_t c = first + from; c < first + to; c++) {
        uint32_t skips[LMC_KV_MAX_KERNEL_GROUPS];
        if (!lmc_server_driven_chunk_skip(op, m->cs, og, c, sp->skip, skips))
            continue;
        for (size_t i = 0; i < n;) {
            size_t run = 1;   /* consecutive layers of one kernel group: one call */
            while (i + run < n && refs[i + run].kg == refs[i].kg &&
                   refs[i + run].layer == refs[i].layer + run)
                run++;
            const lmc_kv_kernel_group *g = &p->kg[refs[i].kg];
            lmc_kv_chunk_copy cc = {.g = g, .bases = op->c->bases[refs[i].kg],
                                    .blocks = lmc_server_driven_kept_ids(op, refs[i].kg, c),
                                    .entry = op->arena + sp->leases[c - first].offset +
                                             g->entry_offset,
                                    .skip_blocks = skips[member_of(&p->og[og], refs[i].kg)],
                                    .method = m->copy};
            lmc_kv_scatter_layers(&cc, refs[i].layer, refs[i].layer + (uint32_t)run);
            i += run;
        }
    }
    return true;
}

/* Scatters the layers refs[0..n) of chunks [first, op->n) of object group
 * og, split across the copy workers like a RETRIEVE's (server_driven.c);
 * false when the engine's memory went away under the copy. */
static bool scatter_batch(sd_mod *m, lmc_rpc_call *call, const sd_op *op, uint32_t og,
                          size_t first, uint64_t skip, const lmc_lease *leases,
                          const lmc_kv_layer_ref *refs, size_t n)
{
    const lmc_kv_plan *p = &op->c->plan;
    sd_split sp = {.m = m, .op = op, .og = og, .first = first, .skip = skip, .leases = leases,
                   .refs = refs, .n_refs = n, .items = op->n - first,
                   .copy = scatter_batch_items};
    uint32_t layers = lmc_kv_plan_layers(p);
    uint64_t bytes = layers ? sp.items * p->og[og].object_size * n / layers : 0;
    return lmc_server_driven_run_split(call, &sp, bytes);
}

/* Leases object group og's objects in its window, then copies and
 * announces them batch by batch; every lease goes back before it returns,
 * whatever happened (docs/protocol.md, "RETRIEVE_LAYERWISE"). */
static bool stream_group(sd_mod *m, lmc_rpc_call *call, const sd_op *op, uint32_t og,
                         uint64_t skip, lmc_object_key *keys, lmc_lease *leases,
                         uint64_t *bytes)
{
    const lmc_kv_plan *p = &op->c->plan;
    size_t first = lmc_server_driven_window_start(op, og), n = op->n - first;
    for (size_t c = first; c < op->n; c++) {
        for (uint32_t k = 0; k < p->og[og].n_members; k++)
            if (!lmc_server_driven_ids_in_range(op, p->og[og].members[k], c))
                return false;
        keys[c - first] = op->keys[c * p->n_og + og];
    }
    lmc_kv_layer_batches lb;
    if (lmc_kv_layer_batches_build(p, og, batch_setting(m), &lb) != 0)
        return false;
    lmc_object_sizes want = {&p->og[og].object_size, 1, 1};
    if (lmc_storage_manager_lease_copy(m->ctx->storage, keys, n, LMC_COPY_CARRIES_SHARE, true,
                                       &want, leases, NULL) != n) {
        lmc_kv_layer_batches_free(&lb);
        return false;
    }
    bool ok = true;
    for (size_t b = 0; ok && b < lb.n_batches; b++) {
        const lmc_kv_layer_ref *refs = lb.refs + lb.starts[b];
        size_t nr = lb.starts[b + 1] - lb.starts[b];
        char err[256] = "the engine's memory went away under the copy";
        ok = op->c->cuda ? lmc_server_driven_cuda_layers(m, op, og, first, skip, leases, refs,
                                                         nr, refs[0].index, err,
                                                         sizeof err) == 0
                         : scatter_batch(m, call, op, og, first, skip, leases, refs, nr);
        if (!ok)
            LMC_WARN_LIMITED("RETRIEVE_LAYERWISE on instance %lld: %s",
                             (long long)op->c->instance_id, err);
        else if (!send_batch(call, refs, nr))
            LMC_WARN_LIMITED("RETRIEVE_LAYERWISE: no memory for a batch's reply");
        atomic_fetch_add(&m->layer_batches, ok ? 1 : 0);
    }
    if (ok)
        *bytes += n * p->og[og].object_size;
    if (op->c->cuda)    /* copies may be in flight, failed or not */
        lmc_server_driven_cuda_give_back_after(m, op, keys, leases, n);
    else
        lmc_storage_manager_give_back(m->ctx->storage, keys, leases, n);
    lmc_kv_layer_batches_free(&lb);
    return ok;
}

/* Frames 0-4 resolved, and a CUDA context's stream made to wait for the
 * engine's event: 0, or -1 / -2 with the reason. */
static int begin(sd_mod *m, lmc_rpc_call *call, sd_op *op, uint64_t *skip, char *err,
                 size_t errlen)
{
    *op = (sd_op){0};
    if (batch_setting(m) == 0)
        return snprintf(err, errlen, "layerwise retrieve is off (--layerwise-batch 0, "
                                     "LMCACHE_MP_LAYERWISE_BATCH)"), -1;
    int rc = lmc_server_driven_op_begin(m, call, op, false, err, errlen);
    const uint8_t *h;
    size_t hlen;
    if (rc == 0)
        rc = lmc_server_driven_decode_skip(call, skip, err, errlen);
    if (rc == 0)
        rc = lmc_server_driven_client_event(call, &h, &hlen, err, errlen);
    if (rc == 0 && op->c->cuda)
        rc = lmc_server_driven_cuda_wait(m, op, h, hlen, err, errlen);
    return rc;
}

/* RETRIEVE_LAYERWISE(key, instance_id, block_ids, event_ipc_handle[, skip])
 * -> [frame, false, false] per landed batch, then [b"", true, ok].  A
 * failure before the copy (unknown instance, bad frames, missing objects)
 * gets only the final frame, with ok false. */
lmc_handler_result lmc_server_driven_retrieve_layerwise(void *state, lmc_rpc_call *call)
{
    sd_mod *m = state;
    sd_op op;
    char err[256];
    uint64_t skip = 0, bytes = 0;
    bool ok = begin(m, call, &op, &skip, err, sizeof err) == 0;
    lmc_object_key *keys = ok ? malloc((op.n + 1) * sizeof *keys) : NULL;
    lmc_lease *leases = ok ? calloc(op.n + 1, sizeof *leases) : NULL;
    if (ok && (!keys || !leases))
        ok = !snprintf(err, sizeof err, "out of memory");
    if (ok) {
        /* The events a RETRIEVE publishes (docs/observability.md): the
         * transfer metrics and the trace count a layerwise one alike. */
        const char *device = op.c->cuda ? "cuda" : "cpu";
        lmc_transfer_publish(m->ctx->events, LMC_EVENT_RETRIEVE_START, &op.key,
                             op.c->instance_id, device, op.n, 0);
        for (uint32_t og = 0; ok && og < op.c->plan.n_og; og++)
            ok = stream_group(m, call, &op, og, skip, keys, leases, &bytes);
        if (!ok) {
            LMC_WARN_LIMITED("RETRIEVE_LAYERWISE: chunks missing, or naming blocks outside "
                             "their tensors");
            lmc_storage_manager_report_read_failure(m->ctx->storage, "l1_retrieve",
                                                    "not_found", &op.keys[0], op.n);
        }
        lmc_transfer_publish(m->ctx->events, LMC_EVENT_RETRIEVE_END, &op.key,
                             op.c->instance_id, device, ok ? op.n : 0, bytes);
        atomic_fetch_add(&m->chunks_retrieved, ok ? op.n : 0);
        atomic_fetch_add(&m->bytes_retrieved, bytes);
    } else {
        LMC_WARN_LIMITED("RETRIEVE_LAYERWISE: %s", err);
    }
    pack_frame(lmc_rpc_call_reply(call), NULL, 0, true, ok);
    atomic_fetch_add(ok ? &m->layerwise_ok : &m->layerwise_failed, 1);
    free(keys);
    free(leases);
    lmc_server_driven_op_end(m, &op);
    return LMC_HANDLER_REPLY;
}

/* A full queue's answer (docs/protocol.md, "Overload"): the final frame
 * alone, not served. */
lmc_handler_result lmc_server_driven_layerwise_busy(void *state, lmc_rpc_call *call)
{
    (void)state;
    pack_frame(lmc_rpc_call_reply(call), NULL, 0, true, false);
    return LMC_HANDLER_REPLY;
}
