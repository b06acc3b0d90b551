/* Engine-driven transfer ops of multi-group contexts (docs/protocol.md,
 * "Engine-driven multi-group layouts"): PREPARE_STORE and PREPARE_RETRIEVE
 * of every object group of a hybrid model's chunks, each answered with one
 * slot per kernel group entry.  The COMMITs, the contexts and the pending
 * lists are the single-group path's (engine_driven.c). */
#include <stdatomic.h>
#include <stdlib.h>

#include "modules/transfer/engine/engine_internal.h"
#include "modules/transfer/transfer.h"
#include "obs/events.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/storage_events.h"
#include "storage/storage_manager.h"

/* One object group's slots of one chunk: a slot per entry, at the entry's
 * place inside the object (docs/protocol.md, "Engine-driven multi-group
 * layouts"). */
static void pack_entry_slots(msgpack_packer *pk, const lmc_engine_driven_groups *g, uint32_t og,
                             uint64_t object_offset)
{
    msgpack_pack_array(pk, g->first[og + 1] - g->first[og]);
    for (uint32_t k = g->first[og]; k < g->first[og + 1]; k++) {
        const lmc_engine_driven_entry *e = &g->entries[k];
        lmc_engine_driven_pack_slot(pk, object_offset + e->offset, e->bytes, e->ndim, e->shape, e->dtype);
    }
}

/* {"object_groups": [{"object_group_id", "chunk_indices", "slots"}, ...]}:
 * every object group, each with the chunks `in[c * G + og]` marks, in chunk
 * order, and their objects' slots (leases chunk-major like the keys).
 * `in` NULL: no chunk in any group. */
void lmc_engine_driven_pack_groups_context(msgpack_packer *pk, const lmc_engine_driven_groups *g, size_t n,
                                const lmc_lease *leases, const bool *in)
{
    uint32_t G = g->n_groups;
    msgpack_pack_map(pk, 1);
    lmc_mp_pack_cstr(pk, "object_groups");
    msgpack_pack_array(pk, G);
    for (uint32_t og = 0; og < G; og++) {
        size_t count = 0;
        for (size_t c = 0; in && c < n; c++)
            count += in[c * G + og];
        msgpack_pack_map(pk, 3);
        lmc_mp_pack_cstr(pk, "object_group_id");
        msgpack_pack_uint32(pk, og);
        lmc_mp_pack_cstr(pk, "chunk_indices");
        msgpack_pack_array(pk, count);
        for (size_t c = 0; in && c < n; c++)
            if (in[c * G + og])
                msgpack_pack_uint64(pk, c);
        lmc_mp_pack_cstr(pk, "slots");
        msgpack_pack_array(pk, count);
        for (size_t c = 0; in && c < n; c++)
            if (in[c * G + og])
                pack_entry_slots(pk, g, og, leases[c * G + og].offset);
    }
}

/* One object group's keys, leases and results of an op's chunks. */
typedef struct {
    lmc_object_key *keys;
    lmc_lease *leases;
    lmc_l1_result *res;
} group_scratch;

/* Reserves object group og's missing objects of the op's chunks; leases
 * and results land chunk-major like the keys. */
static void reserve_group(engine_mod *m, const ed_op *op, uint32_t og, group_scratch *t,
                          lmc_lease *leases, lmc_l1_result *res)
{
    uint32_t G = op->groups->n_groups;
    for (size_t c = 0; c < op->n; c++)
        t->keys[c] = op->keys[c * G + og];
    lmc_transfer_reserve_writes(m->ctx->storage, t->keys, op->n, op->layout.group_sizes[og], op->tag,
                       t->leases, t->res);
    for (size_t c = 0; c < op->n; c++) {
        leases[c * G + og] = t->leases[c];
        res[c * G + og] = t->res[c];
    }
}

/* PREPARE_STORE of a multi-group context: each object group's missing
 * objects, all-or-nothing per object, never per chunk (a group whose
 * object is there already keeps it); the reply lists per group the chunks
 * it reserved. */
