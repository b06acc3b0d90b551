/* The paged KV formats of a vLLM engine's registered tensors, and the
 * address arithmetic of the server-driven copies (docs/protocol.md,
 * "Server-driven KV formats").  The offset functions are `static inline`
 * and free of anything host-only, so that the CPU copy and a CUDA kernel
 * compile the very same formula and the CPU tests check it. */
#ifndef LMC_KV_KV_FORMAT_H
#define LMC_KV_KV_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/shared_tensor.h"

#ifdef __CUDACC__
#define LMC_KV_INLINE __host__ __device__ static inline
#else
#define LMC_KV_INLINE static inline
#endif

/* Symbols: NL layers, NB blocks, BS slots per block, NH heads, HS head
 * size, _X_ a list (one tensor per layer).  Values are ours, not wire. */
typedef enum lmc_kv_format {
    LMC_KV_NB_NL_TWO_BS_NH_HS = 0,   /* cross-layer: one [NB, NL, 2, BS, NH, HS] */
    LMC_KV_NL_X_TWO_NB_BS_NH_HS,     /* FlashAttention, NHD: [2, NB, BS, NH, HS] */
    LMC_KV_NL_X_TWO_NB_NH_BS_HS,     /* FlashAttention, HND: [2, NB, NH, BS, HS] */
    LMC_KV_NL_X_NB_TWO_BS_NH_HS,     /* FlashInfer, NHD: [NB, 2, BS, NH, HS] */
    LMC_KV_NL_X_NB_TWO_NH_BS_HS,     /* FlashInfer, HND: [NB, 2, NH, BS, HS] */
    LMC_KV_NL_X_NB_BS_HS,            /* MLA: [NB, BS, HS], rows may be padded */
    LMC_KV_NL_X_NB_BS_NH_TWO_HS,     /* fused K/V, NHD: [NB, BS, NH, 2*HS] */
    LMC_KV_NL_X_NB_NH_BS_TWO_HS,     /* fused K/V, HND: [NB, NH, BS, 2*HS] */
    LMC_KV_NB_NL_TWO_NH_BS_HS,       /* TRT-LLM cross-layer: one [NB, NL, 2, NH, BS, HS] */
    LMC_KV_TWO_X_NL_X_NB_BS_NH_HS,   /* SGLang: NL K tensors, then NL V tensors,
                                      * each [NB, BS, NH, HS] (registered [NB*BS, NH, HS]) */
    LMC_KV_NL_X_NB_BS_NH_HS,         /* SGLang unified: every K, V or state tensor its own
                                      * single-plane [NB, BS, NH, HS] "layer" */
} lmc_kv_format;

/* Whether one tensor holds every layer (the offsets then take the layer),
 * and whether K and V are separate tensors (tensor kv*nl + layer). */
LMC_KV_INLINE bool lmc_kv_format_cross_layer(lmc_kv_format f)
{
    return f == LMC_KV_NB_NL_TWO_BS_NH_HS || f == LMC_KV_NB_NL_TWO_NH_BS_HS;
}
LMC_KV_INLINE bool lmc_kv_format_kv_lists(lmc_kv_format f)
{
    return f == LMC_KV_TWO_X_NL_X_NB_BS_NH_HS;
}

typedef struct lmc_kv_geometry {
    lmc_kv_format format;
    uint32_t kv_size;          /* 2 (K, V), or 1 (MLA, fused: hs holds K then V) */
    uint32_t nl;               /* layers */
    uint64_t nb;               /* blocks */
    uint32_t bs;               /* slots per block */
    uint32_t nh;               /* heads (1 for MLA) */
    uint32_t hs;               /* elements per head (2 x head size when fused) */
    uint32_t element_size;
    uint64_t block_stride;     /* elements from one block to the next (MLA may pad) */
} lmc_kv_geometry;

const char *lmc_kv_format_name(lmc_kv_format f);

/* Bytes from a tensor's element 0 that the offset formulas below can reach
 * (one past the element at the highest indices), computed with checked
 * arithmetic: false when that does not fit in 63 bits.  The detectors
 * refuse such a geometry, so every offset of one they return fits. */
bool lmc_kv_span_bytes(const lmc_kv_geometry *g, uint64_t *out);

/* Detects the format of a vLLM registration: `n` tensors, one per layer
 * (or one cross-layer tensor), all of one shape, dtype and wrapper; `hnd`
 * the layout hint, forced on a server without a GPU (vLLM's CPU attention
 * stores HND whatever it reports).  0, or -1 with the reason in `err`. */
int lmc_kv_detect_vllm(const lmc_shared_tensor *tensors, size_t n, bool hnd, bool cpu_server,
                       lmc_kv_geometry *out, char *err, size_t errlen);

