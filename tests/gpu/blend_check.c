/* The GPU check of CacheBlend's device executor (docs/cacheblend.md,
 * "CUDA kernels"): liblmcached_cuda.so's blend_execute against the CPU
 * executor lmc_kv_blend_execute on the same plan, objects and cos/sin
 * cache, for FlashAttention NHD and HND, bf16 and f32, NeoX (full
 * rotary) and GPT-J (partial rotary), with chunks moved (re-rotated) and
 * one left in place; then the other tensor layouts once each (cross-layer,
 * FlashInfer, K/V lists, fused K/V, MLA's padded rows with a rope window).
 * V and every byte outside the rotation windows must be identical; the
 * rotated K elements within twice the documented tolerance of the
 * rotation (both results are within it of the float64 reference).  Then a plan with
 * a bad row must be refused with a reason and nothing written.
 *
 *   blend_check LIBLMCACHED_CUDA_SO [--skip-without-gpu]
 *
 * Exit 0 PASS, 1 FAIL, 77 no GPU (with --skip-without-gpu).  Built twice:
 * against CUDA's runtime as blend_check (ctest gpu.blend_check, and
 * tests/gpu/run.sh from the bundle), and against tests/gpu/host_shim as
 * blend_check_host, which drives cuda_blend.cu compiled for the CPU (ctest
 * gpu.blend_kernels_on_host, in every build). */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_launch.h"
#include "kv/cuda_transfer.h"
#include "kv/kv_blend_plan.h"
#include "rope_ref.h"

enum { NL = 2, NB = 16, BS = 4, SLOTS = 8, MAX_POS = 128, MAX_BATCH = 2, N_CHUNKS = 3,
       MAX_TENSORS = 2 * NL, SENTINEL = 0xA5 };

static const lmc_kv_blend_chunk g_chunks[N_CHUNKS] = {
    {0, 5, 13},     /* moved, starting inside a block */
    {16, 16, 22},   /* in place, partial */
    {40, 24, 32}};  /* moved backwards */

/* kv_size planes of nh heads of hs elements; rotation: head_size, style,
 * the cache's width, an optional window (MLA's latent row). */
typedef struct bcase {
    lmc_kv_format format;
    lmc_kv_rope_dtype kd;
    bool neox;
    uint32_t rot_dim;
    const char *name;
    uint32_t kv_size, nh, hs, head_size, pad;
    bool window;
    uint32_t win_offset;
} bcase;

/* Everything one case owns, host and device. */
typedef struct fixture {
    lmc_kv_kernel_group kg;
    lmc_kv_plan kv;
    int64_t table[NB];
    const int64_t *blocks[1];
    uint64_t n_blocks[1];
    bool rope_on[1];
    uint32_t read[1];
    lmc_kv_blend_input in;
    lmc_kv_blend_plan plan;
    void *plan_mem;
    lmc_kv_rope_cache cache;
    lmc_kv_rope_geom rope;
    uint8_t *cache_data;
    uint8_t *objects[N_CHUNKS];       /* pinned */
    uint8_t *cpu[MAX_TENSORS];
    uint8_t *k_mask[MAX_TENSORS];    /* 1: a K element in the rotation window */
    void *dev[MAX_TENSORS];
    void *dev_cache;
    uint64_t span;
    uint32_t n_tensors;
} fixture;

static const lmc_cuda_ops *g_ops;
static lmc_cuda_stream *g_stream;

#define CK(call)                                                                  \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) {                                                  \
            printf("FAIL: %s: %s\n", #call, cudaGetErrorString(e_));              \
            return -1;                                                            \
        }                                                                         \
    } while (0)

static uint32_t g_rng = 12345;
static double next_value(void)   /* a multiple of 1/64 in (-2, 2): exact in every type */
{
    g_rng = g_rng * 1103515245u + 12345u;
    return (double)((int)((g_rng >> 16) % 255) - 127) / 64;
}

