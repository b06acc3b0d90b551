/* CacheBlend's re-rotation of stored K and its per-token scatter into an
 * engine's paged KV (docs/cacheblend.md).  A stored chunk's K was
 * rotated at the positions it was computed at; reused at another position
 * it is rotated by the position delta, V copied as it is, and each token
 * written to the slot the block table names for its new position (reused
 * tokens need not start on a block boundary).
 *
 * The index arithmetic (which elements form a rotation pair, where a
 * position's cos/sin sit in the cache, which paged slot a position maps
 * to, the rotation itself, the element conversions) is `static inline`
 * and `__host__ __device__` under nvcc, like kv_format.h's offsets, so that
 * the CPU implementation (kv_rope.c) and the CUDA kernels (cuda_blend.cu,
 * docs/cacheblend.md "CUDA kernels") compile the very same formulas and
 * the CPU tests check them. */
#ifndef LMC_KV_KV_ROPE_H
#define LMC_KV_KV_ROPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kv/kv_format.h"
#include "kv/kv_plan.h"

/* Element types a K plane or a cos/sin cache may have. */
typedef enum lmc_kv_rope_dtype {
    LMC_KV_ROPE_F16,
    LMC_KV_ROPE_BF16,
    LMC_KV_ROPE_F32,
} lmc_kv_rope_dtype;

LMC_KV_INLINE uint32_t lmc_kv_rope_dtype_size(lmc_kv_rope_dtype d)
{
    return d == LMC_KV_ROPE_F32 ? 4u : 2u;
}

/* Element conversions, rounding to nearest even (docs/cacheblend.md,
 * "The math and its precision"); bit patterns move through memcpy, which
 * nvcc compiles in device code too. */
LMC_KV_INLINE float lmc_kv_rope_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
LMC_KV_INLINE uint32_t lmc_kv_rope_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

LMC_KV_INLINE float lmc_kv_rope_f16_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float f = (float)m * 0x1p-24f;   /* zero or subnormal, exact */
        return s ? -f : f;
    }
    return lmc_kv_rope_bits_float(e == 31 ? (s | 0x7f800000u | (m << 13))
                                          : (s | ((e + 112) << 23) | (m << 13)));
}

LMC_KV_INLINE uint16_t lmc_kv_rope_float_f16(float f)
{
    uint32_t u = lmc_kv_rope_float_bits(f), a = u & 0x7fffffffu;
    uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u)
        return s | 0x7e00u;              /* NaN */
    if (a >= 0x477ff000u)
        return s | 0x7c00u;              /* 65520 and above round to infinity */
    if (a < 0x38800000u) {               /* below 2^-14: a subnormal half */
        float v = lmc_kv_rope_bits_float(a);
        float r = (v * 0x1p24f + 0x1p23f) - 0x1p23f;   /* round to an integer, exact */
        return s | (uint16_t)r;
    }
    a += 0xfffu + ((a >> 13) & 1u);
    return s | (uint16_t)((a - 0x38000000u) >> 13);
}

LMC_KV_INLINE float lmc_kv_rope_bf16_float(uint16_t b)
{
    return lmc_kv_rope_bits_float((uint32_t)b << 16);
}