void lmc_engine_driven_prepare_store_groups(engine_mod *m, lmc_rpc_call *call, ed_op *op)
{
    size_t nk = op->registered && !op->unknown_names ? op->n_keys : 0, ok = 0, oom = 0;
    uint64_t bytes = 0;
    lmc_lease *leases = calloc(nk + 1, sizeof *leases), *granted = calloc(nk + 1, sizeof *granted);
    lmc_l1_result *res = calloc(nk + 1, sizeof *res);
    bool *in = calloc(nk + 1, sizeof *in);
    lmc_object_key *reserved = malloc((nk + 1) * sizeof *reserved);
    group_scratch t = {malloc((op->n + 1) * sizeof *t.keys),
                       malloc((op->n + 1) * sizeof *t.leases),
                       malloc((op->n + 1) * sizeof *t.res)};
    if (!leases || !granted || !res || !in || !reserved || !t.keys || !t.leases || !t.res) {
        oom = nk;
        nk = 0;
    }
    for (uint32_t og = 0; nk && og < op->groups->n_groups; og++)
        reserve_group(m, op, og, &t, leases, res);
    for (size_t i = 0; i < nk; i++) {
        oom += res[i] == LMC_L1_OUT_OF_MEMORY;
        in[i] = res[i] == LMC_L1_SUCCESS;
        if (in[i]) {
            granted[ok] = leases[i];
            reserved[ok++] = op->keys[i];
            bytes += op->layout.group_sizes[i % op->groups->n_groups];
        }
    }
    ok = lmc_engine_driven_keep_reserved(m, op, reserved, granted, ok, bytes);
    if (oom)
        LMC_WARN_LIMITED("PREPARE_STORE: L1 full, %zu of %zu objects not stored", oom, op->n_keys);
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    msgpack_pack_map(pk, 1);
    lmc_mp_pack_cstr(pk, "context");
    lmc_engine_driven_pack_groups_context(pk, op->groups, op->n, leases, ok ? in : NULL);
    atomic_fetch_add(&m->chunks_reserved, ok);
    if (ok)
        lmc_engine_driven_publish_transfer(m, LMC_EVENT_STORE_START, op, ok, 0);
    free(leases);
    free(granted);
    free(res);
    free(in);
    free(t.keys);
    free(t.leases);
    free(t.res);
}

/* PREPARE_RETRIEVE of a multi-group context: every full-attention group's
 * objects of every chunk and each sliding-window group's of its last
 * chunks_in_sw, all or none (each COPY lease carries the LOOKUP's share). */
void lmc_engine_driven_prepare_retrieve_groups(engine_mod *m, lmc_rpc_call *call, ed_op *op)
{
    uint32_t G = op->groups->n_groups;
    size_t nk = op->n_keys, t = 0;
    uint64_t bytes = 0;
    bool *in = calloc(nk + 1, sizeof *in);
    uint64_t *sizes = malloc((nk + 1) * sizeof *sizes);
    lmc_object_key *keys = malloc((nk + 1) * sizeof *keys);
    lmc_lease *leases = calloc(nk + 1, sizeof *leases), *by_key = calloc(nk + 1, sizeof *by_key);
    bool ok = op->registered && !op->unknown_names && op->n > 0 && in && keys && leases &&
              by_key && sizes;
    for (size_t i = 0; ok && i < nk; i++) {
        in[i] = i / G >= lmc_engine_driven_groups_window_start(op->groups, (uint32_t)(i % G), op->n);
        if (in[i]) {
            sizes[t] = op->layout.group_sizes[i % G];
            keys[t++] = op->keys[i];
            bytes += op->layout.group_sizes[i % G];
        }
    }
    lmc_object_sizes want = {sizes, (uint32_t)(t ? t : 1), 1};
    if (ok && lmc_storage_manager_lease_copy(m->ctx->storage, keys, t, LMC_COPY_CARRIES_SHARE,
                                             true, &want, leases, NULL) != t) {
        lmc_storage_manager_report_read_failure(m->ctx->storage, "l1_retrieve", "not_found",
                                                &keys[0], t);
        ok = false;
    }
    if (ok) {
        for (size_t i = 0, j = 0; i < nk; i++)
            if (in[i])
                by_key[i] = leases[j++];
        lmc_keys_hold(keys, t); /* the pending entry outlives this request */
        ok = lmc_engine_driven_add_pending(m, op, keys, leases, t, bytes, false);
        if (ok) {
            keys = NULL;
        } else { /* no COMMIT_RETRIEVE will come for these: this reader is done */
            lmc_storage_manager_give_back(m->ctx->storage, keys, leases, t);
            lmc_keys_drop(keys, t);
        }
    }
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    lmc_engine_driven_pack_retrieve_head(pk, ok);
    if (ok)
        lmc_engine_driven_pack_groups_context(pk, op->groups, op->n, by_key, in);
    else
        msgpack_pack_map(pk, 0);
    atomic_fetch_add(ok ? &m->retrieves_ok : &m->retrieves_failed, 1);
    if (ok)
        lmc_engine_driven_publish_transfer(m, LMC_EVENT_RETRIEVE_START, op, t, 0);
    free(in);
    free(sizes);
    free(keys);
    free(leases);
    free(by_key);
}

