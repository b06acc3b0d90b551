/* Token hashing: test vectors (docs/hashing.md, "Algorithms"), CBOR boundaries,
 * range/token edge cases, chain caching, and a cross-check against b3sum. */
#include "hash/cbor.h"
#include "hash/token_hash.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------ */

static void from_hex(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

static void assert_hash_hex(const uint8_t *h, const char *hex)
{
    uint8_t want[32];
    assert_int_equal(strlen(hex), 64);
    from_hex(hex, want, 32);
    assert_memory_equal(h, want, 32);
}

static lmc_token_hasher *make(const char *algo, uint32_t cs, const char *seed)
{
    lmc_token_hasher *h = NULL;
    char err[256] = "";
    int rc = lmc_token_hasher_new(algo, cs, seed, &h, err, sizeof err);
    if (rc != 0)
        fail_msg("hasher_new(%s, %u): %s", algo, cs, err);
    return h;
}

/* Deterministic PRNG so failures reproduce. */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill_tokens(uint64_t *t, size_t n, uint64_t *seed, uint64_t mod)
{
    for (size_t i = 0; i < n; i++)
        t[i] = rng_next(seed) % mod;
}

static void sha256_bytes(const uint8_t *in, size_t len, uint8_t out[32])
{
    unsigned int olen = 0;
    assert_true(EVP_Digest(in, len, out, &olen, EVP_sha256(), NULL));
    assert_int_equal(olen, 32);
}

/* ---- spec test vectors -------------------------------------------------- */

static void test_blake3_vectors(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("blake3", 4, NULL);
    assert_int_equal(lmc_token_hasher_digest_len(h), 32);
    assert_string_equal(lmc_token_hasher_name(h), "blake3");
    assert_hash_hex(lmc_token_hasher_none_hash(h),
                    "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b");
    const uint64_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t out[64];
    assert_int_equal(lmc_hash_chunks(h, toks, 8, 0, 8, out), LMC_HASH_OK);
    assert_hash_hex(out, "6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368b71123c");
    assert_hash_hex(out + 32, "98efc76eafb06cfe774c31ff151f300b61a614c27982a211bb8cdbd83a8c0e19");
    /* The range form returns just the requested chunk, still chained. */
    assert_int_equal(lmc_hash_chunks(h, toks, 8, 4, 8, out), LMC_HASH_OK);
    assert_hash_hex(out, "98efc76eafb06cfe774c31ff151f300b61a614c27982a211bb8cdbd83a8c0e19");
    lmc_token_hasher_free(h);
}

static void test_blake3_seed_ignored(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("blake3", 4, "abc");
    assert_hash_hex(lmc_token_hasher_none_hash(h),
                    "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b");
    lmc_token_hasher_free(h);
}

static void test_sha256_cbor_vectors(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("sha256_cbor", 4, "0");
    assert_string_equal(lmc_token_hasher_name(h), "sha256_cbor");
    assert_hash_hex(lmc_token_hasher_none_hash(h),
                    "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
    const uint64_t toks[4] = {1, 2, 3, 4};
    uint8_t out[32];
    assert_int_equal(lmc_hash_chunks(h, toks, 4, 0, 4, out), LMC_HASH_OK);
    assert_hash_hex(out, "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb");
    lmc_token_hasher_free(h);
}

static void test_sha256_cbor_seed_forms(void **state)
{
    (void)state;
    /* Empty seed is "set": SHA-256 of CBOR text "" = 0x60. */
    lmc_token_hasher *h = make("sha256_cbor", 4, "");
    uint8_t want[32];
    const uint8_t empty_text[1] = {0x60};
    sha256_bytes(empty_text, 1, want);
    assert_memory_equal(lmc_token_hasher_none_hash(h), want, 32);
    lmc_token_hasher_free(h);
    /* A 24-char seed needs the 1-byte-length text head 0x78 0x18. */
    const char *seed = "abcdefghijklmnopqrstuvwx";
    uint8_t enc[26] = {0x78, 24};
    memcpy(enc + 2, seed, 24);
    sha256_bytes(enc, sizeof enc, want);
    h = make("sha256_cbor", 4, seed);
    assert_memory_equal(lmc_token_hasher_none_hash(h), want, 32);
    lmc_token_hasher_free(h);
}

static void test_sha256_cbor_unset_seed_random(void **state)
{
    (void)state;
    lmc_token_hasher *a = make("sha256_cbor", 2, NULL);
    lmc_token_hasher *b = make("sha256_cbor", 2, NULL);
    assert_memory_not_equal(lmc_token_hasher_none_hash(a), lmc_token_hasher_none_hash(b), 32);
    /* Still deterministic within one hasher. */
    const uint64_t toks[4] = {9, 8, 7, 6};
    uint8_t x[64], y[64];
    assert_int_equal(lmc_hash_chunks(a, toks, 4, 0, 4, x), 0);
    assert_int_equal(lmc_hash_chunks(a, toks, 4, 0, 4, y), 0);
    assert_memory_equal(x, y, 64);
    assert_int_equal(lmc_hash_chunks(b, toks, 4, 0, 4, y), 0);
    assert_memory_not_equal(x, y, 32);
    lmc_token_hasher_free(a);
    lmc_token_hasher_free(b);
}

/* ---- CBOR encoding ------------------------------------------------------ */

static void check_head(unsigned major, uint64_t v, const uint8_t *want, size_t wlen)
{
    uint8_t buf[LMC_CBOR_HEAD_MAX];
    assert_int_equal(lmc_cbor_put_head(buf, major, v), wlen);
    assert_int_equal(lmc_cbor_head_len(v), wlen);
    assert_memory_equal(buf, want, wlen);
}

static void test_cbor_uint_boundaries(void **state)
{
    (void)state;
    check_head(0, 0, (const uint8_t[]){0x00}, 1);
    check_head(0, 23, (const uint8_t[]){0x17}, 1);
    check_head(0, 24, (const uint8_t[]){0x18, 0x18}, 2);
    check_head(0, 255, (const uint8_t[]){0x18, 0xff}, 2);
    check_head(0, 256, (const uint8_t[]){0x19, 0x01, 0x00}, 3);
    check_head(0, 65535, (const uint8_t[]){0x19, 0xff, 0xff}, 3);
    check_head(0, 65536, (const uint8_t[]){0x1a, 0x00, 0x01, 0x00, 0x00}, 5);
    check_head(0, 0xffffffffu, (const uint8_t[]){0x1a, 0xff, 0xff, 0xff, 0xff}, 5);
    check_head(0, 0x100000000ULL,
               (const uint8_t[]){0x1b, 0, 0, 0, 1, 0, 0, 0, 0}, 9);
}

static void test_cbor_array_and_string_heads(void **state)
{
    (void)state;
    check_head(LMC_CBOR_ARRAY, 3, (const uint8_t[]){0x83}, 1);
    check_head(LMC_CBOR_ARRAY, 23, (const uint8_t[]){0x97}, 1);
    check_head(LMC_CBOR_ARRAY, 24, (const uint8_t[]){0x98, 0x18}, 2);
    check_head(LMC_CBOR_ARRAY, 255, (const uint8_t[]){0x98, 0xff}, 2);
    check_head(LMC_CBOR_ARRAY, 256, (const uint8_t[]){0x99, 0x01, 0x00}, 3);
    check_head(LMC_CBOR_ARRAY, 65535, (const uint8_t[]){0x99, 0xff, 0xff}, 3);
    check_head(LMC_CBOR_ARRAY, 65536, (const uint8_t[]){0x9a, 0x00, 0x01, 0x00, 0x00}, 5);
    check_head(LMC_CBOR_BYTES, 32, (const uint8_t[]){0x58, 0x20}, 2);
    check_head(LMC_CBOR_TEXT, 1, (const uint8_t[]){0x61}, 1);
}

/* Hand-built reference: 83 58 20 <prefix> <array head> <tokens> f6. */
static size_t ref_cbor(const uint8_t *prefix, const uint64_t *toks, size_t n, uint8_t *out)
{
    size_t len = 0;
    out[len++] = 0x83;
    out[len++] = 0x58;
    out[len++] = 0x20;
    memcpy(out + len, prefix, 32);
    len += 32;
    len += lmc_cbor_put_head(out + len, LMC_CBOR_ARRAY, n);
    for (size_t i = 0; i < n; i++)
        len += lmc_cbor_put_uint(out + len, toks[i]);
    out[len++] = 0xf6;
    return len;
}

/* A chunk of chunk_size tokens cycling through values at every size
 * boundary must hash as SHA-256 of the reference encoding. */
static void check_sha256_chunk(uint32_t cs)
{
    static const uint64_t vals[] = {0, 23, 24, 255, 256, 65535, 65536, 0xffffffffu};
    lmc_token_hasher *h = make("sha256_cbor", cs, "42");
    uint64_t *toks = malloc(cs * sizeof *toks);
    uint8_t *enc = malloc(64 + 5 * (size_t)cs);
    for (uint32_t i = 0; i < cs; i++)
        toks[i] = vals[i % 8];
    uint8_t got[32], want[32];
    assert_int_equal(lmc_hash_chunks(h, toks, cs, 0, cs, got), LMC_HASH_OK);
    sha256_bytes(enc, ref_cbor(lmc_token_hasher_none_hash(h), toks, cs, enc), want);
    assert_memory_equal(got, want, 32);
    free(enc);
    free(toks);
    lmc_token_hasher_free(h);
}

static void test_sha256_cbor_chunk_boundaries(void **state)
{
    (void)state;
    const uint32_t sizes[] = {1, 8, 23, 24, 255, 256, 4096, 65535, 65536};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        check_sha256_chunk(sizes[i]);
}

static void test_sha256_cbor_token_bytes_by_hand(void **state)
{
    (void)state;
    /* Chunk [23, 24, 256, 65536] with seed "0": the token array is written
     * out byte by byte here, independent of the library's encoder. */
    lmc_token_hasher *h = make("sha256_cbor", 4, "0");
    const uint64_t toks[4] = {23, 24, 256, 65536};
    uint8_t enc[35 + 1 + 1 + 2 + 3 + 5 + 1] = {0x83, 0x58, 0x20};
    memcpy(enc + 3, lmc_token_hasher_none_hash(h), 32);
    const uint8_t tail[] = {0x84, 0x17, 0x18, 0x18, 0x19, 0x01, 0x00,
                            0x1a, 0x00, 0x01, 0x00, 0x00, 0xf6};
    memcpy(enc + 35, tail, sizeof tail);
    uint8_t got[32], want[32];
    sha256_bytes(enc, 35 + sizeof tail, want);
    assert_int_equal(lmc_hash_chunks(h, toks, 4, 0, 4, got), LMC_HASH_OK);
    assert_memory_equal(got, want, 32);
    lmc_token_hasher_free(h);
}

/* ---- edge cases --------------------------------------------------------- */

static void test_token_range_limits(void **state)
{
    (void)state;
    const char *algos[] = {"blake3", "sha256_cbor"};
    for (int a = 0; a < 2; a++) {
        lmc_token_hasher *h = make(algos[a], 2, "0");
        uint64_t toks[4] = {0, 0xffffffffu, 0xffffffffu, 0};
        uint8_t out[64];
        assert_int_equal(lmc_hash_chunks(h, toks, 4, 0, 4, out), LMC_HASH_OK);
        toks[3] = 0x100000000ULL;
        assert_int_equal(lmc_hash_chunks(h, toks, 4, 0, 4, out), LMC_HASH_ETOKEN);
        /* Only hashed tokens are checked: a bad token past `end` is fine. */
        assert_int_equal(lmc_hash_chunks(h, toks, 4, 0, 2, out), LMC_HASH_OK);
        toks[3] = UINT64_MAX;
        assert_int_equal(lmc_hash_chunks(h, toks, 4, 2, 4, out), LMC_HASH_ETOKEN);
        lmc_token_hasher_free(h);
    }
}

static void test_blake3_token_encoding(void **state)
{
    (void)state;
    /* Chained onto an all-zero prefix, the chunk [0, 0, 0] must hash as
     * BLAKE3 of 44 zero bytes (32 prefix + 3 * 4 token bytes). */
    lmc_token_hasher *h = make("blake3", 3, NULL);
    const uint64_t toks[3] = {0, 0, 0};
    uint8_t zero[32] = {0}, out[32];
    assert_int_equal(lmc_hash_chunks_from(h, zero, toks, 1, out), LMC_HASH_OK);
    FILE *p = popen("head -c 44 /dev/zero | b3sum --no-names", "r");
    assert_non_null(p);
    char hex[80] = "";
    assert_non_null(fgets(hex, sizeof hex, p));
    pclose(p);
    hex[64] = '\0';
    assert_hash_hex(out, hex);
    lmc_token_hasher_free(h);
}

static void test_empty_and_partial(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("blake3", 4, NULL);
    uint8_t out[96], ref[64];
    assert_int_equal(lmc_hash_num_chunks(h, 0), 0);
    assert_int_equal(lmc_hash_chunks(h, NULL, 0, 0, 0, out), LMC_HASH_OK);
    uint64_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    assert_int_equal(lmc_hash_num_chunks(h, 10), 2);
    assert_int_equal(lmc_hash_chunks(h, toks, 10, 0, 8, out), LMC_HASH_OK);
    assert_int_equal(lmc_hash_chunks(h, toks, 8, 0, 8, ref), LMC_HASH_OK);
    assert_memory_equal(out, ref, 64);
    /* The partial chunk [8,10) cannot be requested. */
    assert_int_equal(lmc_hash_chunks(h, toks, 10, 0, 12, out), LMC_HASH_ERANGE);
    assert_int_equal(lmc_hash_chunks(h, toks, 10, 8, 8, out), LMC_HASH_OK);
    lmc_token_hasher_free(h);
}

static void test_unaligned_rejected(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("blake3", 4, NULL);
    uint64_t toks[16] = {0};
    uint8_t out[128];
    assert_int_equal(lmc_hash_chunks(h, toks, 16, 1, 8, out), LMC_HASH_ERANGE);
    assert_int_equal(lmc_hash_chunks(h, toks, 16, 0, 7, out), LMC_HASH_ERANGE);
    assert_int_equal(lmc_hash_chunks(h, toks, 16, 8, 4, out), LMC_HASH_ERANGE);
    assert_int_equal(lmc_hash_chunks(h, toks, 15, 0, 16, out), LMC_HASH_ERANGE);
    assert_int_equal(lmc_hash_chunks(h, toks, 16, 4, 16, out), LMC_HASH_OK);
    lmc_token_hasher_free(h);
}

static void test_chunk_size_one(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("blake3", 1, NULL);
    const uint64_t toks[3] = {7, 8, 9};
    uint8_t out[96], step[32];
    assert_int_equal(lmc_hash_chunks(h, toks, 3, 0, 3, out), LMC_HASH_OK);
    /* Each hash chains on the previous one, one token at a time. */
    memcpy(step, lmc_token_hasher_none_hash(h), 32);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(lmc_hash_chunks_from(h, step, toks + i, 1, step), LMC_HASH_OK);
        assert_memory_equal(out + 32 * i, step, 32);
    }
    assert_int_equal(lmc_hash_chunks(h, toks, 3, 1, 3, out), LMC_HASH_OK);
    assert_memory_equal(out + 32, step, 32);
    lmc_token_hasher_free(h);
}

static void test_constructor_errors(void **state)
{
    (void)state;
    lmc_token_hasher *h = (lmc_token_hasher *)1;
    char err[512] = "";
    assert_int_equal(lmc_token_hasher_new("builtin", 256, "0", &h, err, sizeof err), -1);
    assert_null(h);
    assert_non_null(strstr(err, "builtin"));
    assert_non_null(strstr(err, "CPython"));
    assert_int_equal(lmc_token_hasher_new("md5", 256, NULL, &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "md5"));
    assert_int_equal(lmc_token_hasher_new("Blake3", 256, NULL, &h, err, sizeof err), -1);
    assert_int_equal(lmc_token_hasher_new("blake3", 0, NULL, &h, err, sizeof err), -1);
    assert_int_equal(lmc_token_hasher_new(NULL, 256, NULL, &h, NULL, 0), -1);
    assert_string_equal(lmc_hash_strerror(LMC_HASH_ETOKEN), "token id outside 0..2^32-1");
}

/* ---- chains ------------------------------------------------------------- */

static void check_chain_matches(const lmc_token_hasher *h, const lmc_hash_chain *c,
                                const uint64_t *toks, size_t n_chunks)
{
    const size_t cs = lmc_token_hasher_chunk_size(h);
    uint8_t *ref = malloc(n_chunks * 32 + 1);
    assert_int_equal(lmc_hash_chunks(h, toks, n_chunks * cs, 0, n_chunks * cs, ref), 0);
    assert_true(lmc_hash_chain_count(c) >= n_chunks);
    if (n_chunks)
        assert_memory_equal(lmc_hash_chain_get(c, 0), ref, n_chunks * 32);
    free(ref);
}

static void chain_growth(const char *algo)
{
    lmc_token_hasher *h = make(algo, 16, "7");
    lmc_hash_chain *c = lmc_hash_chain_new(h);
    uint64_t seed = 0x1234, toks[1000];
    fill_tokens(toks, 1000, &seed, 1ULL << 32);
    /* A growing token list, extended at irregular lengths (partial tails). */
    const size_t lens[] = {0, 5, 16, 40, 40, 200, 333, 1000};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        assert_int_equal(lmc_hash_chain_extend(c, toks, lens[i]), LMC_HASH_OK);
        assert_int_equal(lmc_hash_chain_count(c), lens[i] / 16);
        check_chain_matches(h, c, toks, lens[i] / 16);
    }
    assert_null(lmc_hash_chain_get(c, 1000 / 16));
    lmc_hash_chain_free(c);
    lmc_token_hasher_free(h);
}