static int setup_plan(fixture *f, const bcase *c, char *err)
{
    uint32_t es = lmc_kv_rope_dtype_size(c->kd);
    f->kg.geo = (lmc_kv_geometry){c->format, c->kv_size, NL, NB, BS, c->nh, c->hs, es,
                                  (uint64_t)BS * c->hs + c->pad};
    f->n_tensors = lmc_cuda_tensors_needed(&f->kg.geo);
    f->kg.n_tensors = f->n_tensors;
    f->kg.tokens_per_block = BS;
    f->kg.keep_blocks = SLOTS / BS;
    f->kg.slots = SLOTS;
    f->kg.entry_bytes = (uint64_t)c->kv_size * NL * SLOTS * c->nh * c->hs * es;
    if (!lmc_kv_span_bytes(&f->kg.geo, &f->span))
        return snprintf(err, 256, "span"), -1;
    f->kg.span_bytes = f->span;
    f->kv = (lmc_kv_plan){.kg = &f->kg, .n_kg = 1, .n_og = 1};
    f->kv.og[0] = (lmc_kv_object_group){
        .members = {0}, .n_members = 1, .object_size = f->kg.entry_bytes, .chunks_in_sw = -1};
    for (int j = 0; j < NB; j++)
        f->table[j] = (j * 5 + 3) % NB;
    f->blocks[0] = f->table;
    f->n_blocks[0] = NB;
    f->rope_on[0] = true;
    f->in = (lmc_kv_blend_input){&f->kv, f->read, 1, g_chunks, N_CHUNKS, f->blocks,
                                 f->n_blocks, f->rope_on, MAX_BATCH};
    uint64_t bytes = 0;
    if (lmc_kv_blend_plan_size(&f->in, &bytes, err, 256) != 0)
        return -1;
    f->plan_mem = malloc(bytes + 8);
    if (lmc_kv_blend_plan_build(&f->in, f->plan_mem, bytes, &f->plan, err, 256) != 0)
        return -1;
    f->cache_data = rope_ref_cache(c->kd, c->rot_dim, MAX_POS);
    if (lmc_kv_rope_cache_init(&f->cache, f->cache_data, (uint64_t)MAX_POS * c->rot_dim * es,
                               c->kd, MAX_POS, c->rot_dim, err, 256) != 0 ||
        lmc_kv_rope_geometry(&f->kg.geo, c->head_size, c->neox, c->window, c->win_offset,
                             c->rot_dim, c->rot_dim, &f->rope, err, 256) != 0)
        return -1;
    return 0;
}

static int setup_memory(fixture *f, const bcase *c)
{
    uint32_t es = lmc_kv_rope_dtype_size(c->kd);
    for (int i = 0; i < N_CHUNKS; i++) {
        CK(cudaMallocHost((void **)&f->objects[i], f->kg.entry_bytes));
        for (uint64_t k = 0; k < f->kg.entry_bytes / es; k++)
            enc(c->kd, f->objects[i] + k * es, next_value());
    }
    for (uint32_t l = 0; l < f->n_tensors; l++) {
        f->cpu[l] = malloc(f->span);
        f->k_mask[l] = calloc(f->span / es, 1);
        memset(f->cpu[l], SENTINEL, f->span);
        CK(cudaMalloc(&f->dev[l], f->span));
        CK(cudaMemset(f->dev[l], SENTINEL, f->span));
    }
    uint64_t cb = (uint64_t)MAX_POS * c->rot_dim * es;
    CK(cudaMalloc(&f->dev_cache, cb));
    CK(cudaMemcpy(f->dev_cache, f->cache_data, cb, cudaMemcpyHostToDevice));
    return 0;
}

static void teardown(fixture *f)
{
    for (int i = 0; i < N_CHUNKS; i++)
        if (f->objects[i])
            cudaFreeHost(f->objects[i]);
    for (uint32_t l = 0; l < f->n_tensors; l++) {
        free(f->cpu[l]);
        free(f->k_mask[l]);
        if (f->dev[l])
            cudaFree(f->dev[l]);
    }
    if (f->dev_cache)
        cudaFree(f->dev_cache);
    free(f->cache_data);
    free(f->plan_mem);
}

static int run_cpu(fixture *f, const bcase *c, char *err)
{
    uint8_t *bases[MAX_TENSORS];
    for (uint32_t l = 0; l < f->n_tensors; l++)
        bases[l] = f->cpu[l];
    lmc_kv_blend_group_io io = {bases, f->span, &f->cache, &f->rope, c->kd};
    uint64_t pool_bytes = f->plan.slot_stride * MAX_BATCH;
    uint8_t *pool = malloc(pool_bytes);
    int rc = lmc_kv_blend_execute(&f->in, &f->plan, (const uint8_t *const *)f->objects, &io, pool,
                                  pool_bytes, err, 256);
    free(pool);
    return rc;
}

