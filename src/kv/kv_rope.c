#include "kv/kv_rope.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"

static int refuse(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

double lmc_kv_rope_cache_mscale(const lmc_kv_rope_cache *c)
{
    uint64_t n = c->max_position * c->rot_dim, half = c->rot_dim / 2;
    double sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        double v = lmc_kv_rope_load(c->dtype, c->data, i);
        sum += v * v;
    }
    /* n / 2 (cos, sin) pairs; sqrt by Newton steps, free of libm */
    double mean = sum / (double)(c->max_position * half), m = mean > 1 ? mean : 1;
    for (int k = 0; k < 64 && mean > 0; k++)
        m = 0.5 * (m + mean / m);
    return mean > 0 ? m : 0;
}

int lmc_kv_rope_cache_normalize(lmc_kv_rope_cache *c, void **owned, char *err, size_t errlen)
{
    *owned = NULL;
    double m = lmc_kv_rope_cache_mscale(c);
    if (m == 0)
        return refuse(err, errlen, "cos_sin_cache: every value is zero");
    if (m - 1 < LMC_KV_ROPE_MSCALE_TOLERANCE && 1 - m < LMC_KV_ROPE_MSCALE_TOLERANCE)
        return 0;
    uint64_t n = c->max_position * c->rot_dim;
    void *copy = malloc((size_t)(n * lmc_kv_rope_dtype_size(c->dtype)));
    if (!copy)
        return refuse(err, errlen, "out of memory"), -2;
    for (uint64_t i = 0; i < n; i++)
        lmc_kv_rope_store(c->dtype, copy, i, lmc_kv_rope_load(c->dtype, c->data, i) / (float)m);
    c->data = copy;
    *owned = copy;
    return 0;
}

int lmc_kv_rope_cache_init(lmc_kv_rope_cache *out, const void *data, uint64_t bytes,
                           lmc_kv_rope_dtype dtype, uint64_t rows, uint64_t cols, char *err,
                           size_t errlen)
{
    uint64_t need;
    if (dtype > LMC_KV_ROPE_F32)
        return refuse(err, errlen, "cos_sin_cache: unsupported dtype");
    if (cols == 0 || cols % 2 || cols > UINT32_MAX)
        return refuse(err, errlen, "cos_sin_cache: rot_dim %llu is not an even width",
                      (unsigned long long)cols);
    if (rows == 0 || !lmc_mul_u64(rows, cols, &need) ||
        !lmc_mul_u64(need, lmc_kv_rope_dtype_size(dtype), &need) || need != bytes || !data)
        return refuse(err, errlen,
                      "cos_sin_cache: %llu bytes do not hold [%llu, %llu] elements",
                      (unsigned long long)bytes, (unsigned long long)rows,
                      (unsigned long long)cols);
    *out = (lmc_kv_rope_cache){data, rows, (uint32_t)cols, dtype};
    return 0;
}

/* A window at offset > 0 is one latent row ([content | rope], MLA). */
static int latent_geometry(const lmc_kv_geometry *g, uint64_t hidden, uint32_t off, uint32_t w,
                           uint32_t cache_rot_dim, lmc_kv_rope_geom *out, char *err,
                           size_t errlen)
{
    if (g->kv_size != 1 || (uint64_t)off + w != hidden)
        return refuse(err, errlen,
                      "group_rot: window [%u, +%u) must end a single-plane row of %llu", off,
                      w, (unsigned long long)hidden);
    if (cache_rot_dim != w)
        return refuse(err, errlen, "group_rot: window width %u differs from the cache's %u", w,
                      cache_rot_dim);
    out->n_heads = 1;
    out->head_stride = (uint32_t)hidden;
    out->rot_offset = off;
    return 0;
}

