/* The host-side arithmetic of liblmcached_cuda.so's block copy kernel
 * (cuda_transfer.cu), in plain C so that the CPU unit tests
 * (tests/unit/cuda/test_cuda_launch.c) check exactly what the kernel runs:
 * the by-value parameter block of one launch (one member kernel group of
 * one chunk object), its capacity checks, the copy unit, the launch
 * geometry and the two byte addresses of every copied row.
 *
 * One launch copies one kernel group's entry of one chunk object: grid
 * (kv plane, kept block, layer), threads (copy unit within a head's row,
 * head, slot within the block), each looping when the block's dims are
 * smaller than the heads or slots.  A row is one head of one slot:
 * hs * element_size bytes, contiguous on both sides in every format.  The
 * addresses come from kv_format.h's lmc_kv_paged_offset and
 * lmc_kv_object_offset, the formulas the CPU copy (kv_copy.c) uses.
 *
 * Everything here is `static inline`; the row helpers are also
 * `__host__ __device__` under nvcc, like kv_format.h's. */
#ifndef LMC_CUDA_CUDA_LAUNCH_H
#define LMC_CUDA_CUDA_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kv/kv_format.h"
#include "kv/kv_plan.h"

#ifdef __CUDACC__
#define LMC_CUDA_INLINE __host__ __device__ static inline
#else
#define LMC_CUDA_INLINE static inline
#endif

/* Kernel parameters may take 32764 bytes since CUDA 12.1 (Volta and
 * newer); the block ids and tensor addresses travel in them, so that the
 * caller may free its arrays as soon as the launch is enqueued and no
 * host-to-device copy (nor a synchronization) is needed per launch. */
#define LMC_CUDA_PARAM_LIMIT 32764
#define LMC_CUDA_MAX_BLOCKS 1024      /* kept block ids of one member group */
#define LMC_CUDA_MAX_TENSORS 2944     /* tensor addresses of one member group */
#define LMC_CUDA_THREADS 512          /* threads per CUDA block, at most */
#define LMC_CUDA_MAX_UNIT 16          /* bytes: one uint4 */
#define LMC_CUDA_MAX_GRID_YZ 65535u   /* gridDim.y and gridDim.z limits */

/* One launch: kept blocks first_block .. keep_blocks-1 of one member
 * kernel group, every kv plane, its layers (or a layerwise batch's). */
typedef struct lmc_cuda_copy_params {
    lmc_kv_geometry geo;
    uint64_t entry;            /* address of the group's entry in the staging buffer */
    uint32_t slots;            /* the entry's slots per chunk (keep_blocks * bs) */
    uint32_t keep_blocks;      /* kept block ids in blocks[] */
    uint32_t first_block;      /* skip_blocks: the leading ones left alone */
    uint32_t n_tensors;        /* tensors[] used */
    uint32_t unit;             /* bytes per copy unit: 16, 8, 4, 2 or 1 */
    uint32_t units_per_row;    /* hs * element_size / unit */
    uint32_t to_staging;       /* 1: blocks -> staging (STORE); 0: the reverse */
    uint32_t first_layer;      /* layers first_layer .. first_layer+n_layers-1 */
    uint32_t n_layers;         /* (all of them unless a layerwise RETRIEVE narrows it) */
    uint32_t reserved;
    uint64_t tensors[LMC_CUDA_MAX_TENSORS];   /* element 0 of each tensor */
    int64_t blocks[LMC_CUDA_MAX_BLOCKS];
} lmc_cuda_copy_params;

#ifdef __cplusplus
static_assert(sizeof(lmc_cuda_copy_params) <= LMC_CUDA_PARAM_LIMIT,
              "kernel parameters exceed CUDA's 32764 bytes");
#else
_Static_assert(sizeof(lmc_cuda_copy_params) <= LMC_CUDA_PARAM_LIMIT,
               "kernel parameters exceed CUDA's 32764 bytes");
#endif

typedef struct lmc_cuda_dims {
    uint32_t grid[3];          /* kv planes, kept blocks copied, layers */
    uint32_t block[3];         /* units of a row, heads, slots */
} lmc_cuda_dims;

/* How many tensor addresses a group's formulas use: the one cross-layer
 * tensor, K tensors then V tensors for K/V lists, else one per layer. */
LMC_CUDA_INLINE uint32_t lmc_cuda_tensors_needed(const lmc_kv_geometry *g)
{
    if (lmc_kv_format_cross_layer(g->format))
        return 1;
    return lmc_kv_format_kv_lists(g->format) ? g->kv_size * g->nl : g->nl;
}

