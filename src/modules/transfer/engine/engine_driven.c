/* Engine-driven transfer module (docs/protocol.md, "Engine-driven transfer
 * ops" and "Engine-driven flow, end to end"): workers copy KV chunks into
 * and out of the server's SHM pool themselves; the server only reserves,
 * publishes, locks and releases L1 objects.
 *
 *   REGISTER_/UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT   SYNC
 *   PREPARE_STORE, COMMIT_STORE, PREPARE_RETRIEVE, COMMIT_RETRIEVE   AFFINITY, quick
 *
 * Per registered instance the module keeps a context with the layout and
 * the leases of its pending writes (WRITE leases: reserved, not yet
 * published) and pending reads (COPY leases: slots handed out, each with
 * the read share the LOOKUP left for this reader), keyed by a digest of
 * the op's key range.  Unregistering or reaping a context gives its leases
 * back (docs/storage.md, "Leases"), so a dead worker can neither publish
 * half-written chunks nor pin memory.
 *
 * Locking: the instance registry's lock (instance_registry.h) guards the
 * context list and every pending list; storage calls happen outside it
 * (the storage manager is thread-safe), and an op that reserved memory
 * re-checks under the lock that its context still exists before recording
 * the reservation. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/fnv.h"
#include "modules/transfer/engine/engine_internal.h"
#include "modules/services/ipc_key.h"
#include "modules/module.h"
#include "modules/transfer/resolve.h"
#include "modules/transfer/transfer.h"
#include "obs/events.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "storage/storage_events.h"
#include "storage/storage_manager.h"

/* ---- contexts and pending entries (lock held) -------------------------- */

ed_ctx *lmc_engine_driven_find_ctx_locked(engine_mod *m, int64_t id)
{
    return lmc_transfer_registry_find_locked(&m->instances, id);
}

static ed_pending *pop_pending(ed_pending **list, uint64_t digest)
{
    for (ed_pending **p = list; *p; p = &(*p)->next) {
        if ((*p)->digest == digest) {
            ed_pending *e = *p;
            *p = e->next;
            return e;
        }
    }
    return NULL;
}

static size_t count_pending(const ed_pending *p)
{
    size_t n = 0;
    for (; p; p = p->next)
        n++;
    return n;
}

static void free_pending(ed_pending *p)
{
    lmc_keys_drop(p->keys, p->n);
    free(p->keys);
    free(p->leases);
    free(p);
}

/* Gives back whatever an unlinked context holds (writes unpublished, reads
 * with their shares); the layout loses a reference. */
void lmc_engine_driven_ctx_destroy(engine_mod *m, ed_ctx *c)
{
    ed_pending *lists[2] = {c->writes, c->reads};
    for (int l = 0; l < 2; l++) {
        while (lists[l]) {
            ed_pending *p = lists[l];
            lists[l] = p->next;
            lmc_storage_manager_give_back(m->ctx->storage, p->keys, p->leases, p->n);
            free_pending(p);
        }
    }
    c->writes = c->reads = NULL;
    lmc_layout_registry_release(m->ctx->layouts, c->model, c->world_size);
    lmc_engine_driven_groups_unref(c->groups);
    lmc_intern_release(c->model);
    free(c);
}

/* ---- key resolution ----------------------------------------------------- */

/* The op's context, when its key names the context's own model and world
 * size: the layout, groups and tag are copied for the op. */
