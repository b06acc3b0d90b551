/* LOOKUP key decoding: the time lmcached spends decoding a 32,768-token
 * IPCCacheServerKey frame before it may answer (lmc_ipc_key_decode_frame:
 * every field checked, token ids into an array), beside msgpack-c's generic
 * msgpack_unpack of the same frame into its object tree, measured in the
 * same run.
 *
 *   decode_bench [TOKENS] [ROUNDS]   (defaults 32768 2000)
 *
 * Three token-id mixes: the transfer bench's (ids below 128,000 from a
 * fixed stride, so 16- and 32-bit forms alternate in a pattern a branch
 * predictor partly learns), an estimate of prose (token_id) and uniformly
 * random ids below 128,000 (the widths are unpredictable).  Each round decodes the next of KEYS different prompts, so
 * that the branch predictor cannot learn one prompt by heart.  Prints the
 * median time of ROUNDS for each. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "modules/services/ipc_key.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

enum { KEYS = 32 };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef enum { IDS_STRIDE, IDS_RANDOM, IDS_TEXT } id_mix;

/* One token id of the mix.  IDS_TEXT is an estimate of English prose
 * through a 128k BPE vocabulary (single-byte punctuation and digits below
 * 128, most words between 256 and 65535, a few rarer ones above): 12 %
 * fixint, 3 % uint8, 80 % uint16, 5 % uint32 forms, in random order. */
static uint64_t token_id(id_mix mix, unsigned seed, size_t i)
{
    if (mix == IDS_STRIDE)
        return (seed * 2654435761u + i * 40503u) % 128000;
    if (mix == IDS_RANDOM)
        return (uint64_t)rand() % 128000;
    int r = rand() % 100;
    if (r < 12)
        return (uint64_t)rand() % 128;
    if (r < 15)
        return 128 + (uint64_t)rand() % 128;
    if (r < 95)
        return 256 + (uint64_t)rand() % (65536 - 256);
    return 65536 + (uint64_t)rand() % (128000 - 65536);
}

static void pack_key(msgpack_sbuffer *sb, size_t n, id_mix mix, unsigned seed)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 8);
    pack_str(&pk, "model_name"), pack_str(&pk, "bench-model");
    pack_str(&pk, "world_size"), msgpack_pack_int(&pk, 1);
    pack_str(&pk, "worker_id"), msgpack_pack_nil(&pk);
    pack_str(&pk, "token_ids"), msgpack_pack_array(&pk, (uint32_t)n);
    srand(seed);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&pk, token_id(mix, seed, i));
    pack_str(&pk, "start"), msgpack_pack_int(&pk, 0);
    pack_str(&pk, "end"), msgpack_pack_uint64(&pk, n - n % 256);
    pack_str(&pk, "request_id"), pack_str(&pk, "req-1");
    pack_str(&pk, "cache_salt"), pack_str(&pk, "");
}

static void run(const char *label, size_t n, int rounds, id_mix mix)
{
    msgpack_sbuffer sb[KEYS];
    for (unsigned i = 0; i < KEYS; i++)
        pack_key(&sb[i], n, mix, 7 + i);
    double *key_t = malloc(rounds * sizeof *key_t), *generic_t = malloc(rounds * sizeof *generic_t);
    if (!key_t || !generic_t)
        exit(1);
    for (int r = 0; r < rounds; r++) {
        const msgpack_sbuffer *f = &sb[r % KEYS];
        lmc_ipc_key k;
        char err[256];
        double t0 = now_s();
        if (lmc_ipc_key_decode_frame((const uint8_t *)f->data, f->size, 256, &k, err,
                                     sizeof err) != 0) {
            fprintf(stderr, "decode failed: %s\n", err);
            exit(1);
        }
        key_t[r] = now_s() - t0;
        lmc_ipc_key_free(&k);
        msgpack_zone zone;
        msgpack_object obj;
        msgpack_zone_init(&zone, 4096);
        size_t off = 0;
        t0 = now_s();
        if (msgpack_unpack(f->data, f->size, &off, &zone, &obj) != MSGPACK_UNPACK_SUCCESS) {
            fprintf(stderr, "msgpack_unpack failed\n");
            exit(1);
        }
        generic_t[r] = now_s() - t0;
        msgpack_zone_destroy(&zone);
    }
    qsort(key_t, rounds, sizeof *key_t, cmp_double);
    qsort(generic_t, rounds, sizeof *generic_t, cmp_double);
    double key = key_t[rounds / 2], generic = generic_t[rounds / 2];
    printf("%-22s: key decode %6.1f us (%.2f ns/token), msgpack_unpack %6.1f us = %.2fx\n",
           label, key * 1e6, key * 1e9 / (double)n, generic * 1e6, key / generic);
    for (unsigned i = 0; i < KEYS; i++)
        msgpack_sbuffer_destroy(&sb[i]);
    free(key_t);
    free(generic_t);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 32768;
    int rounds = argc > 2 ? atoi(argv[2]) : 2000;
    if (n < 256 || rounds < 1) {
        fprintf(stderr, "usage: decode_bench [TOKENS >= 256] [ROUNDS >= 1]\n");
        return 2;
    }
    printf("LOOKUP key of %zu token ids (%d rounds over %d prompts, medians):\n", n, rounds, KEYS);
    run("stride ids (bench mix)", n, rounds, IDS_STRIDE);
    run("text-like width mix", n, rounds, IDS_TEXT);
    run("random ids < 128000", n, rounds, IDS_RANDOM);
    return 0;
}