/* The tensor holding (kv, layer), and the layer the offset formula takes
 * (0 for per-layer tensors: the layer is in the choice of tensor). */
LMC_CUDA_INLINE uint32_t lmc_cuda_tensor_index(const lmc_kv_geometry *g, uint32_t kv,
                                               uint32_t layer)
{
    if (lmc_kv_format_cross_layer(g->format))
        return 0;
    return lmc_kv_format_kv_lists(g->format) ? kv * g->nl + layer : layer;
}
LMC_CUDA_INLINE uint32_t lmc_cuda_formula_layer(const lmc_kv_geometry *g, uint32_t layer)
{
    return lmc_kv_format_cross_layer(g->format) ? layer : 0;
}

/* The widest unit (16, 8, 4, 2 or 1 bytes) dividing a row's byte size and
 * every address bit pattern in `addr_bits` (the OR of the row starts'
 * possible offsets), so that each unit access is naturally aligned. */
LMC_CUDA_INLINE uint32_t lmc_cuda_copy_unit(uint64_t row_bytes, uint64_t addr_bits)
{
    uint64_t bits = row_bytes | addr_bits;
    uint32_t u = LMC_CUDA_MAX_UNIT;
    while (u > 1 && (bits & (u - 1)) != 0)
        u >>= 1;
    return u;
}

/* Grid (kv_size, keep_blocks - first_block, n_layers); block (tx, ty, tz) with
 * tx = min(units per row, 32), ty = min(heads, THREADS / tx),
 * tz = min(slots per block, THREADS / (tx * ty)).  A grid with a zero
 * dimension means nothing to launch. */
LMC_CUDA_INLINE lmc_cuda_dims lmc_cuda_launch_dims(const lmc_cuda_copy_params *p)
{
    lmc_cuda_dims d;
    uint32_t tx = p->units_per_row < 32 ? p->units_per_row : 32;
    if (tx == 0)
        tx = 1;
    uint32_t ty = LMC_CUDA_THREADS / tx;
    if (ty > p->geo.nh)
        ty = p->geo.nh;
    if (ty == 0)
        ty = 1;
    uint32_t tz = LMC_CUDA_THREADS / (tx * ty);
    if (tz > p->geo.bs)
        tz = p->geo.bs;
    if (tz == 0)
        tz = 1;
    d.grid[0] = p->geo.kv_size;
    d.grid[1] = p->keep_blocks > p->first_block ? p->keep_blocks - p->first_block : 0;
    d.grid[2] = p->n_layers;
    d.block[0] = tx;
    d.block[1] = ty;
    d.block[2] = tz;
    return d;
}

/* Byte address, in the engine's tensor, of head h of slot s of kept block
 * j of (kv, layer). */
LMC_CUDA_INLINE uint64_t lmc_cuda_engine_row(const lmc_cuda_copy_params *p, uint32_t kv,
                                             uint32_t layer, uint32_t j, uint32_t s, uint32_t h)
{
    const lmc_kv_geometry *g = &p->geo;
    return p->tensors[lmc_cuda_tensor_index(g, kv, layer)] +
           lmc_kv_paged_offset(g, kv, lmc_cuda_formula_layer(g, layer), (uint64_t)p->blocks[j],
                               s, h, 0) * g->element_size;
}

/* Byte address, in the staging buffer, of the same row: object slot
 * j * bs + s of the group's dense [kv_size, nl, slots, nh * hs] entry. */
LMC_CUDA_INLINE uint64_t lmc_cuda_staging_row(const lmc_cuda_copy_params *p, uint32_t kv,
                                              uint32_t layer, uint32_t j, uint32_t s, uint32_t h)
{
    const lmc_kv_geometry *g = &p->geo;
    return p->entry + lmc_kv_object_offset(g, p->slots, kv, layer, j * g->bs + s, h, 0) *
                          g->element_size;
}

/* Fills `p` for one member group of one chunk object: `tensors` its
 * g->n_tensors addresses, `blocks` its g->keep_blocks kept ids,
 * `skip_blocks` the leading ones left alone (clamped to keep_blocks),
 * `entry` the staging address of its entry.  0, or -1 with the reason in
 * err when the group does not fit the parameter block or its geometry
 * cannot be launched.  Host only. */