static void bind_context(engine_mod *m, ed_op *op)
{
    pthread_mutex_lock(&m->instances.lock);
    ed_ctx *c = lmc_engine_driven_find_ctx_locked(m, op->instance_id);
    /* A key of another model than the context's would reserve and read
     * objects at the wrong layout's size (issue 29): such an op is
     * answered as for an instance that is not registered. */
    bool other_model = c && (c->world_size != op->key.world_size ||
                             strlen(c->model) != op->key.model_len ||
                             memcmp(c->model, op->key.model_name, op->key.model_len) != 0);
    if (c && !other_model) {
        op->layout = c->layout;
        op->groups = lmc_engine_driven_groups_ref(c->groups);
        memcpy(op->tag, c->tag, sizeof op->tag);
    }
    uint32_t ctx_ws = c ? c->world_size : 0;
    pthread_mutex_unlock(&m->instances.lock);
    if (other_model)
        LMC_WARN_LIMITED("engine-driven instance %lld: a key names another model or world "
                         "size (%u) than the instance registered (world size %u); answered as "
                         "unregistered", (long long)op->instance_id, op->key.world_size, ctx_ws);
    op->registered = c != NULL && !other_model;
}

/* The pending entries' key: the op's chunk hashes, range, rank and salt. */
static uint64_t op_digest(const ed_op *op, const uint8_t *hashes)
{
    uint64_t d = lmc_fnv1a64(LMC_FNV1A64_SHORT_BASIS, hashes, op->n * LMC_TOKEN_HASH_LEN);
    uint64_t range[3] = {op->key.start, op->key.end, op->key.worker_id};
    d = lmc_fnv1a64(d, range, sizeof range);
    return lmc_fnv1a64(d, op->key.cache_salt, op->key.salt_len);
}

/* Decodes the key (frame 0) and instance id (frame 1) of a transfer op and
 * resolves the rank's ObjectKeys; copies the context's layout and tag.
 * Only a registered instance's PREPARE_STORE (`store`) interns the key's
 * names; the other ops look them up (docs/storage.md, "Interned strings").
 * 0; -1 for a malformed op; -2 when memory ran out (err says which). */
static int resolve(engine_mod *m, lmc_rpc_call *call, ed_op *op, bool store, char *err,
                   size_t errlen)
{
    *op = (ed_op){0};
    if (!lmc_transfer_instance_arg(call, 1, &op->instance_id))
        return snprintf(err, errlen, "instance_id must be an int"), -1;
    int rc = lmc_transfer_decode_key(call, m->cs, "worker_id must not be None on transfer ops",
                                     &op->key, err, errlen);
    if (rc != 0)
        return rc;
    lmc_transfer_touch(m->ctx->liveness, op->instance_id);
    bind_context(m, op);
    op->n = lmc_ipc_key_num_chunks(&op->key, m->cs);
    uint32_t groups = op->groups ? op->groups->n_groups : 1;
    op->n_keys = op->n * groups;
    lmc_transfer_keys ck;
    rc = lmc_transfer_chunk_keys(m->ctx, &op->key, op->n, groups, store && op->registered, &ck,
                                 err, errlen);
    op->keys = ck.keys;
    if (rc == 0 && ck.result == LMC_TRANSFER_KEYS_NO_MEMORY)
        rc = -2, snprintf(err, errlen, "hashing failed: %s", lmc_hash_strerror(LMC_HASH_ENOMEM));
    if (rc == 0) {
        /* Names a full interner refused: the op goes on with nothing stored. */
        op->unknown_names = ck.result != LMC_TRANSFER_KEYS_BUILT;
        op->n_held = op->unknown_names ? 0 : op->n_keys;
        op->digest = op_digest(op, ck.hashes);
    }
    free(ck.hashes);
    if (rc != 0)
        lmc_engine_driven_op_free(op);
    return rc;
}

/* The error a failed resolve() answers with: the client's key is not at
 * fault when the server ran out of memory. */
static const char *resolve_error(int rc)
{
    return rc == -2 ? "MemoryError" : "ValidationError";
}

void lmc_engine_driven_op_free(ed_op *op)
{
    lmc_ipc_key_free(&op->key);
    lmc_engine_driven_groups_unref(op->groups);
    op->groups = NULL;
    if (op->keys)
        lmc_keys_drop(op->keys, op->n_held);
    free(op->keys);
    op->keys = NULL;
    op->n_held = 0;
}

