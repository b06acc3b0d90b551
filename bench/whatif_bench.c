/* The trace what-if's speed (issue 33: at least 1 million records a
 * second per policy and size, on one core; docs/trace.md, "What-if").
 *
 *   whatif_bench [--requests N] [--keys K] [--prompts P] [--file PATH]
 *                (defaults 40000 8 4000 /tmp/whatif_bench.lct)
 *
 * Writes a trace of N requests with the recorder's own encoder: each
 * request picks one of P prompts (a skewed pick: a few hot prompts, a
 * long tail) of K 1 MiB chunks and records submit_prefetch_task,
 * reserve_write, finish_write and read_prefetched_results.__enter__ /
 * __exit__ of its K keys, 5 records a request.  Then, timed:
 *   - the baseline: reading and decoding every frame (lmc_trace_reader);
 *   - loading: the same plus building the compact trace;
 *   - each simulation (LRU and noop at 1/4, 1/2 and 5/4 of the distinct
 *     bytes), as records per second and as a ratio to the decode's rate.
 * Also prints this machine's single-thread memcpy speed, as the other
 * benchmarks of BENCHMARKS.md do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "storage/storage_trace.h"
#include "storage/storage_trace_reader.h"
#include "storage/storage_whatif.h"

#define MIB (1u << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static double memcpy_gibs(void)
{
    size_t n = 256u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b)
        return 0;
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e9;
    for (int i = 0; i < 5; i++) {
        double t = now_s();
        memcpy(b, a, n);
        t = now_s() - t;
        best = t < best ? t : best;
        a[i] = b[n - 1 - i];
    }
    free(a);
    free(b);
    return (double)n / best / (1u << 30);
}

static int write_trace(const char *path, size_t requests, size_t k, size_t prompts)
{
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_object_key *keys = calloc(k, sizeof *keys);
    size_t cap = 4096 + k * 128;
    uint8_t *buf = malloc(cap);
    FILE *f = fopen(path, "wb");
    if (!in || !keys || !buf || !f)
        return -1;
    const char *m = lmc_intern(in, "org/model", 9), *salt = lmc_intern(in, "", 0);
    size_t n = lmc_storage_trace_encode_header(buf, cap, "storage", 0, 1.7e9, "{}");
    fwrite(buf, 1, n, f);
    static const lmc_storage_trace_op ops[] = {
        LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK, LMC_STORAGE_TRACE_RESERVE_WRITE,
        LMC_STORAGE_TRACE_FINISH_WRITE, LMC_STORAGE_TRACE_READ_PREFETCHED_ENTER,
        LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT};
    uint64_t seed = 42;
    double t = 0;
    for (size_t r = 0; r < requests; r++) {
        /* skewed: the square of a uniform pick favours low prompt ids */
        uint64_t u = rng(&seed) % prompts;
        uint64_t prompt = u * u / prompts;
        for (size_t i = 0; i < k; i++) {
            keys[i] = (lmc_object_key){.chunk_hash_len = 32, .kv_rank = 0x01000100};
            uint64_t id = prompt * k + i;
            memcpy(keys[i].chunk_hash, &id, sizeof id);
            keys[i].chunk_hash[31] = 0x5a;
            keys[i].model_name = m;
            keys[i].cache_salt = salt;
        }
        for (size_t o = 0; o < 5; o++, t += 1e-4) {
            n = lmc_storage_trace_encode_record(buf, cap, t, 1.7e9 + t, ops[o], keys, k, MIB);
            if (n > cap || fwrite(buf, 1, n, f) != n)
                return -1;
        }
    }
    fclose(f);
    free(buf);
    free(keys);
    lmc_key_interner_free(in);
    return 0;
}

/* Reads every frame; with t, also builds the compact trace.  Records read
 * or 0. */
