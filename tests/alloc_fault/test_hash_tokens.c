/* Allocation failures in token hashing (src/hash): making a hasher, giving
 * it a memo, and a request's hash chain growing over several calls.  The
 * hashes of every successful call must match ones computed beforehand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "hash/token_hash.h"

#define CS 16
#define CHUNKS 24
#define N_TOKENS (CS * CHUNKS)

typedef struct {
    const char *algo;
    const char *seed;                         /* PYTHONHASHSEED for sha256_cbor */
    uint64_t tokens[N_TOKENS];
    uint64_t changed[N_TOKENS];               /* differs from chunk 7 on */
    uint8_t want[CHUNKS * LMC_TOKEN_HASH_LEN];
    uint8_t want_changed[CHUNKS * LMC_TOKEN_HASH_LEN];
} hash_fixture;

static int same_hashes(const lmc_token_hasher *h, const uint64_t *tokens, const uint8_t *want,
                       size_t chunks)
{
    uint8_t got[CHUNKS * LMC_TOKEN_HASH_LEN];
    int rc = lmc_hash_chunks(h, tokens, N_TOKENS, 0, chunks * CS, got);
    if (rc == LMC_HASH_ENOMEM || rc == LMC_HASH_ECRYPTO)
        return lmc_fault_fired() ? LMC_FAULT_ERROR
                                 : lmc_fault_violation("hashing failed with memory left");
    if (rc != LMC_HASH_OK || memcmp(got, want, chunks * LMC_TOKEN_HASH_LEN) != 0)
        return lmc_fault_violation("hashes differ from the reference (rc %d)", rc);
    return LMC_FAULT_OK;
}

static int new_hasher(const hash_fixture *fx, lmc_token_hasher **h)
{
    char err[256] = "";
    if (lmc_token_hasher_new(fx->algo, CS, fx->seed, h, err, sizeof err) == 0)
        return LMC_FAULT_OK;
    if (*h)
        return lmc_fault_violation("a failed hasher_new left *out set");
    if (!lmc_fault_fired())
        return lmc_fault_violation("hasher_new failed with memory left: %s", err);
    return strstr(err, "memory") ? LMC_FAULT_ERROR
                                  : lmc_fault_violation("out of memory reported as '%s'", err);
}

static int scenario_hasher(void *arg)
{
    const hash_fixture *fx = arg;
    lmc_token_hasher *h;
    int rc = new_hasher(fx, &h);
    if (rc != LMC_FAULT_OK)
        return rc;
    rc = same_hashes(h, fx->tokens, fx->want, CHUNKS);
    lmc_token_hasher_free(h);
    return rc;
}

/* A memo that cannot be made is an error of enable_memo only: the hasher
 * goes on without one and still hashes right. */
static int scenario_memo(void *arg)
{
    const hash_fixture *fx = arg;
    lmc_token_hasher *h;
    int rc = new_hasher(fx, &h);
    if (rc != LMC_FAULT_OK)
        return rc;
    lmc_hash_memo_stats st;
    if (lmc_token_hasher_enable_memo(h, 1u << 20) != 0) {
        rc = !lmc_fault_fired() ? lmc_fault_violation("enable_memo failed with memory left")
             : lmc_token_hasher_memo_stats(h, &st)
                 ? lmc_fault_violation("a failed enable_memo left a memo")
                 : LMC_FAULT_ERROR;
    }
    /* Twice: the second pass is served by the memo when there is one. */
    for (int pass = 0; pass < 2 && rc != LMC_FAULT_VIOLATION; pass++) {
        int hrc = same_hashes(h, fx->tokens, fx->want, CHUNKS);
        if (hrc != LMC_FAULT_OK)
            rc = hrc;
    }
    lmc_token_hasher_free(h);
    return rc;
}

/* The chain must hold a valid prefix after every call, failed or not. */
static int chain_prefix_ok(const lmc_hash_chain *c, const uint8_t *want, size_t at_most)
{
    size_t n = lmc_hash_chain_count(c);
    if (n > at_most)
        return lmc_fault_violation("chain holds %zu chunks, more than the %zu it may", n, at_most);
    if (n && memcmp(lmc_hash_chain_get(c, 0), want, n * LMC_TOKEN_HASH_LEN) != 0)
        return lmc_fault_violation("chain's %zu hashes are not a valid prefix", n);
    return LMC_FAULT_OK;
}

