/* Server-driven ("lmcache_driven") transfer module (docs/protocol.md,
 * "Server-driven transfer ops"): the engine registers its paged KV tensors
 * once (register.c), then asks the server to copy chunks between its
 * blocks and L1.
 *
 *   REGISTER_KV_CACHE, UNREGISTER_KV_CACHE   SYNC
 *   STORE, RETRIEVE                          AFFINITY (the --max-gpu-workers pool)
 *
 * STORE gathers the chunks' blocks into freshly reserved L1 objects and
 * publishes them once every byte is in place; RETRIEVE scatters objects a
 * LOOKUP read-locked into the given blocks and gives one read share per
 * object back.  On CPU shared tensors the copy is synchronous, so both reply
 * when the bytes have moved, with 64 zero bytes for the event handle (what
 * an upstream server without a GPU sends); on CUDA tensors the copies are
 * enqueued on the context's stream and the reply carries its event
 * (cuda_plugin.c). */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "modules/transfer/server/fault_guard.h"
#include "modules/services/ipc_key.h"
#include "kv/kv_copy.h"
#include "modules/transfer/server/checksums.h"
#include "modules/transfer/server/server_internal.h"
#include "modules/transfer/resolve.h"
#include "modules/transfer/transfer.h"
#include "obs/events.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/storage_events.h"
#include "storage/storage_manager.h"

#define MAX_BLOCK_IDS (1u << 20)    /* per request, all lists together */
#define EVENT_HANDLE_BYTES 64

void lmc_server_driven_op_end(sd_mod *m, sd_op *op)
{
    if (op->key_decoded)
        lmc_ipc_key_free(&op->key);
    lmc_keys_drop(op->keys, op->n_keys);
    free(op->keys);
    free(op->ids);
    lmc_server_driven_put(m, op->c);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Copies one int list into ids; false if it is not a list of ints. */
static bool take_list(const msgpack_object *o, int64_t *ids, size_t *used)
{
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *v = &o->via.array.ptr[i];
        if (v->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_int(v, &ids[(*used)++]))
            return false;
    }
    return true;
}

/* block_ids: one list per kernel group (a flat list: the one group's),
 * each covering at least the op's chunks.  Ids past them (the blocks of a
 * request's partial last chunk, which vLLM's adapter sends along) are
 * ignored, as upstream does (docs/protocol.md, "Server-driven transfer"). */
static int decode_block_ids(const sd_ctx *c, const msgpack_object *o, sd_op *op, char *err,
                            size_t errlen)
{
    const lmc_kv_plan *p = &c->plan;
    if (!o || o->type != MSGPACK_OBJECT_ARRAY)
        return snprintf(err, errlen, "block_ids must be a list"), -1;
    bool flat = o->via.array.size == 0 || o->via.array.ptr[0].type != MSGPACK_OBJECT_ARRAY;
    uint32_t lists = flat ? 1 : o->via.array.size;
    if (lists != p->n_kg)
        return snprintf(err, errlen, "%u block id lists for %u kernel groups", lists, p->n_kg),
               -1;
    size_t total = flat ? o->via.array.size : 0;
    for (uint32_t g = 0; !flat && g < lists; g++) {
        if (o->via.array.ptr[g].type != MSGPACK_OBJECT_ARRAY)
            return snprintf(err, errlen, "block_ids[%u] must be a list", g), -1;
        total += o->via.array.ptr[g].via.array.size;
    }
    if (total > MAX_BLOCK_IDS)
        return snprintf(err, errlen, "more than %u block ids", MAX_BLOCK_IDS), -1;
    if (!(op->ids = malloc((total ? total : 1) * sizeof *op->ids)))
        return snprintf(err, errlen, "out of memory"), -2;
    size_t used = 0;
    for (uint32_t g = 0; g < lists; g++) {
        const msgpack_object *l = flat ? o : &o->via.array.ptr[g];
        const lmc_kv_kernel_group *kg = &p->kg[g];
        op->offs[g] = used;
        if (!take_list(l, op->ids, &used))
            return snprintf(err, errlen, "block_ids[%u] must hold ints", g), -1;
        if (l->via.array.size < op->n * kg->blocks_per_chunk)
            return snprintf(err, errlen, "block_ids[%u] has %u ids; %zu chunks of %u blocks "
                                         "need %zu", g, l->via.array.size, op->n,
                            kg->blocks_per_chunk, op->n * kg->blocks_per_chunk), -1;
    }
    return 0;
}

/* Why op's object keys could not be built: a STORE interns the key's
 * names, a RETRIEVE only looks them up (docs/storage.md, "Interned
 * strings").  0, or -1 / -2 with the reason. */
static int keys_error(lmc_transfer_keys_result r, char *err, size_t errlen)
{
    switch (r) {
    case LMC_TRANSFER_KEYS_BUILT:
        return 0;
    case LMC_TRANSFER_KEYS_UNKNOWN:
        return snprintf(err, errlen, "nothing is stored under this model name and cache "
                                     "salt"), -1;
    case LMC_TRANSFER_KEYS_FULL:
        return snprintf(err, errlen, "too many distinct model names and cache salts "
                                     "(--max-interned-strings)"), -1;
    case LMC_TRANSFER_KEYS_NO_MEMORY:
        break;
    }
    return snprintf(err, errlen, "out of memory"), -2;
}

