/* The health of the L2 adapters (docs/l2.md, "Health"): the verdict
 * bookkeeping, the fs probe against real directories, the fault wrapper
 * passing its inner backend's probe on, and the monitor's thread noticing
 * a directory that goes away and comes back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "storage/l2/l2_adapter.h"
#include "storage/l2/l2_health.h"

static void test_record_transitions(void **state)
{
    (void)state;
    lmc_l2_health_state st = {0};
    /* Healthy at the first probe: nothing to log, but the time is set. */
    assert_int_equal(lmc_l2_health_record(&st, true, "", 1000), LMC_L2_HEALTH_SAME);
    assert_true(st.healthy);
    assert_int_equal(st.since_ms, 1000);
    assert_int_equal(lmc_l2_health_record(&st, true, "", 2000), LMC_L2_HEALTH_SAME);
    assert_int_equal(st.since_ms, 1000);
    assert_int_equal(lmc_l2_health_record(&st, false, "refused", 3000), LMC_L2_HEALTH_FAILED);
    assert_false(st.healthy);
    assert_string_equal(st.reason, "refused");
    assert_int_equal(st.since_ms, 3000);
    assert_int_equal(lmc_l2_health_record(&st, false, "refused", 4000), LMC_L2_HEALTH_SAME);
    /* Another reason is logged again; unhealthy since the first failure. */
    assert_int_equal(lmc_l2_health_record(&st, false, "AUTH refused", 5000),
                     LMC_L2_HEALTH_FAILED);
    assert_string_equal(st.reason, "AUTH refused");
    assert_int_equal(st.since_ms, 3000);
    assert_int_equal(lmc_l2_health_record(&st, true, "", 6000), LMC_L2_HEALTH_RECOVERED);
    assert_true(st.healthy);
    assert_string_equal(st.reason, "");
    assert_int_equal(st.since_ms, 6000);
}

static void test_record_keeps_reasons_printable(void **state)
{
    (void)state;
    lmc_l2_health_state st = {0};
    assert_int_equal(lmc_l2_health_record(&st, false, "-ERR \x01\xff\n", 1),
                     LMC_L2_HEALTH_FAILED);
    assert_string_equal(st.reason, "-ERR ???");
    lmc_l2_health_state first_unhealthy = {0};
    assert_int_equal(lmc_l2_health_record(&first_unhealthy, false, "down", 1),
                     LMC_L2_HEALTH_FAILED);
}

static lmc_l2_backend *fs_at(const char *dir)
{
    lmc_l2_fs_options o = {.base_path = dir};
    char err[256];
    lmc_l2_backend *b = lmc_l2_fs_new(&o, err, sizeof err);
    assert_non_null(b);
    return b;
}