/* Records `keys` (owned from here on success, with the string references
 * they hold) and a copy of their leases
 * under (instance, op key); false if the instance's context is gone (or
 * memory ran out): the caller still holds the leases then. */
bool lmc_engine_driven_add_pending(engine_mod *m, const ed_op *op, lmc_object_key *keys,
                        const lmc_lease *leases, size_t n, uint64_t bytes, bool write)
{
    ed_pending *p = malloc(sizeof *p);
    lmc_lease *held = malloc((n ? n : 1) * sizeof *held);
    if (!p || !held) {
        free(p);
        free(held);
        return false;
    }
    memcpy(held, leases, n * sizeof *held);
    *p = (ed_pending){.digest = op->digest, .keys = keys, .leases = held, .n = n,
                      .bytes = bytes};
    pthread_mutex_lock(&m->instances.lock);
    ed_ctx *c = lmc_engine_driven_find_ctx_locked(m, op->instance_id);
    if (c) {
        ed_pending **list = write ? &c->writes : &c->reads;
        p->next = *list;
        *list = p;
    }
    pthread_mutex_unlock(&m->instances.lock);
    if (!c) {
        free(held);
        free(p);
    }
    return c != NULL;
}

static ed_pending *take_pending(engine_mod *m, const ed_op *op, bool write)
{
    pthread_mutex_lock(&m->instances.lock);
    ed_ctx *c = lmc_engine_driven_find_ctx_locked(m, op->instance_id);
    ed_pending *p = c ? pop_pending(write ? &c->writes : &c->reads, op->digest) : NULL;
    pthread_mutex_unlock(&m->instances.lock);
    return p;
}

/* ---- replies ------------------------------------------------------------ */

/* Slot = {"offset", "length", "shape", "dtype"} (docs/protocol.md). */
void lmc_engine_driven_pack_slot(msgpack_packer *pk, uint64_t offset, uint64_t length, uint32_t ndim,
                      const uint64_t *shape, const char *dtype)
{
    msgpack_pack_map(pk, 4);
    lmc_mp_pack_cstr(pk, "offset");
    msgpack_pack_uint64(pk, offset);
    lmc_mp_pack_cstr(pk, "length");
    msgpack_pack_uint64(pk, length);
    lmc_mp_pack_cstr(pk, "shape");
    msgpack_pack_array(pk, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        msgpack_pack_uint64(pk, shape[i]);
    lmc_mp_pack_cstr(pk, "dtype");
    lmc_mp_pack_cstr(pk, dtype);
}

static void pack_object_slot(msgpack_packer *pk, uint64_t offset, const lmc_layout *l)
{
    lmc_engine_driven_pack_slot(pk, offset, l->object_size, l->ndim, l->shape, l->dtype);
}

/* {"success", "data": b"", "context": <packed next by the caller>} */
void lmc_engine_driven_pack_retrieve_head(msgpack_packer *pk, bool success)
{
    msgpack_pack_map(pk, 3);
    lmc_mp_pack_cstr(pk, "success");
    success ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    lmc_mp_pack_cstr(pk, "data");
    msgpack_pack_bin(pk, 0);
    lmc_mp_pack_cstr(pk, "context");
}

/* {"context": {"slots": [...], "chunk_indices": [...]}} */
static void pack_store_reply(msgpack_packer *pk, const lmc_lease *leases, const size_t *idx,
                             size_t n, const lmc_layout *l)
{
    msgpack_pack_map(pk, 1);
    lmc_mp_pack_cstr(pk, "context");
    msgpack_pack_map(pk, 2);
    lmc_mp_pack_cstr(pk, "slots");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        pack_object_slot(pk, leases[idx[i]].offset, l);
    lmc_mp_pack_cstr(pk, "chunk_indices");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, idx[i]);
}

