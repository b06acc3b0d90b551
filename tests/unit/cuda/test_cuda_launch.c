/* The host arithmetic of liblmcached_cuda.so's block copy kernel
 * (cuda/cuda_launch.h), checked on the CPU without a GPU or nvcc: the copy
 * unit, the launch geometry, the parameter block's capacity checks, and a
 * reference kernel, a loop over the very grid, thread block and row
 * helpers the CUDA kernel uses, against the CPU copy (kv/kv_copy.h)
 * byte for byte, both directions, for every format, padded MLA rows,
 * misaligned tensors and entries, more heads and slots than threads, and
 * skip_blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/cuda_launch.h"
#include "kv/kv_copy.h"

/* ---- helpers ------------------------------------------------------------ */

typedef struct gcase {
    const char *name;
    lmc_kv_format f;
    uint32_t kv_size, nl, bs, nh, hs, es;
    uint64_t nb;
    uint32_t keep;             /* kept blocks per chunk */
    uint64_t pad;              /* MLA: elements past bs*hs per block */
    uint64_t entry_offset;     /* bytes into the object */
    uint32_t misalign;         /* bytes added to every tensor base */
} gcase;

static lmc_kv_kernel_group group_of(const gcase *c)
{
    lmc_kv_kernel_group g;
    memset(&g, 0, sizeof g);
    g.geo.format = c->f;
    g.geo.kv_size = c->kv_size;
    g.geo.nl = c->nl;
    g.geo.nb = c->nb;
    g.geo.bs = c->bs;
    g.geo.nh = c->nh;
    g.geo.hs = c->hs;
    g.geo.element_size = c->es;
    g.geo.block_stride = c->f == LMC_KV_NL_X_NB_BS_HS ? (uint64_t)c->bs * c->hs + c->pad
                                                      : (uint64_t)c->bs * c->nh * c->hs;
    g.n_tensors = lmc_cuda_tensors_needed(&g.geo);
    g.keep_blocks = c->keep;
    g.blocks_per_chunk = c->keep;
    g.slots = c->keep * c->bs;
    g.entry_offset = c->entry_offset;
    g.entry_bytes = (uint64_t)c->kv_size * c->nl * g.slots * c->nh * c->hs * c->es;
    assert_true(lmc_kv_span_bytes(&g.geo, &g.span_bytes));
    return g;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

/* The engine side: n tensors, each in its own buffer at `misalign` bytes
 * past a 64-byte boundary. */
typedef struct paged {
    uint32_t n;
    uint64_t span;
    uint8_t *raw[2][64];
    uint8_t *base[2][64];      /* two identical copies: reference and kv_copy */
    uint64_t addr[64];
} paged;

static paged *paged_new(const lmc_kv_kernel_group *g, uint32_t misalign, uint32_t seed)
{
    paged *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->n = g->n_tensors;
    assert_true(p->n <= 64);
    p->span = g->span_bytes;
    for (int k = 0; k < 2; k++)
        for (uint32_t t = 0; t < p->n; t++) {
            p->raw[k][t] = aligned_alloc(64, (p->span + misalign + 63) / 64 * 64 + 64);
            assert_non_null(p->raw[k][t]);
            p->base[k][t] = p->raw[k][t] + misalign;
            fill(p->base[k][t], p->span, seed + t);
        }
    for (uint32_t t = 0; t < p->n; t++)
        p->addr[t] = (uint64_t)(uintptr_t)p->base[0][t];
    return p;
}

static void paged_free(paged *p)
{
    for (int k = 0; k < 2; k++)
        for (uint32_t t = 0; t < p->n; t++)
            free(p->raw[k][t]);
    free(p);
}

/* The CUDA kernel, run on the CPU: every CUDA block of the grid, every
 * thread of the block, the same loops and the same row helpers.  `hits`
 * (entry-relative, may be NULL) counts the writes of each staging byte of
 * a gather; every unit access must be aligned to the unit. */
static void reference_kernel(const lmc_cuda_copy_params *p, uint8_t *hits)
{
    lmc_cuda_dims d = lmc_cuda_launch_dims(p);
    assert_true(d.block[0] * d.block[1] * d.block[2] <= LMC_CUDA_THREADS);
    assert_true(d.block[0] >= 1 && d.block[1] >= 1 && d.block[2] >= 1);
    uint32_t bs = p->geo.bs, nh = p->geo.nh, upr = p->units_per_row, unit = p->unit;
    for (uint32_t bx = 0; bx < d.grid[0]; bx++)
        for (uint32_t by = 0; by < d.grid[1]; by++)
            for (uint32_t bz = 0; bz < d.grid[2]; bz++)
                for (uint32_t tz = 0; tz < d.block[2]; tz++)
                    for (uint32_t ty = 0; ty < d.block[1]; ty++)
                        for (uint32_t tx = 0; tx < d.block[0]; tx++) {
                            uint32_t kv = bx, j = p->first_block + by,
                                     layer = p->first_layer + bz;
                            for (uint32_t s = tz; s < bs; s += d.block[2])
                                for (uint32_t h = ty; h < nh; h += d.block[1]) {
                                    uint64_t e = lmc_cuda_engine_row(p, kv, layer, j, s, h);
                                    uint64_t st = lmc_cuda_staging_row(p, kv, layer, j, s, h);
                                    for (uint32_t u = tx; u < upr; u += d.block[0]) {
                                        uint64_t eu = e + (uint64_t)u * unit;
                                        uint64_t su = st + (uint64_t)u * unit;
                                        assert_int_equal(eu % unit, 0);
                                        assert_int_equal(su % unit, 0);
                                        if (p->to_staging) {
                                            memcpy((void *)(uintptr_t)su,
                                                   (const void *)(uintptr_t)eu, unit);
                                            if (hits)
                                                for (uint32_t b = 0; b < unit; b++)
                                                    hits[su - p->entry + b]++;
                                        } else {
                                            memcpy((void *)(uintptr_t)eu,
                                                   (const void *)(uintptr_t)su, unit);
                                        }
                                    }
                                }
                        }
}

/* Gathers with the reference kernel and with kv_copy (`method`), then
 * scatters a fresh object both ways with skip_blocks 0 and `skip`: the
 * objects, then the tensors, must match byte for byte.  `runs`: the blocks
 * are consecutive (one run, or two where they wrap), else out of order. */
static void round_trip_with(const gcase *c, uint32_t skip, lmc_copy_method method, bool runs)
{
    lmc_kv_kernel_group g = group_of(c);
    paged *pg = paged_new(&g, c->misalign, 7);
    int64_t blocks[LMC_CUDA_MAX_BLOCKS];
    for (uint32_t j = 0; j < c->keep; j++)   /* distinct */
        blocks[j] = (int64_t)(((runs ? j : j * 7) + 3) % c->nb);
    uint64_t size = c->entry_offset + g.entry_bytes + 40;
    uint8_t *raw_a = aligned_alloc(64, (size + 63) / 64 * 64);
    uint8_t *raw_b = aligned_alloc(64, (size + 63) / 64 * 64);
    uint8_t *hits = calloc(1, g.entry_bytes);
    lmc_cuda_copy_params *p = malloc(sizeof *p);
    assert_non_null(raw_a);
    assert_non_null(raw_b);
    assert_non_null(hits);
    assert_non_null(p);
    memset(raw_a, 0xA5, size);
    memset(raw_b, 0xA5, size);
    char err[256] = "";

    /* STORE: blocks -> entry */
    int rc = lmc_cuda_params_pack(p, &g, pg->addr, blocks, 5 /* ignored */,
                                  (uint64_t)(uintptr_t)(raw_a + c->entry_offset), true, err,
                                  sizeof err);
    assert_int_equal(rc, 0);
    p->first_block = 0;   /* what copy_object packs for a STORE */
    reference_kernel(p, hits);
    lmc_kv_chunk_copy cc = {.g = &g, .bases = pg->base[1], .blocks = blocks,
                            .entry = raw_b + c->entry_offset, .method = method};
    lmc_kv_gather_chunk(&cc);
    assert_memory_equal(raw_a, raw_b, size);
    for (uint64_t i = 0; i < g.entry_bytes; i++)
        if (hits[i] != 1)
            fail_msg("%s: staging byte %llu written %u times", c->name, (unsigned long long)i,
                     hits[i]);

    /* RETRIEVE: a fresh entry -> blocks, all of them, then past `skip` */
    uint32_t skips[2] = {0, skip};
    for (int k = 0; k < 2; k++) {
        fill(raw_a, size, 99 + k);
        memcpy(raw_b, raw_a, size);
        rc = lmc_cuda_params_pack(p, &g, pg->addr, blocks, skips[k],
                                  (uint64_t)(uintptr_t)(raw_a + c->entry_offset), false, err,
                                  sizeof err);
        assert_int_equal(rc, 0);
        assert_int_equal(p->first_block, skips[k] < c->keep ? skips[k] : c->keep);
        reference_kernel(p, NULL);
        cc.skip_blocks = p->first_block;
        lmc_kv_scatter_chunk(&cc);
        for (uint32_t t = 0; t < pg->n; t++)
            if (memcmp(pg->base[0][t], pg->base[1][t], pg->span) != 0)
                fail_msg("%s: tensor %u differs after a scatter with skip %u", c->name, t,
                         skips[k]);
    }
    /* A layerwise batch: the last layer alone, then the others, each
     * against kv_copy's layer range from a fresh entry. */
    uint32_t ranges[2][2] = {{c->nl - 1, c->nl}, {0, c->nl - 1}};
    for (int k = 0; k < 2 && c->nl > 1; k++) {
        fill(raw_a, size, 199 + k);
        memcpy(raw_b, raw_a, size);
        rc = lmc_cuda_params_pack(p, &g, pg->addr, blocks, skip,
                                  (uint64_t)(uintptr_t)(raw_a + c->entry_offset), false, err,
                                  sizeof err);
        assert_int_equal(rc, 0);
        assert_int_equal(lmc_cuda_params_layers(p, ranges[k][0], ranges[k][1], err, sizeof err),
                         0);
        assert_int_equal(lmc_cuda_launch_dims(p).grid[2], ranges[k][1] - ranges[k][0]);
        reference_kernel(p, NULL);
        cc.skip_blocks = p->first_block;
        lmc_kv_scatter_layers(&cc, ranges[k][0], ranges[k][1]);
        for (uint32_t t = 0; t < pg->n; t++)
            if (memcmp(pg->base[0][t], pg->base[1][t], pg->span) != 0)
                fail_msg("%s: tensor %u differs after layers [%u, %u)", c->name, t,
                         ranges[k][0], ranges[k][1]);
    }
    assert_int_equal(lmc_cuda_params_layers(p, c->nl, c->nl + 1, err, sizeof err), -1);
    free(p);
    free(hits);
    free(raw_a);
    free(raw_b);
    paged_free(pg);
}

/* Both methods: streaming stores take other kernels (bulk_copy.c), and
 * consecutive blocks make runs longer than a block. */
static void round_trip(const gcase *c, uint32_t skip)
{
    round_trip_with(c, skip, LMC_COPY_MEMCPY, false);
    round_trip_with(c, skip, LMC_COPY_STREAM, false);
    round_trip_with(c, skip, LMC_COPY_STREAM, true);
}

/* ---- the reference kernel against kv_copy, per format ------------------- */

static const gcase CASES[] = {
    {"fa_nhd", LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 3, 16, 2, 8, 2, 12, 4, 0, 0, 0},
    {"fa_hnd", LMC_KV_NL_X_TWO_NB_NH_BS_HS, 2, 3, 16, 2, 8, 2, 12, 4, 0, 64, 0},
    {"fi_nhd", LMC_KV_NL_X_NB_TWO_BS_NH_HS, 2, 2, 8, 4, 16, 2, 10, 3, 0, 32, 0},
    {"fi_hnd", LMC_KV_NL_X_NB_TWO_NH_BS_HS, 2, 2, 8, 4, 16, 2, 10, 3, 0, 0, 0},
    /* MLA: 24-byte rows, blocks padded by 5 elements (odd: 2-byte units) */
    {"mla_padded", LMC_KV_NL_X_NB_BS_HS, 1, 3, 16, 1, 12, 2, 9, 2, 5, 16, 0},
    {"mla_padded_aligned", LMC_KV_NL_X_NB_BS_HS, 1, 2, 16, 1, 64, 2, 9, 2, 32, 0, 0},
    {"fused_nhd", LMC_KV_NL_X_NB_BS_NH_TWO_HS, 1, 2, 16, 2, 16, 2, 8, 2, 0, 0, 0},
    {"fused_hnd", LMC_KV_NL_X_NB_NH_BS_TWO_HS, 1, 2, 16, 2, 16, 2, 8, 2, 0, 0, 0},
    {"cross_nhd", LMC_KV_NB_NL_TWO_BS_NH_HS, 2, 4, 16, 2, 8, 2, 12, 4, 0, 0, 0},
    {"cross_hnd_trt", LMC_KV_NB_NL_TWO_NH_BS_HS, 2, 4, 16, 2, 8, 2, 12, 4, 0, 96, 0},
    {"sglang_kv_lists", LMC_KV_TWO_X_NL_X_NB_BS_NH_HS, 2, 3, 16, 2, 8, 2, 12, 4, 0, 0, 0},
    /* SGLang unified: K and V views as layers; opaque fp32 state, one slot */
    {"sglang_unified", LMC_KV_NL_X_NB_BS_NH_HS, 1, 4, 16, 2, 8, 2, 12, 4, 0, 0, 0},
    {"sglang_unified_state", LMC_KV_NL_X_NB_BS_NH_HS, 1, 2, 1, 1, 1000, 4, 6, 1, 0, 24, 0},
    /* more heads than ty and more slots than tz: 512-byte rows, 32 lanes */
    {"many_heads_hnd", LMC_KV_NL_X_TWO_NB_NH_BS_HS, 2, 2, 4, 20, 256, 2, 6, 2, 0, 0, 0},
    /* 160-byte rows: the AVX2 transpose's two whole lines and a 32-byte tail */
    {"hnd_tail_rows", LMC_KV_NL_X_TWO_NB_NH_BS_HS, 2, 2, 16, 2, 80, 2, 12, 4, 0, 64, 0},
    {"many_heads_nhd", LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 2, 64, 40, 64, 2, 5, 2, 0, 0, 0},
    /* fp8 rows of 3 bytes: 1-byte units */
    {"fp8_odd_rows", LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 2, 16, 3, 3, 1, 8, 3, 0, 0, 0},
    /* tensors 4 bytes past alignment, entry 8 bytes past: 4-byte units */
    {"misaligned_bases", LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 2, 16, 2, 64, 2, 8, 3, 0, 8, 4},
    /* entry at an odd multiple of 2 bytes (after another group's entry) */
    {"misaligned_entry", LMC_KV_NL_X_NB_TWO_NH_BS_HS, 2, 2, 16, 2, 64, 2, 8, 3, 0, 6, 0},
    /* fp32, one block per chunk, one head */
    {"fp32_one_block", LMC_KV_NL_X_NB_TWO_BS_NH_HS, 2, 1, 32, 1, 128, 4, 4, 1, 0, 0, 0},
};

static void test_reference_kernel_matches_kv_copy(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        print_message("  %s\n", CASES[i].name);
        round_trip(&CASES[i], CASES[i].keep > 1 ? CASES[i].keep / 2 + 1 : 1);
    }
}

