/* CB_RETRIEVE_PRE_COMPUTED (docs/cacheblend.md, "Retrieve"): the matched
 * chunks' objects, read under the locks the unified lookup stashed on the
 * session (or taken now), staged, their K re-rotated to the new positions
 * and every token scattered into the request's blocks.  Replies
 * [event, scatter_ran] with the outcomes of the spec's table: a repeat, a
 * match past the allocated blocks, a missing object.  On CPU shared
 * tensors the CPU executor runs here and the event is b""; on CUDA ones
 * the plan goes to the instance's stream (blend_cuda.c) and every reply
 * carries a fresh event ("The GPU path"). */
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "core/errbuf.h"
#include "core/fnv.h"
#include "core/mix.h"
#include "kv/kv_blend_plan.h"
#include "modules/blend/serve/blend_serve.h"
#include "modules/transfer/resolve.h"
#include "modules/transfer/server/fault_guard.h"
#include "obs/log.h"
#include "storage/storage_manager.h"

#define MAX_BATCH 4 /* staging slots, the spec's max_batch_size */

/* ---- the repeat-call guard ------------------------------------------------ */

int lmc_blend_serve_applied_init(cb_applied *a, size_t cap)
{
    a->cap = cap;
    a->gen[0] = calloc(2 * cap, sizeof *a->gen[0]);
    a->gen[1] = calloc(2 * cap, sizeof *a->gen[1]);
    return a->gen[0] && a->gen[1] ? 0 : -1;
}

void lmc_blend_serve_applied_free(cb_applied *a)
{
    free(a->gen[0]);
    free(a->gen[1]);
}

/* Open addressing over 2 * cap slots; 0 marks an empty slot (a digest of
 * 0 is stored as 1). */
static uint64_t *slot_of(uint64_t *t, size_t cap, uint64_t d)
{
    size_t n = 2 * cap, i = (size_t)(d % n);
    while (t[i] && t[i] != d)
        i = (i + 1) % n;
    return &t[i];
}

static bool applied_has(cb_applied *a, uint64_t d)
{
    d = d ? d : 1;
    return *slot_of(a->gen[0], a->cap, d) == d || *slot_of(a->gen[1], a->cap, d) == d;
}

/* The newer generation fills to cap, then becomes the older one. */
static void applied_add(cb_applied *a, uint64_t d)
{
    d = d ? d : 1;
    if (applied_has(a, d))
        return;
    if (a->used[0] == a->cap) {
        uint64_t *old = a->gen[1];
        a->gen[1] = a->gen[0];
        a->gen[0] = old;
        memset(a->gen[0], 0, 2 * a->cap * sizeof *a->gen[0]);
        a->used[1] = a->used[0];
        a->used[0] = 0;
    }
    *slot_of(a->gen[0], a->cap, d) = d;
    a->used[0]++;
}

/* ---- one call ------------------------------------------------------------ */

typedef struct {
    lmc_blend_retrieve q;
    sd_ctx *c;
    cb_rope *r;
    lmc_blend_match **order;          /* matches by cur_st, the repeats dropped */
    size_t n;
    int64_t *ids[LMC_KV_MAX_KERNEL_GROUPS];   /* physical block tables */
    uint64_t n_ids[LMC_KV_MAX_KERNEL_GROUPS];
    uint64_t *digest;                 /* per match of order */
    lmc_object_key *keys;             /* this rank's, per match */
    lmc_lease *leases;
    size_t n_keys;
    bool carried;                     /* the leases carry the stash's shares */
} cb_call;

static void call_free(cb_mod *m, cb_call *x)
{
    if (x->n_keys) {
        lmc_storage_manager_give_back(m->ctx->storage, x->keys, x->leases, x->n_keys);
        lmc_keys_drop(x->keys, x->n_keys);
    }
    free(x->keys);
    free(x->leases);
    free(x->digest);
    free(x->order);
    for (uint32_t k = 0; k < LMC_KV_MAX_KERNEL_GROUPS; k++)
        free(x->ids[k]);
    lmc_blend_serve_rope_put(x->r);
    lmc_server_driven_put(m->sd, x->c);
    lmc_blend_retrieve_free(&x->q);
}