static void pack_retrieve_reply(msgpack_packer *pk, const lmc_lease *leases, size_t n,
                                const lmc_layout *l)
{
    lmc_engine_driven_pack_retrieve_head(pk, leases != NULL);
    if (!leases) {
        msgpack_pack_map(pk, 0);
        return;
    }
    msgpack_pack_map(pk, 1);
    lmc_mp_pack_cstr(pk, "slots");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        pack_object_slot(pk, leases[i].offset, l);
}

/* ---- transfer ops ------------------------------------------------------- */

/* STORE_* / RETRIEVE_* events (obs/events.h): PREPARE opens a transfer,
 * COMMIT closes it; the worker copies in between, so START -> END is the
 * engine's copy time.  Keyed by (request id, worker) like upstream's
 * (session, device). */
void lmc_engine_driven_publish_transfer(engine_mod *m, const char *type, const ed_op *op, size_t chunks,
                             uint64_t bytes)
{
    lmc_transfer_publish(m->ctx->events, type, &op->key, op->instance_id, "cpu", chunks,
                         bytes);
}

/* Records a PREPARE_STORE's `ok` reservations as the op's pending writes
 * (`reserved`, owned from here either way).  Returns ok, or 0 when the
 * instance was unregistered or reaped meanwhile: then they are given back,
 * never published. */
size_t lmc_engine_driven_keep_reserved(engine_mod *m, const ed_op *op, lmc_object_key *reserved,
                            lmc_lease *granted, size_t ok, uint64_t bytes)
{
    lmc_keys_hold(reserved, ok); /* the pending entry outlives this request */
    if (ok && !lmc_engine_driven_add_pending(m, op, reserved, granted, ok, bytes, true)) {
        lmc_storage_manager_give_back(m->ctx->storage, reserved, granted, ok);
        lmc_keys_drop(reserved, ok);
        ok = 0;
    }
    if (ok == 0)
        free(reserved);
    return ok;
}

/* PREPARE_STORE(key, instance_id) -> {"context": {"slots", "chunk_indices"}} */
static lmc_handler_result prepare_store(void *state, lmc_rpc_call *call)
{
    engine_mod *m = state;
    ed_op op;
    char err[256];
    int rrc = resolve(m, call, &op, true, err, sizeof err);
    if (rrc != 0)
        return lmc_rpc_call_fail(call, resolve_error(rrc), "PREPARE_STORE: %s", err);
    if (op.groups) {
        lmc_engine_driven_prepare_store_groups(m, call, &op);
        lmc_engine_driven_op_free(&op);
        return LMC_HANDLER_REPLY;
    }
    /* Names a full interner refused: nothing of them can be stored (it
     * logged why), so there is nothing to write. */
    size_t n = op.registered && !op.unknown_names ? op.n : 0, ok = 0, oom = 0;
    lmc_lease *leases = calloc(n + 1, sizeof *leases);
    lmc_lease *granted = calloc(n + 1, sizeof *granted);
    lmc_l1_result *res = calloc(n + 1, sizeof *res);
    size_t *idx = calloc(n + 1, sizeof *idx);
    lmc_object_key *reserved = malloc((n + 1) * sizeof *reserved);
    if (!leases || !granted || !res || !idx || !reserved) {
        oom = n;
        n = 0;
    }
    if (n)
        lmc_transfer_reserve_writes(m->ctx->storage, op.keys, op.n, op.layout.object_size, op.tag,
                           leases, res);
    for (size_t i = 0; i < n; i++) {
        oom += res[i] == LMC_L1_OUT_OF_MEMORY;
        if (res[i] == LMC_L1_SUCCESS) {
            idx[ok] = i;
            granted[ok] = leases[i];
            reserved[ok++] = op.keys[i];
        }
    }
    ok = lmc_engine_driven_keep_reserved(m, &op, reserved, granted, ok, ok * op.layout.object_size);
    if (oom)
        LMC_WARN_LIMITED("PREPARE_STORE: L1 full, %zu of %zu chunks not stored", oom, op.n);
    if (!op.registered)
        LMC_WARN_LIMITED("PREPARE_STORE: instance %lld is not registered",
                         (long long)op.instance_id);
    pack_store_reply(lmc_rpc_call_reply(call), leases, idx, ok, &op.layout);
    atomic_fetch_add(&m->chunks_reserved, ok);
    if (ok)
        lmc_engine_driven_publish_transfer(m, LMC_EVENT_STORE_START, &op, ok, 0);
    free(leases);
    free(granted);
    free(res);
    free(idx);
    lmc_engine_driven_op_free(&op);
    return LMC_HANDLER_REPLY;
}