/* Frames 0 (key) and 1 (instance) and 2 (block ids): the context, the
 * object keys of every object group and the block lists.  0, or -1 / -2
 * with the reason. */
int lmc_server_driven_op_begin(sd_mod *m, lmc_rpc_call *call, sd_op *op, bool store, char *err,
                               size_t errlen)
{
    *op = (sd_op){0};
    int64_t id;
    if (!lmc_transfer_instance_arg(call, 1, &id))
        return snprintf(err, errlen, "instance_id must be an int"), -1;
    if (!(op->c = lmc_server_driven_get(m, id)))
        return snprintf(err, errlen, "instance %lld is not registered", (long long)id), -1;
    lmc_transfer_touch(m->ctx->liveness, id);
    int rc = lmc_transfer_decode_key(call, m->cs, "worker_id must not be None", &op->key, err,
                                     errlen);
    if (rc != 0)
        return rc;
    op->key_decoded = true;
    if (!lmc_server_driven_bind_model(m, op->c, op->key.model_name, op->key.model_len,
                           op->key.world_size))
        return snprintf(err, errlen, "the key names another model or world size (%u) than "
                                     "instance %lld registered (world size %u)",
                        op->key.world_size, (long long)id, op->c->world_size), -1;
    op->n = lmc_ipc_key_num_chunks(&op->key, m->cs);
    uint32_t n_og = op->c->plan.n_og;
    lmc_transfer_keys ck;
    rc = lmc_transfer_chunk_keys(m->ctx, &op->key, op->n, n_og, store, &ck, err, errlen);
    op->keys = ck.keys;
    free(ck.hashes);
    if (rc == 0)
        rc = keys_error(ck.result, err, errlen);
    if (rc != 0)
        return rc;
    op->n_keys = op->n * n_og;
    op->arena = lmc_storage_manager_l1_arena(m->ctx->storage)->base;
    return decode_block_ids(op->c, lmc_rpc_call_arg(call, 2), op, err, errlen);
}

/* [event_ipc_handle, success]: 64 zero bytes for a registered CPU context
 * (nothing to wait for, in the form CUDA-less upstream sends); an empty
 * handle when the instance is unknown, which no client waits on. */
static void reply(lmc_rpc_call *call, const sd_op *op, bool ok)
{
    static const uint8_t zeros[EVENT_HANDLE_BYTES];
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    msgpack_pack_array(pk, 2);
    size_t n = op->c ? EVENT_HANDLE_BYTES : 0;
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, zeros, n);
    ok ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

/* A CUDA context's reply carries a recorded event; a failure without one
 * (the stream is unusable) gets an empty handle, which no client waits on
 * and which is safe with success false. */