static void test_chain_growth(void **state)
{
    (void)state;
    chain_growth("blake3");
    chain_growth("sha256_cbor");
}

static void test_chain_detects_change(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("blake3", 8, NULL);
    lmc_hash_chain *c = lmc_hash_chain_new(h);
    uint64_t seed = 99, toks[256];
    fill_tokens(toks, 256, &seed, 50000);
    assert_int_equal(lmc_hash_chain_extend(c, toks, 256), 0);
    uint8_t old5[32];
    memcpy(old5, lmc_hash_chain_get(c, 5), 32);
    toks[100] += 1; /* chunk 12 */
    assert_int_equal(lmc_hash_chain_extend(c, toks, 256), 0);
    assert_int_equal(lmc_hash_chain_count(c), 32);
    check_chain_matches(h, c, toks, 32);
    assert_memory_equal(lmc_hash_chain_get(c, 5), old5, 32);
    /* A change inside a shorter request truncates and rehashes up to end. */
    toks[3] += 1;
    assert_int_equal(lmc_hash_chain_extend_to(c, toks, 256, 64), 0);
    assert_int_equal(lmc_hash_chain_count(c), 8);
    check_chain_matches(h, c, toks, 8);
    assert_memory_not_equal(lmc_hash_chain_get(c, 5), old5, 32);
    lmc_hash_chain_free(c);
    lmc_token_hasher_free(h);
}

