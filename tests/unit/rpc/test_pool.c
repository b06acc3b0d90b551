/* lmc_pool_share: one task's work cut into pieces that the pool's idle
 * threads take beside the task's own thread (docs/architecture.md, "One
 * request across the copy workers"). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "rpc/pool.h"

#define MAX_PIECES 64

typedef struct {
    lmc_pool_task task;            /* first: the pool links tasks through it */
    lmc_pool *pool;
    size_t n_pieces;
    size_t fail_piece;             /* this piece returns false; SIZE_MAX: none */
    bool rendezvous;               /* piece 0 waits for piece 1 to start */
    atomic_int runs[MAX_PIECES];
    pthread_t ran_on[MAX_PIECES];
    atomic_bool started[MAX_PIECES];
    bool rendezvous_met;
    bool result;
    atomic_bool finished;
} share_task;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static bool piece(void *arg, size_t i)
{
    share_task *t = arg;
    atomic_fetch_add(&t->runs[i], 1);
    t->ran_on[i] = pthread_self();
    atomic_store(&t->started[i], true);
    if (t->rendezvous && i == 0) {
        /* Only another thread can start piece 1 while this one waits. */
        double give_up = now_s() + 10;
        while (!atomic_load(&t->started[1]) && now_s() < give_up)
            ;
        t->rendezvous_met = atomic_load(&t->started[1]);
    }
    return i != t->fail_piece;
}

static void run_share(lmc_pool_task *task, void *user)
{
    (void)user;
    share_task *t = (share_task *)task;
    t->result = lmc_pool_share(t->pool, t->n_pieces, piece, t);
    atomic_store(&t->finished, true);
}

static void wait_finished(share_task *t)
{
    double give_up = now_s() + 20;
    while (!atomic_load(&t->finished) && now_s() < give_up)
        ;
    assert_true(atomic_load(&t->finished));
}

static void init_task(share_task *t, lmc_pool *pool, size_t n)
{
    memset(t, 0, sizeof *t);
    t->pool = pool;
    t->n_pieces = n;
    t->fail_piece = SIZE_MAX;
}

static void assert_each_ran_once(share_task *t)
{
    for (size_t i = 0; i < t->n_pieces; i++)
        assert_int_equal(atomic_load(&t->runs[i]), 1);
}

static void test_every_piece_runs_once(void **state)
{
    (void)state;
    lmc_pool *pool = lmc_pool_new("t", 3, 3, 0, 0, run_share, NULL);
    assert_non_null(pool);
    size_t sizes[] = {0, 1, 2, 7, MAX_PIECES};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        share_task t;
        init_task(&t, pool, sizes[k]);
        assert_true(lmc_pool_submit(pool, k, &t.task, 0, false));
        wait_finished(&t);
        assert_true(t.result);
        assert_each_ran_once(&t);
    }
    lmc_pool_free(pool);
}

static void test_a_failed_piece_fails_the_share_and_the_rest_still_run(void **state)
{
    (void)state;
    lmc_pool *pool = lmc_pool_new("t", 2, 2, 0, 0, run_share, NULL);
    assert_non_null(pool);
    share_task t;
    init_task(&t, pool, 9);
    t.fail_piece = 4;
    assert_true(lmc_pool_submit(pool, 0, &t.task, 0, false));
    wait_finished(&t);
    assert_false(t.result);
    assert_each_ran_once(&t);
    lmc_pool_free(pool);
}

/* Piece 0 (the caller's first claim) spins until piece 1 has started, so
 * the share completes only when an idle thread took piece 1.  Repeated:
 * the idle thread is sometimes asleep, sometimes about to sleep, when the
 * share is posted, and must not sleep through it. */
static void test_an_idle_thread_takes_pieces(void **state)
{
    (void)state;
    lmc_pool *pool = lmc_pool_new("t", 2, 2, 0, 0, run_share, NULL);
    assert_non_null(pool);
    size_t before = lmc_pool_pieces_helped(pool);
    for (int rep = 0; rep < 200; rep++) {
        share_task t;
        init_task(&t, pool, 2);
        t.rendezvous = true;
        assert_true(lmc_pool_submit(pool, (size_t)rep, &t.task, 0, false));
        wait_finished(&t);
        assert_true(t.result);
        assert_true(t.rendezvous_met);
        assert_each_ran_once(&t);
        assert_false(pthread_equal(t.ran_on[0], t.ran_on[1]));
    }
    assert_int_equal(lmc_pool_pieces_helped(pool) - before, 200);
    lmc_pool_free(pool);
}

/* Two tasks share at once on a pool of three: every piece of each runs
 * exactly once, whoever takes it. */
static void test_concurrent_shares_keep_their_pieces_apart(void **state)
{
    (void)state;
    lmc_pool *pool = lmc_pool_new("t", 3, 3, 0, 0, run_share, NULL);
    assert_non_null(pool);
    for (int rep = 0; rep < 100; rep++) {
        share_task a, b;
        init_task(&a, pool, MAX_PIECES);
        init_task(&b, pool, 33);
        b.fail_piece = 32;
        assert_true(lmc_pool_submit(pool, 0, &a.task, 0, false));
        assert_true(lmc_pool_submit(pool, 1, &b.task, 0, false));
        wait_finished(&a);
        wait_finished(&b);
        assert_true(a.result);
        assert_false(b.result);
        assert_each_ran_once(&a);
        assert_each_ran_once(&b);
    }
    lmc_pool_free(pool);
}

/* A pool of one thread has nobody to share with: the caller runs it all. */
static void test_a_single_thread_runs_every_piece_itself(void **state)
{
    (void)state;
    lmc_pool *pool = lmc_pool_new("t", 1, 1, 0, 0, run_share, NULL);
    assert_non_null(pool);
    share_task t;
    init_task(&t, pool, 5);
    assert_true(lmc_pool_submit(pool, 0, &t.task, 0, false));
    wait_finished(&t);
    assert_true(t.result);
    assert_each_ran_once(&t);
    for (size_t i = 1; i < 5; i++)
        assert_true(pthread_equal(t.ran_on[i], t.ran_on[0]));
    assert_int_equal(lmc_pool_pieces_helped(pool), 0);
    lmc_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_piece_runs_once),
        cmocka_unit_test(test_a_failed_piece_fails_the_share_and_the_rest_still_run),
        cmocka_unit_test(test_an_idle_thread_takes_pieces),
        cmocka_unit_test(test_concurrent_shares_keep_their_pieces_apart),
        cmocka_unit_test(test_a_single_thread_runs_every_piece_itself),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