int lmc_kv_rope_geometry(const lmc_kv_geometry *g, uint32_t head_size, bool is_neox,
                         bool has_window, uint32_t win_offset, uint32_t win_width,
                         uint32_t cache_rot_dim, lmc_kv_rope_geom *out, char *err, size_t errlen)
{
    uint64_t hidden = (uint64_t)g->nh * g->hs;
    if (g->kv_size != 1 && g->kv_size != 2)
        return refuse(err, errlen, "kv_size %u is neither 1 nor 2", g->kv_size);
    if (cache_rot_dim == 0 || cache_rot_dim % 2)
        return refuse(err, errlen, "cos_sin_cache: rot_dim %u is not an even width",
                      cache_rot_dim);
    if (hidden > UINT32_MAX)
        return refuse(err, errlen, "row of %llu elements", (unsigned long long)hidden);
    *out = (lmc_kv_rope_geom){.rot_dim = cache_rot_dim, .is_neox = is_neox};
    if (has_window && win_width == 0)
        return refuse(err, errlen, "group_rot: width 0");
    if (has_window && win_offset > 0)
        return latent_geometry(g, hidden, win_offset, win_width, cache_rot_dim, out, err,
                               errlen);
    bool fused = (g->format == LMC_KV_NL_X_NB_BS_NH_TWO_HS ||
                  g->format == LMC_KV_NL_X_NB_NH_BS_TWO_HS) &&
                 (uint64_t)g->hs == 2ull * head_size;
    uint64_t per_head = (uint64_t)head_size * (fused ? 2 : 1);
    if (head_size == 0 || hidden % per_head)
        return refuse(err, errlen, "head_size %u does not divide the row of %llu elements%s",
                      head_size, (unsigned long long)hidden, fused ? " (fused K/V)" : "");
    if (has_window && win_width > head_size)
        return refuse(err, errlen, "group_rot: a window of %u elements passes the head of %u "
                      "(the row's rotation window)", win_width, head_size);
    if (cache_rot_dim > head_size || (has_window && cache_rot_dim > win_width))
        return refuse(err, errlen, "cos_sin_cache: rot_dim %u exceeds head_size %u",
                      cache_rot_dim, has_window ? win_width : head_size);
    out->n_heads = (uint32_t)(hidden / per_head);
    out->head_stride = (uint32_t)per_head;
    return 0;
}

/* The group's sizes recomputed here, not trusted: what the tensors and an
 * entry must hold, and how many tensors the formulas index. */
static int check_sizes(const lmc_kv_rope_target *t, char *err, size_t errlen)
{
    const lmc_kv_kernel_group *k = t->g;
    const lmc_kv_geometry *g = &k->geo;
    uint64_t span, entry, f[] = {g->kv_size, g->nl, k->slots, g->nh, g->hs, g->element_size};
    uint64_t need = lmc_kv_format_cross_layer(g->format)  ? 1
                    : lmc_kv_format_kv_lists(g->format) ? 2ull * g->nl
                                                        : g->nl;
    if (!lmc_kv_span_bytes(g, &span) || t->tensor_bytes < span)
        return refuse(err, errlen, "tensors of %llu bytes, the group reaches %llu",
                      (unsigned long long)t->tensor_bytes, (unsigned long long)span);
    if (!lmc_product_u64(f, 6, &entry) || entry != k->entry_bytes)
        return refuse(err, errlen, "kernel group: entry of %llu bytes, not [%u, %u, %u, %u x %u]",
                      (unsigned long long)k->entry_bytes, g->kv_size, g->nl, k->slots, g->nh,
                      g->hs);
    if (k->n_tensors < need || !t->bases)
        return refuse(err, errlen, "kernel group: %u tensors, its format uses %llu",
                      k->n_tensors, (unsigned long long)need);
    return 0;
}

/* The rotation against the group's row and the cache (none: not rotated). */
static int check_rope(const lmc_kv_rope_target *t, char *err, size_t errlen)
{
    const lmc_kv_geometry *g = &t->g->geo;
    if (!t->cache)
        return 0;
    const lmc_kv_rope_geom *r = t->rope;
    uint64_t heads = r ? (uint64_t)r->n_heads * r->head_stride : 0;
    if (!r || heads != (uint64_t)g->nh * g->hs || r->rot_dim == 0 || r->rot_dim % 2 ||
        (uint64_t)r->rot_offset + r->rot_dim > r->head_stride)
        return refuse(err, errlen, "rope geometry does not fit the group's row of %u x %u",
                      g->nh, g->hs);
    if (r->rot_dim != t->cache->rot_dim)
        return refuse(err, errlen, "rope rot_dim %u, cos_sin_cache rot_dim %u", r->rot_dim,
                      t->cache->rot_dim);
    return 0;
}