static uint64_t read_all(const char *path, lmc_storage_whatif_trace *t)
{
    char err[512];
    lmc_trace_reader *r = lmc_trace_reader_open(path, err, sizeof err);
    lmc_trace_record rec;
    uint64_t n = 0;
    int rc;
    if (!r) {
        fprintf(stderr, "whatif_bench: %s\n", err);
        return 0;
    }
    while ((rc = lmc_trace_reader_next(r, &rec, err, sizeof err)) == 1) {
        n++;
        if (t && lmc_storage_whatif_trace_add(t, &rec) != 0)
            rc = -1;
    }
    if (rc != 0)
        fprintf(stderr, "whatif_bench: %s\n", rc < 0 ? err : "out of memory");
    lmc_trace_reader_close(r);
    return rc == 0 ? n : 0;
}

int main(int argc, char **argv)
{
    size_t requests = 40000, k = 8, prompts = 4000;
    const char *path = "/tmp/whatif_bench.lct";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--requests"))
            requests = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--keys"))
            k = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--prompts"))
            prompts = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--file"))
            path = argv[i + 1];
    }
    if (!requests || !k || k > 4096 || !prompts || argc % 2 == 0) {
        fprintf(stderr, "usage: whatif_bench [--requests N] [--keys K <= 4096] [--prompts P] "
                        "[--file PATH]\n");
        return 2;
    }
    printf("memcpy (one thread, 256 MiB): %.1f GiB/s\n", memcpy_gibs());
    if (write_trace(path, requests, k, prompts) != 0) {
        fprintf(stderr, "whatif_bench: cannot write %s\n", path);
        return 1;
    }
    double t0 = now_s();
    uint64_t records = read_all(path, NULL);
    double decode_s = now_s() - t0;
    lmc_storage_whatif_trace *t = lmc_storage_whatif_trace_new();
    t0 = now_s();
    if (!records || !t || read_all(path, t) != records)
        return 1;
    double load_s = now_s() - t0;
    lmc_storage_whatif_summary sum;
    lmc_storage_whatif_trace_summary(t, &sum);
    double decode_rate = (double)records / decode_s;
    printf("trace: %llu records (%zu requests of %zu keys), %llu distinct keys, %llu bytes\n",
           (unsigned long long)records, requests, k, (unsigned long long)sum.distinct_keys,
           (unsigned long long)sum.distinct_bytes);
    printf("baseline, decode only:  %.3f s, %.2f M records/s\n", decode_s, decode_rate / 1e6);
    printf("load (decode + index):  %.3f s, %.2f M records/s\n", load_s,
           (double)records / load_s / 1e6);
    static const char *policies[] = {"LRU", "noop"};
    static const double fractions[] = {0.25, 0.5, 1.25};
    for (size_t p = 0; p < 2; p++) {
        for (size_t f = 0; f < 3; f++) {
            lmc_storage_whatif_config c = {.policy = policies[p],
                                           .l1_bytes = (uint64_t)(sum.distinct_bytes *
                                                                  fractions[f]),
                                           .trigger_watermark = 0.8, .eviction_ratio = 0.2};
            lmc_storage_whatif_result r;
            char err[256];
            t0 = now_s();
            if (lmc_storage_whatif_run(t, &c, &r, err, sizeof err) != 0) {
                fprintf(stderr, "whatif_bench: %s\n", err);
                return 1;
            }
            double s = now_s() - t0, rate = (double)records / s;
            printf("simulate %-4s at %.2fx distinct bytes: %.3f s, %6.2f M records/s "
                   "(%5.2fx decode; goal >= 1 M/s: %s), hit %.3f, %llu evicted\n",
                   policies[p], fractions[f], s, rate / 1e6, rate / decode_rate,
                   rate >= 1e6 ? "met" : "NOT met",
                   r.lookup_keys ? (double)r.hit_keys / (double)r.lookup_keys : 0.0,
                   (unsigned long long)r.evictions);
        }
    }
    lmc_storage_whatif_trace_free(t);
    remove(path);
    return 0;
}