static void scratch(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/lmc-l2-health-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void test_fs_probe(void **state)
{
    (void)state;
    char dir[64], why[512];
    scratch(dir, sizeof dir);
    lmc_l2_backend *b = fs_at(dir);
    assert_non_null(b->ops->probe);
    assert_int_equal(b->ops->probe(b, why, sizeof why), 0);
    assert_int_equal(rmdir(dir), 0);                  /* empty: the probe left nothing */
    assert_int_equal(b->ops->probe(b, why, sizeof why), -1);
    assert_non_null(strstr(why, dir));
    assert_non_null(strstr(why, "No such file or directory"));
    FILE *f = fopen(dir, "w");                        /* a regular file where the dir was */
    assert_non_null(f);
    fclose(f);
    assert_int_equal(b->ops->probe(b, why, sizeof why), -1);
    char want[128];
    snprintf(want, sizeof want, "base_path %s is not a directory", dir);
    assert_string_equal(why, want);
    b->ops->destroy(b);
    unlink(dir);
}

static void test_fault_wrapper_probes_its_inner_backend(void **state)
{
    (void)state;
    char dir[64], why[512];
    scratch(dir, sizeof dir);
    lmc_l2_fault_options fo = {.fail_rate = 1.0, .seed = 1};
    lmc_l2_backend *b = lmc_l2_fault_new(fs_at(dir), &fo);
    assert_int_equal(b->ops->probe(b, why, sizeof why), 0); /* faults are not an outage */
    scratch_dir_remove(dir);
    assert_int_equal(b->ops->probe(b, why, sizeof why), -1);
    assert_non_null(strstr(why, dir));
    b->ops->destroy(b);
    lmc_l2_backend *mock = lmc_l2_mock_new(0);
    assert_null(mock->ops->probe);                    /* nothing to reach */
    mock->ops->destroy(mock);
}

/* Waits up to 5 s for adapter 0's verdict to be `healthy`. */
static lmc_l2_health_state wait_verdict(lmc_l2_health *h, bool healthy)
{
    lmc_l2_health_state st;
    for (int i = 0; i < 500; i++) {
        lmc_l2_health_get(h, 0, &st);
        if (st.healthy == healthy)
            break;
        usleep(10000);
    }
    return st;
}

static void test_monitor_follows_the_backend(void **state)
{
    (void)state;
    char dir[64], away[80];
    static uint8_t arena[4096];
    scratch(dir, sizeof dir);
    snprintf(away, sizeof away, "%s.away", dir);
    lmc_l2_adapter *ad = lmc_l2_adapter_new(fs_at(dir), arena, 1);
    assert_non_null(ad);
    lmc_l2_health *h = lmc_l2_health_new(&ad, 1, 0.02);
    assert_non_null(h);
    lmc_l2_health_state st;
    lmc_l2_health_get(h, 0, &st);                     /* probed before new() returned */
    assert_true(st.healthy);
    assert_true(st.since_ms > 0);
    assert_int_equal(rename(dir, away), 0);
    st = wait_verdict(h, false);
    assert_false(st.healthy);
    assert_non_null(strstr(st.reason, dir));
    json_t *js = json_pack("{s:b}", "is_healthy", 1);
    assert_int_equal(lmc_l2_health_annotate(h, 0, js), 0);
    assert_true(json_is_false(json_object_get(js, "is_healthy")));
    assert_string_equal(json_string_value(json_object_get(js, "health_reason")), st.reason);
    assert_int_equal(json_integer_value(json_object_get(js, "health_since_ms")), st.since_ms);
    assert_int_equal(rename(away, dir), 0);
    st = wait_verdict(h, true);
    assert_true(st.healthy);
    assert_int_equal(lmc_l2_health_annotate(h, 0, js), 0);
    assert_true(json_is_null(json_object_get(js, "health_reason")));
    json_decref(js);
    lmc_l2_health_free(h);
    lmc_l2_adapter_close(ad);
    scratch_dir_remove(dir);
}

/* Without a period the verdict is the one at start: no thread probes. */
static void test_monitor_without_period_probes_once(void **state)
{
    (void)state;
    char dir[64];
    static uint8_t arena[4096];
    scratch(dir, sizeof dir);
    lmc_l2_adapter *ad = lmc_l2_adapter_new(fs_at(dir), arena, 1);
    lmc_l2_health *h = lmc_l2_health_new(&ad, 1, 0);
    assert_non_null(h);
    scratch_dir_remove(dir);
    usleep(50000);
    lmc_l2_health_state st;
    lmc_l2_health_get(h, 0, &st);
    assert_true(st.healthy);
    lmc_l2_health_get(h, 7, &st);                     /* no such adapter: healthy */
    assert_true(st.healthy);
    lmc_l2_health_free(h);
    lmc_l2_adapter_close(ad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_transitions),
        cmocka_unit_test(test_record_keeps_reasons_printable),
        cmocka_unit_test(test_fs_probe),
        cmocka_unit_test(test_fault_wrapper_probes_its_inner_backend),
        cmocka_unit_test(test_monitor_follows_the_backend),
        cmocka_unit_test(test_monitor_without_period_probes_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