static void test_skip_blocks_cover_everything_or_nothing(void **state)
{
    (void)state;
    gcase c = CASES[1];   /* fa_hnd */
    round_trip(&c, c.keep);          /* every block skipped: nothing launched */
    round_trip(&c, c.keep + 10);     /* clamped */
    round_trip(&c, 1);
}

/* ---- units, dims and the parameter block -------------------------------- */

static void test_copy_unit(void **state)
{
    (void)state;
    assert_int_equal(lmc_cuda_copy_unit(256, 0), 16);     /* hs 128 bf16 */
    assert_int_equal(lmc_cuda_copy_unit(1152, 0x7f0000000000), 16);
    assert_int_equal(lmc_cuda_copy_unit(24, 0), 8);       /* MLA hs 12 bf16 */
    assert_int_equal(lmc_cuda_copy_unit(12, 0), 4);
    assert_int_equal(lmc_cuda_copy_unit(6, 0), 2);
    assert_int_equal(lmc_cuda_copy_unit(3, 0), 1);        /* fp8, hs 3 */
    assert_int_equal(lmc_cuda_copy_unit(256, 0x1004), 4); /* a base 4 bytes off */
    assert_int_equal(lmc_cuda_copy_unit(256, 0x1002), 2);
    assert_int_equal(lmc_cuda_copy_unit(256, 0x1008), 8);
    assert_int_equal(lmc_cuda_copy_unit(256, 0x1001), 1);
}