static void test_chain_shorter_prefix_and_errors(void **state)
{
    (void)state;
    lmc_token_hasher *h = make("sha256_cbor", 4, "1");
    lmc_hash_chain *c = lmc_hash_chain_new(h);
    uint64_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (uint64_t)i * 1000;
    assert_int_equal(lmc_hash_chain_extend(c, toks, 40), 0);
    /* A consistent shorter list keeps the longer chain. */
    assert_int_equal(lmc_hash_chain_extend(c, toks, 9), 0);
    assert_int_equal(lmc_hash_chain_count(c), 10);
    assert_int_equal(lmc_hash_chain_extend_to(c, toks, 40, 6), LMC_HASH_ERANGE);
    assert_int_equal(lmc_hash_chain_extend_to(c, toks, 7, 8), LMC_HASH_ERANGE);
    assert_int_equal(lmc_hash_chain_count(c), 10);
    /* A bad token in chunk 6 stops the chain at 6 chunks. */
    toks[26] = 1ULL << 40;
    assert_int_equal(lmc_hash_chain_extend(c, toks, 40), LMC_HASH_ETOKEN);
    assert_int_equal(lmc_hash_chain_count(c), 6);
    check_chain_matches(h, c, toks, 6);
    toks[26] = 5;
    assert_int_equal(lmc_hash_chain_extend(c, toks, 40), 0);
    check_chain_matches(h, c, toks, 10);
    lmc_hash_chain_reset(c);
    assert_int_equal(lmc_hash_chain_count(c), 0);
    lmc_hash_chain_free(c);
    lmc_token_hasher_free(h);
}