/* The checks that apply to the group as a whole. */
static int check_target(const lmc_kv_rope_target *t, char *err, size_t errlen)
{
    const lmc_kv_kernel_group *k = t->g;
    const lmc_kv_geometry *g = &k->geo;
    if (g->kv_size != 1 && g->kv_size != 2)
        return refuse(err, errlen, "kv_size %u is neither 1 nor 2", g->kv_size);
    if (g->bs == 0 || k->tokens_per_block != g->bs)
        return refuse(err, errlen, "kernel group: %u tokens per block of %u slots (compressed)",
                      k->tokens_per_block, g->bs);
    if (g->element_size != lmc_kv_rope_dtype_size(t->k_dtype))
        return refuse(err, errlen, "K dtype of %u bytes on a group of %u-byte elements",
                      lmc_kv_rope_dtype_size(t->k_dtype), g->element_size);
    return check_sizes(t, err, errlen) != 0 ? -1 : check_rope(t, err, errlen);
}

/* A match: its entry, the blocks its tokens land in, the cache rows its
 * slots' positions read (all slots are rotated, docs/cacheblend.md). */
static int check_match(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m, size_t i,
                       char *err, size_t errlen)
{
    const lmc_kv_kernel_group *k = t->g;
    uint64_t end, last_old, last_new;
    if (!m->entry || m->entry_bytes != k->entry_bytes)
        return refuse(err, errlen, "match %zu: entry of %llu bytes, the group's is %llu", i,
                      (unsigned long long)m->entry_bytes, (unsigned long long)k->entry_bytes);
    if (m->n_tok > k->slots)
        return refuse(err, errlen, "match %zu: %u tokens from a chunk of %u slots", i, m->n_tok,
                      k->slots);
    if (!lmc_add_u64(m->cur_st, m->n_tok, &end))
        return refuse(err, errlen, "match %zu: cur_st overflows", i);
    for (uint64_t j = m->cur_st / k->geo.bs; m->n_tok && j <= (end - 1) / k->geo.bs; j++) {
        if (j >= t->n_blocks)
            return refuse(err, errlen, "match %zu: position %llu past the %llu-block table", i,
                          (unsigned long long)(end - 1), (unsigned long long)t->n_blocks);
        if (t->blocks[j] < 0 || (uint64_t)t->blocks[j] >= k->geo.nb)
            return refuse(err, errlen, "match %zu: block id %lld outside [0, %llu)", i,
                          (long long)t->blocks[j], (unsigned long long)k->geo.nb);
    }
    if (!t->cache || m->old_st == m->cur_st || m->n_tok == 0)
        return 0;
    if (!lmc_add_u64(m->old_st, k->slots, &last_old) ||
        !lmc_add_u64(m->cur_st, k->slots, &last_new) || last_old > t->cache->max_position ||
        last_new > t->cache->max_position)
        return refuse(err, errlen,
                      "match %zu: positions %llu/%llu + %u past cos_sin_cache's %llu rows", i,
                      (unsigned long long)m->old_st, (unsigned long long)m->cur_st, k->slots,
                      (unsigned long long)t->cache->max_position);
    return 0;
}

/* Per token, the cos and sin of its rotation by cur - old. */
static void delta_table(const lmc_kv_rope_cache *c, const lmc_kv_rope_match *m, float *cd,
                        float *sd)
{
    uint32_t e = c->rot_dim / 2;
    for (uint32_t t = 0; t < m->n_tok; t++)
        for (uint32_t i = 0; i < e; i++)
            lmc_kv_rope_delta_at(c->dtype, c->data, c->rot_dim, m->old_st + t, m->cur_st + t,
                                 i, &cd[(size_t)t * e + i], &sd[(size_t)t * e + i]);
}

/* Pairs from..rot_dim/2-1 of every head of one K row, read from `in` and
 * written rotated to `out` (the same row, or its slot); one loop per
 * element type. */
#define ROTATE_ROW(NAME, TYPE, LOAD, STORE)                                                     \
    static void NAME(void *out, const void *in, const lmc_kv_rope_geom *r, const float *cd,   \
                     const float *sd, uint32_t from)                                           \
    {                                                                                          \
        TYPE *p = out;                                                                         \
        const TYPE *q = in;                                                                    \
        for (uint32_t h = 0; h < r->n_heads; h++)                                              \
            for (uint32_t i = from; i < r->rot_dim / 2; i++) {                                 \
                uint32_t x, y;                                                                 \
                float xo, yo;                                                                  \
                lmc_kv_rope_pair(r, h, i, &x, &y);                                             \
                lmc_kv_rope_apply(LOAD(q[x]), LOAD(q[y]), cd[i], sd[i], &xo, &yo);             \
                p[x] = STORE(xo);                                                              \
                p[y] = STORE(yo);                                                              \
            }                                                                                  \
    }