/* blend_execute on a (possibly altered) plan, then a sync. */
static int run_gpu(fixture *f, const bcase *c, const lmc_kv_blend_plan *plan, char *err)
{
    uint64_t tensors[MAX_TENSORS];
    for (uint32_t l = 0; l < f->n_tensors; l++)
        tensors[l] = (uint64_t)(uintptr_t)f->dev[l];
    lmc_cuda_blend_group grp = {&f->kg, tensors, (uint64_t)(uintptr_t)f->dev_cache, MAX_POS,
                                c->kd, f->rope, c->kd};
    lmc_cuda_blend b = {plan, &grp, (const uint8_t *const *)f->objects, 1, N_CHUNKS, MAX_BATCH};
    if (g_ops->blend_execute(g_stream, &b, err, 256) != 0)
        return -1;
    return g_ops->sync(g_stream, err, 256);
}

/* Where plane 0's rotation window lies in the tensors. */
static void mark_k(fixture *f)
{
    const lmc_kv_geometry *g = &f->kg.geo;
    for (uint32_t l = 0; l < NL; l++)
        for (uint64_t b = 0; b < NB; b++)
            for (uint32_t s = 0; s < BS; s++)
                for (uint32_t h = 0; h < g->nh; h++)
                    for (uint32_t e = 0; e < g->hs; e++)
                        if (rope_ref_in_window(&f->rope, h * g->hs + e))
                            f->k_mask[lmc_kv_rope_tensor(g, 0, l)]
                                     [lmc_kv_rope_dst_offset(g, 0, l, b, s, h) + e] = 1;
}

/* Every element of every tensor: rotated K within tol of the CPU's,
 * everything else identical. */
static int compare(fixture *f, const bcase *c)
{
    uint32_t es = lmc_kv_rope_dtype_size(c->kd);
    /* the stored values are under 2 in magnitude: |x| + |y| < 4 */
    double tol = 2 * ((unit_roundoff(c->kd) + 64 * 0x1p-24) * 4 +
                      (c->kd == LMC_KV_ROPE_F16 ? 0x1p-25 : 0));
    uint64_t n = f->span / es, written = 0, k_diff = 0;
    uint8_t *got = malloc(f->span);
    int rc = 0;
    mark_k(f);
    for (uint32_t l = 0; l < f->n_tensors && rc == 0; l++) {
        if (cudaMemcpy(got, f->dev[l], f->span, cudaMemcpyDeviceToHost) != cudaSuccess) {
            printf("FAIL %s: cudaMemcpy back\n", c->name);
            rc = -1;
            break;
        }
        for (uint64_t e = 0; e < n; e++) {
            const uint8_t *g = got + e * es, *w = f->cpu[l] + e * es;
            written += memcmp(w, "\xA5\xA5\xA5\xA5", es) != 0;
            if (memcmp(g, w, es) == 0)
                continue;
            double d = dec(c->kd, g) - dec(c->kd, w);
            if (f->k_mask[l][e] && d <= tol && d >= -tol) {
                k_diff++;
                continue;
            }
            printf("FAIL %s: tensor %u element %llu (%s): device %.9g, CPU %.9g\n", c->name, l,
                   (unsigned long long)e, f->k_mask[l][e] ? "rotated K" : "exact",
                   dec(c->kd, g), dec(c->kd, w));
            rc = -1;
            break;
        }
    }
    free(got);
    if (rc == 0 && written == 0) {
        printf("FAIL %s: the CPU executor wrote nothing\n", c->name);
        rc = -1;
    }
    if (rc == 0)
        printf("ok   %s: %llu elements written, %llu rotated ones differ in the last bits\n",
               c->name, (unsigned long long)written, (unsigned long long)k_diff);
    return rc;
}

/* A scatter row pointing past the pool: refused, nothing written. */
static int check_refusal(fixture *f, const bcase *c)
{
    char err[256] = "";
    lmc_kv_blend_plan bad = f->plan;
    size_t sz = f->plan.n_scatters * sizeof(lmc_kv_blend_scatter);
    lmc_kv_blend_scatter *rows = malloc(sz);
    memcpy(rows, f->plan.scatters, sz);
    rows[f->plan.n_scatters - 1].slot = MAX_BATCH;
    bad.scatters = rows;
    int rc = run_gpu(f, c, &bad, err);
    free(rows);
    if (rc == 0 || !strstr(err, "scatter row")) {
        printf("FAIL %s: a scatter row into slot %d was not refused (rc %d, \"%s\")\n", c->name,
               MAX_BATCH, rc, err);
        return -1;
    }
    printf("ok   %s: refused: %s\n", c->name, err);
    return 0;
}

