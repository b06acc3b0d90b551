/* The CUDA part of the server-driven transfer (docs/protocol.md,
 * "Server-driven copies over CUDA IPC"): a shared object,
 * liblmcached_cuda.so, built with nvcc where the toolkit is present and
 * loaded by lmcached with dlopen() the first time an engine registers CUDA
 * tensors.  lmcached itself never links the CUDA runtime, so the same
 * binary starts on a machine without a GPU and answers a CUDA registration
 * with the loader's reason.
 *
 * This header is the whole contract: plain C, no CUDA types.  Device
 * addresses travel as uint64_t.  Every function returns 0 or -1 with one
 * line in err (never aborts); none may be called from a host callback. */
#ifndef LMC_KV_CUDA_TRANSFER_H
#define LMC_KV_CUDA_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_blend_plan.h"
#include "kv/kv_plan.h"

/* 4: format NL_X_NB_BS_NH_HS (SGLang unified), whose offsets a library
 * of ABI 3 would not know; 5: the layerwise entries (event_pool,
 * record_pool_event, copy_layers); 6: blend_execute (CacheBlend's
 * retrieve plan on the device); 7: upload and free_device (a cos/sin
 * cache the server divided, docs/cacheblend.md "The GPU path"). */
#define LMC_CUDA_ABI_VERSION 7
#define LMC_CUDA_LIB_NAME "liblmcached_cuda.so"
#define LMC_CUDA_ENTRY "lmc_cuda_transfer_ops"   /* const lmc_cuda_ops *(void) */
#define LMC_CUDA_EVENT_HANDLE_BYTES 64

/* One registered engine worker's copy machinery on one device: a
 * non-default stream (all of its work runs on it, in order), a device
 * staging buffer of one chunk object and a device buffer of block ids. */
typedef struct lmc_cuda_stream lmc_cuda_stream;

/* What one chunk object of one object group is made of: its member
 * kernel groups (geometry, slots per chunk, kept blocks, entry offset) and,
 * per member, the device address of each tensor the group copies
 * (kernel_group.n_tensors of them, element 0 of each). */
typedef struct lmc_cuda_object {
    const lmc_kv_kernel_group *const *groups;
    const uint64_t *const *tensors;
    uint32_t n_groups;
    uint64_t object_size;
} lmc_cuda_object;

/* One staged kernel group of a CacheBlend retrieve plan (plan->groups[g])
 * as blend_execute writes it: its geometry (g), the device address of
 * each of its g->n_tensors tensors, and its rotation: the device address
 * of its cos/sin cache ([cache_rows, rope.rot_dim] of cache_dtype, mscale
 * already stripped; 0 for a group the plan does not rotate) and where K
 * is rotated in a row (kv_rope.h's lmc_kv_rope_geometry). */
typedef struct lmc_cuda_blend_group {
    const lmc_kv_kernel_group *g;
    const uint64_t *tensors;
    uint64_t cos_sin;
    uint64_t cache_rows;
    lmc_kv_rope_dtype cache_dtype;
    lmc_kv_rope_geom rope;
    lmc_kv_rope_dtype k_dtype;    /* K's element type (its size: g->geo.element_size) */
} lmc_cuda_blend_group;

/* One built plan (lmc_kv_blend_plan_build) of one registration, its host
 * tables as built, and where the chunks' objects are: objects[chunk *
 * n_read + read] in host memory, each at least the staging rows' nbytes
 * long (pinned for an asynchronous copy; pageable works, synchronously).
 * max_batch is the plan input's: the device slot pool has max_batch slots
 * of plan->slot_stride bytes. */
typedef struct lmc_cuda_blend {
    const lmc_kv_blend_plan *plan;
    const lmc_cuda_blend_group *groups;   /* plan->n_groups, in the plan's order */
    const uint8_t *const *objects;
    uint32_t n_read;
    uint32_t n_chunks;
    uint32_t max_batch;
} lmc_cuda_blend;