/* Publishes a pending entry's writes; the number actually stored (a key a
 * forced clear voided meanwhile is not; a call that failed whole gives
 * every lease back). */
static size_t publish_pending(engine_mod *m, ed_pending *p)
{
    lmc_l1_result *res = malloc((p->n ? p->n : 1) * sizeof *res);
    size_t ok = 0;
    if (!res || lmc_storage_manager_publish_writes(m->ctx->storage, p->keys, p->leases, p->n, 0,
                                                   res) != 0) {
        lmc_storage_manager_give_back(m->ctx->storage, p->keys, p->leases, p->n);
        free(res);
        return 0;
    }
    for (size_t i = 0; i < p->n; i++)
        ok += res[i] == LMC_L1_SUCCESS;
    free(res);
    return ok;
}

/* COMMIT_STORE(key, instance_id, data: bytes) -> bool */
static lmc_handler_result commit_store(void *state, lmc_rpc_call *call)
{
    engine_mod *m = state;
    ed_op op;
    char err[256];
    const uint8_t *data = NULL;
    size_t data_len = 0;
    const msgpack_object *d = lmc_rpc_call_arg(call, 2);
    if (d && !lmc_mp_is_nil(d) && !lmc_mp_get_bin(d, &data, &data_len))
        return lmc_rpc_call_fail(call, "ValidationError", "COMMIT_STORE: data must be bytes");
    int rrc = resolve(m, call, &op, false, err, sizeof err);
    if (rrc != 0)
        return lmc_rpc_call_fail(call, resolve_error(rrc), "COMMIT_STORE: %s", err);
    /* Non-empty data is the pickle fallback, which lmcached does not speak. */
    ed_pending *p = data_len == 0 ? take_pending(m, &op, true) : NULL;
    size_t published = p ? publish_pending(m, p) : 0;
    if (p) {
        atomic_fetch_add(&m->chunks_committed, published);
        lmc_engine_driven_publish_transfer(m, LMC_EVENT_STORE_END, &op, published,
                         published == p->n ? p->bytes : p->bytes / p->n * published);
    }
    /* True only when every chunk prepared is now stored: a write a forced
     * clear voided (or whose lock lapsed) is not, and the engine is told. */
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    p && published == p->n ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    if (p)
        free_pending(p);
    lmc_engine_driven_op_free(&op);
    return LMC_HANDLER_REPLY;
}

