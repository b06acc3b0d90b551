/* Prefetch-job registry: exactly-once results, replacement, unknown ids,
 * parked waiters with a fake clock, bounds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "modules/services/prefetch_jobs.h"

static int64_t fake_now;
static int64_t fake_clock(void *user)
{
    return *(int64_t *)user;
}

typedef struct {
    int calls;
    lmc_job_status st;
    int64_t hits;
} seen;

static void on_wait(void *user, lmc_job_status st, int64_t hits)
{
    seen *s = user;
    s->st = st;
    s->hits = hits;
    __atomic_add_fetch(&s->calls, 1, __ATOMIC_RELEASE);   /* the timer thread calls too */
}

static lmc_jobs *new_jobs(size_t max)
{
    fake_now = 1000;
    lmc_jobs_options o = {.max_jobs = max, .clock = fake_clock, .clock_user = &fake_now};
    return lmc_jobs_new(&o);
}

static void test_exactly_once_and_unknown(void **st)
{
    (void)st;
    lmc_jobs *j = new_jobs(0);
    int64_t hits = -1;
    assert_int_equal(lmc_jobs_query(j, "x", 1, &hits), LMC_JOB_UNKNOWN);
    assert_int_equal(hits, 0);
    bool replaced;
    uint64_t id = lmc_jobs_submit(j, "r1", 2, &replaced);
    assert_true(id != 0);
    assert_false(replaced);
    assert_int_equal(lmc_jobs_query(j, "r1", 2, &hits), LMC_JOB_RUNNING);
    assert_int_equal(lmc_jobs_lookup_hits(j, "r1", 2, &hits), LMC_JOB_RUNNING);
    lmc_jobs_set_lookup_hits(j, "r1", 2, id, 5);
    assert_int_equal(lmc_jobs_lookup_hits(j, "r1", 2, &hits), LMC_JOB_DONE);
    assert_int_equal(hits, 5);
    lmc_jobs_complete(j, "r1", 2, id, 4);
    assert_int_equal(lmc_jobs_lookup_hits(j, "r1", 2, &hits), LMC_JOB_DONE);  /* not consuming */
    assert_int_equal(lmc_jobs_query(j, "r1", 2, &hits), LMC_JOB_DONE);
    assert_int_equal(hits, 4);
    assert_int_equal(lmc_jobs_query(j, "r1", 2, &hits), LMC_JOB_UNKNOWN);
    assert_int_equal(lmc_jobs_count(j), 0);
    lmc_jobs_free(j);
}

static void test_replace(void **st)
{
    (void)st;
    lmc_jobs *j = new_jobs(0);
    bool replaced;
    int64_t hits;
    uint64_t a = lmc_jobs_submit(j, "r", 1, &replaced);
    lmc_jobs_complete(j, "r", 1, a, 7);
    uint64_t b = lmc_jobs_submit(j, "r", 1, &replaced);
    assert_true(replaced);          /* the result 7 was never consumed */
    assert_true(b != a);
    lmc_jobs_complete(j, "r", 1, a, 9);   /* stale id: ignored */
    assert_int_equal(lmc_jobs_query(j, "r", 1, &hits), LMC_JOB_RUNNING);
    lmc_jobs_complete(j, "r", 1, b, 2);
    assert_int_equal(lmc_jobs_query(j, "r", 1, &hits), LMC_JOB_DONE);
    assert_int_equal(hits, 2);
    lmc_jobs_submit(j, "r", 1, &replaced);
    assert_false(replaced);         /* consumed before */
    assert_true(lmc_jobs_drop(j, "r", 1));
    assert_false(lmc_jobs_drop(j, "r", 1));
    lmc_jobs_free(j);
}

static void test_waiters(void **st)
{
    (void)st;
    lmc_jobs *j = new_jobs(0);
    bool replaced;
    int64_t hits;
    seen a = {0}, b = {0}, c = {0};
    assert_int_equal(lmc_jobs_wait(j, "u", 1, 100, on_wait, &a, &hits), LMC_JOB_UNKNOWN);
    uint64_t id = lmc_jobs_submit(j, "r", 1, &replaced);
    assert_int_equal(lmc_jobs_wait(j, "r", 1, 100, on_wait, &a, &hits), LMC_JOB_WAITING);
    assert_int_equal(lmc_jobs_wait(j, "r", 1, 500, on_wait, &b, &hits), LMC_JOB_WAITING);
    assert_int_equal(lmc_jobs_waiter_count(j), 2);
    fake_now += 99;
    assert_int_equal(lmc_jobs_expire(j), 0);
    fake_now += 1;
    assert_int_equal(lmc_jobs_expire(j), 1);      /* a timed out: None */
    assert_int_equal(a.calls, 1);
    assert_int_equal(a.st, LMC_JOB_RUNNING);
    lmc_jobs_complete(j, "r", 1, id, 3);          /* wakes b with the result */
    assert_int_equal(b.calls, 1);
    assert_int_equal(b.st, LMC_JOB_DONE);
    assert_int_equal(b.hits, 3);
    assert_int_equal(lmc_jobs_query(j, "r", 1, &hits), LMC_JOB_UNKNOWN);  /* consumed */
    /* Dropping and freeing answer parked waiters exactly once. */
    lmc_jobs_submit(j, "r", 1, &replaced);
    lmc_jobs_wait(j, "r", 1, 1000, on_wait, &c, &hits);
    lmc_jobs_drop(j, "r", 1);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.st, LMC_JOB_UNKNOWN);
    lmc_jobs_submit(j, "r", 1, &replaced);
    lmc_jobs_wait(j, "r", 1, 1000, on_wait, &c, &hits);
    lmc_jobs_free(j);
    assert_int_equal(c.calls, 2);
    assert_int_equal(c.st, LMC_JOB_RUNNING);
    assert_int_equal(a.calls, 1);
}

