/* CacheBlend's re-rotation and per-token scatter (kv/kv_rope.h,
 * docs/cacheblend.md).  Each case fills the paged tensors with a
 * sentinel, scatters a few matches (shifted, partial, unshifted) through a
 * block table in scattered order, and checks every element of every
 * tensor: K elements inside the rotation window against a float64
 * computation of the spec's undo-old / apply-new formulas on the stored
 * values, every other element of the named slots byte-identical to the
 * stored chunk, and every other byte still the sentinel.
 *
 * Tolerance (docs/cacheblend.md, "The math and its precision"): the
 * result is rounded once to the K type after a float32 computation, so
 *   |got - ref| <= (u_K + 64 u_f32) (|x| + |y|) + m_K
 * with u the unit roundoff (2^-11 fp16, 2^-8 bf16, 2^-24 fp32), x, y the
 * stored pair and m_K half the smallest subnormal of fp16 (0 otherwise). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_rope.h"
#include "rope_ref.h"

enum { SENTINEL = 0xA5, MAX_POS = 128, MAX_TENSORS = 8, NL = 2 };

/* ---- the fixture: one kernel group, its tensors, a block table ---- */

typedef struct spec {
    lmc_kv_format format;
    uint32_t kv_size, nb, bs, nh, hs, slots;
    lmc_kv_rope_dtype kd, cd;
    uint32_t head_size, rot_dim;
    bool neox, window;
    uint32_t win_off, win_w;
    bool nope;
} spec;

typedef struct fixture {
    spec sp;
    lmc_kv_kernel_group g;
    uint8_t *tensors[MAX_TENSORS];
    uint8_t *marks[MAX_TENSORS];   /* per element: 0 untouched, 1 exact, 2 rotated */
    double *ref[MAX_TENSORS];
    double *mag[MAX_TENSORS];      /* |x| + |y| of a rotated element's pair */
    uint64_t span;
    int64_t table[32];
    uint8_t *cache_data;
    lmc_kv_rope_cache cache;
    lmc_kv_rope_geom rope;
    lmc_kv_rope_target t;
    uint8_t *entries[3];
    lmc_kv_rope_match m[3];
    size_t n;
} fixture;

static uint32_t n_tensors(const lmc_kv_geometry *g)
{
    if (lmc_kv_format_cross_layer(g->format))
        return 1;
    return lmc_kv_format_kv_lists(g->format) ? 2 * g->nl : g->nl;
}

static void make_cache(fixture *f)
{
    const spec *s = &f->sp;
    uint64_t bytes = (uint64_t)MAX_POS * s->rot_dim * lmc_kv_rope_dtype_size(s->cd);
    f->cache_data = rope_ref_cache(s->cd, s->rot_dim, MAX_POS);
    char err[256];
    assert_int_equal(lmc_kv_rope_cache_init(&f->cache, f->cache_data, bytes, s->cd, MAX_POS,
                                            s->rot_dim, err, sizeof err),
                     0);
}

static void make_entry(fixture *f, int i, uint64_t old_st, uint64_t cur_st, uint32_t n_tok)
{
    uint32_t es = f->g.geo.element_size;
    uint64_t elems = f->g.entry_bytes / es;
    f->entries[i] = malloc(f->g.entry_bytes);
    for (uint64_t k = 0; k < elems; k++)   /* multiples of 1/64 in (-2, 2): exact in every type */
        enc(f->sp.kd, f->entries[i] + k * es, (double)((int)((k * 37 + i * 11) % 255) - 127) / 64);
    f->m[i] = (lmc_kv_rope_match){f->entries[i], f->g.entry_bytes, old_st, cur_st, n_tok};
}