static int run_case(const bcase *c, bool refusal)
{
    fixture f;
    memset(&f, 0, sizeof f);
    char err[256] = "";
    int rc = setup_plan(&f, c, err);
    if (rc != 0)
        printf("FAIL %s: plan: %s\n", c->name, err);
    if (rc == 0)
        rc = setup_memory(&f, c);
    if (rc == 0 && refusal)
        rc = check_refusal(&f, c);
    if (rc == 0 && (rc = run_cpu(&f, c, err)) != 0)
        printf("FAIL %s: CPU executor: %s\n", c->name, err);
    if (rc == 0 && (rc = run_gpu(&f, c, &f.plan, err)) != 0)
        printf("FAIL %s: blend_execute: %s\n", c->name, err);
    if (rc == 0)
        rc = compare(&f, c);
    teardown(&f);
    return rc;
}

static int open_plugin(const char *path, bool skip)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("%s: no CUDA device\n", skip ? "SKIP" : "FAIL");
        return skip ? 77 : 1;
    }
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const lmc_cuda_ops *(*entry)(void) =
        dl ? (const lmc_cuda_ops *(*)(void))dlsym(dl, LMC_CUDA_ENTRY) : NULL;
    g_ops = entry ? entry() : NULL;
    if (!g_ops || g_ops->abi_version != LMC_CUDA_ABI_VERSION) {
        printf("FAIL: %s: %s\n", path, dl ? "not of this ABI" : dlerror());
        return 1;
    }
    char err[256] = "";
    int devices = 0;
    if (g_ops->init(&devices, err, sizeof err) != 0 ||
        !(g_stream = g_ops->stream_new(0, 0, err, sizeof err))) {
        printf("FAIL: plugin: %s\n", err);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: blend_check LIBLMCACHED_CUDA_SO [--skip-without-gpu]\n");
        return 2;
    }
    int rc = open_plugin(argv[1], argc > 2 && strcmp(argv[2], "--skip-without-gpu") == 0);
    if (rc != 0)
        return rc;
#define KV2 2, 2, 16, 16, 0, false, 0   /* K and V planes, two heads of 16 */
    static const bcase cases[] = {
        {LMC_KV_NL_X_TWO_NB_BS_NH_HS, LMC_KV_ROPE_BF16, true, 16, "NHD bf16 NeoX", KV2},
        {LMC_KV_NL_X_TWO_NB_BS_NH_HS, LMC_KV_ROPE_BF16, false, 8, "NHD bf16 GPT-J partial",
         KV2},
        {LMC_KV_NL_X_TWO_NB_BS_NH_HS, LMC_KV_ROPE_F32, true, 16, "NHD f32 NeoX", KV2},
        {LMC_KV_NL_X_TWO_NB_BS_NH_HS, LMC_KV_ROPE_F32, false, 8, "NHD f32 GPT-J partial", KV2},
        {LMC_KV_NL_X_TWO_NB_NH_BS_HS, LMC_KV_ROPE_BF16, true, 16, "HND bf16 NeoX", KV2},
        {LMC_KV_NL_X_TWO_NB_NH_BS_HS, LMC_KV_ROPE_BF16, false, 8, "HND bf16 GPT-J partial",
         KV2},
        {LMC_KV_NL_X_TWO_NB_NH_BS_HS, LMC_KV_ROPE_F32, true, 16, "HND f32 NeoX", KV2},
        {LMC_KV_NL_X_TWO_NB_NH_BS_HS, LMC_KV_ROPE_F32, false, 8, "HND f32 GPT-J partial", KV2},
        {LMC_KV_NB_NL_TWO_BS_NH_HS, LMC_KV_ROPE_F16, true, 16, "cross-layer f16 NeoX", KV2},
        {LMC_KV_NL_X_NB_TWO_NH_BS_HS, LMC_KV_ROPE_BF16, false, 16, "FlashInfer HND bf16 GPT-J",
         KV2},
        {LMC_KV_TWO_X_NL_X_NB_BS_NH_HS, LMC_KV_ROPE_BF16, true, 8, "K/V lists bf16 NeoX partial",
         KV2},
        {LMC_KV_NL_X_NB_BS_NH_TWO_HS, LMC_KV_ROPE_BF16, true, 16, "fused K/V bf16 NeoX", 1, 2, 32,
         16, 0, false, 0},
        {LMC_KV_NL_X_NB_BS_HS, LMC_KV_ROPE_BF16, false, 8, "MLA padded bf16 GPT-J window", 1, 1,
         24, 24, 8, true, 16},
    };
#undef KV2
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        failed += run_case(&cases[i], i == 0) != 0;
    g_ops->stream_free(g_stream);
    printf("%s: blend_check, %d of %zu cases failed\n", failed ? "FAIL" : "PASS", failed,
           sizeof cases / sizeof cases[0]);
    return failed ? 1 : 0;
}
