/* The CacheBlend module (docs/cacheblend.md, "The blend module"): the
 * blend RPCs of `--engine-type blend` over the server-driven transfer's
 * registrations, the fingerprint matcher fed by their STOREs, and the
 * unified lookup's prefix leg through the lookup module.
 *
 * Files: blend_module.c (the module's face, the handshake, RoPE state, the
 * STORE hook), blend_lookup.c (CB_UNIFIED_LOOKUP's state machine),
 * blend_stash.c (the read locks a lookup hands to the retrieves),
 * blend_retrieve.c (CB_RETRIEVE_PRE_COMPUTED), blend_cuda.c (its GPU path
 * and the CUDA cos/sin caches). */
#ifndef LMC_MODULES_BLEND_SERVE_BLEND_SERVE_H
#define LMC_MODULES_BLEND_SERVE_BLEND_SERVE_H

#include <pthread.h>
#include <stdatomic.h>

#include "kv/kv_blend_plan.h"
#include "kv/kv_rope.h"
#include "modules/blend/blend_coord.h"
#include "modules/blend/blend_matcher.h"
#include "modules/blend/blend_wire.h"
#include "modules/module.h"
#include "modules/transfer/server/server_internal.h"

extern const lmc_module_def lmc_blend_serve_module;

/* One instance's CB_REGISTER_ROPE: its caches mapped (and normalised
 * where they carry an mscale) and each kernel group's rotation. */
typedef struct cb_rope {
    int64_t instance_id;
    uint32_t n_caches;
    lmc_kv_rope_cache caches[LMC_BLEND_MAX_ROPE_CACHES];
    void *maps[LMC_BLEND_MAX_ROPE_CACHES];      /* shm mappings, map_len bytes */
    size_t map_len[LMC_BLEND_MAX_ROPE_CACHES];
    void *owned[LMC_BLEND_MAX_ROPE_CACHES];     /* normalised copies */
    bool rope_on[LMC_KV_MAX_KERNEL_GROUPS];
    uint32_t cache_of[LMC_KV_MAX_KERNEL_GROUPS];
    lmc_kv_rope_geom geom[LMC_KV_MAX_KERNEL_GROUPS];
    lmc_kv_rope_dtype k_dtype;
    atomic_int refs;                            /* the table's and each retrieve's */
    /* A CUDA instance's (blend_cuda.c): caches[i].data is NULL, the cache
     * is at device address cu_cache[i]: in the allocation cu_opened[i],
     * mapped through the instance's context (referenced by cu_ctx), or
     * the divided copy the server uploaded, cu_owned[i]. */
    sd_mod *sd;
    sd_ctx *cu_ctx;
    uint64_t cu_cache[LMC_BLEND_MAX_ROPE_CACHES];
    uint64_t cu_opened[LMC_BLEND_MAX_ROPE_CACHES];
    uint64_t cu_owned[LMC_BLEND_MAX_ROPE_CACHES];
} cb_rope;

typedef struct cb_job cb_job;

/* Applied (request, rank, match, destination) digests: the repeat-call
 * guard of CB_RETRIEVE_PRE_COMPUTED, two generations of `cap` each. */
typedef struct {
    uint64_t *gen[2];
    size_t used[2], cap;
} cb_applied;

typedef struct cb_mod {
    lmc_module_ctx *ctx;
    sd_mod *sd;
    uint32_t cs;
    lmc_blend_matcher *matcher;
    lmc_blend_coord *coord;          /* the fleet's index with --coordinator-url, else NULL */
    bool segmented;                  /* --enable-segmented-prefix */
    pthread_mutex_t lock;            /* ropes, jobs, applied */
    cb_rope **ropes;
    size_t n_ropes, cap_ropes;
    cb_job *jobs;                    /* unified lookups in flight, newest first */
    size_t n_jobs;
    cb_applied applied;
    atomic_uint_fast64_t handshakes, ropes_registered, ropes_refused, fingerprinted_stores,
        lookups, lookups_done, matches_found, matches_stale, matches_removed, prefix_tokens,
        segmented_chunks, retrieves_ok, retrieves_failed, retrieves_deferred,
        retrieves_repeated, chunks_scattered, jobs_dropped, l2_loads, coordinator_matches,
        coordinator_failures;
} cb_mod;

/* ---- blend_module.c ---- */
/* The call's first payload frames (at most max) for the blend decoders;
 * how many there are. */