static void setup(fixture *f, const spec *s)
{
    memset(f, 0, sizeof *f);
    f->sp = *s;
    lmc_kv_geometry *g = &f->g.geo;
    *g = (lmc_kv_geometry){s->format, s->kv_size, NL, s->nb, s->bs, s->nh, s->hs,
                           lmc_kv_rope_dtype_size(s->kd), (uint64_t)s->bs * s->hs};
    f->g.n_tensors = n_tensors(g);
    f->g.tokens_per_block = s->bs;
    f->g.slots = s->slots;
    f->g.entry_bytes = (uint64_t)s->kv_size * NL * s->slots * s->nh * s->hs * g->element_size;
    assert_true(lmc_kv_span_bytes(g, &f->span));
    f->g.span_bytes = f->span;
    for (uint32_t i = 0; i < f->g.n_tensors; i++) {
        f->tensors[i] = malloc(f->span);
        memset(f->tensors[i], SENTINEL, f->span);
        f->marks[i] = calloc(f->span / g->element_size, 1);
        f->ref[i] = calloc(f->span / g->element_size, sizeof(double));
        f->mag[i] = calloc(f->span / g->element_size, sizeof(double));
    }
    for (int j = 0; j < 32; j++)   /* scattered: a long-running engine's free list */
        f->table[j] = (j * 7 + 3) % s->nb;
    char err[256];
    if (!s->nope) {
        make_cache(f);
        assert_int_equal(lmc_kv_rope_geometry(g, s->head_size, s->neox, s->window, s->win_off,
                                              s->win_w, s->rot_dim, &f->rope, err, sizeof err),
                         0);
    }
    f->t = (lmc_kv_rope_target){&f->g, f->tensors, f->span, f->table, 32,
                                s->nope ? NULL : &f->cache, s->nope ? NULL : &f->rope, s->kd};
    /* shifted and not block-aligned; shifted, partial; unshifted */
    make_entry(f, 0, 2 * s->slots, 3, s->slots);
    make_entry(f, 1, 0, 5 * s->bs, s->slots - 5);
    make_entry(f, 2, 4 * s->slots, 4 * s->slots, s->slots);
    f->n = 3;
}

static void teardown(fixture *f)
{
    for (uint32_t i = 0; i < f->g.n_tensors; i++) {
        free(f->tensors[i]);
        free(f->marks[i]);
        free(f->ref[i]);
        free(f->mag[i]);
    }
    for (int i = 0; i < 3; i++)
        free(f->entries[i]);
    free(f->cache_data);
}

static double reference(const fixture *f, const uint8_t *row, uint32_t r, uint64_t old,
                        uint64_t new, double *mag)
{
    return rope_ref_rotated(&f->rope, f->sp.kd, f->sp.cd, f->cache_data, row, r, old, new, mag);
}

static bool in_window(const fixture *f, uint32_t r)
{
    return rope_ref_in_window(&f->rope, r);
}

/* Marks what match m should have written, with the test's own slot and
 * tensor arithmetic. */
static void expect_match(fixture *f, const lmc_kv_rope_match *m)
{
    const lmc_kv_geometry *g = &f->g.geo;
    uint32_t es = g->element_size;
    bool shifted = !f->sp.nope && m->old_st != m->cur_st;
    for (uint32_t kv = 0; kv < g->kv_size; kv++)
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t t = 0; t < m->n_tok; t++) {
                uint64_t pos = m->cur_st + t, b = (uint64_t)f->table[pos / g->bs];
                uint32_t ti = lmc_kv_format_cross_layer(g->format) ? 0
                              : lmc_kv_format_kv_lists(g->format) ? kv * NL + l : l;
                uint32_t layer = lmc_kv_format_cross_layer(g->format) ? l : 0;
                const uint8_t *row =
                    m->entry + ((((uint64_t)kv * NL + l) * f->g.slots + t) * g->nh * g->hs) * es;
                for (uint32_t h = 0; h < g->nh; h++)
                    for (uint32_t e = 0; e < g->hs; e++) {
                        uint64_t o = lmc_kv_paged_offset(g, kv, layer, b, pos % g->bs, h, e);
                        uint32_t r = h * g->hs + e;
                        if (shifted && kv == 0 && in_window(f, r)) {
                            f->marks[ti][o] = 2;
                            f->ref[ti][o] =
                                reference(f, row, r, m->old_st + t, pos, &f->mag[ti][o]);
                        } else {
                            f->marks[ti][o] = 1;
                            memcpy(&f->ref[ti][o], row + (uint64_t)r * es, es);
                        }
                    }
            }
}