static lmc_cuda_copy_params *packed(lmc_kv_format f, uint32_t nl, uint32_t bs, uint32_t nh,
                                    uint32_t hs, uint32_t es, uint32_t keep)
{
    gcase c = {"dims", f, 2, nl, bs, nh, hs, es, 64, keep, 0, 0, 0};
    if (f == LMC_KV_NL_X_NB_BS_HS || f == LMC_KV_NL_X_NB_BS_NH_TWO_HS)
        c.kv_size = 1;
    lmc_kv_kernel_group g = group_of(&c);
    static uint64_t tensors[LMC_CUDA_MAX_TENSORS];
    static int64_t blocks[LMC_CUDA_MAX_BLOCKS];
    for (uint32_t i = 0; i < LMC_CUDA_MAX_TENSORS; i++)
        tensors[i] = 0x7f0000000000ull + (uint64_t)i * 0x100000;
    lmc_cuda_copy_params *p = malloc(sizeof *p);
    assert_non_null(p);
    char err[256];
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0x7e0000000000ull, true,
                                          err, sizeof err), 0);
    return p;
}

static void test_launch_dims(void **state)
{
    (void)state;
    /* Llama-like: hs 128 bf16 (16 units of 16 bytes), 8 heads, 16 slots */
    lmc_cuda_copy_params *p = packed(LMC_KV_NL_X_TWO_NB_BS_NH_HS, 32, 16, 8, 128, 2, 16);
    lmc_cuda_dims d = lmc_cuda_launch_dims(p);
    assert_int_equal(p->unit, 16);
    assert_int_equal(p->units_per_row, 16);
    assert_int_equal(d.grid[0], 2);
    assert_int_equal(d.grid[1], 16);
    assert_int_equal(d.grid[2], 32);
    assert_int_equal(d.block[0], 16);
    assert_int_equal(d.block[1], 8);
    assert_int_equal(d.block[2], 4);
    p->first_block = 10;                 /* a RETRIEVE skipping 10 blocks */
    assert_int_equal(lmc_cuda_launch_dims(p).grid[1], 6);
    p->first_block = 16;
    assert_int_equal(lmc_cuda_launch_dims(p).grid[1], 0);
    free(p);
    /* 64 heads of 256-byte rows: ty is capped at 512/16, heads loop */
    p = packed(LMC_KV_NL_X_TWO_NB_NH_BS_HS, 2, 16, 64, 128, 2, 4);
    d = lmc_cuda_launch_dims(p);
    assert_int_equal(d.block[0], 16);
    assert_int_equal(d.block[1], 32);
    assert_int_equal(d.block[2], 1);
    free(p);
    /* long rows: hs 576 fp16 MLA (72 units), lanes capped at 32 */
    p = packed(LMC_KV_NL_X_NB_BS_HS, 61, 64, 1, 576, 2, 4);
    d = lmc_cuda_launch_dims(p);
    assert_int_equal(p->unit, 16);
    assert_int_equal(p->units_per_row, 72);
    assert_int_equal(d.grid[0], 1);
    assert_int_equal(d.block[0], 32);
    assert_int_equal(d.block[1], 1);
    assert_int_equal(d.block[2], 16);
    free(p);
    /* tiny rows: one unit, one head, the block's 16 slots */
    p = packed(LMC_KV_NL_X_TWO_NB_BS_NH_HS, 1, 16, 1, 8, 2, 2);
    d = lmc_cuda_launch_dims(p);
    assert_int_equal(d.block[0], 1);
    assert_int_equal(d.block[1], 1);
    assert_int_equal(d.block[2], 16);
    free(p);
}

