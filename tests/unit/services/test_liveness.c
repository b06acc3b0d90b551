/* The liveness registry (src/modules/services/liveness.h): registered instances
 * stay until forgotten; ids a client only PINGs are bounded, oldest first
 * out (issue 29: PING of any int64 id used to grow the table for ever). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "modules/services/liveness.h"

static void test_registered_and_pinged(void **state)
{
    (void)state;
    lmc_liveness *lv = lmc_liveness_new();
    lmc_liveness_entry e;
    assert_int_equal(lmc_liveness_touch(lv, 7, 5, false), 0);   /* an op of an unknown id */
    assert_false(lmc_liveness_get(lv, 7, &e));
    assert_int_equal(lmc_liveness_register(lv, 7, 10), 0);
    assert_true(lmc_liveness_get(lv, 7, &e));
    assert_false(e.pinged);
    assert_int_equal(lmc_liveness_touch(lv, 7, 20, true), 0);
    assert_true(lmc_liveness_get(lv, 7, &e));
    assert_true(e.pinged);
    assert_int_equal(e.last_seen_ms, 20);
    /* A worker that pings before it registers keeps its ping. */
    assert_int_equal(lmc_liveness_touch(lv, 8, 30, true), 0);
    assert_int_equal(lmc_liveness_register(lv, 8, 31), 0);
    assert_true(lmc_liveness_get(lv, 8, &e) && e.pinged && e.last_seen_ms == 31);
    lmc_liveness_forget(lv, 7);
    assert_false(lmc_liveness_get(lv, 7, &e));
    assert_int_equal(lmc_liveness_count(lv), 1);
    lmc_liveness_free(lv);
}

static void test_pings_of_fresh_ids_are_bounded(void **state)
{
    (void)state;
    lmc_liveness *lv = lmc_liveness_new();
    for (int64_t id = 1; id <= 100; id++)
        assert_int_equal(lmc_liveness_register(lv, id * 1000003, 0), 0);
    for (int64_t id = 0; id < 300000; id++)
        assert_int_equal(lmc_liveness_touch(lv, -id - 1, id, true), 0);
    assert_int_equal(lmc_liveness_count(lv), 100 + LMC_LIVENESS_MAX_UNREGISTERED);
    lmc_liveness_entry e;
    for (int64_t id = 1; id <= 100; id++)   /* registered ones all stay */
        assert_true(lmc_liveness_get(lv, id * 1000003, &e));
    assert_true(lmc_liveness_get(lv, -300000, &e));   /* the newest pinger */
    assert_false(lmc_liveness_get(lv, -1, &e));       /* the oldest went */
    assert_false(lmc_liveness_get(lv, -(300000 - LMC_LIVENESS_MAX_UNREGISTERED), &e));
    assert_true(lmc_liveness_get(lv, -(300000 - LMC_LIVENESS_MAX_UNREGISTERED + 1), &e));
    /* Forgetting in the middle of probe runs keeps every other id findable. */
    for (int64_t id = 1; id <= 100; id += 2)
        lmc_liveness_forget(lv, id * 1000003);
    for (int64_t id = 2; id <= 100; id += 2)
        assert_true(lmc_liveness_get(lv, id * 1000003, &e));
    for (int64_t k = 0; k < LMC_LIVENESS_MAX_UNREGISTERED; k++)
        assert_true(lmc_liveness_get(lv, -(300000 - k), &e));
    lmc_liveness_free(lv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registered_and_pinged),
        cmocka_unit_test(test_pings_of_fresh_ids_are_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