/* Every element of every tensor against the marks. */
static uint64_t check_all(const fixture *f)
{
    const lmc_kv_geometry *g = &f->g.geo;
    uint32_t es = g->element_size;
    uint8_t sentinel[4];
    memset(sentinel, SENTINEL, sizeof sentinel);
    double u = unit_roundoff(f->sp.kd), m = f->sp.kd == LMC_KV_ROPE_F16 ? 0x1p-25 : 0;
    uint64_t rotated = 0;
    for (uint32_t ti = 0; ti < f->g.n_tensors; ti++)
        for (uint64_t o = 0; o < f->span / es; o++) {
            const uint8_t *p = f->tensors[ti] + o * es;
            if (f->marks[ti][o] == 0) {
                if (memcmp(p, sentinel, es) != 0)
                    fail_msg("tensor %u element %llu written outside the named slots", ti,
                             (unsigned long long)o);
            } else if (f->marks[ti][o] == 1) {
                if (memcmp(p, &f->ref[ti][o], es) != 0)
                    fail_msg("tensor %u element %llu not copied verbatim", ti,
                             (unsigned long long)o);
            } else {
                double got = dec(f->sp.kd, p), d = got - f->ref[ti][o];
                double tol = (u + 64 * 0x1p-24) * f->mag[ti][o] + m;
                if (d > tol || d < -tol)
                    fail_msg("tensor %u element %llu: %.9g, reference %.9g (tolerance %.3g)", ti,
                             (unsigned long long)o, got, f->ref[ti][o], tol);
                rotated++;
            }
        }
    return rotated;
}

/* The geometry docs/cacheblend.md gives for the spec, worked out
 * here by hand: a latent window is one head of the whole row; fused heads
 * are 2 x head_size apart; others head_size. */
static void check_geometry(const fixture *f)
{
    const spec *s = &f->sp;
    bool fused =
        s->format == LMC_KV_NL_X_NB_BS_NH_TWO_HS || s->format == LMC_KV_NL_X_NB_NH_BS_TWO_HS;
    uint32_t stride = s->window && s->win_off ? s->nh * s->hs : s->head_size * (fused ? 2 : 1);
    assert_int_equal(f->rope.head_stride, stride);
    assert_int_equal(f->rope.n_heads, s->nh * s->hs / stride);
    assert_int_equal(f->rope.rot_offset, s->window ? s->win_off : 0);
    assert_int_equal(f->rope.rot_dim, s->rot_dim);
    assert_int_equal(f->rope.is_neox, s->neox);
}

static void run_spec(const spec *s)
{
    fixture f;
    char err[256] = "";
    setup(&f, s);
    if (!s->nope)
        check_geometry(&f);
    for (size_t i = 0; i < f.n; i++)
        expect_match(&f, &f.m[i]);
    int rc = lmc_kv_rope_scatter(&f.t, f.m, f.n, err, sizeof err);
    if (rc != 0)
        fail_msg("refused: %s", err);
    uint64_t rotated = check_all(&f);
    if (!s->nope)
        assert_true(rotated > 0);
    teardown(&f);
}

static const lmc_kv_rope_dtype k_types[] = {LMC_KV_ROPE_F16, LMC_KV_ROPE_BF16, LMC_KV_ROPE_F32};

/* FlashAttention NHD, every K type, both styles, full and partial rotary. */
static void test_rotate_types_and_dims(void **state)
{
    (void)state;
    struct { uint32_t nh, hs, rot; } dims[] = {{2, 64, 64}, {4, 32, 16}, {1, 128, 128},
                                               {3, 80, 32},
                                               {2, 24, 24}, {2, 20, 20}};
    for (size_t k = 0; k < 3; k++)
        for (int neox = 0; neox < 2; neox++)
            for (size_t d = 0; d < sizeof dims / sizeof *dims; d++) {
                spec s = {LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 16, 8, dims[d].nh, dims[d].hs, 16,
                          k_types[k], k_types[k], dims[d].hs, dims[d].rot, neox, false, 0, 0,
                          false};
                run_spec(&s);
            }
}

/* A cache of another type than K (the newest upstream converts). */
static void test_cache_type_differs(void **state)
{
    (void)state;
    spec s = {LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 16, 8, 2, 64, 16, LMC_KV_ROPE_BF16,
              LMC_KV_ROPE_F32, 64, 64, true, false, 0, 0, false};
    run_spec(&s);
    s.kd = LMC_KV_ROPE_F32;
    s.cd = LMC_KV_ROPE_F16;
    run_spec(&s);
}

/* Formats whose slot is not one run (HND), one cross-layer tensor, K and V
 * lists, and block sizes 4 and 16. */