#define SAME(v) (v)
ROTATE_ROW(rotate_f32, float, SAME, SAME)
ROTATE_ROW(rotate_f16, uint16_t, lmc_kv_rope_f16_float, lmc_kv_rope_float_f16)
ROTATE_ROW(rotate_bf16, uint16_t, lmc_kv_rope_bf16_float, lmc_kv_rope_float_bf16)

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

/* Eight pairs at a time with AVX2 and F16C: the same products and sums in
 * the same order as lmc_kv_rope_apply (no fused multiply-add), and the
 * same round-to-nearest-even conversions, so both paths give one result. */
#define VEC __attribute__((target("avx2,f16c")))

VEC static inline __m256 vload(lmc_kv_rope_dtype d, const uint8_t *p)
{
    if (d == LMC_KV_ROPE_F32)
        return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (d == LMC_KV_ROPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* nt: p is 16-byte aligned, store past the cache (see put_span). */
VEC static inline void vstore(lmc_kv_rope_dtype d, uint8_t *p, __m256 v, bool nt)
{
    if (d == LMC_KV_ROPE_F32 && nt) {
        _mm_stream_ps((float *)p, _mm256_castps256_ps128(v));
        _mm_stream_ps((float *)p + 4, _mm256_extractf128_ps(v, 1));
        return;
    }
    if (d == LMC_KV_ROPE_F32) {
        _mm256_storeu_ps((float *)p, v);
        return;
    }
    __m128i h;
    if (d == LMC_KV_ROPE_F16) {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
        __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
        __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        r = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16),
                               _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
        h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    }
    if (nt)
        _mm_stream_si128((__m128i *)p, h);
    else
        _mm_storeu_si128((__m128i *)p, h);
}

/* NeoX: a head's x run and y run, eight pairs a step. */
VEC static inline __attribute__((always_inline)) uint32_t
rotate_neox_body(lmc_kv_rope_dtype d, uint8_t *out, const uint8_t *in, const lmc_kv_rope_geom *r,
                 const float *cd, const float *sd, bool stream)
{
    uint32_t es = lmc_kv_rope_dtype_size(d), n = r->rot_dim / 2 / 8 * 8;
    for (uint32_t h = 0; h < r->n_heads; h++) {
        uint32_t x0, y0;
        lmc_kv_rope_pair(r, h, 0, &x0, &y0);
        /* a step is 16 or 32 bytes: aligned at the start, aligned throughout */
        bool nt = stream && (((uintptr_t)(out + (size_t)x0 * es) |
                              (uintptr_t)(out + (size_t)y0 * es)) & 15) == 0;
        for (uint32_t i = 0; i < n; i += 8) {
            size_t ox = (size_t)(x0 + i) * es, oy = (size_t)(y0 + i) * es;
            __m256 x = vload(d, in + ox), y = vload(d, in + oy);
            __m256 c = _mm256_loadu_ps(cd + i), s = _mm256_loadu_ps(sd + i);
            vstore(d, out + ox, _mm256_sub_ps(_mm256_mul_ps(x, c), _mm256_mul_ps(y, s)), nt);
            vstore(d, out + oy, _mm256_add_ps(_mm256_mul_ps(y, c), _mm256_mul_ps(x, s)), nt);
        }
    }
    return n;
}

/* One copy of the loop per element type, so that no conversion choice is
 * left inside it. */
VEC static uint32_t rotate_neox_vec(lmc_kv_rope_dtype d, uint8_t *out, const uint8_t *in,
                                    const lmc_kv_rope_geom *r, const float *cd, const float *sd,
                                    bool stream)
{
    if (d == LMC_KV_ROPE_BF16)
        return rotate_neox_body(LMC_KV_ROPE_BF16, out, in, r, cd, sd, stream);
    if (d == LMC_KV_ROPE_F16)
        return rotate_neox_body(LMC_KV_ROPE_F16, out, in, r, cd, sd, stream);
    return rotate_neox_body(LMC_KV_ROPE_F32, out, in, r, cd, sd, stream);
}

/* GPT-J: four adjacent pairs a step; x' = x c + y (-s), y' = y c + x s. */
VEC static uint32_t rotate_gptj_vec(lmc_kv_rope_dtype d, uint8_t *out, const uint8_t *in,
                                    const lmc_kv_rope_geom *r, const float *cd, const float *sd)
{
    uint32_t es = lmc_kv_rope_dtype_size(d), n = r->rot_dim / 2 / 4 * 4;
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256 sign = _mm256_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1);
    for (uint32_t h = 0; h < r->n_heads; h++) {
        uint32_t x0, y0;
        lmc_kv_rope_pair(r, h, 0, &x0, &y0);
        for (uint32_t i = 0; i < n; i += 4) {
            size_t o = (size_t)(x0 + 2 * i) * es;
            __m256 v = vload(d, in + o), sw = _mm256_permute_ps(v, 0xB1);
            __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cd + i)), dup);
            __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sd + i)), dup);
            __m256 ys = _mm256_mul_ps(sw, _mm256_mul_ps(s, sign));
            vstore(d, out + o, _mm256_add_ps(_mm256_mul_ps(v, c), ys), false);
        }
    }
    return n;
}