static int scenario_chain(void *arg)
{
    const hash_fixture *fx = arg;
    lmc_token_hasher *h;
    int rc = new_hasher(fx, &h);
    if (rc != LMC_FAULT_OK)
        return rc;
    lmc_hash_chain *c = lmc_hash_chain_new(h);
    if (!c) {
        lmc_token_hasher_free(h);
        return lmc_fault_fired() ? LMC_FAULT_ERROR
                                 : lmc_fault_violation("chain_new failed with memory left");
    }
    /* A prompt growing over calls (each step past the last capacity), then
     * one that changed in the middle. */
    static const struct {
        size_t chunks;
        bool changed;
    } steps[] = {{2, false}, {3, false}, {9, false}, {CHUNKS, false}, {CHUNKS, true}};
    size_t held = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0] && rc == LMC_FAULT_OK; i++) {
        const uint64_t *toks = steps[i].changed ? fx->changed : fx->tokens;
        const uint8_t *want = steps[i].changed ? fx->want_changed : fx->want;
        int hrc = lmc_hash_chain_extend_to(c, toks, N_TOKENS, steps[i].chunks * CS);
        if (hrc == LMC_HASH_OK) {
            rc = lmc_hash_chain_count(c) == steps[i].chunks
                     ? chain_prefix_ok(c, want, steps[i].chunks)
                     : lmc_fault_violation("chain has %zu chunks after extending to %zu",
                                           lmc_hash_chain_count(c), steps[i].chunks);
        } else if (hrc == LMC_HASH_ENOMEM || hrc == LMC_HASH_ECRYPTO) {
            rc = !lmc_fault_fired() ? lmc_fault_violation("extend failed with memory left")
                 /* Only chunks it had before survive, as far as they still hold. */
                 : chain_prefix_ok(c, want, held) == LMC_FAULT_OK ? LMC_FAULT_ERROR
                 : LMC_FAULT_VIOLATION;
        } else {
            rc = lmc_fault_violation("extend returned %s", lmc_hash_strerror(hrc));
        }
        held = lmc_hash_chain_count(c);
    }
    lmc_hash_chain_free(c);
    lmc_token_hasher_free(h);
    return rc;
}

/* ---- cmocka ----------------------------------------------------------------- */

static hash_fixture g_blake3 = {.algo = "blake3"};
static hash_fixture g_sha = {.algo = "sha256_cbor", .seed = "0"};

static void fixture_init(hash_fixture *fx)
{
    for (size_t i = 0; i < N_TOKENS; i++) {
        fx->tokens[i] = (i * 104729u) % 128000u;
        fx->changed[i] = i < 7 * CS ? fx->tokens[i] : fx->tokens[i] + 1;
    }
    lmc_token_hasher *h;
    char err[128];
    assert_int_equal(lmc_token_hasher_new(fx->algo, CS, fx->seed, &h, err, sizeof err), 0);
    assert_int_equal(lmc_hash_chunks(h, fx->tokens, N_TOKENS, 0, N_TOKENS, fx->want), 0);
    assert_int_equal(lmc_hash_chunks(h, fx->changed, N_TOKENS, 0, N_TOKENS, fx->want_changed), 0);
    lmc_token_hasher_free(h);
}

static int setup(void **state)
{
    (void)state;
    fixture_init(&g_blake3);
    fixture_init(&g_sha);
    return 0;
}

static void test_hasher(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("hash.hasher.blake3", scenario_hasher, &g_blake3, NULL, 0), 0);
    assert_int_equal(lmc_fault_run("hash.hasher.sha256_cbor", scenario_hasher, &g_sha, NULL, 0), 0);
}

static void test_memo(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("hash.memo", scenario_memo, &g_blake3, NULL, 0), 0);
}

static void test_chain(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("hash.chain.blake3", scenario_chain, &g_blake3, NULL, 0), 0);
    assert_int_equal(lmc_fault_run("hash.chain.sha256_cbor", scenario_chain, &g_sha, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hasher),
        cmocka_unit_test(test_memo),
        cmocka_unit_test(test_chain),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