static void test_formats(void **state)
{
    (void)state;
    lmc_kv_format fm[] = {LMC_KV_NL_X_TWO_NB_NH_BS_HS, LMC_KV_NL_X_NB_TWO_NH_BS_HS,
                          LMC_KV_NB_NL_TWO_BS_NH_HS, LMC_KV_NB_NL_TWO_NH_BS_HS,
                          LMC_KV_TWO_X_NL_X_NB_BS_NH_HS, LMC_KV_NL_X_NB_TWO_BS_NH_HS};
    uint32_t bss[] = {4, 16};
    for (size_t i = 0; i < sizeof fm / sizeof *fm; i++)
        for (size_t b = 0; b < 2; b++) {
            spec s = {fm[i], 2, 32, bss[b], 4, 32, 16, LMC_KV_ROPE_F16, LMC_KV_ROPE_F16, 32, 32,
                      i % 2 == 0, false, 0, 0, false};
            run_spec(&s);
        }
}

/* HND slots are written block by block over each run of a match's
 * tokens: block sizes that the matches (starting at 3 and 5 x bs) cross
 * at odd offsets, both styles, full rotary (K rotated straight into each
 * head's slot) and partial (K through a row, V still head by head). */
static void test_hnd_block_runs(void **state)
{
    (void)state;
    lmc_kv_format fm[] = {LMC_KV_NL_X_TWO_NB_NH_BS_HS, LMC_KV_NB_NL_TWO_NH_BS_HS};
    uint32_t bss[] = {3, 5, 7}, rots[] = {32, 16};
    for (size_t i = 0; i < 2; i++)
        for (size_t b = 0; b < 3; b++)
            for (size_t r = 0; r < 2; r++)
                for (int neox = 0; neox < 2; neox++) {
                    spec s = {fm[i], 2, 32, bss[b], 3, 32, 16, LMC_KV_ROPE_F16,
                              LMC_KV_ROPE_F32, 32, rots[r], neox, false, 0, 0, false};
                    run_spec(&s);
                }
}

/* Fused K/V heads (hs = 2 x head_size): only each head's K half turns. */
static void test_fused(void **state)
{
    (void)state;
    spec s = {LMC_KV_NL_X_NB_BS_NH_TWO_HS, 1, 16, 8, 2, 64, 16, LMC_KV_ROPE_BF16,
              LMC_KV_ROPE_BF16, 32, 32, true, false, 0, 0, false};
    run_spec(&s);
    s.format = LMC_KV_NL_X_NB_NH_BS_TWO_HS;
    s.neox = false;
    run_spec(&s);
}

/* MLA latent row [content 64 | rope 32]: only the window turns. */
static void test_mla_window(void **state)
{
    (void)state;
    spec s = {LMC_KV_NL_X_NB_BS_HS, 1, 16, 8, 1, 96, 16, LMC_KV_ROPE_BF16, LMC_KV_ROPE_BF16,
              64, 32, false, true, 64, 32, false};
    run_spec(&s);
}

/* No cache (NoPE): shifted K is copied verbatim too. */
static void test_nope(void **state)
{
    (void)state;
    spec s = {LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 16, 8, 2, 64, 16, LMC_KV_ROPE_F16,
              LMC_KV_ROPE_F16, 64, 64, true, false, 0, 0, true};
    run_spec(&s);
}

/* The shared index helpers a CUDA kernel will compile too. */
static void test_index_helpers(void **state)
{
    (void)state;
    lmc_kv_rope_geom neox = {4, 80, 8, 32, true}, gptj = {4, 80, 8, 32, false};
    uint32_t x, y;
    lmc_kv_rope_pair(&neox, 2, 5, &x, &y);
    assert_int_equal(x, 2 * 80 + 8 + 5);
    assert_int_equal(y, 2 * 80 + 8 + 5 + 16);
    lmc_kv_rope_pair(&gptj, 2, 5, &x, &y);
    assert_int_equal(x, 2 * 80 + 8 + 10);
    assert_int_equal(y, 2 * 80 + 8 + 11);
    assert_int_equal(lmc_kv_rope_cos_index(32, 7, 3), 7 * 32 + 3);
    assert_int_equal(lmc_kv_rope_sin_index(32, 7, 3), 7 * 32 + 16 + 3);
    int64_t table[] = {9, 4, 7}, b;
    uint32_t s;
    assert_true(lmc_kv_rope_slot(table, 3, 16, 37, &b, &s));
    assert_int_equal(b, 7);
    assert_int_equal(s, 5);
    assert_false(lmc_kv_rope_slot(table, 3, 16, 48, &b, &s));
    float c, sn, xo, yo;
    lmc_kv_rope_delta(0.6f, 0.8f, 0.6f, 0.8f, &c, &sn);   /* same position: identity */
    assert_true(c > 0.9999f && c < 1.0001f && sn > -1e-6f && sn < 1e-6f);
    lmc_kv_rope_apply(1.0f, 0.0f, 0.0f, 1.0f, &xo, &yo);  /* a quarter turn */
    assert_true(xo == 0.0f && yo == 1.0f);
}