size_t lmc_blend_serve_frames(lmc_rpc_call *call, lmc_blend_frame *f, size_t max);
/* The rope state of `id` with a reference, or NULL; lmc_blend_serve_rope_put() it. */
cb_rope *lmc_blend_serve_rope_get(cb_mod *m, int64_t id);
void lmc_blend_serve_rope_put(cb_rope *r);
/* The matcher namespace of a key's model, salt and world size. */
lmc_blend_ns lmc_blend_serve_ns(const lmc_object_key *k, uint32_t world_size);

/* A key's model and salt as the matcher's NUL-terminated namespace. */
typedef struct {
    char model[LMC_MODEL_NAME_MAX + 1];
    char salt[LMC_CACHE_SALT_MAX + 1];
} cb_key_ns;
bool lmc_blend_serve_key_ns_init(cb_key_ns *out, const lmc_ipc_key *k);

/* ---- blend_lookup.c ---- */
lmc_handler_result lmc_blend_serve_unified_lookup(void *state, lmc_rpc_call *call);
/* Drops every job (their leases go back); after the L2 prefetches stopped. */
void lmc_blend_serve_jobs_close(cb_mod *m);

/* ---- blend_stash.c ---- */
/* The found matches' read locks, per chunk hash: `ranks` keys each with
 * `shares` left, kept on the request's session until a retrieve consumes
 * them or the session goes (docs/cacheblend.md, "Read locks"). */
typedef struct cb_stash_entry {
    uint8_t hash[LMC_BLEND_HASH_BYTES];
    lmc_object_key *keys;            /* ranks, each holding its references */
    lmc_lease *leases;               /* READ, the shares not yet consumed */
} cb_stash_entry;

typedef struct cb_stash {
    lmc_session_ext ext;
    lmc_storage_manager *storage;
    uint32_t ranks;
    size_t n;
    cb_stash_entry *e;
} cb_stash;

cb_stash *lmc_blend_serve_stash_new(lmc_storage_manager *sm, uint32_t ranks, size_t cap);
/* Gives back every share left and frees the stash. */
void lmc_blend_serve_stash_release(cb_stash *s);
cb_stash_entry *lmc_blend_serve_stash_find(cb_stash *s, const uint8_t *hash);
/* Gives back the shares of the entries whose hash is not in hashes[0..n)
 * (32 bytes each) and drops them. */
size_t lmc_blend_serve_stash_release_others(cb_stash *s, const uint8_t *hashes, size_t n);

/* ---- blend_retrieve.c ---- */
lmc_handler_result lmc_blend_serve_retrieve(void *state, lmc_rpc_call *call);
int lmc_blend_serve_applied_init(cb_applied *a, size_t cap);
void lmc_blend_serve_applied_free(cb_applied *a);

/* ---- blend_cuda.c (docs/cacheblend.md, "The GPU path") ---- */
/* Maps cos/sin cache i (a CUDA IPC tensor on c's device, its shape
 * checked by the caller) into r: r->caches[i] without data, its device
 * address in r->cu_cache[i] (a divided copy where it carries an mscale). */
int lmc_blend_serve_cuda_map_cache(cb_mod *m, cb_rope *r, uint32_t i, sd_ctx *c,
                                   const lmc_shared_tensor *t, lmc_kv_rope_dtype dt,
                                   char *err, size_t errlen);
/* Closes r's device caches once c's stream has passed every plan. */
void lmc_blend_serve_cuda_rope_release(cb_rope *r);
/* Enqueues a built plan on the instance's stream after the client's
 * event (docs/cacheblend.md, "The GPU path").  0, or -1 with the reason. */
int lmc_blend_serve_cuda_execute(cb_mod *m, sd_ctx *c, const cb_rope *r,
                                 const lmc_kv_blend_input *in, const lmc_kv_blend_plan *plan,
                                 const uint8_t *const *objects, const uint8_t *event,
                                 size_t event_len, char *err, size_t errlen);
/* The leases (and keys, referenced) go back once the stream has passed
 * what is enqueued; the arrays stay the caller's. */
void lmc_blend_serve_cuda_give_back_after(cb_mod *m, sd_ctx *c, lmc_object_key *keys,
                                          lmc_lease *leases, size_t n);
/* [fresh event handle, ran]; an empty handle where none can be made. */
void lmc_blend_serve_cuda_reply(cb_mod *m, sd_ctx *c, lmc_rpc_call *call, bool ran);

#endif