LMC_KV_INLINE uint16_t lmc_kv_rope_float_bf16(float f)
{
    uint32_t u = lmc_kv_rope_float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element i of an array of type d, as float32 (exact), and stored back
 * rounded to d. */
LMC_KV_INLINE float lmc_kv_rope_load(lmc_kv_rope_dtype d, const void *base, uint64_t i)
{
    uint16_t h;
    float f;
    if (d == LMC_KV_ROPE_F32) {
        memcpy(&f, (const uint8_t *)base + i * 4, 4);
        return f;
    }
    memcpy(&h, (const uint8_t *)base + i * 2, 2);
    return d == LMC_KV_ROPE_BF16 ? lmc_kv_rope_bf16_float(h) : lmc_kv_rope_f16_float(h);
}

LMC_KV_INLINE void lmc_kv_rope_store(lmc_kv_rope_dtype d, void *base, uint64_t i, float f)
{
    if (d == LMC_KV_ROPE_F32) {
        memcpy((uint8_t *)base + i * 4, &f, 4);
        return;
    }
    uint16_t h = d == LMC_KV_ROPE_BF16 ? lmc_kv_rope_float_bf16(f) : lmc_kv_rope_float_f16(f);
    memcpy((uint8_t *)base + i * 2, &h, 2);
}

/* A registered cos/sin cache: `max_position` rows of `rot_dim` elements,
 * row p = cos of pairs 0..rot_dim/2-1 at position p, then their sin. */
typedef struct lmc_kv_rope_cache {
    const void *data;
    uint64_t max_position;
    uint32_t rot_dim;
    lmc_kv_rope_dtype dtype;
} lmc_kv_rope_cache;

/* Where K is rotated inside one token's K row of a kernel group: n_heads
 * heads head_stride elements apart; in each, rot_dim elements from
 * rot_offset, paired NeoX style (i, i + rot_dim/2) or GPT-J style
 * (2i, 2i + 1). */
typedef struct lmc_kv_rope_geom {
    uint32_t n_heads;
    uint32_t head_stride;
    uint32_t rot_offset;
    uint32_t rot_dim;
    bool is_neox;
} lmc_kv_rope_geom;

/* Row elements of rotation pair i of head h. */
LMC_KV_INLINE void lmc_kv_rope_pair(const lmc_kv_rope_geom *r, uint32_t h, uint32_t i,
                                    uint32_t *x, uint32_t *y)
{
    uint32_t base = h * r->head_stride + r->rot_offset;
    if (r->is_neox) {
        *x = base + i;
        *y = base + i + r->rot_dim / 2;
    } else {
        *x = base + 2 * i;
        *y = base + 2 * i + 1;
    }
}

/* Cache elements of pair i's cos and sin at position pos. */
LMC_KV_INLINE uint64_t lmc_kv_rope_cos_index(uint32_t rot_dim, uint64_t pos, uint32_t i)
{
    return pos * rot_dim + i;
}
LMC_KV_INLINE uint64_t lmc_kv_rope_sin_index(uint32_t rot_dim, uint64_t pos, uint32_t i)
{
    return pos * rot_dim + rot_dim / 2 + i;
}

/* Undoing the rotation at the old position and applying the new one is
 * one rotation by their difference: its cos and sin from the two rows. */
LMC_KV_INLINE void lmc_kv_rope_delta(float cos_old, float sin_old, float cos_new, float sin_new,
                                     float *cos_d, float *sin_d)
{
    *cos_d = cos_new * cos_old + sin_new * sin_old;
    *sin_d = sin_new * cos_old - cos_new * sin_old;
}

/* The rotation of pair i from position o to position n, read from a
 * cos/sin cache of rot_dim columns and type d. */
LMC_KV_INLINE void lmc_kv_rope_delta_at(lmc_kv_rope_dtype d, const void *cache, uint32_t rot_dim,
                                        uint64_t o, uint64_t n, uint32_t i, float *cos_d,
                                        float *sin_d)
{
    lmc_kv_rope_delta(lmc_kv_rope_load(d, cache, lmc_kv_rope_cos_index(rot_dim, o, i)),
                      lmc_kv_rope_load(d, cache, lmc_kv_rope_sin_index(rot_dim, o, i)),
                      lmc_kv_rope_load(d, cache, lmc_kv_rope_cos_index(rot_dim, n, i)),
                      lmc_kv_rope_load(d, cache, lmc_kv_rope_sin_index(rot_dim, n, i)), cos_d,
                      sin_d);
}

LMC_KV_INLINE void lmc_kv_rope_apply(float x, float y, float cos_d, float sin_d, float *x_out,
                                     float *y_out)
{
    *x_out = x * cos_d - y * sin_d;
    *y_out = y * cos_d + x * sin_d;
}

/* The paged block and slot in it of request position pos, through a block
 * table of n_blocks ids of bs slots each; false past the table. */
LMC_KV_INLINE bool lmc_kv_rope_slot(const int64_t *table, uint64_t n_blocks, uint32_t bs,
                                    uint64_t pos, int64_t *block, uint32_t *slot)
{
    uint64_t j = pos / bs;
    if (j >= n_blocks)
        return false;
    *block = table[j];
    *slot = (uint32_t)(pos % bs);
    return true;
}

/* The same position as one paged slot index, block * bs + slot (the
 * retrieve plan's slot_map), and back; false past the table. */
LMC_KV_INLINE bool lmc_kv_rope_slot_index(const int64_t *table, uint64_t n_blocks, uint32_t bs,
                                          uint64_t pos, int64_t *index)
{
    int64_t b;
    uint32_t s;
    if (!lmc_kv_rope_slot(table, n_blocks, bs, pos, &b, &s))
        return false;
    *index = b * (int64_t)bs + (int64_t)s;
    return true;
}
LMC_KV_INLINE void lmc_kv_rope_slot_split(int64_t index, uint32_t bs, int64_t *block,
                                          uint32_t *slot)
{
    *block = index / (int64_t)bs;
    *slot = (uint32_t)(index % (int64_t)bs);
}

/* Row `row` of a staged entry's K plane, rows taken layer by layer: its
 * layer and slot; the slot's position is the chunk's start plus it. */
LMC_KV_INLINE void lmc_kv_rope_entry_row(uint32_t slots, uint64_t row, uint32_t *layer,
                                         uint32_t *slot)
{
    *layer = (uint32_t)(row / slots);
    *slot = (uint32_t)(row % slots);
}

/* The registered tensor holding plane kv of layer l: the one cross-layer
 * tensor, K tensors then V tensors, or one per layer. */
LMC_KV_INLINE uint32_t lmc_kv_rope_tensor(const lmc_kv_geometry *g, uint32_t kv, uint32_t l)
{
    if (lmc_kv_format_cross_layer(g->format))
        return 0;
    return lmc_kv_format_kv_lists(g->format) ? kv * g->nl + l : l;
}

/* Element offset, in that tensor, of element 0 of head h of paged slot
 * (b, s) of plane kv of layer l (the layer enters the formula only in a
 * cross-layer tensor). */
LMC_KV_INLINE uint64_t lmc_kv_rope_dst_offset(const lmc_kv_geometry *g, uint32_t kv, uint32_t l,
                                              uint64_t b, uint32_t s, uint32_t h)
{
    return lmc_kv_paged_offset(g, kv, lmc_kv_format_cross_layer(g->format) ? l : 0, b, s, h, 0);
}

/* Checks a cos/sin cache of `bytes` bytes as [rows, cols] of `dtype` and
 * fills *out.  0, or -1 with the reason in err. */
int lmc_kv_rope_cache_init(lmc_kv_rope_cache *out, const void *data, uint64_t bytes,
                           lmc_kv_rope_dtype dtype, uint64_t rows, uint64_t cols, char *err,
                           size_t errlen);

/* YaRN and longrope bake a magnitude m into the cache (cos^2 + sin^2 =
 * m^2); re-rotation must be a pure rotation (docs/cacheblend.md,
 * "The cos/sin cache").  The mscale is sqrt of the mean of cos^2 + sin^2
 * over every row and pair (0 for an all-zero cache). */
#define LMC_KV_ROPE_MSCALE_TOLERANCE 1e-3
double lmc_kv_rope_cache_mscale(const lmc_kv_rope_cache *c);
/* When |m - 1| >= LMC_KV_ROPE_MSCALE_TOLERANCE, replaces c->data by a copy
 * divided by m in float32 and rounded back to the cache's type, and hands
 * the copy's ownership to *owned (free() it after the last use); else
 * leaves c alone, *owned NULL.  0; -1 refused (all zero); -2 out of memory. */
int lmc_kv_rope_cache_normalize(lmc_kv_rope_cache *c, void **owned, char *err, size_t errlen);

/* The rotation geometry of a kernel group (docs/cacheblend.md,
 * "Geometry"): head_size and style from CB_REGISTER_ROPE, the group's
 * declared window (has_window false: rotate from offset 0 of each head),
 * and the width of the cache the group uses.  0, or -1 with the reason. */
int lmc_kv_rope_geometry(const lmc_kv_geometry *g, uint32_t head_size, bool is_neox,
                         bool has_window, uint32_t win_offset, uint32_t win_width,
                         uint32_t cache_rot_dim, lmc_kv_rope_geom *out, char *err,
                         size_t errlen);

/* One reused chunk: the kernel group's entry of its stored object
 * ([kv_size, nl, slots, nh*hs], docs/storage.md), stored at old_st, its
 * first n_tok slots written at cur_st.. of the request. */
typedef struct lmc_kv_rope_match {
    const uint8_t *entry;
    uint64_t entry_bytes;
    uint64_t old_st;
    uint64_t cur_st;
    uint32_t n_tok;
} lmc_kv_rope_match;

/* Where the matches go: one kernel group's registered tensors (each
 * tensor_bytes long), its block table (physical ids of geo.bs slots), and
 * the rotation (cache NULL: a NoPE model or a group not rotated). */
typedef struct lmc_kv_rope_target {
    const lmc_kv_kernel_group *g;
    uint8_t *const *bases;
    uint64_t tensor_bytes;
    const int64_t *blocks;
    uint64_t n_blocks;
    const lmc_kv_rope_cache *cache;
    const lmc_kv_rope_geom *rope;
    lmc_kv_rope_dtype k_dtype;
} lmc_kv_rope_target;

/* Re-rotates (when old_st != cur_st) and scatters every match.  Every
 * match is checked before anything is written: 0; -1 refused, with the
 * reason in err and the tensors untouched; -2 out of memory (untouched). */
int lmc_kv_rope_scatter(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m, size_t n,
                        char *err, size_t errlen);

/* The checks lmc_kv_rope_scatter makes, alone: for a caller that stages,
 * rotates and scatters in separate steps (docs/cacheblend.md, "Retrieve
 * plan and CPU executor") and must refuse before its first write.  0, or
 * -1 with the reason in err. */
int lmc_kv_rope_check(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m, size_t n,
                      char *err, size_t errlen);

/* Re-rotates, in place, the K plane of every one of the group's slots of
 * m->entry from old_st + t to cur_st + t (the rope step of a staged
 * chunk; all slots, as the spec's kernel does).  Nothing to do when
 * t->cache is NULL or old_st == cur_st.  m must have passed
 * lmc_kv_rope_check on t.  0, or -2 out of memory (entry untouched). */
int lmc_kv_rope_rotate_entry(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m,
                             char *err, size_t errlen);

#endif
