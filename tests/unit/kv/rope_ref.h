/* The float64 reference of CacheBlend's re-rotation that the kv tests
 * share (test_kv_rope.c, test_kv_blend_plan.c): element codecs
 * independent of kv_rope.c's, a smooth cos/sin cache, and the spec's
 * undo-old / apply-new formulas (docs/cacheblend.md, "The math and its
 * precision", which also gives the tolerance the tests apply). */
#ifndef LMC_TESTS_KV_ROPE_REF_H
#define LMC_TESTS_KV_ROPE_REF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_rope.h"

static inline double dec(lmc_kv_rope_dtype d, const uint8_t *p)
{
    uint16_t h;
    uint32_t u;
    float f;
    if (d == LMC_KV_ROPE_F32) {
        memcpy(&f, p, 4);
        return f;
    }
    memcpy(&h, p, 2);
    if (d == LMC_KV_ROPE_BF16) {
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? (1.0 + m / 1024.0) : m / 1024.0;
    int ex = e ? e - 15 : -14;
    for (; ex > 0; ex--)
        v *= 2;
    for (; ex < 0; ex++)
        v /= 2;
    return (h & 0x8000) ? -v : v;
}

/* Truncating encoder: exact for the stored K values (multiples of 1/64
 * below 2), close enough for cache values (the reference decodes them). */
static inline void enc(lmc_kv_rope_dtype d, uint8_t *p, double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t h;
    if (d == LMC_KV_ROPE_F32) {
        memcpy(p, &f, 4);
        return;
    }
    if (d == LMC_KV_ROPE_BF16) {
        h = (uint16_t)(u >> 16);
    } else {
        uint32_t a = u & 0x7fffffffu;
        h = a < 0x38800000u ? 0 : (uint16_t)(((a >> 23) - 112) << 10 | ((a >> 13) & 1023));
        h |= (uint16_t)((u >> 16) & 0x8000u);
    }
    memcpy(p, &h, 2);
}

/* cos and sin without libm: Taylor series, |a| <= 1. */
static inline void sincos_small(double a, double *s, double *c)
{
    double term = 1, cs = 0, sn = 0;
    for (int k = 0; k < 30; k++) {
        if (k % 2 == 0)
            cs += (k % 4 == 0 ? 1 : -1) * term;
        else
            sn += (k % 4 == 1 ? 1 : -1) * term;
        term *= a / (k + 1);
    }
    *s = sn;
    *c = cs;
}

/* A cache of max_pos rows of rot_dim elements: pair i turns by theta_i
 * in (0, 1] per position.  malloc'd; NULL when out of memory. */
static inline uint8_t *rope_ref_cache(lmc_kv_rope_dtype cd, uint32_t rot_dim, uint32_t max_pos)
{
    uint32_t es = lmc_kv_rope_dtype_size(cd), e = rot_dim / 2;
    uint8_t *data = malloc((size_t)max_pos * rot_dim * es);
    for (uint32_t i = 0; data && i < e; i++) {
        double th = 1.0, sn, cs, c = 1, sv = 0;
        for (uint32_t k = 0; k < 2 * i; k++)   /* theta_i = 3^(-2i/rot_dim)-ish, in (0, 1] */
            th *= 1.0 - 1.0 / rot_dim;
        sincos_small(th, &sn, &cs);
        for (uint32_t p = 0; p < max_pos; p++) {
            enc(cd, data + ((uint64_t)p * rot_dim + i) * es, c);
            enc(cd, data + ((uint64_t)p * rot_dim + e + i) * es, sv);
            double nc = c * cs - sv * sn, ns = sv * cs + c * sn;
            c = nc;
            sv = ns;
        }
    }
    return data;
}

/* The spec's formulas in float64: element r of a K row whose stored
 * values (of type kd) are `row`, moved from old to new under rotation g
 * and the cache `cache` (of type cd); *mag = |x| + |y| of its pair. */
static inline double rope_ref_rotated(const lmc_kv_rope_geom *g, lmc_kv_rope_dtype kd,
                                      lmc_kv_rope_dtype cd, const uint8_t *cache,
                                      const uint8_t *row, uint32_t r, uint64_t old, uint64_t new,
                                      double *mag)
{
    uint32_t es = lmc_kv_rope_dtype_size(kd), ce = lmc_kv_rope_dtype_size(cd), e = g->rot_dim / 2;
    uint32_t base = r / g->head_stride * g->head_stride + g->rot_offset;
    uint32_t j = r - base, i, xi, yi;
    if (g->is_neox) {
        i = j < e ? j : j - e;
        xi = base + i;
        yi = base + i + e;
    } else {
        i = j / 2;
        xi = base + 2 * i;
        yi = xi + 1;
    }
    double x = dec(kd, row + xi * es), y = dec(kd, row + yi * es);
    double co = dec(cd, cache + (old * g->rot_dim + i) * ce);
    double so = dec(cd, cache + (old * g->rot_dim + e + i) * ce);
    double cn = dec(cd, cache + (new * g->rot_dim + i) * ce);
    double sn = dec(cd, cache + (new * g->rot_dim + e + i) * ce);
    double x1 = x * co + y * so, y1 = y * co - x * so;
    *mag = (x < 0 ? -x : x) + (y < 0 ? -y : y);
    return r == xi ? x1 * cn - y1 * sn : y1 * cn + x1 * sn;
}

/* Whether element r of a K row is inside the rotation window. */
static inline bool rope_ref_in_window(const lmc_kv_rope_geom *g, uint32_t r)
{
    uint32_t j = r % g->head_stride;
    return r / g->head_stride < g->n_heads && j >= g->rot_offset &&
           j < g->rot_offset + g->rot_dim;
}

static inline double unit_roundoff(lmc_kv_rope_dtype d)
{
    return d == LMC_KV_ROPE_F32 ? 0x1p-24 : d == LMC_KV_ROPE_BF16 ? 0x1p-8 : 0x1p-11;
}

/* The tolerance of a rotated element whose pair has magnitude mag. */
static inline double rope_ref_tolerance(lmc_kv_rope_dtype kd, double mag)
{
    return (unit_roundoff(kd) + 64 * 0x1p-24) * mag + (kd == LMC_KV_ROPE_F16 ? 0x1p-25 : 0);
}

#endif