static void reply_cuda(lmc_rpc_call *call, const uint8_t *handle, bool have, bool ok)
{
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    msgpack_pack_array(pk, 2);
    msgpack_pack_bin(pk, have ? EVENT_HANDLE_BYTES : 0);
    msgpack_pack_bin_body(pk, handle, have ? EVENT_HANDLE_BYTES : 0);
    ok ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

/* The reply of a request that failed before its copies, or any CPU one. */
static void reply_plain(sd_mod *m, lmc_rpc_call *call, const sd_op *op, bool ok)
{
    uint8_t handle[EVENT_HANDLE_BYTES];
    if (op->c && op->c->cuda)
        reply_cuda(call, handle, lmc_server_driven_cuda_failure_event(m, op, handle), ok);
    else
        reply(call, op, ok);
}

/* Frame 3, the engine's event handle: bytes (empty: none), or None. */
int lmc_server_driven_client_event(lmc_rpc_call *call, const uint8_t **h, size_t *len, char *err,
                                   size_t errlen)
{
    const msgpack_object *o = lmc_rpc_call_arg(call, 3);
    *h = NULL;
    *len = 0;
    if (!o || lmc_mp_is_nil(o))
        return 0;
    return lmc_mp_get_bin(o, h, len) ? 0
                                      : (snprintf(err, errlen, "event_ipc_handle must be bytes"),
                                         -1);
}

/* ---- STORE -------------------------------------------------------------- */

/* The engine block a physical id was expanded from (Python's floor
 * division, as the client's expansion of a negative sentinel). */
static int64_t engine_block_of(int64_t id, uint32_t per_engine)
{
    int64_t q = id / per_engine;
    return q * per_engine > id ? q - 1 : q;
}

/* Chunk `c` of object group og holds only null blocks: nothing to store. */
static bool null_chunk(const sd_op *op, const lmc_kv_object_group *og, size_t c)
{
    for (uint32_t i = 0; i < og->n_members; i++) {
        uint32_t gi = og->members[i];
        const lmc_kv_kernel_group *g = &op->c->plan.kg[gi];
        const int64_t *ids = op->ids + op->offs[gi] + c * g->blocks_per_chunk;
        for (uint32_t j = 0; j < g->blocks_per_chunk; j++)
            if (!g->has_null_block ||
                engine_block_of(ids[j], g->physical_per_engine) != g->null_block_id)
                return false;
    }
    return true;
}

static void sd_store_plan_free(sd_store_plan *s)
{
    free(s->keys);
    free(s->slot);
    free(s->leases);
    free(s->res);
}

/* Lists the non-null chunks of every object group; false when one of
 * them names a block outside its tensor (nothing is stored then). */
static int plan_store(const sd_op *op, sd_store_plan *s, char *err, size_t errlen)
{
    const lmc_kv_plan *p = &op->c->plan;
    size_t cap = op->n * p->n_og + 1;
    *s = (sd_store_plan){.keys = malloc(cap * sizeof *s->keys), .slot = malloc(cap * sizeof(size_t)),
                      .leases = calloc(cap, sizeof *s->leases),
                      .res = calloc(cap, sizeof *s->res)};
    if (!s->keys || !s->slot || !s->leases || !s->res)
        return snprintf(err, errlen, "out of memory"), -2;
    for (uint32_t og = 0; og < p->n_og; og++) {
        for (size_t c = 0; c < op->n; c++) {
            if (null_chunk(op, &p->og[og], c))
                continue;
            for (uint32_t i = 0; i < p->og[og].n_members; i++)
                if (!lmc_server_driven_ids_in_range(op, p->og[og].members[i], c))
                    return snprintf(err, errlen, "chunk %zu names a block outside kernel group "
                                                 "%u's %llu blocks", c, p->og[og].members[i],
                                    (unsigned long long)p->kg[p->og[og].members[i]].geo.nb), -1;
            s->slot[s->n] = c * p->n_og + og;
            s->keys[s->n++] = op->keys[c * p->n_og + og];
        }
    }
    return 0;
}

/* Reserves the planned keys, object group by object group, then keeps only
 * the chunks before the first one L1 had no room for (a chunk after a hole
 * can never be a prefix hit).  Returns the chunk bound. */
static size_t reserve_store(sd_mod *m, const sd_op *op, sd_store_plan *s)
{
    const lmc_kv_plan *p = &op->c->plan;
    size_t bound = op->n, at = 0;
    for (uint32_t og = 0; og < p->n_og; og++) {
        size_t from = at;
        while (at < s->n && s->slot[at] % p->n_og == og)
            at++;
        if (at > from)
            lmc_transfer_reserve_writes(m->ctx->storage, s->keys + from, at - from,
                               p->og[og].object_size, op->c->tag, s->leases + from,
                               s->res + from);
        for (size_t i = from; i < at; i++)
            if (s->res[i] == LMC_L1_OUT_OF_MEMORY && s->slot[i] / p->n_og < bound)
                bound = s->slot[i] / p->n_og;
    }
    for (size_t i = 0; i < s->n; i++) {
        if (s->res[i] == LMC_L1_SUCCESS && s->slot[i] / p->n_og >= bound) {
            lmc_storage_manager_give_back(m->ctx->storage, &s->keys[i], &s->leases[i], 1);
            s->res[i] = LMC_L1_OUT_OF_MEMORY;
        }
    }
    return bound;
}

/* ---- one request across the copy workers ------------------------------ */

/* Pieces for `items` items of `bytes` in all: none under twice
 * --copy-split-bytes, a single worker, or the socket thread; else at most
 * four per thread, each of at least --copy-split-bytes. */
static bool splits(const sd_mod *m, size_t width, uint64_t bytes)
{
    uint64_t min = (uint64_t)m->ctx->config->mp.copy_split_bytes;
    return min > 0 && width >= 2 && bytes / min >= 2;
}

static size_t split_count(const sd_mod *m, lmc_rpc_call *call, size_t items, uint64_t bytes)
{
    uint64_t min = (uint64_t)m->ctx->config->mp.copy_split_bytes;
    size_t width = lmc_rpc_call_share_width(call);
    if (!splits(m, width, bytes))
        return 1;
    uint64_t n = bytes / min;
    if (n > 4 * width)
        n = 4 * width;
    return n < items ? (size_t)n : items;
}

/* Piece `piece` of the split, under this thread's SIGBUS guard: false when
 * the engine shrank a segment under the copy (docs/protocol.md). */
static bool copy_piece(void *arg, size_t piece)
{
    sd_split *sp = arg;
    size_t from = piece * sp->items / sp->pieces, to = (piece + 1) * sp->items / sp->pieces;
    if (!pthread_equal(pthread_self(), sp->owner))
        atomic_fetch_add(&sp->m->pieces_helped, 1);
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        lmc_fault_guard_leave();
        return false;
    }
    lmc_fault_guard_enter(&jb);
    bool ok = sp->copy(sp, from, to);
    lmc_fault_guard_leave();
    return ok;
}

bool lmc_server_driven_run_split(lmc_rpc_call *call, sd_split *sp, uint64_t bytes)
{
    sp->pieces = split_count(sp->m, call, sp->items, bytes);
    sp->owner = pthread_self();
    if (sp->pieces < 2)
        return sp->items == 0 || copy_piece(sp, 0);
    atomic_fetch_add(&sp->m->split_copies, 1);
    return lmc_rpc_call_share(call, sp->pieces, copy_piece, sp);
}

