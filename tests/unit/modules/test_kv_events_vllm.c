/* vLLM block hashes for the KV event publisher (docs/kv_events.md, "vLLM
 * block hashes"): the ints of vLLM's sha256_cbor hash_block_tokens chain,
 * checked against vectors computed with Python's cbor2 6.1.4 and hashlib
 * as vLLM computes them:
 *
 *   def sha256_cbor(x): return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
 *   prev = sha256_cbor(seed)                       # NONE_HASH
 *   for each full block b: prev = sha256_cbor((prev, tuple(b), None))
 *   int = int.from_bytes(prev, "big") & (2**64 - 1)
 *
 * plus the chaining across chunks, the skips and the table's bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "modules/kv_events_vllm.h"

static lmc_kv_events_vllm *new_view(uint32_t bs, uint32_t cs, const char *seed)
{
    char err[256] = "";
    lmc_kv_events_vllm *v = lmc_kv_events_vllm_new(bs, cs, seed, err, sizeof err);
    assert_non_null(v);
    return v;
}

static void key(uint8_t out[32], uint8_t b)
{
    memset(out, b, 32);
}

/* seed "0", block 4: tokens 1..8 in chunk A, 9..16 in chunk B after A. */
static const uint64_t SEED0_BS4[] = {0x1e0b2e028ef071cbULL, 0xefad121d154ab2d6ULL,
                                     0xdaed446d95c926b2ULL, 0x3940779f0245259eULL};

static void test_two_chunks_chain_like_vllm(void **state)
{
    (void)state;
    lmc_kv_events_vllm *v = new_view(4, 8, "0");
    uint32_t toks[16];
    for (uint32_t i = 0; i < 16; i++)
        toks[i] = i + 1;
    uint8_t a[32], b[32];
    key(a, 0xa1);
    key(b, 0xb2);
    lmc_kv_events_vllm_blocks out;
    assert_int_equal(lmc_kv_events_vllm_stored(v, a, 32, NULL, toks, 8, &out), 1);
    assert_int_equal(out.n, 2);
    assert_false(out.has_parent);
    assert_memory_equal(out.hashes, SEED0_BS4, 2 * sizeof(uint64_t));
    assert_int_equal(lmc_kv_events_vllm_stored(v, b, 32, a, toks + 8, 8, &out), 1);
    assert_int_equal(out.n, 2);
    assert_true(out.has_parent);
    assert_int_equal(out.parent, SEED0_BS4[1]);
    assert_memory_equal(out.hashes, SEED0_BS4 + 2, 2 * sizeof(uint64_t));
    size_t n;
    const uint64_t *removed = lmc_kv_events_vllm_removed(v, b, 32, &n);
    assert_non_null(removed);
    assert_int_equal(n, 2);
    assert_memory_equal(removed, SEED0_BS4 + 2, 2 * sizeof(uint64_t));
    lmc_kv_events_vllm_free(v);
}

/* Tokens whose CBOR heads take 1, 2, 3, 5 bytes, seed "" (set but empty). */
static void test_every_cbor_head_width(void **state)
{
    (void)state;
    static const uint32_t toks[] = {0, 23, 24, 255, 256, 65535, 65536, 4294967295u};
    static const uint64_t want[] = {0xf0dcc3c6b4e5970cULL, 0x0eaa52eff8f49ea6ULL,
                                    0xc94d3f8be94f40d9ULL, 0xc3e841f4631b939bULL};
    lmc_kv_events_vllm *v = new_view(2, 8, "");
    uint8_t a[32];
    key(a, 1);
    lmc_kv_events_vllm_blocks out;
    assert_int_equal(lmc_kv_events_vllm_stored(v, a, 32, NULL, toks, 8, &out), 1);
    assert_int_equal(out.n, 4);
    assert_memory_equal(out.hashes, want, sizeof want);
    lmc_kv_events_vllm_free(v);
}

