/* CacheBlend's retrieve plan and its CPU executor (docs/cacheblend.md,
 * "Retrieve plan and CPU executor").  The plan is pure integer work over
 * a registration's kernel/object groups, the matched chunks of one
 * CB_RETRIEVE_PRE_COMPUTED call and the request's block tables: the
 * positions the chunks land at, each staged group's paged slot of every
 * position, and per wave the staging, rope and scatter rows.  Its tables
 * are flat int64-sized rows in memory the caller hands in, so that the
 * CPU executor here and a device executor read the same rows. */
#ifndef LMC_KV_KV_BLEND_PLAN_H
#define LMC_KV_KV_BLEND_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_plan.h"
#include "kv/kv_rope.h"

#define LMC_KV_BLEND_SLOT_ALIGN 256u

/* One matched chunk: stored at old_st.., written at cur_st..cur_ed-1 of
 * the new prompt (cur_ed - cur_st <= the chunk's slots). */
typedef struct lmc_kv_blend_chunk {
    uint64_t old_st;
    uint64_t cur_st;
    uint64_t cur_ed;
} lmc_kv_blend_chunk;

typedef struct lmc_kv_blend_input {
    const lmc_kv_plan *kv;            /* the registration's groups */
    const uint32_t *read_ogs;         /* object groups read, ascending (blend: {0}) */
    uint32_t n_read;
    const lmc_kv_blend_chunk *chunks; /* sorted by cur_st, not overlapping */
    uint32_t n_chunks;
    const int64_t *const *blocks;     /* per kernel group of kv: the request's block ids */
    const uint64_t *n_blocks;
    const bool *rope_on;              /* per kernel group; NULL: none rotated (NoPE) */
    uint32_t max_batch;               /* staging slots, >= 2 */
} lmc_kv_blend_input;

/* staging: one per (chunk, read object group), chunk-major.  The bytes of
 * read object group `read` of chunk `chunk` go to dst_offset of the slot
 * pool (slot * slot_stride + the group's offset in a slot). */
typedef struct lmc_kv_blend_staging {
    int64_t chunk, read, slot, dst_offset, nbytes;
} lmc_kv_blend_staging;

/* ropes: per shifted chunk, one per staged group with rope on. */
typedef struct lmc_kv_blend_rope {
    int64_t group, slot, old_st, cur_st;
} lmc_kv_blend_rope;

/* scatters: per chunk, one per staged group: the slot's first n_tok
 * tokens to the paged slots of pos[token_offset ..]. */
typedef struct lmc_kv_blend_scatter {
    int64_t group, slot, token_offset, n_tok;
} lmc_kv_blend_scatter;

/* Cumulative ends of wave w's rows in the three tables. */
typedef struct lmc_kv_blend_step {
    int64_t staging_end, ropes_end, scatters_end;
} lmc_kv_blend_step;

typedef struct lmc_kv_blend_plan {
    uint32_t n_groups;                /* staged kernel groups */
    uint32_t groups[LMC_KV_MAX_KERNEL_GROUPS];   /* their kernel group indices */
    uint64_t read_offset[LMC_KV_MAX_OBJECT_GROUPS]; /* read group r's bytes in a slot */
    uint64_t group_offset[LMC_KV_MAX_KERNEL_GROUPS]; /* staged group g's entry in a slot */
    uint64_t slot_stride;             /* round_up(sum of read object sizes, 256) */
    uint32_t wave;                    /* max_batch / 2 */
    uint64_t n_pos, n_staging, n_ropes, n_scatters, n_waves;
    int64_t *pos;                     /* n_pos */
    int64_t *slot_map;                /* n_groups rows of n_pos: row g = staged group g */
    lmc_kv_blend_staging *staging;
    lmc_kv_blend_rope *ropes;
    lmc_kv_blend_scatter *scatters;
    lmc_kv_blend_step *steps;         /* n_waves */
} lmc_kv_blend_plan;

/* Checks the input and counts the rows: *bytes the memory
 * lmc_kv_blend_plan_build needs.  0, or -1 refused with the reason in err
 * (nothing to plan from such an input, docs/cacheblend.md says which
 * reply the handler then gives). */
int lmc_kv_blend_plan_size(const lmc_kv_blend_input *in, uint64_t *bytes, char *err,
                           size_t errlen);

/* Lays the plan out in `mem` (at least the size's bytes, 8-byte aligned;
 * none for an empty plan, whose tables stay NULL); *out's tables point
 * into it.  0, or -1 refused (as _size). */
int lmc_kv_blend_plan_build(const lmc_kv_blend_input *in, void *mem, uint64_t mem_bytes,
                            lmc_kv_blend_plan *out, char *err, size_t errlen);

/* Where a kernel group's chunks go: its registered tensors and rotation
 * (cache NULL exactly where in->rope_on is false). */
typedef struct lmc_kv_blend_group_io {
    uint8_t *const *bases;
    uint64_t tensor_bytes;
    const lmc_kv_rope_cache *cache;
    const lmc_kv_rope_geom *rope;
    lmc_kv_rope_dtype k_dtype;
} lmc_kv_blend_group_io;

/* Runs plan p (built from in) wave by wave: stage each chunk's objects
 * (objects[chunk * n_read + read], each its object group's size) into the
 * slot pool, re-rotate the shifted chunks' K there, scatter every chunk's
 * tokens.  io is indexed by kernel group.  Everything is checked before
 * the first write: 0; -1 refused (pool and tensors untouched); -2 out of
 * memory (earlier waves may have been written: the retrieve failed). */
int lmc_kv_blend_execute(const lmc_kv_blend_input *in, const lmc_kv_blend_plan *p,
                         const uint8_t *const *objects, const lmc_kv_blend_group_io *io,
                         uint8_t *pool, uint64_t pool_bytes, char *err, size_t errlen);

#endif