/* PREPARE_RETRIEVE(key, instance_id) -> {"success", "data", "context"} */
static lmc_handler_result prepare_retrieve(void *state, lmc_rpc_call *call)
{
    engine_mod *m = state;
    ed_op op;
    char err[256];
    int rrc = resolve(m, call, &op, false, err, sizeof err);
    if (rrc != 0)
        return lmc_rpc_call_fail(call, resolve_error(rrc), "PREPARE_RETRIEVE: %s", err);
    if (op.groups) {
        lmc_engine_driven_prepare_retrieve_groups(m, call, &op);
        lmc_engine_driven_op_free(&op);
        return LMC_HANDLER_REPLY;
    }
    /* Each COPY lease carries the share the LOOKUP took for this reader;
     * all or none, since the engine loads every chunk or none. */
    lmc_lease *leases = calloc(op.n + 1, sizeof *leases);
    lmc_l1_result *res = calloc(op.n + 1, sizeof *res);
    bool asked = op.registered && !op.unknown_names && leases && res && op.n > 0;
    lmc_object_sizes want = {&op.layout.object_size, 1, 1};
    size_t granted = asked ? lmc_storage_manager_lease_copy(m->ctx->storage, op.keys, op.n,
                                                            LMC_COPY_CARRIES_SHARE, true, &want,
                                                            leases, res)
                           : 0;
    bool ok = op.n > 0 && granted == op.n;
    if (asked && !ok) {
        size_t readable = 0;
        for (size_t i = 0; i < op.n; i++)
            readable += res[i] == LMC_L1_SUCCESS;
        lmc_storage_manager_report_read_failure(m->ctx->storage, "l1_retrieve", "not_found",
                                                &op.keys[0], op.n - readable);
    }
    if (ok) {
        ok = lmc_engine_driven_add_pending(m, &op, op.keys, leases, op.n, op.n * op.layout.object_size, false);
        if (ok)
            op.keys = NULL, op.n_held = 0;   /* now owned by the pending entry */
        else   /* no COMMIT_RETRIEVE will come for these: this reader is done */
            lmc_storage_manager_give_back(m->ctx->storage, op.keys, leases, op.n);
    }
    pack_retrieve_reply(lmc_rpc_call_reply(call), ok ? leases : NULL, op.n, &op.layout);
    atomic_fetch_add(ok ? &m->retrieves_ok : &m->retrieves_failed, 1);
    if (ok)
        lmc_engine_driven_publish_transfer(m, LMC_EVENT_RETRIEVE_START, &op, op.n, 0);
    free(leases);
    free(res);
    lmc_engine_driven_op_free(&op);
    return LMC_HANDLER_REPLY;
}

/* COMMIT_RETRIEVE(key, instance_id) -> true */
static lmc_handler_result commit_retrieve(void *state, lmc_rpc_call *call)
{
    engine_mod *m = state;
    ed_op op;
    char err[256];
    int rrc = resolve(m, call, &op, false, err, sizeof err);
    if (rrc != 0)
        return lmc_rpc_call_fail(call, resolve_error(rrc), "COMMIT_RETRIEVE: %s", err);
    ed_pending *p = take_pending(m, &op, false);
    if (p) {
        lmc_storage_manager_give_back(m->ctx->storage, p->keys, p->leases, p->n);
        lmc_engine_driven_publish_transfer(m, LMC_EVENT_RETRIEVE_END, &op, p->n, p->bytes);
        free_pending(p);
    }
    msgpack_pack_true(lmc_rpc_call_reply(call));
    lmc_engine_driven_op_free(&op);
    return LMC_HANDLER_REPLY;
}

/* The answers of a full queue (docs/protocol.md, "Overload"): each op's
 * documented failure, with nothing reserved, published or released. */
static lmc_handler_result busy_prepare_store(void *state, lmc_rpc_call *call)
{
    engine_mod *m = state;
    int64_t id;
    lmc_engine_driven_groups *g = NULL;
    if (lmc_transfer_instance_arg(call, 1, &id)) {
        pthread_mutex_lock(&m->instances.lock);
        ed_ctx *c = lmc_engine_driven_find_ctx_locked(m, id);
        g = c ? lmc_engine_driven_groups_ref(c->groups) : NULL;
        pthread_mutex_unlock(&m->instances.lock);
    }
    msgpack_packer *pk = lmc_rpc_call_reply(call);
    if (g) { /* nothing to write, in the form a multi-group worker reads */
        msgpack_pack_map(pk, 1);
        lmc_mp_pack_cstr(pk, "context");
        lmc_engine_driven_pack_groups_context(pk, g, 0, NULL, NULL);
        lmc_engine_driven_groups_unref(g);
    } else {
        pack_store_reply(pk, NULL, NULL, 0, NULL);   /* nothing to write */
    }
    return LMC_HANDLER_REPLY;
}

