/* The P2P serving side's lookup results (docs/p2p.md, "Bounds"): handed
 * out once, lapsing after the TTL, bounded in count and in addresses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "modules/p2p/tasks.h"

static int64_t fake_now;
static lmc_p2p_serve_owner g_owner;   /* every test's results are this peer's */

static int64_t fake_clock(void *user)
{
    (void)user;
    return fake_now;
}

/* n addresses, the i-th at offset base + i. */
static lmc_p2p_serve_addr *addrs_of(size_t n, int64_t base)
{
    lmc_p2p_serve_addr *a = calloc(n ? n : 1, sizeof *a);
    assert_non_null(a);
    for (size_t i = 0; i < n; i++)
        a[i] = (lmc_p2p_serve_addr){base + (int64_t)i, 64};
    return a;
}

static lmc_p2p_serve_tasks *new_tasks(size_t max_tasks, size_t max_entries)
{
    fake_now = 1000;
    lmc_p2p_serve_tasks *t = lmc_p2p_serve_tasks_new(max_tasks, max_entries, 500, fake_clock, NULL);
    assert_non_null(t);
    return t;
}

static bool has(lmc_p2p_serve_tasks *t, uint64_t id, int64_t *first)
{
    lmc_p2p_serve_addr *a;
    size_t n;
    if (!lmc_p2p_serve_tasks_take(t, id, &a, &n))
        return false;
    if (first)
        *first = n ? a[0].offset : -1;
    free(a);
    return true;
}

static void test_handed_out_once(void **st)
{
    (void)st;
    lmc_p2p_serve_tasks *t = new_tasks(4, 100);
    uint64_t a = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(3, 10), 3);
    uint64_t b = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(0, 0), 0);
    assert_true(a > 0 && b > a);
    int64_t first;
    assert_true(has(t, a, &first));
    assert_int_equal(first, 10);
    assert_false(has(t, a, NULL));
    assert_true(has(t, b, NULL));              /* an empty result is a result */
    assert_false(has(t, 0, NULL));
    assert_false(has(t, 12345, NULL));
    lmc_p2p_serve_task_counts c;
    lmc_p2p_serve_tasks_counts(t, &c);
    assert_int_equal(c.pending, 0);
    assert_int_equal(c.entries, 0);
    /* Ids are never reused. */
    assert_true(lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(1, 0), 1) > b);
    lmc_p2p_serve_tasks_free(t);
}

static void test_results_lapse_after_the_ttl(void **st)
{
    (void)st;
    lmc_p2p_serve_tasks *t = new_tasks(4, 100);
    uint64_t a = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(2, 0), 2);
    fake_now += 400;
    uint64_t b = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(2, 0), 2);
    assert_int_equal(lmc_p2p_serve_tasks_sweep(t), 0);
    fake_now += 100;                            /* a is 500 ms old: lapsed */
    assert_false(has(t, a, NULL));
    assert_int_equal(lmc_p2p_serve_tasks_sweep(t), 1);
    lmc_p2p_serve_task_counts c;
    lmc_p2p_serve_tasks_counts(t, &c);
    assert_int_equal(c.pending, 1);
    assert_int_equal(c.entries, 2);
    assert_int_equal(c.expired, 1);
    assert_true(has(t, b, NULL));
    lmc_p2p_serve_tasks_free(t);
}

static void test_count_bound_drops_the_oldest(void **st)
{
    (void)st;
    lmc_p2p_serve_tasks *t = new_tasks(3, 100);
    uint64_t ids[4];
    for (int i = 0; i < 4; i++)
        ids[i] = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(1, i), 1);
    assert_false(has(t, ids[0], NULL));
    lmc_p2p_serve_task_counts c;
    lmc_p2p_serve_tasks_counts(t, &c);
    assert_int_equal(c.pending, 3);
    assert_int_equal(c.dropped, 1);
    for (int i = 1; i < 4; i++)
        assert_true(has(t, ids[i], NULL));
    lmc_p2p_serve_tasks_free(t);
}

static void test_entry_bound_drops_the_oldest(void **st)
{
    (void)st;
    lmc_p2p_serve_tasks *t = new_tasks(16, 10);
    uint64_t a = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(4, 0), 4);
    uint64_t b = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(4, 0), 4);
    uint64_t c_id = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(6, 0), 6);   /* 14 > 10: a goes */
    assert_true(c_id > 0);
    lmc_p2p_serve_task_counts c;
    lmc_p2p_serve_tasks_counts(t, &c);
    assert_int_equal(c.entries, 10);
    assert_int_equal(c.dropped, 1);
    assert_false(has(t, a, NULL));
    assert_true(has(t, b, NULL));
    assert_true(has(t, c_id, NULL));
    /* One result over the whole bound is refused, and drops nothing. */
    uint64_t d = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(2, 0), 2);
    assert_int_equal(lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(11, 0), 11), 0);
    assert_true(has(t, d, NULL));
    assert_null(lmc_p2p_serve_tasks_new(0, 1, 1, NULL, NULL));
    assert_null(lmc_p2p_serve_tasks_new(1, 1, 0, NULL, NULL));
    lmc_p2p_serve_tasks_free(t);
}

/* What was dropped unqueried (lapsed or for room) is handed to the reaper
 * once, with its owner and addresses; what was handed out never is. */
typedef struct {
    size_t calls, addrs;
    int64_t first[4];
    bool owner_ok;
} reaped;

static void on_abandoned(void *user, const lmc_p2p_serve_owner *owner,
                         const lmc_p2p_serve_addr *addrs, size_t n)
{
    reaped *r = user;
    if (r->calls < 4)
        r->first[r->calls] = n ? addrs[0].offset : -1;
    r->calls++;
    r->addrs += n;
    r->owner_ok = lmc_p2p_serve_owner_equal(owner, &g_owner);
}

static void test_abandoned_results_are_reaped_once(void **st)
{
    (void)st;
    lmc_p2p_serve_owner_set(&g_owner, (const uint8_t *)"peer-a", 6);
    lmc_p2p_serve_tasks *t = new_tasks(2, 100);
    uint64_t a = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(3, 100), 3);
    uint64_t b = lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(2, 200), 2);
    assert_true(has(t, b, NULL));                       /* handed out: never reaped */
    lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(1, 300), 1);
    lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(1, 400), 1);   /* room: a goes */
    reaped r = {0};
    assert_int_equal(lmc_p2p_serve_tasks_reap(t, on_abandoned, &r), 1);
    assert_true(r.owner_ok);
    assert_int_equal(r.first[0], 100);
    assert_int_equal(r.addrs, 3);
    assert_false(has(t, a, NULL));
    fake_now += 500;                                    /* the other two lapse */
    assert_int_equal(lmc_p2p_serve_tasks_sweep(t), 2);
    assert_int_equal(lmc_p2p_serve_tasks_reap(t, on_abandoned, &r), 2);
    assert_int_equal(r.addrs, 5);
    assert_int_equal(lmc_p2p_serve_tasks_reap(t, on_abandoned, &r), 0);
    /* Dropped but not yet reaped: freed with the table. */
    lmc_p2p_serve_tasks_add(t, &g_owner, addrs_of(1, 0), 1);
    fake_now += 500;
    lmc_p2p_serve_tasks_sweep(t);
    lmc_p2p_serve_tasks_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handed_out_once),
        cmocka_unit_test(test_results_lapse_after_the_ttl),
        cmocka_unit_test(test_count_bound_drops_the_oldest),
        cmocka_unit_test(test_entry_bound_drops_the_oldest),
        cmocka_unit_test(test_abandoned_results_are_reaped_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