/* ---- b3sum cross-check -------------------------------------------------- */

static void b3sum_file(const uint8_t *data, size_t len, uint8_t out[32])
{
    char path[] = "/tmp/lmc_b3_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
    char cmd[128], hex[80] = "";
    snprintf(cmd, sizeof cmd, "b3sum --no-names %s", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(hex, sizeof hex, p));
    assert_int_equal(pclose(p), 0);
    unlink(path);
    hex[64] = '\0';
    from_hex(hex, out, 32);
}

/* Two chained chunks of random tokens, each checked against b3sum of
 * prefix || big-endian tokens written to a file. */
static void b3sum_check(uint32_t cs, uint64_t seed)
{
    lmc_token_hasher *h = make("blake3", cs, NULL);
    uint64_t *toks = malloc(2 * (size_t)cs * sizeof *toks);
    uint8_t *buf = malloc(32 + 4 * (size_t)cs);
    fill_tokens(toks, 2 * (size_t)cs, &seed, 1ULL << 32);
    toks[0] = 0xffffffffu;
    uint8_t got[64], prev[32];
    assert_int_equal(lmc_hash_chunks(h, toks, 2 * (size_t)cs, 0, 2 * (size_t)cs, got), 0);
    memcpy(prev, lmc_token_hasher_none_hash(h), 32);
    for (int c = 0; c < 2; c++) {
        memcpy(buf, prev, 32);
        for (uint32_t i = 0; i < cs; i++) {
            uint64_t t = toks[(size_t)c * cs + i];
            uint8_t *d = buf + 32 + 4 * (size_t)i;
            d[0] = (uint8_t)(t >> 24), d[1] = (uint8_t)(t >> 16);
            d[2] = (uint8_t)(t >> 8), d[3] = (uint8_t)t;
        }
        b3sum_file(buf, 32 + 4 * (size_t)cs, prev);
        assert_memory_equal(got + 32 * c, prev, 32);
    }
    free(buf);
    free(toks);
    lmc_token_hasher_free(h);
}