/* The helpers added for the CUDA kernels (docs/cacheblend.md, "CUDA
 * kernels"): a slot index splits back into what lmc_kv_rope_slot gives,
 * entry rows go layer by layer, the destination offset takes the layer
 * only in a cross-layer tensor, the delta reads the four cache elements
 * lmc_kv_rope_cos/sin_index name, and the conversions round as the
 * rotation does. */
static void test_kernel_helpers(void **state)
{
    (void)state;
    int64_t table[] = {9, 4, 7}, idx, b, b2;
    uint32_t s, s2;
    for (uint64_t pos = 0; pos < 48; pos++) {
        assert_true(lmc_kv_rope_slot_index(table, 3, 16, pos, &idx));
        assert_true(lmc_kv_rope_slot(table, 3, 16, pos, &b, &s));
        lmc_kv_rope_slot_split(idx, 16, &b2, &s2);
        assert_int_equal(b2, b);
        assert_int_equal(s2, s);
        assert_int_equal(idx, b * 16 + s);
    }
    assert_false(lmc_kv_rope_slot_index(table, 3, 16, 48, &idx));
    uint32_t l, t;
    lmc_kv_rope_entry_row(24, 2 * 24 + 5, &l, &t);
    assert_int_equal(l, 2);
    assert_int_equal(t, 5);
    lmc_kv_geometry cross = {LMC_KV_NB_NL_TWO_BS_NH_HS, 2, 3, 4, 16, 2, 8, 2, 0};
    lmc_kv_geometry nhd = {LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 3, 4, 16, 2, 8, 2, 0};
    assert_int_equal(lmc_kv_rope_dst_offset(&cross, 1, 2, 3, 5, 1),
                     lmc_kv_paged_offset(&cross, 1, 2, 3, 5, 1, 0));
    assert_int_equal(lmc_kv_rope_dst_offset(&nhd, 1, 2, 3, 5, 1),
                     lmc_kv_paged_offset(&nhd, 1, 0, 3, 5, 1, 0));
    /* rows 3 (old) and 5 (new) of a 4-wide cache: pair 1's cos and sin */
    float cache[6 * 4] = {0}, cd, sd, c2, s2f;
    cache[3 * 4 + 1] = 0.6f;
    cache[3 * 4 + 3] = 0.8f;
    cache[5 * 4 + 1] = 0.8f;
    cache[5 * 4 + 3] = 0.6f;
    lmc_kv_rope_delta_at(LMC_KV_ROPE_F32, cache, 4, 3, 5, 1, &cd, &sd);
    lmc_kv_rope_delta(0.6f, 0.8f, 0.8f, 0.6f, &c2, &s2f);
    assert_true(cd == c2 && sd == s2f);
    uint16_t h[3];
    lmc_kv_rope_store(LMC_KV_ROPE_BF16, h, 0, 1.0f + 0x1p-8f);      /* a tie: to even */
    lmc_kv_rope_store(LMC_KV_ROPE_BF16, h, 1, 1.0f + 0x1p-8f + 0x1p-20f);
    lmc_kv_rope_store(LMC_KV_ROPE_F16, h, 2, 0x1p-24f * 3);          /* subnormal half */
    assert_int_equal(h[0], 0x3F80);
    assert_int_equal(h[1], 0x3F81);
    assert_int_equal(h[2], 3);
    assert_true(lmc_kv_rope_load(LMC_KV_ROPE_F16, h, 2) == 0x1p-24f * 3);
    assert_true(lmc_kv_rope_load(LMC_KV_ROPE_BF16, h, 1) == 1.0f + 0x1p-7f);
}