/* STORE: the planned objects [from, to) that hold a lease. */
static bool gather_items(const sd_split *sp, size_t from, size_t to)
{
    const sd_op *op = sp->op;
    const sd_store_plan *s = sp->s;
    const lmc_kv_plan *p = &op->c->plan;
    for (size_t i = from; i < to; i++) {
        if (s->res[i] != LMC_L1_SUCCESS)
            continue;
        size_t c = s->slot[i] / p->n_og;
        const lmc_kv_object_group *og = &p->og[s->slot[i] % p->n_og];
        for (uint32_t k = 0; k < og->n_members; k++) {
            uint32_t gi = og->members[k];
            const lmc_kv_kernel_group *g = &p->kg[gi];
            lmc_kv_chunk_copy cc = {.g = g, .bases = op->c->bases[gi],
                                    .blocks = lmc_server_driven_kept_ids(op, gi, c),
                                    .entry = op->arena + s->leases[i].offset + g->entry_offset,
                                    .method = sp->m->copy};
            lmc_kv_gather_chunk(&cc);
        }
    }
    return true;
}

/* Gathers every reserved object of the plan; false when the engine shrank
 * a segment under the copy.  *bytes: what the objects hold. */
static bool guarded_gather(sd_mod *m, lmc_rpc_call *call, const sd_op *op,
                           const sd_store_plan *s, uint64_t *bytes)
{
    const lmc_kv_plan *p = &op->c->plan;
    *bytes = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->res[i] == LMC_L1_SUCCESS)
            *bytes += p->og[s->slot[i] % p->n_og].object_size;
    sd_split sp = {.m = m, .op = op, .s = s, .items = s->n, .copy = gather_items};
    return lmc_server_driven_run_split(call, &sp, *bytes);
}

/* Gives back every lease the plan holds (nothing published). */
static void abandon_store(sd_mod *m, sd_store_plan *s)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->res[i] == LMC_L1_SUCCESS)
            lmc_storage_manager_give_back(m->ctx->storage, &s->keys[i], &s->leases[i], 1);
}

/* Publishes what was copied (the rest of the plan holds no lease); the
 * number of chunks now stored. */
static size_t publish_store(sd_mod *m, sd_store_plan *s)
{
    size_t w = 0, stored = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->res[i] == LMC_L1_SUCCESS) {
            s->keys[w] = s->keys[i];
            s->leases[w++] = s->leases[i];
        }
    }
    s->n = w;   /* the plan now holds the published-or-voided writes only */
    if (w && lmc_storage_manager_publish_writes(m->ctx->storage, s->keys, s->leases, w, 0,
                                                s->res) != 0) {
        lmc_storage_manager_give_back(m->ctx->storage, s->keys, s->leases, w);
        return 0;
    }
    for (size_t i = 0; i < w; i++)
        stored += s->res[i] == LMC_L1_SUCCESS;
    return stored;
}

/* Copies the reserved chunks and publishes them; -1 when the engine's
 * memory went away under the copy (nothing is published then). */
static int store_on_cpu(sd_mod *m, lmc_rpc_call *call, const sd_op *op, sd_store_plan *s)
{
    uint64_t bytes = 0;
    if (!guarded_gather(m, call, op, s, &bytes)) {
        abandon_store(m, s);
        LMC_WARN_LIMITED("STORE: instance %lld's memory went away under the copy (a segment "
                         "shrank); nothing stored", (long long)op->c->instance_id);
        return -1;
    }
    size_t reserved = 0;
    for (size_t i = 0; i < s->n; i++)
        reserved += s->res[i] == LMC_L1_SUCCESS;
    size_t stored = publish_store(m, s);
    atomic_fetch_add(&m->chunks_stored, stored);
    atomic_fetch_add(&m->bytes_stored, bytes);
    lmc_transfer_publish(m->ctx->events, LMC_EVENT_STORE_END, &op->key, op->c->instance_id,
                         "cpu", stored, bytes);
    /* A write a forced clear voided in between is not stored: say so. */
    return stored == reserved ? 0 : -1;
}

/* Enqueues the copies on the context's stream and replies with its event;
 * the completion thread publishes (cuda_plugin.c). */
static int store_on_cuda(sd_mod *m, lmc_rpc_call *call, const sd_op *op, sd_store_plan *s,
                         const uint8_t *client, size_t client_len)
{
    uint8_t handle[EVENT_HANDLE_BYTES];
    uint64_t bytes = 0;
    bool ok = lmc_server_driven_cuda_store(m, op, s, client, client_len, handle, &bytes);
    atomic_fetch_add(&m->bytes_stored, ok ? bytes : 0);
    reply_cuda(call, handle, ok || lmc_server_driven_cuda_failure_event(m, op, handle), ok);
    return ok ? 0 : -1;
}