static int by_cur_st(const void *a, const void *b)
{
    const lmc_blend_match *x = *(lmc_blend_match *const *)a, *y = *(lmc_blend_match *const *)b;
    return (x->cur_st > y->cur_st) - (x->cur_st < y->cur_st);
}

/* Each kernel group's physical block table from its engine group's list. */
static int block_tables(cb_call *x, char *err, size_t errlen)
{
    const lmc_kv_plan *p = &x->c->plan;
    for (uint32_t k = 0; k < p->n_kg; k++) {
        const lmc_kv_kernel_group *g = &p->kg[k];
        uint64_t eg = (uint64_t)g->engine_group_id, per = g->physical_per_engine;
        if (eg >= x->q.n_groups)
            return lmc_err(err, errlen, "gpu_block_ids has %u tables; engine group %llu has "
                                        "none", x->q.n_groups, (unsigned long long)eg);
        uint64_t n = (uint64_t)x->q.group_len[eg] * per;
        if (!(x->ids[k] = malloc((n ? n : 1) * sizeof *x->ids[k])))
            return lmc_err(err, errlen, "out of memory");
        for (uint64_t i = 0; i < n; i++)
            x->ids[k][i] = (int64_t)x->q.blocks[eg][i / per] * (int64_t)per + (int64_t)(i % per);
        x->n_ids[k] = n;
    }
    return 0;
}

/* The repeat-call guard's digest of (request, rank, match, the blocks its
 * tokens land in). */
static uint64_t digest_of(const cb_call *x, const lmc_blend_match *mt)
{
    const lmc_ipc_key *k = &x->q.key;
    uint64_t h = lmc_fnv1a64(LMC_FNV1A64_OFFSET_BASIS, k->request_id, k->request_id_len);
    h = lmc_fnv1a64(h, &k->worker_id, sizeof k->worker_id);
    h = lmc_fnv1a64(h, mt->hash, sizeof mt->hash);
    h = lmc_fnv1a64(h, &mt->cur_st, sizeof mt->cur_st);
    h = lmc_fnv1a64(h, &mt->cur_ed, sizeof mt->cur_ed);
    const lmc_kv_plan *p = &x->c->plan;
    for (uint32_t g = 0; g < p->n_kg; g++) {
        uint32_t bs = p->kg[g].geo.bs;
        for (uint64_t b = mt->cur_st / bs; b <= (mt->cur_ed - 1) / bs && b < x->n_ids[g]; b++)
            h = lmc_fnv1a64(h, &x->ids[g][b], sizeof x->ids[g][b]);
    }
    return lmc_core_mix64(h);
}

/* The tokens every staged group has blocks for. */
static uint64_t slot_bound(const cb_call *x)
{
    uint64_t bound = UINT64_MAX;
    const lmc_kv_plan *p = &x->c->plan;
    for (uint32_t g = 0; g < p->n_kg; g++) {
        uint64_t t = x->n_ids[g] * p->kg[g].geo.bs;
        bound = t < bound ? t : bound;
    }
    return bound;
}

/* This rank's keys and leases: from the session's stash when it holds
 * every match (the leases then carry its shares), else taken now.  The
 * stash's other entries, matches the client did not send, are released.
 * False when an object is not there. */
