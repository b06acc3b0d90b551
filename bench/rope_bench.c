/* rope_bench: CacheBlend's CPU re-rotation and per-token scatter
 * (lmc_kv_rope_scatter, docs/cacheblend.md) alone, outside any
 * server: N stored chunks of [2, 8 layers, 256 tokens, 2 heads x 128]
 * written at a position 7 tokens past a block boundary and shifted from
 * where they were stored (K rotated NeoX style over all 128 dims by a
 * float32 cos/sin cache), into paged tensors of block size 16 through a
 * block table in consecutive order; beside the same call with unshifted
 * matches (scatter only) and a plain memcpy of the same bytes, alternating,
 * three rounds.  Prints each one's GB/s and the ratios to memcpy.
 *
 *   rope_bench [chunks] [bf16|f16|f32] [nhd|hnd]     (default 64 bf16 nhd) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_rope.h"

enum { NL = 8, CS = 256, NH = 2, HS = 128, BS = 16, ROT = 128, SHIFT = 7 };

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *filled(size_t n)
{
    void *p = malloc(n);
    if (p)
        memset(p, 0x3c, n);   /* touched: no first-touch faults in the rounds; 0x3c3c is a
                               * normal number in every 2-byte type */
    return p;
}

/* A float32 cache, cos then sin per row; the values' size is all that
 * matters to the speed, so a rotation by a rational angle per step. */
static float *make_cache(uint64_t rows)
{
    float *c = malloc(rows * ROT * sizeof *c);
    for (uint32_t i = 0; c && i < ROT / 2; i++) {
        float cs = 1, sn = 0, a = 0.6f / (1 + i), b = 0.8f / (1 + i), n = a * a + b * b;
        a /= n;
        b /= n;
        for (uint64_t p = 0; p < rows; p++) {
            c[p * ROT + i] = cs;
            c[p * ROT + ROT / 2 + i] = sn;
            float nc = cs * a - sn * b, ns = sn * a + cs * b, m = nc * nc + ns * ns;
            cs = nc / m;
            sn = ns / m;
        }
    }
    return c;
}

static double timed(const lmc_kv_rope_target *t, const lmc_kv_rope_match *m, size_t n)
{
    char err[256];
    double t0 = now_s();
    if (lmc_kv_rope_scatter(t, m, n, err, sizeof err) != 0) {
        fprintf(stderr, "rope_bench: %s\n", err);
        exit(1);
    }
    return now_s() - t0;
}

static int run(size_t chunks, lmc_kv_rope_dtype kd, lmc_kv_format format)
{
    uint32_t es = lmc_kv_rope_dtype_size(kd);
    uint64_t nb = chunks * CS / BS + 2, rows = (chunks + 1) * CS + SHIFT, span;
    lmc_kv_kernel_group g = {
        .geo = {.format = format, .kv_size = 2, .nl = NL, .nb = nb, .bs = BS, .nh = NH,
                .hs = HS, .element_size = es},
        .n_tensors = NL, .tokens_per_block = BS, .slots = CS,
        .entry_bytes = 2ull * NL * CS * NH * HS * es};
    if (!lmc_kv_span_bytes(&g.geo, &span))
        return fprintf(stderr, "rope_bench: geometry too large\n"), -1;
    g.span_bytes = span;
    uint8_t *layers[NL], *entries = filled(chunks * g.entry_bytes);
    uint8_t *copy = filled(chunks * g.entry_bytes);
    int64_t *ids = malloc(nb * sizeof *ids);
    float *cache_data = make_cache(rows);
    lmc_kv_rope_match *shifted = calloc(chunks, sizeof *shifted);
    lmc_kv_rope_match *still = calloc(chunks, sizeof *still);
    int rc = entries && copy && ids && cache_data && shifted && still ? 0 : -1;
    for (int l = 0; l < NL; l++)
        rc |= (layers[l] = filled(span)) ? 0 : -1;
    if (rc != 0)
        return fprintf(stderr, "rope_bench: out of memory\n"), -1;
    for (uint64_t i = 0; i < nb; i++)
        ids[i] = (int64_t)i;
    for (size_t c = 0; c < chunks; c++) {
        const uint8_t *e = entries + c * g.entry_bytes;
        shifted[c] = (lmc_kv_rope_match){e, g.entry_bytes, c * CS, c * CS + SHIFT, CS};
        still[c] = (lmc_kv_rope_match){e, g.entry_bytes, c * CS + SHIFT, c * CS + SHIFT, CS};
    }
    char err[256];
    lmc_kv_rope_cache cache;
    lmc_kv_rope_geom rope;
    if (lmc_kv_rope_cache_init(&cache, cache_data, rows * ROT * 4, LMC_KV_ROPE_F32, rows, ROT,
                               err, sizeof err) != 0 ||
        lmc_kv_rope_geometry(&g.geo, HS, true, false, 0, 0, ROT, &rope, err, sizeof err) != 0)
        return fprintf(stderr, "rope_bench: %s\n", err), -1;
    lmc_kv_rope_target t = {&g, layers, span, ids, nb, &cache, &rope, kd};
    double gb = chunks * g.entry_bytes / 1e9;
    for (int round = 0; round < 3; round++) {
        double tr = timed(&t, shifted, chunks), ts = timed(&t, still, chunks);
        double t0 = now_s();
        memcpy(copy, entries, chunks * g.entry_bytes);
        double tm = now_s() - t0;
        printf("  rotate+scatter %.2f GB/s (%.2fx memcpy), scatter only %.2f GB/s (%.2fx), "
               "memcpy %.2f GB/s\n",
               gb / tr, tm / tr, gb / ts, tm / ts, gb / tm);
    }
    return 0;
}

int main(int argc, char **argv)
{
    size_t chunks = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    const char *type = argc > 2 ? argv[2] : "bf16", *layout = argc > 3 ? argv[3] : "nhd";
    lmc_kv_rope_dtype kd = strcmp(type, "f16") == 0   ? LMC_KV_ROPE_F16
                           : strcmp(type, "f32") == 0 ? LMC_KV_ROPE_F32
                                                      : LMC_KV_ROPE_BF16;
    bool hnd = strcmp(layout, "hnd") == 0;
    if (chunks < 1 || chunks > 4096 ||
        (strcmp(type, "bf16") && strcmp(type, "f16") && strcmp(type, "f32")) ||
        (!hnd && strcmp(layout, "nhd")))
        return fprintf(stderr, "usage: rope_bench [chunks 1..4096] [bf16|f16|f32] [nhd|hnd]\n"),
               1;
    printf("rope_bench: %zu chunks of %d KiB, %s, %s\n", chunks,
           2 * NL * CS * NH * HS * (int)lmc_kv_rope_dtype_size(kd) / 1024, type, layout);
    return run(chunks, kd, hnd ? LMC_KV_NL_X_TWO_NB_NH_BS_HS : LMC_KV_NL_X_TWO_NB_BS_NH_HS) != 0;
}
