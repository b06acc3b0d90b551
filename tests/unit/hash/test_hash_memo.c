/* Hash memo: with or without it the hasher returns the same bytes; repeated
 * prefixes hit, changed tokens miss, a tiny memo replaces entries and stays
 * correct, and threads sharing it agree. */
#include "hash/hash_memo.h"
#include "hash/token_hash.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define CS 16
#define CHUNKS 64

static lmc_token_hasher *hasher(const char *algo, size_t memo_bytes)
{
    lmc_token_hasher *h = NULL;
    char err[128];
    assert_int_equal(lmc_token_hasher_new(algo, CS, "0", &h, err, sizeof err), 0);
    if (memo_bytes)
        assert_int_equal(lmc_token_hasher_enable_memo(h, memo_bytes), 0);
    return h;
}

static void fill(uint64_t *t, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (seed * 2654435761u + i * 40503u) % 150000;
}

static void same_as_plain(const char *algo, size_t memo_bytes)
{
    lmc_token_hasher *plain = hasher(algo, 0), *memo = hasher(algo, memo_bytes);
    uint64_t toks[CHUNKS * CS];
    uint8_t a[CHUNKS * 32], b[CHUNKS * 32];
    for (uint64_t seed = 1; seed <= 5; seed++) {
        fill(toks, CHUNKS * CS, seed);
        for (int pass = 0; pass < 2; pass++) {   /* the second pass hits */
            assert_int_equal(lmc_hash_chunks(plain, toks, CHUNKS * CS, 0, CHUNKS * CS, a), 0);
            assert_int_equal(lmc_hash_chunks(memo, toks, CHUNKS * CS, 0, CHUNKS * CS, b), 0);
            assert_memory_equal(a, b, sizeof a);
        }
        toks[10 * CS + 3] ^= 1;   /* chunk 10 and every later one change */
        assert_int_equal(lmc_hash_chunks(plain, toks, CHUNKS * CS, 0, CHUNKS * CS, a), 0);
        assert_int_equal(lmc_hash_chunks(memo, toks, CHUNKS * CS, 0, CHUNKS * CS, b), 0);
        assert_memory_equal(a, b, sizeof a);
    }
    lmc_token_hasher_free(plain);
    lmc_token_hasher_free(memo);
}

static void test_blake3_same_bytes(void **state)
{
    (void)state;
    same_as_plain("blake3", 1 << 20);
}

static void test_sha256_cbor_same_bytes(void **state)
{
    (void)state;
    same_as_plain("sha256_cbor", 1 << 20);
}

static void test_tiny_memo_replaces_and_stays_correct(void **state)
{
    (void)state;
    same_as_plain("blake3", 4 * (72 + 4 * CS));   /* one set of four */
}

static void test_hits_and_misses_are_counted(void **state)
{
    (void)state;
    lmc_token_hasher *h = hasher("blake3", 1 << 20);
    uint64_t toks[CHUNKS * CS];
    uint8_t out[CHUNKS * 32];
    fill(toks, CHUNKS * CS, 9);
    assert_int_equal(lmc_hash_chunks(h, toks, CHUNKS * CS, 0, CHUNKS * CS, out), 0);
    lmc_hash_memo_stats st;
    assert_true(lmc_token_hasher_memo_stats(h, &st));
    assert_int_equal(st.misses, CHUNKS);
    assert_int_equal(st.hits, 0);
    assert_int_equal(st.entries, CHUNKS);
    /* A second request sharing the first 40 chunks, then diverging. */
    toks[40 * CS] += 1;
    assert_int_equal(lmc_hash_chunks(h, toks, CHUNKS * CS, 0, CHUNKS * CS, out), 0);
    assert_true(lmc_token_hasher_memo_stats(h, &st));
    assert_int_equal(st.hits, 40);
    assert_int_equal(st.misses, CHUNKS + CHUNKS - 40);
    lmc_token_hasher_free(h);
}