static void expect_refused(fixture *f, size_t n, const char *needle)
{
    char err[256] = "";
    assert_int_equal(lmc_kv_rope_scatter(&f->t, f->m, n, err, sizeof err), -1);
    if (!strstr(err, needle))
        fail_msg("reason \"%s\" lacks \"%s\"", err, needle);
    assert_int_equal(check_all(f), 0);   /* no marks: every byte still the sentinel */
}

static const spec base_spec = {LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 16, 8, 2, 64, 16,
                               LMC_KV_ROPE_F16, LMC_KV_ROPE_F16, 64, 64, true, false, 0, 0, false};

/* Bad plans are refused before anything is written, even when only the
 * last match is bad. */
static void test_scatter_refusals(void **state)
{
    (void)state;
    fixture f;
    setup(&f, &base_spec);
    f.t.n_blocks = 6;            /* match 2 lands in blocks 8..9 */
    expect_refused(&f, 3, "past the 6-block table");
    f.t.n_blocks = 32;
    f.table[9] = 16;             /* nb is 16 */
    expect_refused(&f, 3, "block id 16 outside");
    f.table[9] = -1;
    expect_refused(&f, 3, "block id -1 outside");
    f.table[9] = 12;
    f.m[0].old_st = MAX_POS - 8; /* its slots run past the cache */
    expect_refused(&f, 3, "past cos_sin_cache");
    f.m[0].old_st = 0;
    f.m[0].cur_st = MAX_POS - 15;
    expect_refused(&f, 1, "past cos_sin_cache");
    f.m[0].cur_st = UINT64_MAX - 3;
    expect_refused(&f, 1, "overflows");
    f.m[0].cur_st = 3;
    f.m[1].n_tok = 17;
    expect_refused(&f, 3, "17 tokens from a chunk of 16");
    f.m[1].n_tok = 11;
    f.m[2].entry_bytes--;
    expect_refused(&f, 3, "entry of");
    f.m[2].entry_bytes++;
    f.rope.rot_dim = 32;         /* geometry and cache disagree */
    expect_refused(&f, 3, "cos_sin_cache rot_dim 64");
    f.rope.rot_dim = 64;
    f.rope.head_stride = 32;     /* mismatched head dims */
    expect_refused(&f, 3, "does not fit");
    f.rope.head_stride = 64;
    f.t.k_dtype = LMC_KV_ROPE_F32;
    expect_refused(&f, 3, "K dtype");
    f.t.k_dtype = LMC_KV_ROPE_F16;
    f.t.tensor_bytes--;
    expect_refused(&f, 3, "tensors of");
    f.t.tensor_bytes++;
    f.g.tokens_per_block = 4;
    expect_refused(&f, 3, "compressed");
    f.g.tokens_per_block = 8;
    f.g.entry_bytes += 2;        /* the group's own size, matched by the entries' */
    for (int i = 0; i < 3; i++)
        f.m[i].entry_bytes += 2;
    expect_refused(&f, 3, "kernel group: entry of");
    f.g.entry_bytes -= 2;
    for (int i = 0; i < 3; i++)
        f.m[i].entry_bytes -= 2;
    f.g.n_tensors = 1;           /* a per-layer format over 2 layers */
    expect_refused(&f, 3, "1 tensors, its format uses 2");
    f.g.n_tensors = 2;
    f.g.span_bytes = 0;          /* recomputed, not trusted */
    f.t.tensor_bytes = f.span - 1;
    expect_refused(&f, 3, "tensors of");
    f.t.tensor_bytes = f.span;
    assert_int_equal(lmc_kv_rope_scatter(&f.t, f.m, 0, NULL, 0), 0);   /* nothing to do */
    teardown(&f);
}

static void test_geometry_refusals(void **state)
{
    (void)state;
    lmc_kv_geometry g = {LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 2, 16, 8, 2, 64, 2, 0};
    lmc_kv_rope_geom r;
    char err[256];
    assert_int_equal(lmc_kv_rope_geometry(&g, 48, true, false, 0, 0, 48, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "head_size 48 does not divide"));
    assert_int_equal(lmc_kv_rope_geometry(&g, 64, true, false, 0, 0, 96, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "rot_dim 96 exceeds"));
    assert_int_equal(lmc_kv_rope_geometry(&g, 64, true, false, 0, 0, 33, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "not an even width"));
    g.kv_size = 3;
    assert_int_equal(lmc_kv_rope_geometry(&g, 64, true, false, 0, 0, 64, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "kv_size 3"));
    lmc_kv_geometry mla = {LMC_KV_NL_X_NB_BS_HS, 1, 2, 16, 8, 1, 96, 2, 8 * 96};
    assert_int_equal(lmc_kv_rope_geometry(&mla, 64, true, true, 64, 32, 16, &r, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "differs from the cache's 16"));
    assert_int_equal(lmc_kv_rope_geometry(&mla, 64, true, true, 32, 32, 32, &r, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "must end"));
    g.kv_size = 2;   /* a latent window on a two-plane group */
    assert_int_equal(lmc_kv_rope_geometry(&g, 64, true, true, 64, 64, 64, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "single-plane"));
}