/* A run written past the cache when dst is 16-byte aligned and n a
 * multiple of 16: the scattered KV is not read back here, and a store
 * that skips the cache need not read the line first (see put_span). */
static void copy_run(bool vec, uint8_t *dst, const uint8_t *src, uint64_t n)
{
    if (!vec || n % 16 || ((uintptr_t)dst & 15)) {
        memcpy(dst, src, (size_t)n);
        return;
    }
    for (uint64_t i = 0; i < n; i += 16)
        _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
}

/* Makes the streaming stores visible before the caller hands the tensors
 * on. */
static void stream_fence(void)
{
    _mm_sfence();
}

/* F16C from CPUID leaf 1 itself: clang before 15 does not know the
 * "f16c" name of __builtin_cpu_supports. */
static bool have_vec(void)
{
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return f16c && __builtin_cpu_supports("avx2");
}
#else
static bool have_vec(void)
{
    return false;
}

static void copy_run(bool vec, uint8_t *dst, const uint8_t *src, uint64_t n)
{
    (void)vec;
    memcpy(dst, src, (size_t)n);
}

static void stream_fence(void)
{
}
#endif

/* The vector path for the leading pairs where it runs, the scalar loop
 * for the rest. */
static void rotate_row(lmc_kv_rope_dtype d, bool vec, uint8_t *out, const uint8_t *in,
                       const lmc_kv_rope_geom *r, const float *cd, const float *sd,
                       bool stream)
{
    uint32_t from = 0;
#if defined(__x86_64__)
    if (vec)
        from = r->is_neox ? rotate_neox_vec(d, out, in, r, cd, sd, stream)
                          : rotate_gptj_vec(d, out, in, r, cd, sd);
#else
    (void)vec;
    (void)stream;
#endif
    if (from == r->rot_dim / 2)
        return;
    if (d == LMC_KV_ROPE_F32)
        rotate_f32(out, in, r, cd, sd, from);
    else if (d == LMC_KV_ROPE_BF16)
        rotate_bf16(out, in, r, cd, sd, from);
    else
        rotate_f16(out, in, r, cd, sd, from);
}

typedef struct scatter_state {
    const lmc_kv_rope_target *t;
    bool contiguous;      /* a slot's heads lie in one run in the paged tensor */
    bool vec;             /* AVX2 and F16C available */
    bool whole;           /* the rotation covers every element of a K row */
    bool by_head;         /* whole, head-strided slot, rotation heads = the format's:
                           * each head rotated straight into place (put_span) */
    lmc_kv_rope_geom one; /* the rotation of one head, for by_head */
    uint8_t *scratch;     /* one row, for rotating into a head-strided slot */
    float *cd, *sd;       /* delta_table's output */
} scatter_state;

/* Token `tok` of plane kv, layer l of match m, to its slot: a slot that
 * is one run (copies streamed; rotations not, which measured slower
 * there), or a K row rotated through the scratch row and placed head by
 * head. */