static void test_big_tokens_and_tiny_budget(void **state)
{
    (void)state;
    lmc_token_hasher *plain = hasher("blake3", 0), *memo = hasher("blake3", 1 << 20);
    uint64_t toks[4 * CS];
    uint8_t a[4 * 32], b[4 * 32];
    fill(toks, 4 * CS, 3);
    toks[2 * CS + 1] = (uint64_t)1 << 40;
    assert_int_equal(lmc_hash_chunks(plain, toks, 4 * CS, 0, 4 * CS, a), LMC_HASH_ETOKEN);
    assert_int_equal(lmc_hash_chunks(memo, toks, 4 * CS, 0, 4 * CS, b), LMC_HASH_ETOKEN);
    assert_memory_equal(a, b, 2 * 32);   /* the chunks before the bad one */
    lmc_hash_memo_stats st;
    assert_true(lmc_token_hasher_memo_stats(memo, &st));
    assert_int_equal(st.entries, 2);
    assert_false(lmc_token_hasher_memo_stats(plain, &st));
    assert_int_equal(lmc_token_hasher_enable_memo(plain, 100), -1);   /* under 4 entries */
    assert_false(lmc_token_hasher_memo_stats(plain, &st));
    assert_int_equal(lmc_token_hasher_enable_memo(memo, 0), 0);       /* removed */
    assert_false(lmc_token_hasher_memo_stats(memo, &st));
    lmc_token_hasher_free(plain);
    lmc_token_hasher_free(memo);
}

/* The memo's set index looks at a sample of each chunk's tokens: chunks
 * that differ only elsewhere share a set, yet each keeps its own hash,
 * and both are answered from the memo afterwards. */
static void test_chunks_differing_between_sampled_tokens(void **state)
{
    (void)state;
    enum { BIG = 256 };
    lmc_token_hasher *plain = NULL, *memo = NULL;
    char err[128];
    assert_int_equal(lmc_token_hasher_new("blake3", BIG, "0", &plain, err, sizeof err), 0);
    assert_int_equal(lmc_token_hasher_new("blake3", BIG, "0", &memo, err, sizeof err), 0);
    assert_int_equal(lmc_token_hasher_enable_memo(memo, 1 << 20), 0);
    uint64_t a[2 * BIG], b[2 * BIG];
    fill(a, 2 * BIG, 5);
    memcpy(b, a, sizeof a);
    b[1] ^= 7;         /* chunk 0: between the sampled positions */
    b[BIG + 17] ^= 7;  /* chunk 1 too */
    uint8_t want_a[64], want_b[64], got[64];
    assert_int_equal(lmc_hash_chunks(plain, a, 2 * BIG, 0, 2 * BIG, want_a), 0);
    assert_int_equal(lmc_hash_chunks(plain, b, 2 * BIG, 0, 2 * BIG, want_b), 0);
    assert_memory_not_equal(want_a, want_b, 32);
    for (int pass = 0; pass < 2; pass++) {
        assert_int_equal(lmc_hash_chunks(memo, a, 2 * BIG, 0, 2 * BIG, got), 0);
        assert_memory_equal(got, want_a, sizeof got);
        assert_int_equal(lmc_hash_chunks(memo, b, 2 * BIG, 0, 2 * BIG, got), 0);
        assert_memory_equal(got, want_b, sizeof got);
    }
    lmc_hash_memo_stats st;
    assert_true(lmc_token_hasher_memo_stats(memo, &st));
    assert_int_equal(st.misses, 4);
    assert_int_equal(st.hits, 4);
    lmc_token_hasher_free(plain);
    lmc_token_hasher_free(memo);
}

typedef struct {
    lmc_token_hasher *h;
    uint64_t seed;
    uint8_t out[CHUNKS * 32];
} job;

static void *hash_job(void *arg)
{
    job *j = arg;
    uint64_t toks[CHUNKS * CS];
    fill(toks, CHUNKS * CS, 77);               /* a shared prefix ... */
    toks[(CHUNKS / 2) * CS] += j->seed;        /* ... then per-thread tails */
    for (int r = 0; r < 20; r++)
        assert_int_equal(lmc_hash_chunks(j->h, toks, CHUNKS * CS, 0, CHUNKS * CS, j->out), 0);
    return NULL;
}

static void test_threads_share_the_memo(void **state)
{
    (void)state;
    lmc_token_hasher *plain = hasher("blake3", 0), *memo = hasher("blake3", 64 * 1024);
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){.h = memo, .seed = (uint64_t)i};
        pthread_create(&th[i], NULL, hash_job, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        job ref = {.h = plain, .seed = (uint64_t)i};
        hash_job(&ref);
        assert_memory_equal(ref.out, jobs[i].out, sizeof ref.out);
    }
    lmc_token_hasher_free(plain);
    lmc_token_hasher_free(memo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blake3_same_bytes),
        cmocka_unit_test(test_sha256_cbor_same_bytes),
        cmocka_unit_test(test_tiny_memo_replaces_and_stays_correct),
        cmocka_unit_test(test_hits_and_misses_are_counted),
        cmocka_unit_test(test_big_tokens_and_tiny_budget),
        cmocka_unit_test(test_chunks_differing_between_sampled_tokens),
        cmocka_unit_test(test_threads_share_the_memo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
