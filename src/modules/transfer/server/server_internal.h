/* Internal to the server-driven transfer module (register.c:
 * registration, mappings, how a context ends, lifetime; server_driven.c: STORE,
 * RETRIEVE and the module's face). */
#ifndef LMC_MODULES_TRANSFER_SERVER_SERVER_INTERNAL_H
#define LMC_MODULES_TRANSFER_SERVER_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "kv/cuda_transfer.h"
#include "kv/bulk_copy.h"
#include "modules/services/ipc_key.h"
#include "kv/kv_layerwise.h"
#include "kv/kv_plan.h"
#include "modules/services/layout_registry.h"
#include "modules/module.h"
#include "modules/transfer/instance_registry.h"

/* One shared-memory segment of the engine, mapped read/write. */
typedef struct {
    char name[LMC_SHM_NAME_MAX + 1];
    uint8_t *addr;
    size_t len;
} sd_mapping;

/* The CUDA part, loaded at the first CUDA registration (cuda_plugin.c). */
typedef struct sd_completion sd_completion;

typedef struct sd_cuda {
    pthread_mutex_t lock;          /* loading, pinning, the completion queue */
    pthread_cond_t wake;
    bool tried, stopping, thread_started, pin_started, pinner_started, pinned;
    pthread_t pinner;              /* pins the L1 arena once (cuda_plugin.c) */
    void *dl;
    const lmc_cuda_ops *ops;
    char why[256];                 /* why the CUDA part is unavailable */
    sd_completion *head, **tail;
    pthread_t thread;
} sd_cuda;

/* A CUDA context's device, stream and mapped allocations. */
typedef struct sd_cuda_ctx {
    int device;
    lmc_cuda_stream *stream;
    uint64_t *opened;              /* mapped allocations' bases, to close */
    size_t n_opened;
    uint64_t **tensors;            /* [kernel group][tensor]: device address of element 0 */
} sd_cuda_ctx;

/* A registered engine worker.  The module's list holds one reference and
 * every op in flight one more; the last one unmaps, so an unregister or a
 * reap never pulls pages from under a copy. */
typedef struct sd_ctx {
    int64_t instance_id;
    atomic_int refs;
    const char *model;           /* interned, one reference held; NULL until known (2-frame REGISTER) */
    uint32_t world_size;
    bool layout_held;            /* a layout registry reference is ours */
    lmc_layout layout;
    lmc_kv_plan plan;
    uint32_t n_tensors;          /* registered */
    uint8_t ***bases;            /* [kernel group][tensor]: element 0 of each */
    sd_mapping *maps;
    size_t n_maps;
    bool cuda;                   /* CUDA tensors: `cu` instead of bases and maps */
    sd_cuda_ctx cu;
    char tag[40];                /* writer tag "sd:<instance_id>" */
} sd_ctx;

struct sd_op;

typedef struct sd_mod {
    lmc_module_ctx *ctx;
    uint32_t cs;
    lmc_copy_method copy;
    bool force_hnd;              /* vLLM tensors on a server without a GPU */
    /* sd_ctx by instance id (one reference each); its lock guards each
     * ctx's model/layout_held and populating too */
    lmc_transfer_registry instances;
    pthread_cond_t populated;    /* populating fell to 0 */
    int populating;              /* page-table fill threads still running */
    sd_cuda cuda;
    atomic_uint_fast64_t registrations, registrations_refused, unregisters,
        stores_ok, stores_failed, retrieves_ok, retrieves_failed, chunks_stored,
        chunks_retrieved, bytes_stored, bytes_retrieved, store_ns, retrieve_ns,
        layerwise_ok, layerwise_failed, layer_batches, split_copies, pieces_helped;
    /* Set once by the blend module at its creation, before any request
     * (docs/cacheblend.md): a STORE's chunks once they are written (the
     * CPU path) or enqueued (CUDA), and an instance unregistered or
     * reaped. */
    void (*after_store)(void *user, const struct sd_op *op);
    void (*instance_dropped)(void *user, int64_t instance_id);
    void *hook_user;
} sd_mod;

/* One STORE or RETRIEVE, decoded and resolved (server_driven.c). */
typedef struct sd_op {
    struct sd_ctx *c;          /* referenced; NULL when not registered */
    lmc_ipc_key key;
    bool key_decoded;
    size_t n;                  /* chunks */
    lmc_object_key *keys;      /* n * n_og, chunk-major */
    size_t n_keys;             /* keys built, each holding its references */
    int64_t *ids;              /* every block id list, back to back */
    size_t offs[LMC_KV_MAX_KERNEL_GROUPS];   /* where list g starts in ids */
    uint8_t *arena;
} sd_op;

/* The write plan of one STORE: the keys asked for, in (object group,
 * chunk) order, their index in op->keys, and their leases. */
typedef struct {
    lmc_object_key *keys;
    size_t *slot;
    lmc_lease *leases;
    lmc_l1_result *res;
    size_t n;
} sd_store_plan;