static void put_token(const scatter_state *st, const lmc_kv_rope_match *m, uint32_t kv,
                      uint32_t l, uint32_t tok, bool rotate)
{
    const lmc_kv_kernel_group *k = st->t->g;
    const lmc_kv_geometry *g = &k->geo;
    uint64_t es = g->element_size, hs_bytes = (uint64_t)g->hs * es;
    const uint8_t *src = m->entry + lmc_kv_object_offset(g, k->slots, kv, l, tok, 0, 0) * es;
    int64_t b = 0;
    uint32_t s = 0;
    lmc_kv_rope_slot(st->t->blocks, st->t->n_blocks, g->bs, m->cur_st + tok, &b, &s);
    uint8_t *tensor = st->t->bases[lmc_kv_rope_tensor(g, kv, l)];
    uint8_t *dst = tensor + lmc_kv_rope_dst_offset(g, kv, l, (uint64_t)b, s, 0) * es;
    uint8_t *row = st->contiguous ? dst : st->scratch;
    const uint8_t *from = src;   /* the row to place head by head */
    if (rotate) {
        bool whole = st->whole;   /* then every element is written rotated */
        size_t e = st->t->rope->rot_dim / 2;
        if (!whole)
            memcpy(row, src, (size_t)(g->nh * hs_bytes));
        rotate_row(st->t->k_dtype, st->vec, row, whole ? src : row, st->t->rope,
                   st->cd + tok * e, st->sd + tok * e, false);
        from = row;
    } else if (st->contiguous) {
        copy_run(st->vec, dst, src, g->nh * hs_bytes);
    }
    if (st->contiguous)
        return;
    for (uint32_t h = 0; h < g->nh; h++)
        memcpy(tensor + lmc_kv_rope_dst_offset(g, kv, l, (uint64_t)b, s, h) * es,
               from + h * hs_bytes, (size_t)hs_bytes);
}

/* Tokens tok0..tok0+n-1 of plane kv, layer l of match m, all in one
 * block, to a head-strided slot layout (HND), with streaming stores
 * (docs/cacheblend.md, "How the CPU path writes").  Copies go head by
 * head, each head's slots one run in order; rotations token by token,
 * which measured faster: a token's cos/sin row stays at hand for all its
 * heads.  Offsets are linear in slot and head within a block. */
static void put_span(const scatter_state *st, const lmc_kv_rope_match *m, uint32_t kv,
                     uint32_t l, uint32_t tok0, uint32_t n, bool rotate)
{
    const lmc_kv_kernel_group *k = st->t->g;
    const lmc_kv_geometry *g = &k->geo;
    uint64_t es = g->element_size, hs_bytes = (uint64_t)g->hs * es;
    uint64_t row_bytes = (uint64_t)g->nh * hs_bytes;
    int64_t b = 0;
    uint32_t s = 0;
    lmc_kv_rope_slot(st->t->blocks, st->t->n_blocks, g->bs, m->cur_st + tok0, &b, &s);
    uint64_t at = lmc_kv_rope_dst_offset(g, kv, l, (uint64_t)b, 0, 0);
    uint64_t slot_step = (lmc_kv_rope_dst_offset(g, kv, l, (uint64_t)b, 1, 0) - at) * es;
    uint64_t head_step = (lmc_kv_rope_dst_offset(g, kv, l, (uint64_t)b, 0, 1) - at) * es;
    uint8_t *dst = st->t->bases[lmc_kv_rope_tensor(g, kv, l)] + at * es + s * slot_step;
    const uint8_t *src = m->entry + lmc_kv_object_offset(g, k->slots, kv, l, tok0, 0, 0) * es;
    size_t e = st->one.rot_dim / 2;
    for (uint32_t i = 0; rotate && i < n; i++)
        for (uint32_t h = 0; h < g->nh; h++)
            rotate_row(st->t->k_dtype, st->vec, dst + i * slot_step + h * head_step,
                       src + i * row_bytes + h * hs_bytes, &st->one,
                       st->cd + (tok0 + i) * e, st->sd + (tok0 + i) * e, true);
    for (uint32_t h = 0; !rotate && h < g->nh; h++)
        for (uint32_t i = 0; i < n; i++)
            copy_run(st->vec, dst + i * slot_step + h * head_step,
                     src + i * row_bytes + h * hs_bytes, hs_bytes);
}

