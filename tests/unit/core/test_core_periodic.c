/* The periodic thread: calls every period, comes early when woken, and
 * stops at once even in the middle of a long period. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "core/periodic.h"

static void count_call(void *user)
{
    atomic_fetch_add((atomic_int *)user, 1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits up to 5 s for at least `want` calls. */
static int wait_for_calls(atomic_int *calls, int want)
{
    for (double until = now_s() + 5; atomic_load(calls) < want && now_s() < until;)
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    return atomic_load(calls);
}

static void calls_every_period(void **state)
{
    (void)state;
    atomic_int calls = 0;
    lmc_core_periodic *p = lmc_core_periodic_start("test-periodic", 5, count_call, &calls);
    assert_non_null(p);
    assert_true(wait_for_calls(&calls, 3) >= 3);
    lmc_core_periodic_stop(p);
}

static void wakes_early_and_stops_at_once(void **state)
{
    (void)state;
    atomic_int calls = 0;
    lmc_core_periodic *p = lmc_core_periodic_start(NULL, 3600 * 1000, count_call, &calls);
    assert_non_null(p);
    assert_int_equal(atomic_load(&calls), 0);
    double t0 = now_s();
    lmc_core_periodic_wake(p);
    assert_int_equal(wait_for_calls(&calls, 1), 1);
    lmc_core_periodic_stop(p);
    assert_true(now_s() - t0 < 5);
    lmc_core_periodic_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(calls_every_period),
        cmocka_unit_test(wakes_early_and_stops_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