/* STORE(key, instance_id, block_ids, event_ipc_handle) -> [handle, ok] */
static lmc_handler_result store(void *state, lmc_rpc_call *call)
{
    sd_mod *m = state;
    sd_op op;
    sd_store_plan s = {0};
    char err[256];
    int64_t t0 = now_ns();
    int rc = lmc_server_driven_op_begin(m, call, &op, true, err, sizeof err);
    if (rc == 0)
        rc = plan_store(&op, &s, err, sizeof err);
    const uint8_t *client = NULL;
    size_t client_len = 0;
    if (rc == 0)
        rc = lmc_server_driven_client_event(call, &client, &client_len, err, sizeof err);
    bool replied = false;
    if (rc == 0) {
        lmc_transfer_publish(m->ctx->events, LMC_EVENT_STORE_START, &op.key,
                             op.c->instance_id, op.c->cuda ? "cuda" : "cpu", op.n, 0);
        size_t bound = reserve_store(m, &op, &s);
        if (bound < op.n)
            LMC_WARN_LIMITED("STORE: L1 full, chunks %zu..%zu of %zu not stored", bound,
                             op.n - 1, op.n);
        if (op.c->cuda) {
            rc = store_on_cuda(m, call, &op, &s, client, client_len);
            replied = true;
        } else {
            rc = store_on_cpu(m, call, &op, &s);
        }
    } else {
        LMC_WARN_LIMITED("STORE: %s", err);
    }
    if (!replied)
        reply_plain(m, call, &op, rc == 0);
    if (rc == 0 && m->after_store)
        m->after_store(m->hook_user, &op);
    atomic_fetch_add(rc == 0 ? &m->stores_ok : &m->stores_failed, 1);
    atomic_fetch_add(&m->store_ns, (uint64_t)(now_ns() - t0));
    sd_store_plan_free(&s);
    lmc_server_driven_op_end(m, &op);
    return LMC_HANDLER_REPLY;
}

/* ---- RETRIEVE ----------------------------------------------------------- */

/* Scatters chunk c of object group og from `object` into its blocks,
 * leaving the blocks of the first `skip` tokens of the range untouched. */
static void scatter_chunk(sd_mod *m, const sd_op *op, uint32_t og, size_t c,
                          const uint8_t *object, uint64_t skip)
{
    const lmc_kv_plan *p = &op->c->plan;
    uint32_t skips[LMC_KV_MAX_KERNEL_GROUPS];
    if (!lmc_server_driven_chunk_skip(op, m->cs, og, c, skip, skips))
        return;
    for (uint32_t k = 0; k < p->og[og].n_members; k++) {
        uint32_t gi = p->og[og].members[k];
        const lmc_kv_kernel_group *g = &p->kg[gi];
        lmc_kv_chunk_copy cc = {.g = g, .bases = op->c->bases[gi],
                                .blocks = lmc_server_driven_kept_ids(op, gi, c),
                                .entry = (uint8_t *)object + g->entry_offset,
                                .skip_blocks = skips[k], .method = m->copy};
        lmc_kv_scatter_chunk(&cc);
    }
}

/* RETRIEVE: chunks first + [from, to) of the split's object group. */
static bool scatter_items(const sd_split *sp, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        scatter_chunk(sp->m, sp->op, sp->og, sp->first + i,
                      sp->op->arena + sp->leases[i].offset, sp->skip);
    return true;
}

/* Scatters object group og's chunks [first, n) from their leases; false
 * when the engine's memory went away under the copy. */
static bool guarded_scatter(sd_mod *m, lmc_rpc_call *call, const sd_op *op, uint32_t og,
                            size_t first, uint64_t skip, const lmc_lease *leases)
{
    sd_split sp = {.m = m, .op = op, .og = og, .first = first, .skip = skip,
                   .leases = leases, .items = op->n - first, .copy = scatter_items};
    return lmc_server_driven_run_split(call, &sp, sp.items * op->c->plan.og[og].object_size);
}

/* Reads object group og's objects in its window (each read-locked by the
 * LOOKUP, one share of which this RETRIEVE consumes) into the blocks.
 * False, with nothing copied, when any of them is not there. */
static bool retrieve_group(sd_mod *m, lmc_rpc_call *call, const sd_op *op, uint32_t og,
                           uint64_t skip, lmc_object_key *keys, lmc_lease *leases,
                           uint64_t *bytes)
{
    const lmc_kv_plan *p = &op->c->plan;
    size_t first = lmc_server_driven_window_start(op, og), n = op->n - first;
    for (size_t c = first; c < op->n; c++) {
        for (uint32_t k = 0; k < p->og[og].n_members; k++)
            if (!lmc_server_driven_ids_in_range(op, p->og[og].members[k], c)) {
                LMC_WARN_LIMITED("RETRIEVE: chunk %zu names a block outside its tensor", c);
                return false;
            }
        keys[c - first] = op->keys[c * p->n_og + og];
    }
    lmc_object_sizes want = {&p->og[og].object_size, 1, 1};
    size_t got = lmc_storage_manager_lease_copy(m->ctx->storage, keys, n,
                                                LMC_COPY_CARRIES_SHARE, true, &want, leases, NULL);
    if (got != n)
        return false;
    bool copied = guarded_scatter(m, call, op, og, first, skip, leases);
    if (copied)
        *bytes += n * p->og[og].object_size;
    else
        LMC_WARN_LIMITED("RETRIEVE: instance %lld's memory went away under the copy (a segment "
                         "shrank)", (long long)op->c->instance_id);
    lmc_storage_manager_give_back(m->ctx->storage, keys, leases, n);
    return copied;
}