static void test_blake3_vs_b3sum(void **state)
{
    (void)state;
    /* Sizes straddle the internal 2048-token block and BLAKE3's 1 KiB chunks. */
    const uint32_t sizes[] = {1, 7, 248, 256, 2047, 2048, 2049, 4096, 10000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        b3sum_check(sizes[i], 0x9e3779b97f4a7c15ULL + i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blake3_vectors),
        cmocka_unit_test(test_blake3_seed_ignored),
        cmocka_unit_test(test_sha256_cbor_vectors),
        cmocka_unit_test(test_sha256_cbor_seed_forms),
        cmocka_unit_test(test_sha256_cbor_unset_seed_random),
        cmocka_unit_test(test_cbor_uint_boundaries),
        cmocka_unit_test(test_cbor_array_and_string_heads),
        cmocka_unit_test(test_sha256_cbor_chunk_boundaries),
        cmocka_unit_test(test_sha256_cbor_token_bytes_by_hand),
        cmocka_unit_test(test_token_range_limits),
        cmocka_unit_test(test_blake3_token_encoding),
        cmocka_unit_test(test_empty_and_partial),
        cmocka_unit_test(test_unaligned_rejected),
        cmocka_unit_test(test_chunk_size_one),
        cmocka_unit_test(test_constructor_errors),
        cmocka_unit_test(test_chain_growth),
        cmocka_unit_test(test_chain_detects_change),
        cmocka_unit_test(test_chain_shorter_prefix_and_errors),
        cmocka_unit_test(test_blake3_vs_b3sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