/* A cache whose byte length is not [rows, cols] of its type. */
static void test_cache_refusals(void **state)
{
    (void)state;
    static uint16_t data[128 * 64];
    lmc_kv_rope_cache c;
    char err[256];
    assert_int_equal(lmc_kv_rope_cache_init(&c, data, sizeof data, LMC_KV_ROPE_F16, 128, 64, err,
                                            sizeof err),
                     0);
    assert_int_equal(c.max_position, 128);
    assert_int_equal(lmc_kv_rope_cache_init(&c, data, sizeof data - 2, LMC_KV_ROPE_F16, 128, 64,
                                            err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "do not hold"));
    assert_int_equal(lmc_kv_rope_cache_init(&c, data, sizeof data, LMC_KV_ROPE_F32, 128, 64, err,
                                            sizeof err),
                     -1);
    assert_int_equal(lmc_kv_rope_cache_init(&c, data, sizeof data, LMC_KV_ROPE_F16, 64, 127, err,
                                            sizeof err),
                     -1);
    assert_non_null(strstr(err, "not an even width"));
    assert_int_equal(lmc_kv_rope_cache_init(&c, data, sizeof data, LMC_KV_ROPE_F16,
                                            UINT64_MAX / 2, 64, err, sizeof err),
                     -1);
}

/* Results round to nearest, ties to even, in the vector path (pairs 0..7)
 * and the scalar one (pair 8) alike: K = (1, 0) moved from a position of
 * angle 0 to one whose cos is exactly halfway between two K values. */
static void test_rounding_ties(void **state)
{
    (void)state;
    struct { lmc_kv_rope_dtype kd; double ulp; uint16_t down, up; } ty[] = {
        {LMC_KV_ROPE_BF16, 0x1p-7, 0x3F80, 0x3F82}, {LMC_KV_ROPE_F16, 0x1p-10, 0x3C00, 0x3C02}};
    for (int k = 0; k < 2; k++) {
        enum { W = 18, E = W / 2 };
#define UP(i) ((i) % 2 || (i) == E - 1)   /* halfway to an odd value: rounds up */
        lmc_kv_kernel_group g = {
            .geo = {LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 1, 2, 1, 1, W, 2, W},
            .n_tensors = 1, .tokens_per_block = 1, .slots = 1, .entry_bytes = 2 * W * 2};
        assert_true(lmc_kv_span_bytes(&g.geo, &g.span_bytes));
        uint8_t tensor[4 * W * 2], entry[2 * W * 2] = {0}, *bases[] = {tensor};
        float cache_data[2 * W] = {0};
        for (int i = 0; i < E; i++) {
            enc(ty[k].kd, entry + i * 2, 1.0);                /* x = 1, y = 0 */
            cache_data[i] = 1.0f;                             /* position 0: angle 0 */
            cache_data[W + i] = (float)(1.0 + (UP(i) ? 3 : 1) * ty[k].ulp / 2);
        }
        memset(tensor, SENTINEL, sizeof tensor);
        lmc_kv_rope_cache c;
        lmc_kv_rope_geom r;
        char err[256];
        int64_t table[] = {0, 1};
        assert_int_equal(lmc_kv_rope_cache_init(&c, cache_data, sizeof cache_data,
                                                LMC_KV_ROPE_F32, 2, W, err, sizeof err), 0);
        assert_int_equal(lmc_kv_rope_geometry(&g.geo, W, true, false, 0, 0, W, &r, err,
                                              sizeof err), 0);
        lmc_kv_rope_target t = {&g, bases, sizeof tensor, table, 2, &c, &r, ty[k].kd};
        lmc_kv_rope_match m = {entry, sizeof entry, 0, 1, 1};
        assert_int_equal(lmc_kv_rope_scatter(&t, &m, 1, err, sizeof err), 0);
        for (int i = 0; i < E; i++) {   /* block 1, slot 0 of K: elements W.. */
            uint16_t got;
            memcpy(&got, tensor + (W + i) * 2, 2);
            assert_int_equal(got, UP(i) ? ty[k].up : ty[k].down);
        }
#undef UP
    }
}