/* The fifth frame, skip_first_n_tokens (0 when an older client omits it). */
int lmc_server_driven_decode_skip(lmc_rpc_call *call, uint64_t *skip, char *err, size_t errlen)
{
    const msgpack_object *o = lmc_rpc_call_nargs(call) > 4 ? lmc_rpc_call_arg(call, 4) : NULL;
    int64_t v = 0;
    if (o && !lmc_mp_is_nil(o) && (o->type == MSGPACK_OBJECT_BOOLEAN || !lmc_mp_get_int(o, &v)))
        return snprintf(err, errlen, "skip_first_n_tokens must be an int"), -1;
    if (v < 0)
        return snprintf(err, errlen, "skip_first_n_tokens must not be negative"), -1;
    *skip = (uint64_t)v;
    return 0;
}

/* RETRIEVE on a CUDA context: enqueued; the reply's event says when the
 * blocks hold the bytes, and the read shares go back after that. */
static lmc_handler_result retrieve_cuda(sd_mod *m, lmc_rpc_call *call, sd_op *op, uint64_t skip,
                                        const uint8_t *client, size_t client_len, int64_t t0)
{
    uint8_t handle[EVENT_HANDLE_BYTES];
    uint64_t bytes = 0;
    lmc_transfer_publish(m->ctx->events, LMC_EVENT_RETRIEVE_START, &op->key,
                         op->c->instance_id, "cuda", op->n, 0);
    bool ok = lmc_server_driven_cuda_retrieve(m, op, skip, client, client_len, handle, &bytes);
    reply_cuda(call, handle, ok || lmc_server_driven_cuda_failure_event(m, op, handle), ok);
    atomic_fetch_add(&m->chunks_retrieved, ok ? op->n : 0);
    atomic_fetch_add(&m->bytes_retrieved, ok ? bytes : 0);
    atomic_fetch_add(ok ? &m->retrieves_ok : &m->retrieves_failed, 1);
    atomic_fetch_add(&m->retrieve_ns, (uint64_t)(now_ns() - t0));
    lmc_server_driven_op_end(m, op);
    return LMC_HANDLER_REPLY;
}

/* RETRIEVE(key, instance_id, block_ids, event_ipc_handle[, skip_first_n_tokens])
 * -> [handle, ok] */
static lmc_handler_result retrieve(void *state, lmc_rpc_call *call)
{
    sd_mod *m = state;
    sd_op op;
    char err[256];
    uint64_t skip = 0, bytes = 0;
    int64_t t0 = now_ns();
    int rc = lmc_server_driven_op_begin(m, call, &op, false, err, sizeof err);
    if (rc == 0)
        rc = lmc_server_driven_decode_skip(call, &skip, err, sizeof err);
    const uint8_t *client = NULL;
    size_t client_len = 0;
    if (rc == 0)
        rc = lmc_server_driven_client_event(call, &client, &client_len, err, sizeof err);
    if (rc == 0 && op.c->cuda)
        return retrieve_cuda(m, call, &op, skip, client, client_len, t0);
    bool ok = rc == 0;
    lmc_object_key *keys = ok ? malloc((op.n + 1) * sizeof *keys) : NULL;
    lmc_lease *leases = ok ? calloc(op.n + 1, sizeof *leases) : NULL;
    if (ok && (!keys || !leases)) {
        ok = false;
        snprintf(err, sizeof err, "out of memory");
    }
    if (ok) {
        lmc_transfer_publish(m->ctx->events, LMC_EVENT_RETRIEVE_START, &op.key,
                             op.c->instance_id, "cpu", op.n, 0);
        for (uint32_t og = 0; ok && og < op.c->plan.n_og; og++)
            ok = retrieve_group(m, call, &op, og, skip, keys, leases, &bytes);
        if (!ok)
            lmc_storage_manager_report_read_failure(m->ctx->storage, "l1_retrieve", "not_found",
                                                    &op.keys[0], op.n);
        lmc_transfer_publish(m->ctx->events, LMC_EVENT_RETRIEVE_END, &op.key,
                             op.c->instance_id, "cpu", ok ? op.n : 0, bytes);
        atomic_fetch_add(&m->chunks_retrieved, ok ? op.n : 0);
        atomic_fetch_add(&m->bytes_retrieved, bytes);
    } else {
        LMC_WARN_LIMITED("RETRIEVE: %s", err);
    }
    reply_plain(m, call, &op, ok);
    atomic_fetch_add(ok ? &m->retrieves_ok : &m->retrieves_failed, 1);
    atomic_fetch_add(&m->retrieve_ns, (uint64_t)(now_ns() - t0));
    free(keys);
    free(leases);
    lmc_server_driven_op_end(m, &op);
    return LMC_HANDLER_REPLY;
}

/* ---- module ------------------------------------------------------------- */

/* A STORE or RETRIEVE whose blocks hold at most this much may run on the
 * socket thread when it is idle (lmc_rpc_handler_spec.inline_ok), sparing
 * a small copy two thread hand-offs; a larger one goes to the pool, where
 * it delays no other client. */
