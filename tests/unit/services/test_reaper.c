/* Reaper with an injected clock: ping-proven vs never-pinged limits,
 * disabled reaping, and a reaped instance is reported once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "modules/services/reaper.h"

typedef struct {
    int64_t now;
    int64_t ids[4];
    size_t n;
    int64_t reaped[8];
    size_t n_reaped;
} world;

static int64_t clk(void *u)
{
    return ((world *)u)->now;
}

static size_t list(void *u, int64_t *ids, size_t cap)
{
    world *w = u;
    for (size_t i = 0; i < w->n && i < cap; i++)
        ids[i] = w->ids[i];
    return w->n;
}

static void reap(void *u, int64_t id)
{
    world *w = u;
    w->reaped[w->n_reaped++] = id;
    for (size_t i = 0; i < w->n; i++) {
        if (w->ids[i] == id)
            w->ids[i] = w->ids[--w->n];
    }
}

static void test_reap_limits(void **st)
{
    (void)st;
    world w = {.now = 0, .ids = {1, 2, 3}, .n = 3};
    lmc_liveness *lv = lmc_liveness_new();
    lmc_liveness_register(lv, 1, 0);          /* registered, never pinged */
    lmc_liveness_register(lv, 2, 0);
    lmc_liveness_touch(lv, 2, 0, true);       /* ping-proven */
    lmc_liveness_register(lv, 3, 0);
    lmc_liveness_touch(lv, 3, 0, true);
    lmc_reaper_options o = {.timeout_ms = 30000, .grace_ms = 60000, .liveness = lv,
                            .list = list, .reap = reap, .user = &w, .clock = clk,
                            .clock_user = &w};
    lmc_reaper *r = lmc_reaper_new(&o);
    w.now = 30000;
    assert_int_equal(lmc_reaper_run_once(r), 0);   /* not beyond the timeout yet */
    w.now = 30001;
    lmc_liveness_touch(lv, 3, 30001, false);       /* a transfer refreshes 3 */
    assert_int_equal(lmc_reaper_run_once(r), 1);
    assert_int_equal(w.reaped[0], 2);
    w.now = 60001;
    assert_int_equal(lmc_reaper_run_once(r), 1);   /* 1: grace over; 3 still fresh */
    assert_int_equal(w.reaped[1], 1);
    w.now = 60002 + 30000;
    assert_int_equal(lmc_reaper_run_once(r), 1);
    assert_int_equal(w.reaped[2], 3);
    assert_int_equal(lmc_reaper_run_once(r), 0);
    lmc_reaper_free(r);
    lmc_liveness_free(lv);
}

static void test_disabled(void **st)
{
    (void)st;
    world w = {.now = 1LL << 40, .ids = {1}, .n = 1};
    lmc_liveness *lv = lmc_liveness_new();
    lmc_reaper_options o = {.timeout_ms = 0, .grace_ms = 0, .liveness = lv, .list = list,
                            .reap = reap, .user = &w, .clock = clk, .clock_user = &w,
                            .start_thread = true};
    lmc_reaper *r = lmc_reaper_new(&o);
    assert_int_equal(lmc_reaper_run_once(r), 0);
    lmc_reaper_free(r);
    lmc_liveness_free(lv);
}

static void test_period_default(void **st)
{
    (void)st;
    lmc_liveness_entry e = {.instance_id = 1, .last_seen_ms = 0, .pinged = true};
    lmc_reaper_options o = {.timeout_ms = 120000, .grace_ms = 3600000};
    assert_false(lmc_reaper_due(&o, &e, true, 120000));
    assert_true(lmc_reaper_due(&o, &e, true, 120001));
    e.pinged = false;
    assert_false(lmc_reaper_due(&o, &e, true, 120001));
    assert_true(lmc_reaper_due(&o, &e, false, 0));   /* forgotten by liveness */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reap_limits),
        cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_period_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
