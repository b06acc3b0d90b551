/* The trace what-if's simulation (storage_whatif.h; rules in
 * docs/trace.md, "What-if"): a staged write is not evictable and a write
 * that cannot be made room for is refused whole; a controller cycle
 * evicts floor(tracked x ratio) keys, oldest first; lookups hit a prefix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "storage/storage_whatif.h"

static lmc_key_interner *in;

static lmc_object_key k(uint8_t b)
{
    lmc_object_key key = {.chunk_hash_len = 32};
    memset(key.chunk_hash, b, 32);
    lmc_object_key_set_strings(&key, lmc_intern(in, "m", 1), lmc_intern(in, "", 0));
    return key;
}

static void add(lmc_storage_whatif_trace *t, lmc_storage_trace_op op, const uint8_t *ids,
                size_t n, uint64_t size)
{
    lmc_object_key keys[8];
    for (size_t i = 0; i < n; i++)
        keys[i] = k(ids[i]);
    lmc_trace_record rec = {.op = op, .keys = keys, .n_keys = n, .object_size = size,
                            .qualname = ""};
    assert_int_equal(lmc_storage_whatif_trace_add(t, &rec), 0);
}

static lmc_storage_whatif_result run(const lmc_storage_whatif_trace *t, const char *policy,
                                     uint64_t bytes)
{
    lmc_storage_whatif_config c = {policy, bytes, 0.8, 0.2};
    lmc_storage_whatif_result r;
    char err[128];
    assert_int_equal(lmc_storage_whatif_run(t, &c, &r, err, sizeof err), 0);
    return r;
}

static void test_staged_is_not_evictable(void **state)
{
    (void)state;
    lmc_storage_whatif_trace *t = lmc_storage_whatif_trace_new();
    static const uint8_t a[] = {1}, b[] = {2}, ab[] = {1, 2};
    add(t, LMC_STORAGE_TRACE_RESERVE_WRITE, a, 1, 100);
    add(t, LMC_STORAGE_TRACE_RESERVE_WRITE, b, 1, 100);   /* L1 full of staged A: refused */
    add(t, LMC_STORAGE_TRACE_FINISH_WRITE, ab, 2, 0);
    add(t, LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK, ab, 2, 0);
    lmc_storage_whatif_result r = run(t, "LRU", 100);
    assert_int_equal(r.writes_refused, 1);
    assert_int_equal(r.evictions, 0);
    assert_int_equal(r.lookups, 1);
    assert_int_equal(r.lookup_keys, 2);
    assert_int_equal(r.hit_keys, 1);
    /* Finished, A is evictable: B's write evicts it, and B then hits
     * while A, the lookup's first key, misses: no prefix, no hit. */
    lmc_storage_whatif_trace *t2 = lmc_storage_whatif_trace_new();
    add(t2, LMC_STORAGE_TRACE_RESERVE_WRITE, a, 1, 100);
    add(t2, LMC_STORAGE_TRACE_FINISH_WRITE, a, 1, 0);
    add(t2, LMC_STORAGE_TRACE_RESERVE_WRITE, b, 1, 100);
    add(t2, LMC_STORAGE_TRACE_FINISH_WRITE, b, 1, 0);
    add(t2, LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK, ab, 2, 0);
    r = run(t2, "LRU", 100);
    assert_int_equal(r.writes_refused, 0);
    assert_int_equal(r.evictions, 1);
    assert_int_equal(r.hit_keys, 0);
    r = run(t2, "noop", 100);
    assert_int_equal(r.writes_refused, 1);
    assert_int_equal(r.hit_keys, 1);
    lmc_storage_whatif_trace_free(t2);
    lmc_storage_whatif_trace_free(t);
}

/* The policy passes over a staged key to the resident one behind it:
 * staged A is the oldest, resident B is evicted for C. */
static void test_victims_skip_staged_keys(void **state)
{
    (void)state;
    lmc_storage_whatif_trace *t = lmc_storage_whatif_trace_new();
    static const uint8_t a[] = {1}, b[] = {2}, c[] = {3};
    add(t, LMC_STORAGE_TRACE_RESERVE_WRITE, a, 1, 100);
    add(t, LMC_STORAGE_TRACE_RESERVE_WRITE, b, 1, 100);
    add(t, LMC_STORAGE_TRACE_FINISH_WRITE, b, 1, 0);
    add(t, LMC_STORAGE_TRACE_RESERVE_WRITE, c, 1, 100);
    lmc_storage_whatif_result r = run(t, "LRU", 200);
    assert_int_equal(r.evictions, 1);
    assert_int_equal(r.writes_refused, 0);
    lmc_storage_whatif_trace_free(t);
}

/* Eleven objects of 10 bytes in an L1 of 100: the cycle before each write
 * evicts once usage reaches 80 %: before the 9th, 10th and 11th writes,
 * floor(8 x 0.2) = 1 key each, the oldest (0, 1, 2), so the L1 stays at
 * the watermark as a controller that keeps up holds it there. */
static void test_cycle_evicts_a_fifth_oldest_first(void **state)
{
    (void)state;
    lmc_storage_whatif_trace *t = lmc_storage_whatif_trace_new();
    for (uint8_t i = 0; i < 11; i++) {
        uint8_t id[] = {i};
        add(t, LMC_STORAGE_TRACE_RESERVE_WRITE, id, 1, 10);
        add(t, LMC_STORAGE_TRACE_FINISH_WRITE, id, 1, 0);
    }
    for (uint8_t i = 0; i < 11; i++) {
        uint8_t id[] = {i};
        add(t, LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK, id, 1, 0);
    }
    lmc_storage_whatif_result r = run(t, "LRU", 100);
    assert_int_equal(r.evictions, 3);
    assert_int_equal(r.hit_keys, 8);   /* 0, 1 and 2 evicted */
    lmc_storage_whatif_summary s;
    lmc_storage_whatif_trace_summary(t, &s);
    assert_int_equal(s.distinct_keys, 11);
    assert_int_equal(s.distinct_bytes, 110);
    assert_int_equal(s.min_object, 10);
    assert_int_equal(s.by_op[LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK], 11);
    char err[128];
    lmc_storage_whatif_config c = {"ARC", 100, 0.8, 0.2};
    assert_int_equal(lmc_storage_whatif_run(t, &c, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "--policy ARC"));
    lmc_storage_whatif_trace_free(t);
}

int main(void)
{
    in = lmc_key_interner_new();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staged_is_not_evictable),
        cmocka_unit_test(test_victims_skip_staged_keys),
        cmocka_unit_test(test_cycle_evicts_a_fifth_oldest_first),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    lmc_key_interner_free(in);
    return rc;
}