static bool take_objects(cb_mod *m, cb_call *x, uint64_t object_size)
{
    const lmc_ipc_key *k = &x->q.key;
    if (!(x->keys = calloc(x->n + 1, sizeof *x->keys)) ||
        !(x->leases = calloc(x->n + 1, sizeof *x->leases)))
        return false;
    lmc_object_sizes want = {&object_size, 1, 1};
    lmc_session *se = lmc_sessions_acquire(m->ctx->sessions, k->request_id, k->request_id_len,
                                           false);
    cb_stash *s = se ? (cb_stash *)se->ext : NULL;
    bool all = s != NULL;
    for (size_t i = 0; all && i < x->n; i++)
        all = lmc_blend_serve_stash_find(s, x->order[i]->hash) != NULL;
    uint32_t rank = s && s->ranks > 1 ? k->worker_id : 0;
    bool ok = false;
    if (all && rank < s->ranks) {
        uint8_t *sent = malloc(x->n * LMC_BLEND_HASH_BYTES + 1);
        for (size_t i = 0; sent && i < x->n; i++) {
            memcpy(sent + i * LMC_BLEND_HASH_BYTES, x->order[i]->hash, LMC_BLEND_HASH_BYTES);
            x->keys[i] = lmc_blend_serve_stash_find(s, x->order[i]->hash)->keys[rank];
        }
        if (sent) {
            lmc_keys_hold(x->keys, x->n);
            x->n_keys = x->n;
            x->carried = true;
            ok = lmc_storage_manager_lease_copy(m->ctx->storage, x->keys, x->n,
                                                LMC_COPY_CARRIES_SHARE, true, &want, x->leases,
                                                NULL) == x->n;
            /* One share each is the copy's now, given back with it; a READ
             * lease left with none holds nothing more, as a LOOKUP's
             * delivered lease whose shares the RETRIEVEs consumed. */
            for (size_t i = 0; ok && i < x->n; i++) {
                lmc_lease *l = &lmc_blend_serve_stash_find(s, x->order[i]->hash)->leases[rank];
                if (l->shares > 1)
                    l->shares--;
                else
                    l->kind = LMC_LEASE_NONE;
            }
            lmc_blend_serve_stash_release_others(s, sent, x->n);
            free(sent);
        }
    }
    if (se)
        lmc_sessions_release(m->ctx->sessions, se);
    if (x->carried)
        return ok;
    uint8_t *hashes = malloc(x->n * LMC_BLEND_HASH_BYTES + 1);
    for (size_t i = 0; hashes && i < x->n; i++)
        memcpy(hashes + i * LMC_BLEND_HASH_BYTES, x->order[i]->hash, LMC_BLEND_HASH_BYTES);
    bool built = hashes && lmc_ipc_key_object_keys_find(k, hashes, x->n, 1, m->ctx->interner,
                                                        x->keys) == 0;
    free(hashes);
    if (!built)
        return false;
    x->n_keys = x->n;
    return lmc_storage_manager_lease_copy(m->ctx->storage, x->keys, x->n, LMC_COPY_TAKES_SHARE,
                                          true, &want, x->leases, NULL) == x->n;
}

/* The executor under the SIGBUS guard: an engine that shrinks its segment
 * fails this call, not the server.  -2 then, else what it returned. */
static int execute_guarded(const lmc_kv_blend_input *in, const lmc_kv_blend_plan *plan,
                           const uint8_t *const *objects, const lmc_kv_blend_group_io *io,
                           uint8_t *pool, uint64_t pool_bytes, char *err, size_t errlen)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        lmc_fault_guard_leave();
        snprintf(err, errlen, "the engine's memory went away under the copy");
        return -2;
    }
    lmc_fault_guard_enter(&jb);
    int rc = lmc_kv_blend_execute(in, plan, objects, io, pool, pool_bytes, err, errlen);
    lmc_fault_guard_leave();
    return rc;
}