#define INLINE_COPY_BYTES (256u << 10)

static uint64_t bytes_per_block(const lmc_kv_kernel_group *g)
{
    const lmc_kv_geometry *k = &g->geo;
    return (uint64_t)k->kv_size * k->nl * k->bs * k->nh * k->hs * k->element_size;
}

static bool small_copy(void *state, lmc_rpc_call *call)
{
    sd_mod *m = state;
    size_t raw = 0;
    int64_t id;
    if (!lmc_rpc_call_arg_raw(call, 2, &raw) || raw > 4096)
        return false;
    const msgpack_object *id_o = lmc_rpc_call_arg(call, 1), *ids = lmc_rpc_call_arg(call, 2);
    if (!id_o || !lmc_mp_get_int(id_o, &id) || !ids || ids->type != MSGPACK_OBJECT_ARRAY)
        return false;
    sd_ctx *c = lmc_server_driven_get(m, id);
    if (!c)
        return true;   /* answered at once */
    bool flat = ids->via.array.size == 0 || ids->via.array.ptr[0].type != MSGPACK_OBJECT_ARRAY;
    uint64_t bytes = 0;
    for (uint32_t g = 0; g < c->plan.n_kg; g++) {
        const msgpack_object *l = flat ? ids : g < ids->via.array.size ? &ids->via.array.ptr[g]
                                                                       : NULL;
        if (l && l->type == MSGPACK_OBJECT_ARRAY)
            bytes += l->via.array.size * bytes_per_block(&c->plan.kg[g]);
    }
    lmc_server_driven_put(m, c);
    /* A copy the workers would share is theirs, however small. */
    return bytes <= INLINE_COPY_BYTES &&
           !splits(m, (size_t)m->ctx->config->mp.max_gpu_workers, bytes);
}

/* A full queue's answer to STORE and RETRIEVE (docs/protocol.md,
 * "Overload"): [b"", false], what an unknown instance gets: nothing was
 * touched, so there is no event to wait for. */
static lmc_handler_result busy_transfer(void *state, lmc_rpc_call *call)
{
    (void)state;
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    msgpack_pack_array(pk, 2);
    msgpack_pack_bin(pk, 0);
    msgpack_pack_false(pk);
    return LMC_HANDLER_REPLY;
}

static const lmc_rpc_handler_spec sd_handlers[] = {
    {LMC_OP_REGISTER_KV_CACHE, NULL, LMC_POOL_SYNC, lmc_server_driven_register, false, NULL, NULL, false},
    {LMC_OP_UNREGISTER_KV_CACHE, NULL, LMC_POOL_SYNC, lmc_server_driven_unregister, false, NULL, NULL, false},
    {LMC_OP_STORE, NULL, LMC_POOL_AFFINITY, store, false, small_copy, busy_transfer, false},
    {LMC_OP_RETRIEVE, NULL, LMC_POOL_AFFINITY, retrieve, false, small_copy, busy_transfer, false},
    /* Known by name only (docs/protocol.md, "RETRIEVE_LAYERWISE").  Never
     * inline: its replies stream from a pool thread. */
    {0, "register_layerwise_ipc_event_pool", LMC_POOL_SYNC,
     lmc_server_driven_register_layerwise_pool, false, NULL, NULL, false},
    {0, "retrieve_layerwise", LMC_POOL_AFFINITY, lmc_server_driven_retrieve_layerwise, false,
     NULL, lmc_server_driven_layerwise_busy, false},
};

#define COUNTER(name) (json_int_t)atomic_load(&m->name)

static json_t *sd_status(void *state)
{
    sd_mod *m = state;
    json_t *o = json_pack("{s:b, s:s, s:o*}", "is_healthy", 1, "copy_method",
                          lmc_copy_method_name(m->copy), "contexts", lmc_server_driven_contexts_json(m));
    json_t *counts = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f}",
        "registrations", COUNTER(registrations), "registrations_refused",
        COUNTER(registrations_refused), "unregisters", COUNTER(unregisters), "reaped_instances",
        COUNTER(instances.reaped), "stores_ok", COUNTER(stores_ok), "stores_failed",
        COUNTER(stores_failed),
        "retrieves_ok", COUNTER(retrieves_ok), "retrieves_failed", COUNTER(retrieves_failed),
        "chunks_stored", COUNTER(chunks_stored), "chunks_retrieved", COUNTER(chunks_retrieved),
        "bytes_stored", COUNTER(bytes_stored), "bytes_retrieved", COUNTER(bytes_retrieved),
        "store_seconds", atomic_load(&m->store_ns) / 1e9, "retrieve_seconds",
        atomic_load(&m->retrieve_ns) / 1e9);
    json_t *split = json_pack("{s:I, s:I, s:I}", "copy_split_bytes",
                              (json_int_t)m->ctx->config->mp.copy_split_bytes, "split_copies",
                              COUNTER(split_copies), "pieces_helped", COUNTER(pieces_helped));
    if (o && split)
        json_object_update(o, split);
    json_decref(split);
    json_t *layerwise = json_pack("{s:I, s:I, s:I}", "layerwise_retrieves_ok",
                                  COUNTER(layerwise_ok), "layerwise_retrieves_failed",
                                  COUNTER(layerwise_failed), "layer_batches_sent",
                                  COUNTER(layer_batches));
    if (o && counts)
        json_object_update(o, counts);
    if (o && layerwise)
        json_object_update(o, layerwise);
    json_decref(counts);
    json_decref(layerwise);
    /* Contexts whose mappings are still being faulted in after their
     * registration (docs/protocol.md, "CPU shared tensors"). */
    pthread_mutex_lock(&m->instances.lock);
    json_int_t populating = (json_int_t)m->populating;
    pthread_mutex_unlock(&m->instances.lock);
    json_object_set_new(o, "populating", json_integer(populating));
    return o;
}