typedef struct lmc_cuda_ops {
    int abi_version;                   /* LMC_CUDA_ABI_VERSION */
    /* Number of visible devices (0 is an error: "no CUDA device"). */
    int (*init)(int *devices, char *err, size_t errlen);
    /* The ordinal of the device whose UUID prints as `uuid` (lowercase
     * 8-4-4-4-12 hex, an optional "GPU-" prefix accepted). */
    int (*device_by_uuid)(const char *uuid, int *device, char *err, size_t errlen);
    /* Opens (or references again) the cudaIpcMemHandle_t of an allocation
     * on `device`; *base is its device address and *size its size as the
     * driver reports it (cuMemGetAddressRange), whatever the client
     * claimed: no tensor may reach past base + size.  close_mem drops one
     * reference; the last one closes the mapping. */
    int (*open_mem)(int device, const uint8_t handle[64], uint64_t *base, uint64_t *size,
                    char *err, size_t errlen);
    void (*close_mem)(int device, uint64_t base);
    /* Page-locks host memory for DMA (the L1 arena, once per process). */
    int (*pin)(void *host, uint64_t bytes, char *err, size_t errlen);
    void (*unpin)(void *host);
    lmc_cuda_stream *(*stream_new)(int device, uint64_t staging_bytes, char *err,
                                   size_t errlen);
    /* Waits for the stream's work, then frees it. */
    void (*stream_free)(lmc_cuda_stream *s);
    /* Makes the stream wait for the engine's interprocess event: 64 bytes
     * (cudaIpcEventHandle_t), or len 0 for none. */
    int (*wait_event)(lmc_cuda_stream *s, const uint8_t *handle, size_t len, char *err,
                      size_t errlen);
    /* Enqueues one chunk object's copy: device blocks -> staging -> host
     * (to_host, a STORE) or host -> staging -> blocks (a RETRIEVE).
     * blocks[i]: member i's kept block ids (groups[i]->keep_blocks of them,
     * each < its nb); skip_blocks[i]: leading ones a RETRIEVE leaves alone
     * (NULL for none).  `host` must stay valid until the stream passes it. */
    int (*copy_object)(lmc_cuda_stream *s, const lmc_cuda_object *obj, void *host,
                       const int64_t *const *blocks, const uint32_t *skip_blocks, bool to_host,
                       char *err, size_t errlen);
    /* Records a fresh interprocess event on the stream and exports its
     * handle (64 bytes); the plugin keeps the event alive until it has
     * completed and a grace period has passed, as a client may import the
     * handle late. */
    int (*record_event)(lmc_cuda_stream *s, uint8_t handle[64], char *err, size_t errlen);
    /* Runs fn(arg) on a CUDA driver thread once everything enqueued so far
     * has completed.  fn must only hand the work on (no CUDA calls). */
    int (*then)(lmc_cuda_stream *s, void (*fn)(void *arg), void *arg, char *err, size_t errlen);
    /* Blocks until the stream is idle. */
    int (*sync)(lmc_cuda_stream *s, char *err, size_t errlen);
    /* Copies `bytes` of device memory at `src` into pageable host memory
     * and returns when they are there: /cache/checksums reads blocks with
     * it, on its own thread and outside any context's stream. */
    int (*read)(int device, uint64_t src, void *host, uint64_t bytes, char *err, size_t errlen);
    /* ---- layerwise RETRIEVE (ABI 5; docs/protocol.md, "Layerwise
     * retrieve") ---- */
    /* Makes the stream's pool of n interprocess events, once, and writes
     * their exported handles (64 bytes each) to handles[0 .. n*64).  A
     * later call with the same n writes the same handles; another n fails. */
    int (*event_pool)(lmc_cuda_stream *s, uint32_t n, uint8_t *handles, char *err,
                      size_t errlen);
    /* Records pool event i on the stream (it completes when everything
     * enqueued before it has). */
    int (*record_pool_event)(lmc_cuda_stream *s, uint32_t i, char *err, size_t errlen);
    /* copy_object's RETRIEVE narrowed to layers [from[i], to[i]) of member
     * i (from[i] == to[i]: none): host -> staging of those layers' K and V
     * rows, then the scatter of those layers. */
    int (*copy_layers)(lmc_cuda_stream *s, const lmc_cuda_object *obj, void *host,
                       const int64_t *const *blocks, const uint32_t *skip_blocks,
                       const uint32_t *from, const uint32_t *to, char *err, size_t errlen);
    /* ---- CacheBlend (ABI 6; docs/cacheblend.md, "CUDA kernels") ---- */
    /* Enqueues plan b->plan on the stream, wave by wave: each staging row
     * host -> a device slot pool, then the rope rows' re-rotation of the
     * staged K, then the scatter rows into the tensors through the plan's
     * slot_map; the pool and the plan's tables live in stream-ordered
     * device memory freed behind the last wave, so b and everything it
     * points to may go when the call returns, except the objects, which
     * must stay until the stream passes them (then/sync).  Every index the
     * kernels read is checked first against the plan's counts, the
     * groups' geometry and the cos/sin caches' rows; a refusal enqueues
     * nothing.  The tensors' extents are the caller's to check (the plan
     * was built against the registration, as for copy_object). */
    int (*blend_execute)(lmc_cuda_stream *s, const lmc_cuda_blend *b, char *err, size_t errlen);
    /* ---- device memory the server owns (ABI 7) ---- */
    /* Allocates `bytes` on `device` and copies `host` there; returns once
     * the bytes are on the device, *dev their address (0 on failure). */
    int (*upload)(int device, const void *host, uint64_t bytes, uint64_t *dev, char *err,
                  size_t errlen);
    /* Frees what upload allocated; the caller has synced every stream that
     * may still read it. */
    void (*free_device)(int device, uint64_t dev);
} lmc_cuda_ops;

#endif