/* Plans and runs the copy; 0, -1 refused (err), -2 memory / fault. */
static int scatter(cb_mod *m, cb_call *x, char *err, size_t errlen)
{
    const lmc_kv_plan *p = &x->c->plan;
    lmc_kv_blend_chunk *chunks = calloc(x->n, sizeof *chunks);
    const uint8_t **objects = calloc(x->n, sizeof *objects);
    const int64_t *blocks[LMC_KV_MAX_KERNEL_GROUPS];
    lmc_kv_blend_group_io io[LMC_KV_MAX_KERNEL_GROUPS];
    uint32_t read[1] = {0};
    int rc = -2;
    void *mem = NULL;
    uint8_t *pool = NULL;
    if (!chunks || !objects)
        goto out;
    const uint8_t *arena = lmc_storage_manager_l1_arena(m->ctx->storage)->base;
    for (size_t i = 0; i < x->n; i++) {
        chunks[i] = (lmc_kv_blend_chunk){x->order[i]->old_st, x->order[i]->cur_st,
                                         x->order[i]->cur_ed};
        objects[i] = arena + x->leases[i].offset;
    }
    for (uint32_t k = 0; k < p->n_kg; k++) {
        blocks[k] = x->ids[k];
        io[k] = (lmc_kv_blend_group_io){x->c->cuda ? NULL : x->c->bases[k], p->kg[k].span_bytes,
                                        x->r->rope_on[k] ? &x->r->caches[x->r->cache_of[k]]
                                                         : NULL,
                                        &x->r->geom[k], x->r->k_dtype};
    }
    lmc_kv_blend_input in = {p, read, 1, chunks, (uint32_t)x->n, blocks, x->n_ids,
                             x->r->n_caches ? x->r->rope_on : NULL, MAX_BATCH};
    lmc_kv_blend_plan plan;
    uint64_t bytes;
    if ((rc = lmc_kv_blend_plan_size(&in, &bytes, err, errlen)) != 0)
        goto out;
    rc = -2;
    if ((bytes && !(mem = malloc(bytes))))
        goto out;
    if ((rc = lmc_kv_blend_plan_build(&in, mem, bytes, &plan, err, errlen)) != 0)
        goto out;
    if (x->c->cuda) {
        rc = lmc_blend_serve_cuda_execute(m, x->c, x->r, &in, &plan, objects, x->q.event,
                                          x->q.event_len, err, errlen);
        goto out;
    }
    rc = -2;
    uint64_t pool_bytes = plan.slot_stride * MAX_BATCH;
    if (!(pool = malloc(pool_bytes ? pool_bytes : 1)))
        goto out;
    rc = execute_guarded(&in, &plan, objects, io, pool, pool_bytes, err, errlen);
out:
    free(pool);
    free(mem);
    free(objects);
    free(chunks);
    return rc;
}

static lmc_handler_result reply(cb_mod *m, const cb_call *x, lmc_rpc_call *call, bool ran)
{
    if (x->c->cuda)
        lmc_blend_serve_cuda_reply(m, x->c, call, ran);
    else
        lmc_blend_encode_retrieve_reply(lmc_rpc_call_reply(call), NULL, 0, ran); /* b"" */
    return LMC_HANDLER_REPLY;
}

/* A CUDA plan may still read the objects: their leases go back behind it. */
static void give_back_after_stream(cb_mod *m, cb_call *x)
{
    lmc_blend_serve_cuda_give_back_after(m, x->c, x->keys, x->leases, x->n_keys);
    lmc_keys_drop(x->keys, x->n_keys);
    x->n_keys = 0;
}

/* Resolves the call's instance, rope state and block tables; 0, or -1
 * with the reason (a failed request, as the spec's raise). */
static int resolve(cb_mod *m, cb_call *x, char *err, size_t errlen)
{
    const lmc_ipc_key *k = &x->q.key;
    if (!(x->c = lmc_server_driven_get(m->sd, x->q.instance_id)))
        return lmc_err(err, errlen, "instance %lld is not registered",
                       (long long)x->q.instance_id);
    if (!(x->r = lmc_blend_serve_rope_get(m, x->q.instance_id)))
        return lmc_err(err, errlen, "instance %lld has no rope state (CB_REGISTER_ROPE first)",
                       (long long)x->q.instance_id);
    if (x->r->n_caches && x->r->cu_ctx != (x->c->cuda ? x->c : NULL))
        return lmc_err(err, errlen, "instance %lld registered again since its "
                                    "CB_REGISTER_ROPE", (long long)x->q.instance_id);
    if (!k->has_worker)
        return lmc_err(err, errlen, "worker_id must be this rank, not None");
    if (!lmc_server_driven_bind_model(m->sd, x->c, k->model_name, k->model_len, k->world_size))
        return lmc_err(err, errlen, "the key names another model or world size than instance "
                                    "%lld registered", (long long)x->q.instance_id);
    if (x->c->plan.n_og != 1)
        return lmc_err(err, errlen, "instance %lld has %u object groups (blend reads one)",
                       (long long)x->q.instance_id, x->c->plan.n_og);
    if (m->cs % x->c->plan.kg[0].tokens_per_block != 0)
        return lmc_err(err, errlen, "chunk size %u is not a multiple of tokens_per_block %u",
                       m->cs, x->c->plan.kg[0].tokens_per_block);
    return block_tables(x, err, errlen);
}