/* A cache of `rows` x 16 whose pairs have magnitude `mag`. */
static void scaled_cache(lmc_kv_rope_dtype d, uint8_t *out, uint32_t rows, double mag)
{
    uint32_t es = lmc_kv_rope_dtype_size(d);
    for (uint32_t i = 0; i < 8; i++)
        for (uint32_t p = 0; p < rows; p++) {
            double sn, cs;
            sincos_small((p * (i + 1)) % 7 / 7.0, &sn, &cs);   /* any angle in [0, 1) */
            enc(d, out + ((uint64_t)p * 16 + i) * es, cs * mag);
            enc(d, out + ((uint64_t)p * 16 + 8 + i) * es, sn * mag);
        }
}

/* mscale stripping: a magnitude of 1.25, or 1.002, is divided out; 1.0005
 * (under 1e-3 off) and 1 are left in place; an all-zero cache is refused. */
static void test_mscale(void **state)
{
    (void)state;
    static uint8_t data[64 * 16 * 4];
    struct { lmc_kv_rope_dtype d; double mag; bool strip; double tol; } cs[] = {
        {LMC_KV_ROPE_BF16, 1.25, true, 0x1p-7}, {LMC_KV_ROPE_F16, 1.25, true, 0x1p-10},
        {LMC_KV_ROPE_F32, 1.002, true, 1e-6},   {LMC_KV_ROPE_F32, 1.0005, false, 1e-6},
        {LMC_KV_ROPE_F32, 1.0, false, 1e-6}};
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        lmc_kv_rope_cache c;
        char err[256];
        void *owned = (void *)1;
        uint32_t es = lmc_kv_rope_dtype_size(cs[k].d);
        scaled_cache(cs[k].d, data, 64, cs[k].mag);
        assert_int_equal(lmc_kv_rope_cache_init(&c, data, 64 * 16 * es, cs[k].d, 64, 16, err,
                                                sizeof err), 0);
        double m = lmc_kv_rope_cache_mscale(&c);
        assert_true(m > cs[k].mag - 4 * cs[k].tol && m < cs[k].mag + 4 * cs[k].tol);
        assert_int_equal(lmc_kv_rope_cache_normalize(&c, &owned, err, sizeof err), 0);
        assert_int_equal(owned != NULL, cs[k].strip);
        assert_true(c.data == (cs[k].strip ? owned : (void *)data));
        for (uint64_t i = 0; cs[k].strip && i < 64 * 16; i++) {
            double want = dec(cs[k].d, data + i * es) / m;
            double got = dec(cs[k].d, (uint8_t *)owned + i * es);
            if (got - want > cs[k].tol * 1.01 || want - got > cs[k].tol * 1.01)
                fail_msg("cache %zu element %llu: %.9g, want %.9g", k, (unsigned long long)i, got,
                         want);
        }
        m = lmc_kv_rope_cache_mscale(&c);
        assert_true(m > 1 - 4 * cs[k].tol - 1e-3 && m < 1 + 4 * cs[k].tol + 1e-3);
        free(owned);
    }
    memset(data, 0, sizeof data);
    lmc_kv_rope_cache c = {data, 64, 16, LMC_KV_ROPE_F32};
    void *owned;
    char err[256];
    assert_int_equal(lmc_kv_rope_cache_normalize(&c, &owned, err, sizeof err), -1);
    assert_non_null(strstr(err, "zero"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_helpers),
        cmocka_unit_test(test_kernel_helpers),
        cmocka_unit_test(test_rotate_types_and_dims),
        cmocka_unit_test(test_cache_type_differs),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_hnd_block_runs),
        cmocka_unit_test(test_fused),
        cmocka_unit_test(test_mla_window),
        cmocka_unit_test(test_nope),
        cmocka_unit_test(test_rounding_ties),
        cmocka_unit_test(test_scatter_refusals),
        cmocka_unit_test(test_geometry_refusals),
        cmocka_unit_test(test_cache_refusals),
        cmocka_unit_test(test_mscale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
