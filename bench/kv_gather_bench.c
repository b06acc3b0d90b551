/* kv_gather_bench: the server-driven CPU gather (lmc_kv_gather_chunk) alone,
 * outside any server: N chunks of 2 MiB ([2, 8 layers, 256 tokens, 256],
 * bf16; `mla`: [1, 8, 256, 576], block size 64) gathered from paged tensors (block size 16,
 * consecutive blocks) beside a straight streaming copy of the same bytes,
 * alternating, three rounds; in private memory and in shared memory
 * (memfd, 4 KiB pages, as the engine's segments and the L1 pool are).
 * It separates the copy loop's own speed from what the server around it
 * costs (BENCHMARKS.md, "Server-driven transfers").  `hnd` gathers from
 * [2, NB, NH, BS, HS] tensors instead (the transposing kernel); each round
 * also times the scatter of the same objects back into other blocks.
 *
 * `apart` hands out the blocks in a scattered order, as a long-running
 * engine's free list does, instead of consecutively.
 *
 *   kv_gather_bench [chunks] [nhd|hnd|mla] [apart]     (default 512 nhd) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kv/kv_copy.h"

enum { NL = 8, CS = 256 };

/* One layout's paged tensors: FlashAttention's NHD or HND (bf16, block
 * size 16, 2 heads of 128), or MLA's one latent row of 576 per token
 * (DeepSeek's 512 + 64, block size 64). */
typedef struct shape {
    lmc_kv_format format;
    uint32_t kv, bs, nh, hs;
} shape;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *buffer(size_t n, bool shared)
{
    void *p = NULL;
    if (!shared) {
        p = malloc(n);
    } else {
        int fd = memfd_create("kv_gather_bench", 0);
        if (fd >= 0 && ftruncate(fd, (off_t)n) == 0)
            p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0)
            close(fd);
        p = p == MAP_FAILED ? NULL : p;
    }
    if (p)
        memset(p, 7, n);   /* touched: no first-touch faults in the rounds */
    return p;
}

static int run(size_t chunks, bool shared, const shape *sh, bool apart)
{
    size_t per = CS / sh->bs, row = (size_t)sh->nh * sh->hs * 2;
    size_t nb = 2 * chunks * per + 1, plane = nb * sh->bs * row, obj = sh->kv * NL * CS * row;
    uint8_t *layers[NL], *dst = buffer(chunks * obj, shared), *src = buffer(chunks * obj, shared);
    int64_t *ids = malloc(2 * chunks * per * sizeof *ids);
    int rc = dst && src && ids ? 0 : -1;
    for (int l = 0; l < NL; l++)
        rc |= (layers[l] = buffer(sh->kv * plane, shared)) ? 0 : -1;
    if (rc != 0)
        return fprintf(stderr, "kv_gather_bench: out of memory\n"), -1;
    size_t n_all = 2 * chunks * per;
    for (size_t i = 0; i < n_all; i++)   /* a permutation: 7919 is a prime */
        ids[i] = 1 + (int64_t)(apart ? i * 7919 % n_all : i);
    lmc_kv_kernel_group g = {
        .geo = {.format = sh->format, .kv_size = sh->kv, .nl = NL, .nb = nb, .bs = sh->bs,
                .nh = sh->nh, .hs = sh->hs, .element_size = 2,
                .block_stride = (uint64_t)sh->bs * sh->nh * sh->hs},
        .keep_blocks = (uint32_t)per, .slots = CS, .n_tensors = NL};
    size_t n_ids = chunks * per;
    for (int round = 0; round < 3; round++) {
        double t0 = now_s();
        for (size_t c = 0; c < chunks; c++) {
            lmc_kv_chunk_copy cc = {.g = &g, .bases = layers, .blocks = ids + c * per,
                                    .entry = dst + c * obj, .method = LMC_COPY_STREAM};
            lmc_kv_gather_chunk(&cc);
        }
        double t1 = now_s();
        for (size_t c = 0; c < chunks; c++)
            lmc_bulk_copy(LMC_COPY_STREAM, dst + c * obj, src + c * obj, obj);
        lmc_bulk_copy_fence(LMC_COPY_STREAM);
        double t2 = now_s();
        for (size_t c = 0; c < chunks; c++) {   /* into the blocks after the stored ones */
            lmc_kv_chunk_copy cc = {.g = &g, .bases = layers, .blocks = ids + n_ids + c * per,
                                    .entry = dst + c * obj, .method = LMC_COPY_STREAM};
            lmc_kv_scatter_chunk(&cc);
        }
        double t3 = now_s(), gb = chunks * obj / 1e9;
        printf("  %s memory: gather %.2f GB/s (%.2fx), scatter %.2f GB/s (%.2fx) beside a "
               "straight copy at %.2f GB/s\n",
               shared ? "shared " : "private", gb / (t1 - t0), (t2 - t1) / (t1 - t0),
               gb / (t3 - t2), (t2 - t1) / (t3 - t2), gb / (t2 - t1));
    }
    return 0;
}

int main(int argc, char **argv)
{
    size_t chunks = argc > 1 ? strtoul(argv[1], NULL, 10) : 512;
    const char *layout = argc > 2 ? argv[2] : "nhd";
    static const shape shapes[] = {{LMC_KV_NL_X_TWO_NB_BS_NH_HS, 2, 16, 2, 128},
                                   {LMC_KV_NL_X_TWO_NB_NH_BS_HS, 2, 16, 2, 128},
                                   {LMC_KV_NL_X_NB_BS_HS, 1, 64, 1, 576}};
    static const char *const names[] = {"nhd", "hnd", "mla"};
    const shape *sh = NULL;
    for (int i = 0; i < 3; i++)
        sh = strcmp(layout, names[i]) == 0 ? &shapes[i] : sh;
    bool apart = argc > 3 && strcmp(argv[3], "apart") == 0;
    if (chunks < 1 || !sh || (argc > 3 && !apart))
        return fprintf(stderr, "usage: kv_gather_bench [chunks >= 1] [nhd|hnd|mla] [apart]\n"), 1;
    return run(chunks, false, sh, apart) != 0 || run(chunks, true, sh, apart) != 0;
}