static inline int lmc_cuda_params_pack(lmc_cuda_copy_params *p, const lmc_kv_kernel_group *g,
                                       const uint64_t *tensors, const int64_t *blocks,
                                       uint32_t skip_blocks, uint64_t entry, bool to_staging,
                                       char *err, size_t errlen)
{
    const lmc_kv_geometry *geo = &g->geo;
    uint32_t need = lmc_cuda_tensors_needed(geo);
    if (geo->kv_size < 1 || geo->kv_size > 2 || geo->nl < 1 || geo->bs < 1 || geo->nh < 1 ||
        geo->hs < 1 || geo->element_size < 1 || geo->nb < 1) {
        snprintf(err, errlen, "kernel group geometry kv_size %u nl %u bs %u nh %u hs %u "
                 "element size %u nb %llu cannot be copied", geo->kv_size, geo->nl, geo->bs,
                 geo->nh, geo->hs, geo->element_size, (unsigned long long)geo->nb);
        return -1;
    }
    if (geo->nl > LMC_CUDA_MAX_GRID_YZ) {
        snprintf(err, errlen, "kernel group of %u layers: at most %u per launch", geo->nl,
                 LMC_CUDA_MAX_GRID_YZ);
        return -1;
    }
    if (g->keep_blocks > LMC_CUDA_MAX_BLOCKS) {
        snprintf(err, errlen, "kernel group keeps %u blocks per chunk: the CUDA copy takes at "
                 "most %u", g->keep_blocks, LMC_CUDA_MAX_BLOCKS);
        return -1;
    }
    if (need > LMC_CUDA_MAX_TENSORS) {
        snprintf(err, errlen, "kernel group copies %u tensors: the CUDA copy takes at most %u",
                 need, LMC_CUDA_MAX_TENSORS);
        return -1;
    }
    if (g->n_tensors < need) {
        snprintf(err, errlen, "kernel group has %u tensors, its format needs %u", g->n_tensors,
                 need);
        return -1;
    }
    if ((uint64_t)g->slots != (uint64_t)g->keep_blocks * geo->bs) {
        snprintf(err, errlen, "kernel group stores %u slots per chunk, not %u blocks of %u",
                 g->slots, g->keep_blocks, geo->bs);
        return -1;
    }
    uint64_t row = (uint64_t)geo->hs * geo->element_size;
    uint64_t bits = entry;
    if (geo->format == LMC_KV_NL_X_NB_BS_HS)      /* the only padded block stride */
        bits |= geo->block_stride * geo->element_size;
    for (uint32_t i = 0; i < g->keep_blocks; i++) {
        if (blocks[i] < 0 || (uint64_t)blocks[i] >= geo->nb) {
            snprintf(err, errlen, "block id %lld is outside the tensor's %llu blocks",
                     (long long)blocks[i], (unsigned long long)geo->nb);
            return -1;
        }
        p->blocks[i] = blocks[i];
    }
    for (uint32_t i = 0; i < need; i++) {
        p->tensors[i] = tensors[i];
        bits |= tensors[i];
    }
    p->geo = *geo;
    p->entry = entry;
    p->slots = g->slots;
    p->keep_blocks = g->keep_blocks;
    p->first_block = skip_blocks < g->keep_blocks ? skip_blocks : g->keep_blocks;
    p->n_tensors = need;
    p->unit = lmc_cuda_copy_unit(row, bits);
    p->units_per_row = (uint32_t)(row / p->unit);
    p->to_staging = to_staging ? 1 : 0;
    p->first_layer = 0;
    p->n_layers = geo->nl;
    p->reserved = 0;
    if ((uint64_t)p->units_per_row * p->unit != row) {
        snprintf(err, errlen, "a head's row of %llu bytes is too long",
                 (unsigned long long)row);
        return -1;
    }
    return 0;
}

/* Narrows a packed launch to layers [from, to) of its group (a layerwise
 * RETRIEVE's batch, docs/protocol.md "Layerwise retrieve"); to is clamped
 * to the group's layers.  0, or -1 with the reason for an empty range. */
static inline int lmc_cuda_params_layers(lmc_cuda_copy_params *p, uint32_t from, uint32_t to,
                                         char *err, size_t errlen)
{
    if (to > p->geo.nl)
        to = p->geo.nl;
    if (from >= to) {
        snprintf(err, errlen, "layers [%u, %u) of a group of %u: nothing to copy", from, to,
                 p->geo.nl);
        return -1;
    }
    p->first_layer = from;
    p->n_layers = to - from;
    return 0;
}

#endif