static void test_tensor_choice(void **state)
{
    (void)state;
    lmc_kv_geometry g = {.format = LMC_KV_NB_NL_TWO_BS_NH_HS, .kv_size = 2, .nl = 5};
    assert_int_equal(lmc_cuda_tensors_needed(&g), 1);
    assert_int_equal(lmc_cuda_tensor_index(&g, 1, 4), 0);
    assert_int_equal(lmc_cuda_formula_layer(&g, 4), 4);
    g.format = LMC_KV_NB_NL_TWO_NH_BS_HS;
    assert_int_equal(lmc_cuda_tensors_needed(&g), 1);
    assert_int_equal(lmc_cuda_formula_layer(&g, 3), 3);
    g.format = LMC_KV_TWO_X_NL_X_NB_BS_NH_HS;
    assert_int_equal(lmc_cuda_tensors_needed(&g), 10);
    assert_int_equal(lmc_cuda_tensor_index(&g, 0, 4), 4);
    assert_int_equal(lmc_cuda_tensor_index(&g, 1, 4), 9);
    assert_int_equal(lmc_cuda_formula_layer(&g, 4), 0);
    g.format = LMC_KV_NL_X_TWO_NB_NH_BS_HS;
    assert_int_equal(lmc_cuda_tensors_needed(&g), 5);
    assert_int_equal(lmc_cuda_tensor_index(&g, 1, 3), 3);
    assert_int_equal(lmc_cuda_formula_layer(&g, 3), 0);
}

