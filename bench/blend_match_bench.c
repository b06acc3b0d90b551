/* The CacheBlend matcher on one long prompt (docs/cacheblend.md, "Matcher").
 *
 *   blend_match_bench [--rounds R] [--chunk-size K]   (defaults 200, 256)
 *
 * 16 documents of 2048 tokens are registered as separate stores (chunk
 * size K, 2^20 chunks of capacity); the query is 32768 tokens: a 100-token
 * preamble, then the documents in another order, cut at 32768 tokens (the
 * last document loses its last chunk).  Every round matches the query and
 * checks the number of matches (a few fewer than the chunks in the query
 * when two chunks' fingerprints share a table slot: the newer one wins).
 * The baselines, in the same run: the rolling fingerprints of the same
 * query alone (the floor of any probe), and the direct per-window hash of
 * every window (O(n·K)).  Medians in µs; then the matcher's bytes per
 * registered chunk. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "modules/blend/blend_matcher.h"

#define DOCS 16
#define DOC_TOKENS 2048
#define QUERY 32768
#define PREAMBLE 100
#define MAX_ROUNDS 10000

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int register_docs(lmc_blend_matcher *m, const lmc_blend_ns *ns, uint64_t (*docs)[DOC_TOKENS],
                         size_t cs)
{
    size_t nh = DOC_TOKENS / cs;
    uint8_t *h = calloc(nh, 32);
    if (!h)
        return -1;
    for (int d = 0; d < DOCS; d++) {
        for (size_t c = 0; c < nh; c++) {
            uint64_t id = (uint64_t)d << 32 | c;
            memcpy(h + c * 32, &id, sizeof id);
        }
        size_t got;
        if (lmc_blend_matcher_register(m, ns, docs[d], DOC_TOKENS, h, nh, 0, 0, &got) != 0 ||
            got != nh) {
            free(h);
            return -1;
        }
    }
    free(h);
    return 0;
}

static void build_query(uint64_t *q, uint64_t (*docs)[DOC_TOKENS])
{
    int order[DOCS];
    for (int i = 0; i < DOCS; i++)
        order[i] = i;
    for (int i = DOCS - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < PREAMBLE; i++)
        q[i] = 200000 + rnd() % 50000;
    for (size_t pos = PREAMBLE, i = 0; pos < QUERY; pos += DOC_TOKENS, i++) {
        size_t n = QUERY - pos < DOC_TOKENS ? QUERY - pos : DOC_TOKENS;
        memcpy(q + pos, docs[order[i]], n * sizeof *q);
    }
}

int main(int argc, char **argv)
{
    int rounds = 200;
    size_t cs = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--chunk-size") == 0)
            cs = (size_t)atoi(argv[i + 1]);
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || cs < 1 || cs > DOC_TOKENS || DOC_TOKENS % cs) {
        fprintf(stderr,
                "usage: blend_match_bench [--rounds 1..%d] [--chunk-size K, K divides %d]\n",
                MAX_ROUNDS, DOC_TOKENS);
        return 2;
    }
    static uint64_t docs[DOCS][DOC_TOKENS], q[QUERY], r[QUERY];
    static double t_match[MAX_ROUNDS], t_roll[MAX_ROUNDS], t_direct[MAX_ROUNDS];
    for (int d = 0; d < DOCS; d++)
        for (size_t i = 0; i < DOC_TOKENS; i++)
            docs[d][i] = rnd() % 150000;
    build_query(q, docs);
    lmc_blend_matcher_opts o = {.chunk_size = (uint32_t)cs, .hash_len = 32,
                                .max_chunks = LMC_BLEND_MAX_CHUNKS};
    lmc_blend_matcher *m = NULL;
    char err[128];
    const lmc_blend_ns ns = {"bench-model", "", 1};
    if (lmc_blend_matcher_new(&o, &m, err, sizeof err) != 0 || register_docs(m, &ns, docs, cs)) {
        fprintf(stderr, "blend_match_bench: setup failed: %s\n", err);
        return 1;
    }
    size_t want = DOCS * (DOC_TOKENS / cs) - (PREAMBLE + cs - 1) / cs;
    uint64_t sink = 0;
    size_t got = 0;
    for (int k = 0; k < rounds; k++) {
        lmc_blend_candidate *res;
        size_t n;
        double t0 = now_us();
        int rc = lmc_blend_matcher_match(m, &ns, q, QUERY, &res, &n);
        double t1 = now_us();
        lmc_blend_rolling(q, QUERY, cs, r);
        double t2 = now_us();
        for (size_t p = 0; p + cs <= QUERY; p++)
            sink += lmc_blend_fingerprint(q + p, cs);
        double t3 = now_us();
        free(res);
        if (rc != 0 || n > want || n + 8 < want) {
            fprintf(stderr, "blend_match_bench: %zu matches, want %zu\n", n, want);
            return 1;
        }
        got = n;
        t_match[k] = t1 - t0;
        t_roll[k] = t2 - t1;
        t_direct[k] = t3 - t2;
        sink += r[k % QUERY];
    }
    printf("blend_match_bench: %d documents x %d tokens, query %d tokens, chunk %zu, %zu of %zu "
           "chunks matched, %d rounds (checksum %llu)\n",
           DOCS, DOC_TOKENS, QUERY, cs, got, want, rounds, (unsigned long long)(sink & 0xff));
    printf("  match (rolling + probe + result)   %9.1f us median\n", median(t_match, rounds));
    printf("  baseline: rolling fingerprints     %9.1f us median\n", median(t_roll, rounds));
    printf("  baseline: direct hash per window   %9.1f us median\n", median(t_direct, rounds));
    size_t big = lmc_blend_matcher_bytes(LMC_BLEND_MAX_CHUNKS);
    printf("  memory: %zu bytes at %u chunks = %.1f bytes per registered chunk "
           "(entry %d + bucket 4 + the 4 MiB table spread over them)\n",
           big, LMC_BLEND_MAX_CHUNKS, (double)big / LMC_BLEND_MAX_CHUNKS, LMC_BLEND_ENTRY_BYTES);
    lmc_blend_matcher_free(m);
    return 0;
}