/* A CPU copy cut into pieces of whole items (a STORE's planned objects, a
 * RETRIEVE's chunks of one object group) that idle threads of the
 * --max-gpu-workers pool take beside the request's own
 * (docs/architecture.md, "One request across the copy workers"). */
typedef struct sd_split {
    sd_mod *m;
    const sd_op *op;
    const sd_store_plan *s;        /* STORE */
    uint32_t og;                   /* RETRIEVE: the object group, */
    size_t first;                  /* its first chunk, */
    uint64_t skip;                 /* the tokens left alone, */
    const lmc_lease *leases;       /* the objects of chunks first.., */
    const lmc_kv_layer_ref *refs;  /* and a layerwise batch's layers */
    size_t n_refs;
    size_t items, pieces;
    pthread_t owner;
    /* Copies items [from, to); runs under the SIGBUS guard. */
    bool (*copy)(const struct sd_split *split, size_t from, size_t to);
} sd_split;

/* Runs sp's copy over its items of `bytes` in all, in pieces when they are
 * large enough and the request runs on a pool of several workers; false
 * when the engine's memory went away under any piece. */
bool lmc_server_driven_run_split(lmc_rpc_call *call, sd_split *sp, uint64_t bytes);

/* The stored block ids of chunk `chunk` of kernel group gi: the last
 * keep_blocks of its blocks_per_chunk (a sub-chunk window keeps fewer). */
static inline const int64_t *lmc_server_driven_kept_ids(const sd_op *op, uint32_t gi, size_t chunk)
{
    const lmc_kv_kernel_group *g = &op->c->plan.kg[gi];
    return op->ids + op->offs[gi] + chunk * g->blocks_per_chunk +
           (g->blocks_per_chunk - g->keep_blocks);
}

/* Every block id chunk `chunk` of kernel group gi stores is inside the
 * group's tensors (checked before any copy: a kernel would not). */
static inline bool lmc_server_driven_ids_in_range(const sd_op *op, uint32_t gi, size_t chunk)
{
    const lmc_kv_kernel_group *g = &op->c->plan.kg[gi];
    const int64_t *ids = lmc_server_driven_kept_ids(op, gi, chunk);
    for (uint32_t j = 0; j < g->keep_blocks; j++)
        if (ids[j] < 0 || (uint64_t)ids[j] >= g->geo.nb)
            return false;
    return true;
}

/* First chunk object group og needs: a sliding-window group only its last
 * chunks_in_sw, the only ones the LOOKUP locked for it. */
static inline size_t lmc_server_driven_window_start(const sd_op *op, uint32_t og)
{
    int32_t w = op->c->plan.og[og].chunks_in_sw;
    return w < 0 || (size_t)w >= op->n ? 0 : op->n - (size_t)w;
}

/* For chunk c of object group og, how many kept blocks of each member the
 * first `skip` tokens of the range cover (a RETRIEVE leaves them alone);
 * false when they cover the whole chunk. */
static inline bool lmc_server_driven_chunk_skip(const sd_op *op, uint32_t cs, uint32_t og, size_t c,
                                     uint64_t skip, uint32_t *skip_blocks)
{
    uint64_t start = (uint64_t)c * cs;
    if (skip >= start + cs)
        return false;
    const lmc_kv_object_group *o = &op->c->plan.og[og];
    for (uint32_t k = 0; k < o->n_members; k++)
        skip_blocks[k] = lmc_kv_skip_blocks(&op->c->plan.kg[o->members[k]],
                                            skip > start ? skip - start : 0);
    return true;
}

/* ---- CUDA (cuda_plugin.c) ---- */
void lmc_server_driven_cuda_init(sd_cuda *c);
/* After every context's stream was freed: drains and stops the thread. */
void lmc_server_driven_cuda_close(sd_mod *m);
/* Maps a registration's CUDA tensors and makes the context's stream.
 * 0, or -1 / -2 with the reason. */
int lmc_server_driven_cuda_register(sd_mod *m, struct sd_ctx *c, const lmc_shared_tensor *t, size_t n,
                         char *err, size_t errlen);
void lmc_server_driven_cuda_release(sd_mod *m, struct sd_ctx *c);
/* Enqueue a STORE's copies (the reserved chunks of `s`) or a RETRIEVE's
 * (the granted COPY leases of object group og); the stream publishes or
 * gives the leases back when it has passed them, taking ownership of the
 * keys and leases arrays passed.  handle: the event to reply with. */
bool lmc_server_driven_cuda_store(sd_mod *m, const sd_op *op, sd_store_plan *s, const uint8_t *client,
                       size_t client_len, uint8_t handle[LMC_CUDA_EVENT_HANDLE_BYTES],
                       uint64_t *bytes);
bool lmc_server_driven_cuda_retrieve(sd_mod *m, const sd_op *op, uint64_t skip, const uint8_t *client,
                          size_t client_len, uint8_t handle[LMC_CUDA_EVENT_HANDLE_BYTES],
                          uint64_t *bytes);
/* A CUDA shared tensor of `span` bytes beside the registration's, on its
 * device (the blend module's cos/sin caches, docs/cacheblend.md, "The GPU
 * path"), bounds checked as the KV tensors are: *addr its element 0.
 * *opened (0: none) is the allocation to close_mem, failed or not. */