static void test_parameter_block_capacity(void **state)
{
    (void)state;
    assert_true(sizeof(lmc_cuda_copy_params) <= LMC_CUDA_PARAM_LIMIT);
    assert_true(sizeof(lmc_cuda_copy_params) > 4096);   /* needs CUDA >= 12.1 */
    static uint64_t tensors[LMC_CUDA_MAX_TENSORS + 8];
    static int64_t blocks[LMC_CUDA_MAX_BLOCKS + 8];
    lmc_cuda_copy_params *p = malloc(sizeof *p);
    assert_non_null(p);
    char err[256];
    gcase c = {"cap", LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 2, 16, 2, 8, 2, 2048, 0, 0, 0, 0};

    c.keep = LMC_CUDA_MAX_BLOCKS;                      /* just fits */
    lmc_kv_kernel_group g = group_of(&c);
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     0);
    c.keep = LMC_CUDA_MAX_BLOCKS + 1;                  /* one block too many */
    g = group_of(&c);
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "1025 blocks"));

    c.keep = 2;
    c.nl = LMC_CUDA_MAX_TENSORS;                       /* one tensor per layer: fits */
    g = group_of(&c);
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     0);
    c.nl = LMC_CUDA_MAX_TENSORS + 1;
    g = group_of(&c);
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "tensors"));
    c.f = LMC_KV_TWO_X_NL_X_NB_BS_NH_HS;               /* K and V lists: twice the tensors */
    c.nl = LMC_CUDA_MAX_TENSORS / 2 + 1;
    g = group_of(&c);
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    c.f = LMC_KV_NB_NL_TWO_BS_NH_HS;                   /* cross-layer: one tensor, any nl */
    c.nl = LMC_CUDA_MAX_TENSORS + 100;
    g = group_of(&c);
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     0);
    assert_int_equal(p->n_tensors, 1);

    /* fewer tensors than the format needs */
    c.f = LMC_KV_NL_X_TWO_NB_BS_NH_HS;
    c.nl = 4;
    g = group_of(&c);
    g.n_tensors = 3;
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    /* block ids outside the tensor, or negative */
    g = group_of(&c);
    blocks[1] = 2048;
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "block id 2048"));
    blocks[1] = -1;
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    blocks[1] = 2047;
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     0);
    /* slots that are not the kept blocks' */
    g.slots++;
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    /* an empty geometry */
    g = group_of(&c);
    g.geo.hs = 0;
    assert_int_equal(lmc_cuda_params_pack(p, &g, tensors, blocks, 0, 0, true, err, sizeof err),
                     -1);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_unit),
        cmocka_unit_test(test_launch_dims),
        cmocka_unit_test(test_tensor_choice),
        cmocka_unit_test(test_parameter_block_capacity),
        cmocka_unit_test(test_reference_kernel_matches_kv_copy),
        cmocka_unit_test(test_skip_blocks_cover_everything_or_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
