/* The instance registry both transfer modes share: add and find by id,
 * growth past the first allocation, unregister handing the unlinked
 * context to the mode's drop exactly once, and close popping the rest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "modules/transfer/instance_registry.h"

typedef struct {
    int64_t dropped[16];
    void *dropped_ctx[16];
    size_t n_dropped;
} mode;

static void drop(void *user, void *ctx, int64_t id)
{
    mode *m = user;
    m->dropped[m->n_dropped] = id;
    m->dropped_ctx[m->n_dropped++] = ctx;
}

static void registry_open(lmc_transfer_registry *r, mode *m, lmc_liveness *lv)
{
    lmc_transfer_registry_ops ops = {.mode = "test", .drop = drop, .user = m};
    /* A timeout of 0 disables reaping: no thread runs beside the test. */
    assert_int_equal(lmc_transfer_registry_init(r, &ops, lv, 0, 0), 0);
    assert_int_equal(r->reap_timeout_ms, 0);
}

static void test_add_find_drop(void **state)
{
    (void)state;
    lmc_liveness *lv = lmc_liveness_new();
    mode m = {0};
    lmc_transfer_registry r;
    int ctxs[12];
    registry_open(&r, &m, lv);
    for (int i = 0; i < 12; i++)   /* past the first 8 slots */
        assert_int_equal(lmc_transfer_registry_add(&r, 100 + i, &ctxs[i]), 0);
    assert_true(lmc_transfer_registry_has(&r, 105));
    assert_false(lmc_transfer_registry_has(&r, 99));
    pthread_mutex_lock(&r.lock);
    assert_ptr_equal(lmc_transfer_registry_find_locked(&r, 111), &ctxs[11]);
    pthread_mutex_unlock(&r.lock);
    assert_true(lmc_transfer_registry_drop(&r, 103));
    assert_false(lmc_transfer_registry_drop(&r, 103));   /* once only */
    assert_int_equal(m.n_dropped, 1);
    assert_int_equal(m.dropped[0], 103);
    assert_ptr_equal(m.dropped_ctx[0], &ctxs[3]);
    assert_false(lmc_transfer_registry_has(&r, 103));
    assert_true(lmc_transfer_registry_has(&r, 111));   /* the moved last one */
    lmc_transfer_registry_stop(&r);
    size_t popped = 0;
    while (lmc_transfer_registry_pop(&r))
        popped++;
    assert_int_equal(popped, 11);
    assert_int_equal(m.n_dropped, 1);   /* close does not drop */
    lmc_transfer_registry_destroy(&r);
    lmc_liveness_free(lv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_find_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
