/* The copy plan of a server-driven registration (docs/protocol.md,
 * "Server-driven KV formats" and "Kernel groups and object groups"): the
 * registered tensors partitioned into kernel groups (layers one copy
 * describes with one geometry and one block-id list) and the kernel groups
 * bucketed into object groups (what one L1 chunk object holds).
 *
 * Pure arithmetic over decoded handles and EngineGroupInfos: nothing is
 * mapped here, so the rules are unit-tested without shared memory. */
#ifndef LMC_KV_KV_PLAN_H
#define LMC_KV_KV_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_format.h"
#include "kv/shared_tensor.h"

#define LMC_KV_MAX_KERNEL_GROUPS 32
#define LMC_KV_MAX_OBJECT_GROUPS 8
#define LMC_KV_MAX_LAYERS 4096

/* One EngineGroupInfo of REGISTER_KV_CACHE (docs/protocol.md). */
typedef struct lmc_engine_group_info {
    int64_t engine_group_id;
    const uint32_t *layers;       /* indices into the registered list */
    uint32_t n_layers;
    int64_t tokens_per_block;     /* 0: the tensor's slots per block */
    int64_t sw_size_tokens;       /* -1: full attention */
    int64_t physical_per_engine;  /* physical_blocks_per_engine_block: the client
                                   * sends this many consecutive physical ids
                                   * for each engine (manager) block */
    bool has_null_block;          /* false: null_block_id was None */
    int64_t null_block_id;        /* 0 unless the info names another */
    bool recurrent_state;         /* Mamba/GDN state snapshots, not attention KV */
} lmc_engine_group_info;

typedef enum lmc_engine_type {
    LMC_ENGINE_VLLM,
    LMC_ENGINE_SGLANG,
    LMC_ENGINE_TRTLLM,
} lmc_engine_type;

typedef struct lmc_kv_plan_options {
    lmc_engine_type engine;
    bool hnd;                     /* the kv_layout hint, normalised */
    bool force_hnd;               /* vLLM's CPU attention: HND whatever the hint */
    lmc_kv_hints hints;           /* what the SGLang and TRT-LLM detectors read */
    uint32_t chunk_size;
    bool separate_object_groups;
    bool full_sw_kv;              /* every slot of a window group's chunk is stored
                                   * (CacheBlend writes a chunk at any position) */
    const lmc_engine_group_info *infos;   /* NULL / 0: one group, every layer */
    size_t n_infos;
} lmc_kv_plan_options;

typedef struct lmc_kv_kernel_group {
    lmc_kv_geometry geo;          /* geo.nl = n_layers */
    uint32_t *tensors;            /* owned: the registered tensor behind each base
                                   * pointer the copy uses, in order: one per
                                   * layer ascending, or the one cross-layer tensor */
    uint32_t n_tensors;
    int64_t engine_group_id;
    uint32_t tokens_per_block;    /* logical tokens per block id on the wire
                                   * (per physical id when an engine block
                                   * spans several) */
    uint32_t physical_per_engine; /* physical ids per engine block, >= 1 */
    int64_t sw_size_tokens;       /* -1 full attention */
    uint32_t blocks_per_chunk;    /* block ids per chunk on the wire */
    uint32_t keep_blocks;         /* the last ones a chunk stores (sub-chunk window) */
    uint32_t slots;               /* stored slots per chunk: keep_blocks * bs */
    bool has_null_block;
    bool recurrent_state;         /* state snapshots: an object group of its own
                                   * whose window is the last chunk (in the padding
                                   * before null_block_id: the CUDA library's
                                   * layout of this struct is unchanged) */
    int64_t null_block_id;        /* an engine block id: a physical id is null
                                   * when floor(id / physical_per_engine)
                                   * equals it */
    uint32_t object_group;
    uint64_t entry_offset;        /* bytes into its object group's object */
    uint64_t entry_bytes;         /* kv_size * nl * slots * nh * hs * element_size */
    uint64_t span_bytes;          /* lmc_kv_span_bytes(&geo): how much of each of its
                                   * tensors, from element 0, the copies can reach */
} lmc_kv_kernel_group;

typedef struct lmc_kv_object_group {
    uint32_t members[LMC_KV_MAX_KERNEL_GROUPS];
    uint32_t n_members;
    uint64_t object_size;
    int32_t chunks_in_sw;         /* -1 full attention, else ceil(sw / chunk) */
} lmc_kv_object_group;

typedef struct lmc_kv_plan {
    lmc_kv_kernel_group *kg;      /* owned, n_kg */
    uint32_t n_kg;
    lmc_kv_object_group og[LMC_KV_MAX_OBJECT_GROUPS];
    uint32_t n_og;
    char dtype[24];
    uint32_t element_size;
} lmc_kv_plan;

/* Builds the plan of `n` registered tensors.  0; -1 refused, with the
 * reason in `err`; -2 out of memory. */
int lmc_kv_plan_build(const lmc_shared_tensor *tensors, size_t n, const lmc_kv_plan_options *o,
                      lmc_kv_plan *out, char *err, size_t errlen);
void lmc_kv_plan_free(lmc_kv_plan *p);

/* Engine-block count covering `tokens` of kernel group g, rounded down. */
uint32_t lmc_kv_blocks_for_tokens(const lmc_kv_kernel_group *g, uint64_t tokens);
/* Of a chunk's stored blocks, how many the first `skip_tokens` tokens of
 * that chunk cover (what RETRIEVE must leave untouched). */
uint32_t lmc_kv_skip_blocks(const lmc_kv_kernel_group *g, uint64_t skip_tokens);

/* Parses a kv_layout hint; 0 with *hnd set, -1 (refused) otherwise. */
int lmc_kv_layout_parse(const char *s, size_t len, bool *hnd, char *err, size_t errlen);

#endif
