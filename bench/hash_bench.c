/* Token hashing throughput: lmcached's chunked, prefix-chained blake3 over a
 * long prompt, beside single-threaded `b3sum` over a file of the same number
 * of bytes, measured in the same run.
 *
 *   hash_bench [TOKENS] [CHUNK] [ROUNDS]   (defaults 32768 256 400)
 *
 * Prints bytes hashed per second for both and their ratio.  The chain hashes
 * one chunk (4*CHUNK bytes + a 32-byte prefix) at a time, so BLAKE3's
 * multi-chunk SIMD parallelism is only partly available; b3sum over one big
 * buffer is the ceiling. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hash/token_hash.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double bench_chain(const lmc_token_hasher *h, const uint64_t *tokens, size_t n,
                          int rounds, uint8_t *out)
{
    double start = now_s();
    for (int r = 0; r < rounds; r++) {
        if (lmc_hash_chunks(h, tokens, n, 0, n, out) != LMC_HASH_OK) {
            fprintf(stderr, "hash failed\n");
            exit(1);
        }
    }
    return now_s() - start;
}

/* Time of `b3sum --num-threads 1` over a file of `bytes` bytes, best of 3. */
static double bench_b3sum(size_t bytes)
{
    char path[] = "/tmp/lmc-hash-bench-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    char *buf = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        buf[i] = (char)(i * 2654435761u >> 13);
    if (write(fd, buf, bytes) != (ssize_t)bytes) {
        close(fd);
        unlink(path);
        free(buf);
        return -1;
    }
    close(fd);
    free(buf);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "b3sum --num-threads 1 --no-names %s > /dev/null", path);
    double best = 1e9;
    for (int i = 0; i < 3; i++) {
        double t0 = now_s();
        if (system(cmd) != 0) {
            unlink(path);
            return -1;
        }
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    unlink(path);
    return best;
}

/* A new request whose prompt was seen before: a fresh chain per round,
 * every step answered by the memo (what LOOKUP does for a shared prompt). */
static double bench_memo_chain(const lmc_token_hasher *h, const uint64_t *tokens, size_t n,
                               int rounds)
{
    double start = now_s();
    for (int r = 0; r < rounds; r++) {
        lmc_hash_chain *c = lmc_hash_chain_new(h);
        if (!c || lmc_hash_chain_extend_to(c, tokens, n, n) != LMC_HASH_OK) {
            fprintf(stderr, "memoized chain failed\n");
            exit(1);
        }
        lmc_hash_chain_free(c);
    }
    return now_s() - start;
}

int main(int argc, char **argv)
{
    size_t n_tokens = argc > 1 ? strtoul(argv[1], NULL, 10) : 32768;
    uint32_t chunk = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 256;
    int rounds = argc > 3 ? atoi(argv[3]) : 400;
    n_tokens -= n_tokens % chunk;
    lmc_token_hasher *h;
    char err[256];
    if (lmc_token_hasher_new("blake3", chunk, NULL, &h, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint64_t *tokens = malloc(n_tokens * sizeof *tokens);
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i] = (i * 7919u) % 128256u;
    uint8_t *out = malloc(n_tokens / chunk * LMC_TOKEN_HASH_LEN);
    bench_chain(h, tokens, n_tokens, rounds / 10 + 1, out); /* warm-up */
    double t = bench_chain(h, tokens, n_tokens, rounds, out);
    size_t chunks = n_tokens / chunk;
    double bytes = (double)rounds * chunks * (chunk * 4.0 + LMC_TOKEN_HASH_LEN);
    double ours = bytes / t;
    double b3_time = bench_b3sum((size_t)bytes);
    printf("token hashing: %zu tokens, chunk %u, %d rounds\n", n_tokens, chunk, rounds);
    printf("  lmcached chain : %8.1f MB/s  (%.1f us per %zu-token prompt)\n", ours / 1e6,
           t / rounds * 1e6, n_tokens);
    if (b3_time > 0) {
        double theirs = bytes / b3_time;
        printf("  b3sum 1 thread : %8.1f MB/s  (same byte count, one buffer, incl. process start)\n",
               theirs / 1e6);
        printf("  ratio          : %.2fx\n", ours / theirs);
    } else {
        printf("  b3sum unavailable: no baseline\n");
    }
    if (lmc_token_hasher_enable_memo(h, 16u << 20) != 0) {
        fprintf(stderr, "cannot enable the hash memo\n");
        return 1;
    }
    bench_memo_chain(h, tokens, n_tokens, 2); /* fills the memo */
    double tm = bench_memo_chain(h, tokens, n_tokens, rounds);
    printf("  memo hit chain : %8.1f us per %zu-token prompt (a new request, prompt seen before)\n",
           tm / rounds * 1e6, n_tokens);
    free(tokens);
    free(out);
    lmc_token_hasher_free(h);
    return 0;
}