static void test_bound(void **st)
{
    (void)st;
    lmc_jobs *j = new_jobs(4);
    bool replaced;
    int64_t hits;
    char rid[8];
    for (int i = 0; i < 10; i++) {
        snprintf(rid, sizeof rid, "r%d", i);
        lmc_jobs_submit(j, rid, strlen(rid), &replaced);
    }
    assert_true(lmc_jobs_count(j) <= 4);
    assert_int_equal(lmc_jobs_query(j, "r0", 2, &hits), LMC_JOB_UNKNOWN);
    assert_int_equal(lmc_jobs_query(j, "r9", 2, &hits), LMC_JOB_RUNNING);
    lmc_jobs_free(j);
}

static void test_timer_thread(void **st)
{
    (void)st;
    lmc_jobs_options o = {.timer_thread = true};
    lmc_jobs *j = lmc_jobs_new(&o);
    bool replaced;
    int64_t hits;
    seen a = {0};
    lmc_jobs_submit(j, "r", 1, &replaced);
    assert_int_equal(lmc_jobs_wait(j, "r", 1, 30, on_wait, &a, &hits), LMC_JOB_WAITING);
    /* The timer thread unparks the waiter, then answers it outside the lock:
     * wait for the answer itself, not just for the count. */
    for (int i = 0; i < 400 && __atomic_load_n(&a.calls, __ATOMIC_ACQUIRE) == 0; i++)
        usleep(5000);
    assert_int_equal(__atomic_load_n(&a.calls, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(lmc_jobs_waiter_count(j), 0);
    assert_int_equal(a.st, LMC_JOB_RUNNING);
    lmc_jobs_free(j);
}

/* issue 17: parked waits are bounded; past the bound a wait answers None
 * (RUNNING) at once, and room comes back as waits finish. */
static void test_waiter_bound(void **st)
{
    (void)st;
    fake_now = 1000;
    lmc_jobs_options o = {.max_waiters = 2, .clock = fake_clock, .clock_user = &fake_now};
    lmc_jobs *j = lmc_jobs_new(&o);
    bool replaced;
    uint64_t id = lmc_jobs_submit(j, "r", 1, &replaced);
    seen a = {0}, b = {0}, c = {0};
    int64_t hits;
    assert_int_equal(lmc_jobs_wait(j, "r", 1, 100, on_wait, &a, &hits), LMC_JOB_WAITING);
    assert_int_equal(lmc_jobs_wait(j, "r", 1, 500, on_wait, &b, &hits), LMC_JOB_WAITING);
    assert_int_equal(lmc_jobs_wait(j, "r", 1, 500, on_wait, &c, &hits), LMC_JOB_RUNNING);
    assert_int_equal(c.calls, 0);
    assert_int_equal(lmc_jobs_waiter_count(j), 2);
    fake_now += 200;                      /* a times out: room for one more */
    assert_int_equal(lmc_jobs_expire(j), 1);
    assert_int_equal(lmc_jobs_waiter_count(j), 1);
    assert_int_equal(lmc_jobs_wait(j, "r", 1, 500, on_wait, &c, &hits), LMC_JOB_WAITING);
    lmc_jobs_complete(j, "r", 1, id, 3);  /* one of b, c gets the result */
    assert_int_equal(lmc_jobs_waiter_count(j), 0);
    assert_int_equal(a.calls + b.calls + c.calls, 3);
    assert_int_equal((b.st == LMC_JOB_DONE) + (c.st == LMC_JOB_DONE), 1);
    assert_int_equal(b.hits + c.hits, 3);
    lmc_jobs_free(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exactly_once_and_unknown),
        cmocka_unit_test(test_replace),
        cmocka_unit_test(test_waiters),
        cmocka_unit_test(test_bound),
        cmocka_unit_test(test_waiter_bound),
        cmocka_unit_test(test_timer_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