/* Sorts the matches and drops those this (request, rank) applied to the
 * same blocks already. */
static int order_matches(cb_mod *m, cb_call *x)
{
    x->order = malloc((x->q.n_matches + 1) * sizeof *x->order);
    x->digest = malloc((x->q.n_matches + 1) * sizeof *x->digest);
    if (!x->order || !x->digest)
        return -1;
    for (size_t i = 0; i < x->q.n_matches; i++)
        x->order[i] = &x->q.matches[i];
    qsort(x->order, x->q.n_matches, sizeof *x->order, by_cur_st);
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < x->q.n_matches; i++) {
        uint64_t d = digest_of(x, x->order[i]);
        if (!applied_has(&m->applied, d)) {
            x->digest[x->n] = d;
            x->order[x->n++] = x->order[i];
        }
    }
    pthread_mutex_unlock(&m->lock);
    return 0;
}

/* CB_RETRIEVE_PRE_COMPUTED(key, matches, gpu_block_ids, instance_id, event)
 * -> [event, scatter_ran] */
lmc_handler_result lmc_blend_serve_retrieve(void *state, lmc_rpc_call *call)
{
    cb_mod *m = state;
    cb_call x = {0};
    lmc_blend_frame f[5];
    size_t nf = lmc_blend_serve_frames(call, f, 5);
    char err[384];
    int rc = lmc_blend_decode_retrieve(f, nf, m->cs, &x.q, err, sizeof err);
    if (rc != 0)
        return lmc_rpc_call_fail(call, rc == -2 ? "MemoryError" : "ValidationError",
                                 "CB_RETRIEVE_PRE_COMPUTED: %s", err);
    if (resolve(m, &x, err, sizeof err) != 0) {
        call_free(m, &x);
        atomic_fetch_add(&m->retrieves_failed, 1);
        return lmc_rpc_call_fail(call, "ValidationError", "CB_RETRIEVE_PRE_COMPUTED: %s", err);
    }
    lmc_transfer_touch(m->ctx->liveness, x.q.instance_id);
    lmc_handler_result res;
    if (order_matches(m, &x) != 0) {
        res = lmc_rpc_call_fail(call, "MemoryError", "CB_RETRIEVE_PRE_COMPUTED: out of memory");
        goto done;
    }
    if (x.n == 0) { /* nothing new: already applied, or no matches at all */
        atomic_fetch_add(&m->retrieves_repeated, x.q.n_matches > 0);
        res = reply(m, &x, call, true);
        goto done;
    }
    uint64_t bound = slot_bound(&x);
    bool past = false, all_past = true;
    for (size_t i = 0; i < x.n; i++) {
        past |= x.order[i]->cur_ed > bound;
        all_past &= x.order[i]->cur_st >= bound;
    }
    if (past) { /* never a partial scatter; deferred whole, the locks kept */
        atomic_fetch_add(all_past ? &m->retrieves_deferred : &m->retrieves_failed, 1);
        res = reply(m, &x, call, all_past);
        goto done;
    }
    bool ok = take_objects(m, &x, x.c->plan.og[0].object_size);
    rc = ok ? scatter(m, &x, err, sizeof err) : -1;
    if (ok && x.c->cuda)
        give_back_after_stream(m, &x);
    if (!ok)
        LMC_WARN_LIMITED("CB_RETRIEVE_PRE_COMPUTED %.*s: a matched chunk is no longer stored",
                         (int)x.q.key.request_id_len, x.q.key.request_id);
    else if (rc != 0)
        LMC_WARN_LIMITED("CB_RETRIEVE_PRE_COMPUTED %.*s: %s", (int)x.q.key.request_id_len,
                         x.q.key.request_id, err);
    if (rc == 0) {
        pthread_mutex_lock(&m->lock);
        for (size_t i = 0; i < x.n; i++)
            applied_add(&m->applied, x.digest[i]);
        pthread_mutex_unlock(&m->lock);
        atomic_fetch_add(&m->chunks_scattered, x.n);
    }
    atomic_fetch_add(rc == 0 ? &m->retrieves_ok : &m->retrieves_failed, 1);
    res = reply(m, &x, call, rc == 0);
done:
    call_free(m, &x);
    return res;
}