/* Layout hints the SGLang and TRT-LLM detectors read (0 / NONE: absent). */
typedef enum { LMC_KV_LIST_NONE, LMC_KV_LIST_K_V, LMC_KV_LIST_UNIFIED } lmc_kv_list_layout;
typedef struct lmc_kv_hints {
    int64_t tokens_per_block, num_kv_heads, head_dim;
    lmc_kv_list_layout kv_list_layout;
} lmc_kv_hints;

/* SGLang: K tensors then V tensors [NB*BS, NH, HS] (kv_list_layout "k_v",
 * or older adapters' lists with NH > 1), split into blocks of
 * tokens_per_block; or MLA layers [NB*BS, 1, HS]; kv_list_layout
 * "unified" goes to lmc_kv_detect_unified (no state).  Same contract as
 * the vLLM detector. */
int lmc_kv_detect_sglang(const lmc_shared_tensor *tensors, size_t n, const lmc_kv_hints *h,
                         lmc_kv_geometry *out, char *err, size_t errlen);
/* SGLang's kv_list_layout "unified" (docs/protocol.md, "SGLang unified
 * layout"): `n` tensors of one kernel group, each its own block view:
 * attention [NB, BS, NH, HS], MLA [NB, BS, HS], or, for a group whose
 * EngineGroupInfo says recurrent_state, opaque state [NB, 1, 1, E].  Same
 * contract as the vLLM detector. */
int lmc_kv_detect_unified(const lmc_shared_tensor *tensors, size_t n, bool recurrent,
                          lmc_kv_geometry *out, char *err, size_t errlen);
/* TRT-LLM: one pool, [NB, NL, 2, NH*BS*HS] with the num_kv_heads,
 * tokens_per_block and head_dim hints, or already [NB, NL, 2, NH, BS, HS]. */
int lmc_kv_detect_trtllm(const lmc_shared_tensor *tensors, size_t n, const lmc_kv_hints *h,
                         lmc_kv_geometry *out, char *err, size_t errlen);

/* Element offset, inside layer `layer`'s tensor (per-layer formats; its K
 * or V tensor for K/V lists) or the one cross-layer tensor, of element e
 * of head h of slot s of block b, K (kv 0) or V (kv 1). */
LMC_KV_INLINE uint64_t lmc_kv_paged_offset(const lmc_kv_geometry *g, uint32_t kv, uint32_t layer,
                                           uint64_t b, uint32_t s, uint32_t h, uint32_t e)
{
    uint64_t hs = g->hs, nh = g->nh, bs = g->bs;
    switch (g->format) {
    case LMC_KV_NB_NL_TWO_BS_NH_HS:
        return (((b * g->nl + layer) * 2 + kv) * bs + s) * nh * hs + h * hs + e;
    case LMC_KV_NL_X_TWO_NB_BS_NH_HS:
        return ((kv * g->nb + b) * bs + s) * nh * hs + h * hs + e;
    case LMC_KV_NL_X_TWO_NB_NH_BS_HS:
        return ((kv * g->nb + b) * nh + h) * bs * hs + s * hs + e;
    case LMC_KV_NL_X_NB_TWO_BS_NH_HS:
        return ((b * 2 + kv) * bs + s) * nh * hs + h * hs + e;
    case LMC_KV_NL_X_NB_TWO_NH_BS_HS:
        return ((b * 2 + kv) * nh + h) * bs * hs + s * hs + e;
    case LMC_KV_NL_X_NB_BS_HS:
        return b * g->block_stride + s * hs + e;
    case LMC_KV_NL_X_NB_BS_NH_TWO_HS:
        return (b * bs + s) * nh * hs + h * hs + e;
    case LMC_KV_NL_X_NB_NH_BS_TWO_HS:
        return (b * nh + h) * bs * hs + s * hs + e;
    case LMC_KV_NB_NL_TWO_NH_BS_HS:
        return (((b * g->nl + layer) * 2 + kv) * nh + h) * bs * hs + s * hs + e;
    case LMC_KV_TWO_X_NL_X_NB_BS_NH_HS:
    case LMC_KV_NL_X_NB_BS_NH_HS:
        return (b * bs + s) * nh * hs + h * hs + e;
    }
    return 0;
}

/* Element offset inside one kernel group's entry of an L1 chunk object, a
 * dense [kv_size, nl, slots, nh*hs] tensor (docs/storage.md; the same
 * layout the engine-driven path stores). */
LMC_KV_INLINE uint64_t lmc_kv_object_offset(const lmc_kv_geometry *g, uint32_t slots, uint32_t kv,
                                            uint32_t layer, uint32_t s, uint32_t h, uint32_t e)
{
    uint64_t row = (uint64_t)g->nh * g->hs;
    return (((uint64_t)kv * g->nl + layer) * slots + s) * row + (uint64_t)h * g->hs + e;
}

#endif