/* ---- metrics (docs/metrics.md) ---------------------------------------- */

enum { STORES, STORE_FAILURES, RETRIEVES, RETRIEVE_FAILURES, STORED_BYTES, RETRIEVED_BYTES,
       STORE_SECONDS, RETRIEVE_SECONDS, SPLIT_COPIES, PIECES_HELPED, N_SD_METRICS };

static const struct {
    const char *name, *help;
} sd_metric_specs[N_SD_METRICS] = {
    [STORES] = {"lmcache_mp_server_driven_stores_total", "Server-driven STOREs answered true"},
    [STORE_FAILURES] = {"lmcache_mp_server_driven_store_failures_total",
                        "Server-driven STOREs answered false"},
    [RETRIEVES] = {"lmcache_mp_server_driven_retrieves_total",
                   "Server-driven RETRIEVEs answered true"},
    [RETRIEVE_FAILURES] = {"lmcache_mp_server_driven_retrieve_failures_total",
                           "Server-driven RETRIEVEs answered false"},
    [STORED_BYTES] = {"lmcache_mp_server_driven_stored_bytes_total",
                      "Bytes server-driven STOREs copied into L1"},
    [RETRIEVED_BYTES] = {"lmcache_mp_server_driven_retrieved_bytes_total",
                         "Bytes server-driven RETRIEVEs copied into engine blocks"},
    [STORE_SECONDS] = {"lmcache_mp_server_driven_store_seconds_total",
                       "Seconds spent in server-driven STOREs"},
    [RETRIEVE_SECONDS] = {"lmcache_mp_server_driven_retrieve_seconds_total",
                          "Seconds spent in server-driven RETRIEVEs"},
    [SPLIT_COPIES] = {"lmcache_mp_server_driven_split_copies_total",
                      "Server-driven copies cut into pieces for the copy workers"},
    [PIECES_HELPED] = {"lmcache_mp_server_driven_pieces_helped_total",
                       "Pieces of split copies run by a worker other than the request's"},
};

typedef struct {
    sd_mod *m;
    lmc_metric *family[N_SD_METRICS];
} sd_metrics;

static void sd_collect(lmc_metrics *r, void *user)
{
    (void)r;
    sd_metrics *sm = user;
    sd_mod *m = sm->m;
    const double values[N_SD_METRICS] = {
        [STORES] = (double)atomic_load(&m->stores_ok),
        [STORE_FAILURES] = (double)atomic_load(&m->stores_failed),
        [RETRIEVES] = (double)atomic_load(&m->retrieves_ok),
        [RETRIEVE_FAILURES] = (double)atomic_load(&m->retrieves_failed),
        [STORED_BYTES] = (double)atomic_load(&m->bytes_stored),
        [RETRIEVED_BYTES] = (double)atomic_load(&m->bytes_retrieved),
        [STORE_SECONDS] = (double)atomic_load(&m->store_ns) / 1e9,
        [RETRIEVE_SECONDS] = (double)atomic_load(&m->retrieve_ns) / 1e9,
        [SPLIT_COPIES] = (double)atomic_load(&m->split_copies),
        [PIECES_HELPED] = (double)atomic_load(&m->pieces_helped),
    };
    for (size_t i = 0; i < N_SD_METRICS; i++)
        lmc_metric_set(sm->family[i], NULL, values[i]);
}

static int sd_register_metrics(void *state, lmc_metrics *r)
{
    sd_metrics *sm = calloc(1, sizeof *sm);
    if (!sm)
        return -1;
    sm->m = state;
    for (size_t i = 0; i < N_SD_METRICS; i++) {
        sm->family[i] =
            lmc_metrics_counter(r, sd_metric_specs[i].name, sd_metric_specs[i].help, NULL);
        if (!sm->family[i]) {
            free(sm);
            return -1;
        }
    }
    if (!state) { /* not loaded: the families alone, at 0 */
        free(sm);
        return 0;
    }
    return lmc_metrics_add_owned_collector(r, sd_collect, sm);
}

const lmc_module_def lmc_server_driven_module = {
    .name = "lmcache_driven_transfer",
    .create = lmc_server_driven_create,
    .handlers = sd_handlers,
    .n_handlers = sizeof sd_handlers / sizeof sd_handlers[0],
    .report_status = sd_status,
    .register_http = lmc_server_driven_register_http,
    .register_metrics = sd_register_metrics,
    .close = lmc_server_driven_close,
};
