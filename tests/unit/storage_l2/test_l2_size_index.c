/* The size index of the resp and s3 backends (issue 17): overwrites replace
 * a size, forgets subtract it once, reservations enforce the capacity, and
 * the table survives long runs of colliding ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "storage/l2/l2_size_index.h"

static lmc_l2_usage usage_of(lmc_l2_size_index *ix)
{
    lmc_l2_usage u;
    lmc_l2_size_index_usage(ix, &u);
    return u;
}

/* A whole batch written by one part. */
static bool store_all(lmc_l2_size_index *ix, const uint64_t *ids, const uint64_t *sizes,
                      size_t n, size_t written)
{
    lmc_l2_reservation *r = lmc_l2_size_index_reserve_batch(ix, ids, sizes, n);
    if (!r)
        return false;
    uint8_t w[8] = {0};
    for (size_t i = 0; i < written; i++)
        w[i] = 1;
    lmc_l2_size_index_settle(ix, r, 0, n, w, written == n);
    return lmc_l2_size_index_release(ix, r);
}

static void test_overwrite_and_forget(void **state)
{
    (void)state;
    lmc_l2_size_index *ix = lmc_l2_size_index_new(0);
    uint64_t ids[2] = {lmc_l2_key_id("a", 1), lmc_l2_key_id("b", 1)}, sizes[2] = {100, 50};
    assert_true(store_all(ix, ids, sizes, 2, 2));
    assert_int_equal(usage_of(ix).used_bytes, 150);
    sizes[0] = 40; /* "a" shrinks */
    assert_true(store_all(ix, ids, sizes, 1, 1));
    assert_int_equal(usage_of(ix).used_bytes, 90);
    assert_int_equal(usage_of(ix).num_keys, 2);
    assert_true(lmc_l2_size_index_forget(ix, ids[0]));
    assert_false(lmc_l2_size_index_forget(ix, ids[0]));
    assert_int_equal(usage_of(ix).used_bytes, 50);
    assert_int_equal(usage_of(ix).num_keys, 1);
    lmc_l2_size_index_free(ix);
}

static void test_capacity_and_partial_writes(void **state)
{
    (void)state;
    lmc_l2_size_index *ix = lmc_l2_size_index_new(300);
    uint64_t ids[3] = {1, 2, 3}, sizes[3] = {100, 100, 100};
    lmc_l2_reservation *r1 = lmc_l2_size_index_reserve_batch(ix, ids, sizes, 2);
    assert_non_null(r1);
    /* Reserved room counts for a concurrent writer. */
    assert_null(lmc_l2_size_index_reserve_batch(ix, ids + 1, sizes + 1, 2));
    assert_true(store_all(ix, ids + 2, sizes + 2, 1, 1));
    lmc_l2_size_index_settle(ix, r1, 0, 2, (uint8_t[]){1, 0}, false); /* 2nd write failed */
    assert_false(lmc_l2_size_index_release(ix, r1));
    assert_int_equal(usage_of(ix).used_bytes, 200);
    assert_int_equal(usage_of(ix).capacity_bytes, 300);
    assert_true(store_all(ix, ids + 1, sizes + 1, 1, 1));
    assert_false(store_all(ix, (uint64_t[]){4}, (uint64_t[]){1}, 1, 1));
    assert_true(store_all(ix, ids, sizes, 1, 1)); /* same size again */
    assert_int_equal(usage_of(ix).used_bytes, 300);
    lmc_l2_size_index_free(ix);
}

/* Issue 18: a batch written in parts.  A part that fails settles only what
 * it wrote, a part that never ran is released at the end, and the room
 * reserved for both is free again afterwards. */