static void scatter_match(scatter_state *st, const lmc_kv_rope_match *m)
{
    const lmc_kv_geometry *g = &st->t->g->geo;
    bool rotate = st->t->cache && m->old_st != m->cur_st;
    if (rotate)
        delta_table(st->t->cache, m, st->cd, st->sd);
    for (uint32_t kv = 0; kv < g->kv_size; kv++)
        for (uint32_t l = 0; l < g->nl; l++) {
            bool rot = rotate && kv == 0;
            if (st->contiguous || (rot && !st->by_head)) {
                for (uint32_t tok = 0; tok < m->n_tok; tok++)
                    put_token(st, m, kv, l, tok, rot);
                continue;
            }
            for (uint32_t tok = 0, n; tok < m->n_tok; tok += n) {
                uint32_t s = (uint32_t)((m->cur_st + tok) % g->bs);
                n = g->bs - s < m->n_tok - tok ? g->bs - s : m->n_tok - tok;
                put_span(st, m, kv, l, tok, n, rot);
            }
        }
}

int lmc_kv_rope_check(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m, size_t n,
                      char *err, size_t errlen)
{
    if (!t || !t->g || (n && !m))
        return refuse(err, errlen, "no kernel group or matches");
    if (check_target(t, err, errlen) != 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (check_match(t, &m[i], i, err, errlen) != 0)
            return -1;
    return 0;
}

int lmc_kv_rope_rotate_entry(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m,
                             char *err, size_t errlen)
{
    if (!t->cache || m->old_st == m->cur_st)
        return 0;
    const lmc_kv_kernel_group *k = t->g;
    const lmc_kv_geometry *g = &k->geo;
    lmc_kv_rope_match all = *m;
    all.n_tok = k->slots;
    size_t e = t->cache->rot_dim / 2, pairs = (size_t)k->slots * e;
    float *cd = malloc(pairs * sizeof(float) + 1), *sd = malloc(pairs * sizeof(float) + 1);
    if (!cd || !sd) {
        free(cd);
        free(sd);
        return refuse(err, errlen, "out of memory"), -2;
    }
    delta_table(t->cache, &all, cd, sd);
    bool vec = have_vec();
    uint8_t *entry = (uint8_t *)m->entry;   /* the caller's staging slot, writable */
    for (uint64_t r = 0; r < (uint64_t)g->nl * k->slots; r++) {
        uint32_t l, tok;
        lmc_kv_rope_entry_row(k->slots, r, &l, &tok);
        uint8_t *row = entry + lmc_kv_object_offset(g, k->slots, 0, l, tok, 0, 0) *
                                   g->element_size;
        rotate_row(t->k_dtype, vec, row, row, t->rope, cd + tok * e, sd + tok * e, false);
    }
    free(cd);
    free(sd);
    return 0;
}

int lmc_kv_rope_scatter(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m, size_t n,
                        char *err, size_t errlen)
{
    if (lmc_kv_rope_check(t, m, n, err, errlen) != 0)
        return -1;
    const lmc_kv_geometry *g = &t->g->geo;
    scatter_state st = {.t = t, .vec = have_vec()};
    st.contiguous = g->nh == 1 || lmc_kv_paged_offset(g, 0, 0, 0, 0, 1, 0) ==
                                      lmc_kv_paged_offset(g, 0, 0, 0, 0, 0, 0) + g->hs;
    st.whole = t->rope && (uint64_t)t->rope->n_heads * t->rope->rot_dim == (uint64_t)g->nh * g->hs;
    if (st.whole && !st.contiguous && t->rope->head_stride == g->hs) {
        st.by_head = true;
        st.one = *t->rope;
        st.one.n_heads = 1;
    }
    size_t pairs = t->cache ? (size_t)t->g->slots * (t->cache->rot_dim / 2) : 0;
    st.scratch = malloc((size_t)g->nh * g->hs * g->element_size);
    st.cd = malloc(pairs * sizeof(float) + 1);
    st.sd = malloc(pairs * sizeof(float) + 1);
    int rc = st.scratch && st.cd && st.sd ? 0 : -2;
    if (rc == -2)
        refuse(err, errlen, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++)
        scatter_match(&st, &m[i]);
    stream_fence();
    free(st.scratch);
    free(st.cd);
    free(st.sd);
    return rc;
}
