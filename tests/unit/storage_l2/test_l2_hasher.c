/* The fs adapter's checksum pool (issue 18; docs/l2.md, "fs"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "blake3.h"
#include "storage/l2/l2_hasher.h"

#define SIZE (3u * (512u << 10) + 777u)

static void one_shot(const uint8_t *p, size_t n, uint8_t d[LMC_L2_DIGEST_LEN])
{
    blake3_hasher h;
    blake3_hasher_init(&h);
    blake3_hasher_update(&h, p, n);
    blake3_hasher_finalize(&h, d, LMC_L2_DIGEST_LEN);
}

static uint8_t *data(void)
{
    uint8_t *p = malloc(SIZE);
    for (size_t i = 0; i < SIZE; i++)
        p[i] = (uint8_t)(i * 31 + i / 1000);
    return p;
}

/* One pool thread, two jobs: one fed in uneven pieces, one ready at once.
 * Whichever the thread takes, the other is hashed by its finish (or after
 * the first); both digests equal a one-shot hash and nothing waits forever. */
static void test_pieces_and_two_jobs(void **state)
{
    (void)state;
    uint8_t *p = data(), want[LMC_L2_DIGEST_LEN], got[LMC_L2_DIGEST_LEN];
    one_shot(p, SIZE, want);
    lmc_l2_hasher *h = lmc_l2_hasher_new(1);
    assert_non_null(h);
    lmc_l2_hash_job a, b;
    lmc_l2_hash_start(h, &a, p, SIZE, 0);
    lmc_l2_hash_start(h, &b, p, SIZE, SIZE);
    lmc_l2_hash_finish(h, &b, got);
    assert_memory_equal(got, want, sizeof want);
    /* Pauses let the pool thread hash each piece on its own, as it does
     * between the reads of a load. */
    for (uint64_t r = 1; r < SIZE; r += r / 2 + 4097) {
        lmc_l2_hash_advance(h, &a, r);
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    lmc_l2_hash_finish(h, &a, got);
    assert_memory_equal(got, want, sizeof want);
    /* A different byte, a different digest. */
    p[SIZE / 2] ^= 1;
    lmc_l2_hash_start(h, &a, p, SIZE, SIZE / 3);
    lmc_l2_hash_finish(h, &a, got);
    assert_memory_not_equal(got, want, sizeof want);
    lmc_l2_hasher_free(h);
    free(p);
}

/* A failed read aborts its job part-way; an empty object has a digest. */
static void test_abort_and_empty(void **state)
{
    (void)state;
    uint8_t *p = data(), want[LMC_L2_DIGEST_LEN], got[LMC_L2_DIGEST_LEN];
    lmc_l2_hasher *h = lmc_l2_hasher_new(2);
    assert_non_null(h);
    lmc_l2_hash_job j;
    for (int i = 0; i < 50; i++) {
        lmc_l2_hash_start(h, &j, p, SIZE, (uint64_t)i * 4096);
        lmc_l2_hash_abort(h, &j);
    }
    one_shot(p, 0, want);
    lmc_l2_hash_start(h, &j, p, 0, 0);
    lmc_l2_hash_finish(h, &j, got);
    assert_memory_equal(got, want, sizeof want);
    lmc_l2_hasher_free(h);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_and_two_jobs),
        cmocka_unit_test(test_abort_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