static void test_batch_settled_in_parts(void **state)
{
    (void)state;
    lmc_l2_size_index *ix = lmc_l2_size_index_new(400);
    uint64_t ids[4] = {1, 2, 3, 4}, sizes[4] = {100, 100, 100, 100};
    lmc_l2_reservation *r = lmc_l2_size_index_reserve_batch(ix, ids, sizes, 4);
    assert_non_null(r);
    assert_null(lmc_l2_size_index_reserve_batch(ix, (uint64_t[]){9}, (uint64_t[]){1}, 1));
    lmc_l2_size_index_settle(ix, r, 2, 1, (uint8_t[]){1}, true);
    lmc_l2_size_index_settle(ix, r, 0, 2, (uint8_t[]){1, 0}, false);
    assert_int_equal(usage_of(ix).used_bytes, 200);   /* ids 1 and 3 */
    assert_false(lmc_l2_size_index_release(ix, r));  /* id 4's part never ran */
    assert_int_equal(usage_of(ix).num_keys, 2);
    /* Exactly 200 bytes are free again: nothing stays reserved. */
    assert_true(store_all(ix, (uint64_t[]){5, 6}, (uint64_t[]){100, 100}, 2, 2));
    assert_false(store_all(ix, (uint64_t[]){7}, (uint64_t[]){1}, 1, 1));
    r = lmc_l2_size_index_reserve_batch(ix, ids, sizes, 1); /* an overwrite: no growth */
    lmc_l2_size_index_settle(ix, r, 0, 1, (uint8_t[]){1}, true);
    assert_true(lmc_l2_size_index_release(ix, r));
    assert_int_equal(usage_of(ix).used_bytes, 400);
    lmc_l2_size_index_free(ix);
}

/* Ids that share their low bits probe the same run; random puts and
 * forgets, checked against a plain array after every step. */
static void test_colliding_ids_against_a_reference(void **state)
{
    (void)state;
    enum { IDS = 3000, STEPS = 40000 };
    uint64_t *ref = calloc(IDS, sizeof *ref), want = 0, keys = 0;
    lmc_l2_size_index *ix = lmc_l2_size_index_new(0);
    srand(7);
    for (int step = 0; step < STEPS; step++) {
        int i = rand() % IDS;
        uint64_t id = ((uint64_t)(i + 1) << 20) | (uint64_t)(i % 5); /* 5 homes in all */
        if (rand() % 3) {
            uint64_t size = 1 + (uint64_t)(rand() % 1000);
            assert_int_equal(lmc_l2_size_index_put(ix, id, size), 0);
            want += size - ref[i];
            keys += ref[i] == 0;
            ref[i] = size;
        } else {
            assert_int_equal(lmc_l2_size_index_forget(ix, id), ref[i] != 0);
            want -= ref[i];
            keys -= ref[i] != 0;
            ref[i] = 0;
        }
        if (step % 97 == 0 || step == STEPS - 1) {
            assert_int_equal(usage_of(ix).used_bytes, want);
            assert_int_equal(usage_of(ix).num_keys, keys);
        }
    }
    for (int i = 0; i < IDS; i++) { /* everything still findable after the shifts */
        uint64_t id = ((uint64_t)(i + 1) << 20) | (uint64_t)(i % 5);
        assert_int_equal(lmc_l2_size_index_forget(ix, id), ref[i] != 0);
    }
    assert_int_equal(usage_of(ix).used_bytes, 0);
    assert_int_equal(usage_of(ix).num_keys, 0);
    lmc_l2_size_index_free(ix);
    free(ref);
}

static void hand(void *user, const lmc_object_key *keys, const uint64_t *sizes, size_t n)
{
    (void)keys;
    char *log = user;
    size_t at = strlen(log);
    log[at++] = '[';
    for (size_t i = 0; i < n; i++)
        log[at++] = (char)('0' + sizes[i]);
    log[at++] = ']';
    log[at] = '\0';
}

static void test_found_handed_over_by_batch(void **state)
{
    (void)state;
    lmc_l2_found_list l = {0};
    lmc_object_key k = {.chunk_hash_len = 1, .model_name = "m", .cache_salt = ""};
    int64_t batch[5] = {7, 3, 7, 3, 1}, order[5] = {2, 9, 1, 4, 0};
    for (int i = 0; i < 5; i++)
        assert_int_equal(lmc_l2_found_add(&l, &k, (uint64_t)i, batch[i], order[i]), 0);
    char log[64] = "";
    lmc_l2_found_hand_over(&l, hand, log);
    assert_string_equal(log, "[4][31][20]");
    assert_int_equal(l.n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overwrite_and_forget),
        cmocka_unit_test(test_capacity_and_partial_writes),
        cmocka_unit_test(test_batch_settled_in_parts),
        cmocka_unit_test(test_colliding_ids_against_a_reference),
        cmocka_unit_test(test_found_handed_over_by_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