static lmc_handler_result busy_commit_store(void *state, lmc_rpc_call *call)
{
    (void)state;
    msgpack_pack_false(lmc_rpc_call_reply(call));
    return LMC_HANDLER_REPLY;
}

static lmc_handler_result busy_prepare_retrieve(void *state, lmc_rpc_call *call)
{
    (void)state;
    pack_retrieve_reply(lmc_rpc_call_reply(call), NULL, 0, NULL);   /* success: false */
    return LMC_HANDLER_REPLY;
}

static const lmc_rpc_handler_spec ed_handlers[] = {
    {LMC_OP_REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, NULL, LMC_POOL_SYNC, lmc_engine_driven_register,
     false, NULL, NULL, false},
    {LMC_OP_UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, NULL, LMC_POOL_SYNC, lmc_engine_driven_unregister,
     false, NULL, NULL, false},
    {LMC_OP_PREPARE_STORE, NULL, LMC_POOL_AFFINITY, prepare_store, .quick = true,
     .busy = busy_prepare_store},
    {LMC_OP_COMMIT_STORE, NULL, LMC_POOL_AFFINITY, commit_store, .quick = true,
     .busy = busy_commit_store, .releases = true},
    {LMC_OP_PREPARE_RETRIEVE, NULL, LMC_POOL_AFFINITY, prepare_retrieve, .quick = true,
     .busy = busy_prepare_retrieve},
    {LMC_OP_COMMIT_RETRIEVE, NULL, LMC_POOL_AFFINITY, commit_retrieve, .quick = true,
     .releases = true},
};

static json_t *ed_status(void *state)
{
    engine_mod *m = state;
    json_t *ctxs = json_array();
    pthread_mutex_lock(&m->instances.lock);
    for (size_t i = 0; i < m->instances.n; i++) {
        const ed_ctx *c = m->instances.items[i].ctx;
        json_array_append_new(ctxs, json_pack("{s:I, s:s, s:i, s:I, s:I}", "instance_id",
                                              (json_int_t)c->instance_id, "model_name", c->model,
                                              "world_size", (int)c->world_size, "pending_writes",
                                              (json_int_t)count_pending(c->writes),
                                              "pending_reads", (json_int_t)count_pending(c->reads)));
    }
    size_t n_ctxs = m->instances.n;
    pthread_mutex_unlock(&m->instances.lock);
    json_t *wl = json_pack("{s:b, s:f, s:f, s:I}", "enabled", m->instances.reap_timeout_ms > 0,
                           "reap_timeout_seconds", m->cfg_reap_s, "registration_grace_seconds",
                           m->cfg_grace_s, "tracked_instances", (json_int_t)n_ctxs);
    return json_pack("{s:b, s:I, s:o, s:o, s:o, s:I, s:I, s:I, s:I, s:I}", "is_healthy", 1,
                     "registered_contexts", (json_int_t)n_ctxs, "contexts", ctxs, "layouts",
                     lmc_layout_registry_to_json(m->ctx->layouts), "worker_liveness", wl,
                     "chunks_reserved", (json_int_t)atomic_load(&m->chunks_reserved),
                     "chunks_committed", (json_int_t)atomic_load(&m->chunks_committed),
                     "retrieves_ok", (json_int_t)atomic_load(&m->retrieves_ok),
                     "retrieves_failed", (json_int_t)atomic_load(&m->retrieves_failed),
                     "reaped_instances", (json_int_t)atomic_load(&m->instances.reaped));
}

const lmc_module_def lmc_engine_driven_module = {
    .name = "engine_driven_transfer",
    .create = lmc_engine_driven_create,
    .handlers = ed_handlers,
    .n_handlers = sizeof ed_handlers / sizeof ed_handlers[0],
    .report_status = ed_status,
    .close = lmc_engine_driven_close,
};
