/* kv_gather_bench: the server-driven CPU gather (lmc_kv_gather_chunk) alone,
 * outside any server: N chunks of 2 MiB ([2, 8 layers, 256 tokens, 256],
 * bf16) gathered from paged FlashAttention tensors (block size 16,
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
 *   kv_gather_bench [chunks] [nhd|hnd] [apart]     (default 512 nhd) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kv/kv_copy.h"

enum { NL = 8, BS = 16, NH = 2, HS = 128, CS = 256 };

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

static int run(size_t chunks, bool shared, lmc_kv_format format, bool apart)
{
    size_t nb = 2 * chunks * CS / BS + 1, plane = nb * BS * NH * HS * 2;
    size_t obj = 2ull * NL * CS * NH * HS * 2;
    uint8_t *layers[NL], *dst = buffer(chunks * obj, shared), *src = buffer(chunks * obj, shared);
    int64_t *ids = malloc(2 * chunks * (CS / BS) * sizeof *ids);
    int rc = dst && src && ids ? 0 : -1;
    for (int l = 0; l < NL; l++)
        rc |= (layers[l] = buffer(2 * plane, shared)) ? 0 : -1;
    if (rc != 0)
        return fprintf(stderr, "kv_gather_bench: out of memory\n"), -1;
    size_t n_all = 2 * chunks * (CS / BS);
    for (size_t i = 0; i < n_all; i++)   /* a permutation: 7919 is a prime */
        ids[i] = 1 + (int64_t)(apart ? i * 7919 % n_all : i);
    lmc_kv_kernel_group g = {
        .geo = {.format = format, .kv_size = 2, .nl = NL, .nb = nb,
                .bs = BS, .nh = NH, .hs = HS, .element_size = 2, .block_stride = BS * NH * HS},
        .keep_blocks = CS / BS, .slots = CS, .n_tensors = NL};
    size_t per = CS / BS, n_ids = chunks * per;
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
    bool hnd = strcmp(layout, "hnd") == 0;
    bool apart = argc > 3 && strcmp(argv[3], "apart") == 0;
    if (chunks < 1 || (!hnd && strcmp(layout, "nhd") != 0) || (argc > 3 && !apart))
        return fprintf(stderr, "usage: kv_gather_bench [chunks >= 1] [nhd|hnd] [apart]\n"), 1;
    lmc_kv_format f = hnd ? LMC_KV_NL_X_TWO_NB_NH_BS_HS : LMC_KV_NL_X_TWO_NB_BS_NH_HS;
    return run(chunks, false, f, apart) != 0 || run(chunks, true, f, apart) != 0;
}