/* vLLM's default block size 16, seed "abc", tokens 1000..1031. */
static void test_block_size_16(void **state)
{
    (void)state;
    static const uint64_t want[] = {0xaacb841d4e8ac4baULL, 0x977ebd10aae6df84ULL};
    uint32_t toks[32];
    for (uint32_t i = 0; i < 32; i++)
        toks[i] = 1000 + i;
    lmc_kv_events_vllm *v = new_view(16, 256, "abc");
    uint8_t a[32];
    key(a, 2);
    lmc_kv_events_vllm_blocks out;
    assert_int_equal(lmc_kv_events_vllm_stored(v, a, 32, NULL, toks, 32, &out), 1);
    assert_int_equal(out.n, 2);
    assert_memory_equal(out.hashes, want, sizeof want);
    lmc_kv_events_vllm_free(v);
}

static void test_unknown_parent_and_partial_blocks_are_skipped(void **state)
{
    (void)state;
    lmc_kv_events_vllm *v = new_view(4, 8, "0");
    uint32_t toks[16] = {0};
    uint8_t a[32], b[32];
    key(a, 3);
    key(b, 4);
    lmc_kv_events_vllm_blocks out;
    assert_int_equal(lmc_kv_events_vllm_stored(v, b, 32, a, toks, 8, &out), 0);
    assert_int_equal(lmc_kv_events_vllm_stored(v, a, 32, NULL, toks, 3, &out), 0);
    assert_int_equal(lmc_kv_events_vllm_stored(v, a, 32, NULL, toks, 16, &out), 0);
    /* 7 tokens: one whole block, the rest left out as vLLM does */
    assert_int_equal(lmc_kv_events_vllm_stored(v, a, 32, NULL, toks, 7, &out), 1);
    assert_int_equal(out.n, 1);
    size_t n;
    assert_null(lmc_kv_events_vllm_removed(v, b, 32, &n));
    lmc_kv_events_vllm_stats st;
    lmc_kv_events_vllm_get_stats(v, &st);
    assert_int_equal(st.unchained, 1);
    assert_int_equal(st.unknown_removed, 1);
    assert_int_equal(st.chunks, 1);
    lmc_kv_events_vllm_free(v);
}

static void test_table_is_bounded(void **state)
{
    (void)state;
    lmc_kv_events_vllm *v = new_view(4, 4, "0");
    uint32_t toks[4] = {1, 2, 3, 4};
    lmc_kv_events_vllm_blocks out;
    for (uint32_t i = 0; i < 2 * LMC_KV_EVENTS_VLLM_MAX_CHUNKS; i++) {
        uint8_t k[32] = {0};
        memcpy(k, &i, sizeof i);
        assert_int_equal(lmc_kv_events_vllm_stored(v, k, 32, NULL, toks, 4, &out), 1);
    }
    lmc_kv_events_vllm_stats st;
    lmc_kv_events_vllm_get_stats(v, &st);
    assert_true(st.chunks <= LMC_KV_EVENTS_VLLM_MAX_CHUNKS);
    assert_true(st.chunks >= LMC_KV_EVENTS_VLLM_MAX_CHUNKS / 2);
    lmc_kv_events_vllm_free(v);
}

static void test_bad_block_size_is_refused(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(lmc_kv_events_vllm_new(3, 8, "0", err, sizeof err));
    assert_non_null(strstr(err, "--kv-events-block-size"));
    assert_null(lmc_kv_events_vllm_new(0, 8, "0", err, sizeof err));
}

static void test_int_is_the_last_8_bytes(void **state)
{
    (void)state;
    uint8_t h[32];
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)i;
    assert_int_equal(lmc_kv_events_vllm_int(h, 32), 0x18191a1b1c1d1e1fULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_chunks_chain_like_vllm),
        cmocka_unit_test(test_every_cbor_head_width),
        cmocka_unit_test(test_block_size_16),
        cmocka_unit_test(test_unknown_parent_and_partial_blocks_are_skipped),
        cmocka_unit_test(test_table_is_bounded),
        cmocka_unit_test(test_bad_block_size_is_refused),
        cmocka_unit_test(test_int_is_the_last_8_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
