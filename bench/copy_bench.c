/* Bulk copy bandwidth: glibc memcpy against the non-temporal kernels of
 * kv/bulk_copy.h (16-byte SSE2 stores, 32-byte AVX stores), measured
 * in the same run, alternating methods round by round.
 *
 *   copy_bench [CHUNKS] [ROUNDS] [RUNS]   (defaults 512 5 32768,4096)
 *
 * Each pass moves CHUNKS objects of 2 MiB (1 GiB by default) from one buffer
 * to another of the same size, fencing after every object as the KV path
 * does before it publishes one.  Patterns:
 *   contig   2 MiB copies, object after object;
 *   gather   each object filled in order with RUN-byte copies, each read from
 *            a random RUN-aligned place of the source (a fragmented paged
 *            KV cache gathered into L1 objects);
 *   scatter  the reverse: objects read in order, runs written to random
 *            places (an L1 object scattered back into the paged cache).
 * Both buffers are anonymous 4 KiB-page mappings, touched before timing so
 * that page faults stay out of it.  Prints GiB/s (2^30 bytes per second),
 * best and median of ROUNDS passes, and median stream / median memcpy. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kv/bulk_copy.h"

#define CHUNK ((size_t)2 << 20)
#define MAX_ROUNDS 64
#define MAX_RUNS 8

typedef void (*copy_fn)(void *dst, const void *src, size_t n);

typedef struct {
    const char *name;
    copy_fn copy;
    lmc_copy_method fence;   /* what the batch fences as */
} method;

static void do_memcpy(void *dst, const void *src, size_t n)
{
    lmc_bulk_copy(LMC_COPY_MEMCPY, dst, src, n);
}

typedef enum { CONTIG, GATHER, SCATTER } pattern;

static const char *const pattern_names[] = {"contig", "gather", "scatter"};

typedef struct {
    uint8_t *src, *dst;
    size_t total;      /* bytes per pass */
    uint32_t *perm;    /* random order of the total/run runs */
} arena;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint8_t *map_touched(size_t bytes, int fill)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(p, fill, bytes);
    return p;
}

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* A fixed random permutation of 0..runs-1 (Fisher-Yates). */
static void shuffle(uint32_t *perm, size_t runs)
{
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < runs; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = runs; i > 1; i--) {
        size_t j = next_rand(&x) % i;
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

/* One pass over the arena; seconds. */
static double one_pass(const method *m, arena *a, pattern p, size_t run)
{
    size_t runs = a->total / run, per_chunk = CHUNK / run;
    double t0 = now_s();
    for (size_t i = 0; i < runs; i++) {
        size_t seq = i * run, rnd = (size_t)a->perm[i] * run;
        size_t from = p == GATHER ? rnd : seq, to = p == SCATTER ? rnd : seq;
        m->copy(a->dst + to, a->src + from, run);
        if ((i + 1) % per_chunk == 0)
            lmc_bulk_copy_fence(m->fence);
    }
    return now_s() - t0;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

typedef struct {
    double best, median;   /* GiB/s */
} rate;

static rate summarize(double *secs, int rounds, size_t bytes)
{
    qsort(secs, rounds, sizeof *secs, cmp_double);
    double gib = (double)bytes / (1u << 30);
    double mid = rounds % 2 ? secs[rounds / 2] : (secs[rounds / 2 - 1] + secs[rounds / 2]) / 2;
    return (rate){gib / secs[0], gib / mid};
}

/* ROUNDS passes of every method, methods alternating within each round so
 * that the machine's drift over time hits all of them alike. */
static void bench_row(const method *ms, int nm, arena *a, pattern p, size_t run, int rounds)
{
    double secs[4][MAX_ROUNDS];
    if (p != CONTIG)
        shuffle(a->perm, a->total / run);
    else
        for (size_t i = 0; i < a->total / run; i++)
            a->perm[i] = (uint32_t)i;
    for (int k = 0; k < nm; k++)   /* warm-up: TLB, page tables, caches */
        one_pass(&ms[k], a, p, run);
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < nm; k++)
            secs[k][r] = one_pass(&ms[(k + r) % nm], a, p, run);
    printf("  %-7s %7zu", pattern_names[p], run);
    rate base = {0, 0};
    for (int k = 0; k < nm; k++) {
        /* secs[k][r] ran ms[(k + r) % nm]: gather each method's rounds */
        double own[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            own[r] = secs[((k - r) % nm + nm) % nm][r];
        rate q = summarize(own, rounds, a->total);
        if (k == 0)
            base = q;
        printf("   %6.2f %6.2f", q.best, q.median);
        if (k > 0)
            printf(" %5.2fx", q.median / base.median);
    }
    printf("\n");
}

static int parse_runs(const char *arg, size_t *runs)
{
    int n = 0;
    for (const char *s = arg; *s && n < MAX_RUNS; n++) {
        char *end;
        runs[n] = strtoull(s, &end, 10);
        if (end == s || runs[n] < 64 || CHUNK % runs[n] != 0)
            return -1;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int build_methods(method *ms)
{
    int n = 0;
    ms[n++] = (method){"memcpy", do_memcpy, LMC_COPY_MEMCPY};
#if defined(__x86_64__)
    ms[n++] = (method){"stream16", lmc_bulk_copy_stream16, LMC_COPY_STREAM};
    if (lmc_bulk_copy_has_avx2())
        ms[n++] = (method){"stream32", lmc_bulk_copy_stream32, LMC_COPY_STREAM};
#endif
    return n;
}

int main(int argc, char **argv)
{
    size_t chunks = argc > 1 ? strtoull(argv[1], NULL, 10) : 512;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    size_t runs[MAX_RUNS];
    int nruns = parse_runs(argc > 3 ? argv[3] : "32768,4096", runs);
    if (chunks == 0 || rounds < 1 || rounds > MAX_ROUNDS || nruns <= 0) {
        fprintf(stderr, "usage: %s [CHUNKS>0] [ROUNDS 1..%d] [RUN,RUN,... (divisors of 2 MiB, "
                ">= 64)]\n", argv[0], MAX_ROUNDS);
        return 1;
    }
    method ms[3];
    int nm = build_methods(ms);
    arena a = {.total = chunks * CHUNK};
    a.src = map_touched(a.total, 0x5a);
    a.dst = map_touched(a.total, 0);
    a.perm = malloc(a.total / 64 * sizeof *a.perm);
    if (!a.perm)
        return 1;
    printf("copy_bench: %zu objects of 2 MiB (%.2f GiB per pass), %d rounds; "
           "LMC_COPY_STREAM uses %s\n", chunks, (double)a.total / (1u << 30), rounds,
           lmc_bulk_copy_has_avx2() ? "stream32" : "stream16");
    printf("  GiB/s best median; ratio = median / median memcpy\n");
    printf("  %-7s %7s", "pattern", "run");
    for (int k = 0; k < nm; k++)
        printf("   %-*s", k ? 20 : 13, ms[k].name);
    printf("\n");
    bench_row(ms, nm, &a, CONTIG, CHUNK, rounds);
    for (int i = 0; i < nruns; i++) {
        bench_row(ms, nm, &a, GATHER, runs[i], rounds);
        bench_row(ms, nm, &a, SCATTER, runs[i], rounds);
    }
    munmap(a.src, a.total);
    munmap(a.dst, a.total);
    free(a.perm);
    return 0;
}