int lmc_server_driven_cuda_open(sd_mod *m, const struct sd_ctx *c, const lmc_shared_tensor *t,
                                uint64_t span, uint64_t *addr, uint64_t *opened, char *err,
                                size_t errlen);
void lmc_server_driven_cuda_close_mem(sd_mod *m, const struct sd_ctx *c, uint64_t opened);
/* Device bytes into pageable host memory, synchronously (the plugin's read). */
int lmc_server_driven_cuda_read(sd_mod *m, const struct sd_ctx *c, uint64_t src, void *host,
                                uint64_t bytes, char *err, size_t errlen);
/* Device memory of `bytes` on c's device holding `host`'s bytes, owned by
 * the caller until cuda_free_device (after a sync of what reads it). */
int lmc_server_driven_cuda_upload(sd_mod *m, const struct sd_ctx *c, const void *host,
                                  uint64_t bytes, uint64_t *dev, char *err, size_t errlen);
void lmc_server_driven_cuda_free_device(sd_mod *m, const struct sd_ctx *c, uint64_t dev);
/* Blocks until the context's stream is idle. */
void lmc_server_driven_cuda_sync(sd_mod *m, const struct sd_ctx *c);
/* A recorded event for a failure reply; false when none can be made. */
bool lmc_server_driven_cuda_failure_event(sd_mod *m, const sd_op *op,
                               uint8_t handle[LMC_CUDA_EVENT_HANDLE_BYTES]);

/* Layerwise RETRIEVE on CUDA (layerwise.c): the context's event pool of n
 * events (their handles, n * 64 bytes); the wait for the engine's event;
 * one batch's copies of object group og's chunks [first, n) and pool event
 * `pool` recorded after them; the leases given back once the stream has
 * passed them.  0, or -1 with the reason. */
int lmc_server_driven_cuda_event_pool(sd_mod *m, sd_ctx *c, uint32_t n, uint8_t *handles,
                                      char *err, size_t errlen);
int lmc_server_driven_cuda_wait(sd_mod *m, const sd_op *op, const uint8_t *client,
                                size_t client_len, char *err, size_t errlen);
int lmc_server_driven_cuda_layers(sd_mod *m, const sd_op *op, uint32_t og, size_t first,
                                  uint64_t skip, const lmc_lease *leases,
                                  const lmc_kv_layer_ref *refs, size_t n, uint32_t pool,
                                  char *err, size_t errlen);
void lmc_server_driven_cuda_give_back_after(sd_mod *m, const sd_op *op, lmc_object_key *keys,
                                            lmc_lease *leases, size_t n);

/* Maps a CPU shared tensor's whole segment read/write (t->storage_bytes
 * of it; munmap() it), refusing this server's own L1 pool; NULL with the
 * reason. */
void *lmc_server_driven_map_shm(sd_mod *m, const lmc_shared_tensor *t, char *err, size_t errlen);

/* The context of `id` with a reference for the caller, or NULL. */
sd_ctx *lmc_server_driven_get(sd_mod *m, int64_t id);
void lmc_server_driven_put(sd_mod *m, sd_ctx *c);
/* Registers the layout under the key's (model, world size) the first time
 * an op names them, for contexts registered without a model name; then
 * whether the key names the context's own model and world size.  A key of
 * another model would read and write objects of another layout (issue 29),
 * so a STORE or RETRIEVE that names one is refused. */
bool lmc_server_driven_bind_model(sd_mod *m, sd_ctx *c, const char *model, size_t len, uint32_t ws);

/* The steps of a STORE or RETRIEVE that the layerwise RETRIEVE shares
 * (server_driven.c): frames 0-2 resolved (0, or -1 / -2 with the reason),
 * the references dropped, frame 4 (skip_first_n_tokens) and frame 3 (the
 * engine's event handle). */
int lmc_server_driven_op_begin(sd_mod *m, lmc_rpc_call *call, sd_op *op, bool store, char *err,
                               size_t errlen);
void lmc_server_driven_op_end(sd_mod *m, sd_op *op);
int lmc_server_driven_decode_skip(lmc_rpc_call *call, uint64_t *skip, char *err, size_t errlen);
int lmc_server_driven_client_event(lmc_rpc_call *call, const uint8_t **h, size_t *len, char *err,
                                   size_t errlen);

/* ---- layerwise RETRIEVE (layerwise.c) ---- */
lmc_handler_result lmc_server_driven_register_layerwise_pool(void *state, lmc_rpc_call *call);
lmc_handler_result lmc_server_driven_retrieve_layerwise(void *state, lmc_rpc_call *call);
lmc_handler_result lmc_server_driven_layerwise_busy(void *state, lmc_rpc_call *call);

lmc_handler_result lmc_server_driven_register(void *state, lmc_rpc_call *call);
lmc_handler_result lmc_server_driven_unregister(void *state, lmc_rpc_call *call);
int lmc_server_driven_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen);
void lmc_server_driven_close(void *state);
json_t *lmc_server_driven_contexts_json(sd_mod *m);

#endif
