/* Metrics registry: exact exposition text, validation, and the sources
 * (event bus, RPC counts, status, /proc). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "obs/event_bus.h"
#include "obs/metrics.h"

static const char expected_text[] =
    "# HELP lmcache_mp_metrics_series_dropped_total Label sets not recorded because their "
    "family reached its series limit\n"
    "# TYPE lmcache_mp_metrics_series_dropped_total counter\n"
    "lmcache_mp_metrics_series_dropped_total 0\n"
    "# HELP requests_total Requests served\n"
    "# TYPE requests_total counter\n"
    "requests_total 3\n"
    "# HELP ops_total Ops by name\n"
    "# TYPE ops_total counter\n"
    "ops_total{op=\"noop\",pool=\"sync\"} 2\n"
    "ops_total{op=\"a\\\"b\\\\c\\nd\",pool=\"x\"} 1.5\n"
    "# HELP temp_celsius Temperature\\nwith back\\\\slash\n"
    "# TYPE temp_celsius gauge\n"
    "temp_celsius -3.25\n"
    "# HELP latency_seconds Latency\n"
    "# TYPE latency_seconds histogram\n"
    "latency_seconds_bucket{le=\"0.1\"} 0\n"
    "latency_seconds_bucket{le=\"0.5\"} 2\n"
    "latency_seconds_bucket{le=\"1\"} 2\n"
    "latency_seconds_bucket{le=\"+Inf\"} 3\n"
    "latency_seconds_sum 4.75\n"
    "latency_seconds_count 3\n"
    "# HELP size_bytes Sizes by tier\n"
    "# TYPE size_bytes histogram\n"
    "size_bytes_bucket{tier=\"l1\",le=\"1024\"} 1\n"
    "size_bytes_bucket{tier=\"l1\",le=\"+Inf\"} 1\n"
    "size_bytes_sum{tier=\"l1\"} 10\n"
    "size_bytes_count{tier=\"l1\"} 1\n";

static void test_exact_text(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    static const char *const op_pool[] = {"op", "pool", NULL};
    static const char *const tier[] = {"tier", NULL};
    static const double lat_bounds[] = {0.1, 0.5, 1};
    static const double size_bounds[] = {1024};
    lmc_metric *req = lmc_metrics_counter(r, "requests_total", "Requests served", NULL);
    lmc_metric *ops = lmc_metrics_counter(r, "ops_total", "Ops by name", op_pool);
    lmc_metric *temp =
        lmc_metrics_gauge(r, "temp_celsius", "Temperature\nwith back\\slash", NULL);
    lmc_metric *lat = lmc_metrics_histogram(r, "latency_seconds", "Latency", NULL, lat_bounds, 3);
    lmc_metric *size = lmc_metrics_histogram(r, "size_bytes", "Sizes by tier", tier,
                                             size_bounds, 1);
    assert_non_null(req);
    assert_non_null(ops);
    assert_non_null(temp);
    assert_non_null(lat);
    assert_non_null(size);
    lmc_metric_add(req, NULL, 1);
    lmc_metric_add(req, NULL, 2);
    lmc_metric_add(ops, (const char *const[]){"noop", "sync"}, 2);
    lmc_metric_add(ops, (const char *const[]){"a\"b\\c\nd", "x"}, 1.5);
    lmc_metric_set(temp, NULL, -3.25);
    lmc_metric_observe(lat, NULL, 0.25);
    lmc_metric_observe(lat, NULL, 0.5); /* le is inclusive */
    lmc_metric_observe(lat, NULL, 4);
    lmc_metric_observe(size, (const char *const[]){"l1"}, 10);
    char *text = lmc_metrics_render(r);
    assert_non_null(text);
    assert_string_equal(text, expected_text);
    free(text);
    lmc_metrics_free(r);
}

static void test_format_value(void **state)
{
    (void)state;
    char buf[64];
    const struct { double v; const char *text; } cases[] = {
        {0, "0"}, {1, "1"}, {0.1, "0.1"}, {-2.5, "-2.5"}, {1e20, "1e+20"},
        {123456789012345.0, "123456789012345"}, {1.0 / 0.0, "+Inf"}, {-1.0 / 0.0, "-Inf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lmc_metrics_format_value(cases[i].v, buf, sizeof buf);
        assert_string_equal(buf, cases[i].text);
    }
    lmc_metrics_format_value(0.0 / 0.0, buf, sizeof buf);
    assert_string_equal(buf, "NaN");
}

static void test_validation(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    static const char *const bad_label[] = {"__reserved", NULL};
    static const char *const le[] = {"le", NULL};
    static const char *const five[] = {"a", "b", "c", "d", "e", NULL};
    static const double unsorted[] = {1, 0.5};
    assert_null(lmc_metrics_counter(r, "no_suffix", "", NULL));
    assert_null(lmc_metrics_gauge(r, "1starts_with_digit", "", NULL));
    assert_null(lmc_metrics_gauge(r, "has-dash", "", NULL));
    assert_null(lmc_metrics_gauge(r, "ok_name", "", bad_label));
    assert_null(lmc_metrics_gauge(r, "ok_name", "", five));
    assert_null(lmc_metrics_histogram(r, "h", "", le, NULL, 0));
    assert_null(lmc_metrics_histogram(r, "h", "", NULL, unsorted, 2));
    lmc_metric *g = lmc_metrics_gauge(r, "ok_name", "help", NULL);
    assert_non_null(g);
    assert_ptr_equal(lmc_metrics_gauge(r, "ok_name", "other help", NULL), g);
    assert_null(lmc_metrics_counter(r, "ok_name", "", NULL)); /* not a _total name */
    assert_null(lmc_metrics_histogram(r, "ok_name", "", NULL, NULL, 0));
    lmc_metric *c = lmc_metrics_counter(r, "c_total", "", NULL);
    lmc_metric_add(c, NULL, -1); /* counters never go down */
    lmc_metric_observe(c, NULL, 1); /* wrong kind: ignored */
    assert_true(lmc_metric_value(c, NULL) == 0);
    lmc_metrics_free(r);
}

static void test_series_limit(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    static const char *const key[] = {"key", NULL};
    lmc_metric *c = lmc_metrics_counter(r, "keys_total", "", key);
    char value[32];
    for (int i = 0; i < LMC_METRICS_MAX_SERIES + 5; i++) {
        snprintf(value, sizeof value, "k%d", i);
        lmc_metric_add(c, (const char *const[]){value}, 1);
    }
    lmc_metric_add(c, NULL, 1); /* missing label values: ignored */
    char *text = lmc_metrics_render(r);
    assert_non_null(strstr(text, "lmcache_mp_metrics_series_dropped_total 5\n"));
    assert_non_null(strstr(text, "keys_total{key=\"k1023\"} 1\n"));
    assert_null(strstr(text, "k1024"));
    free(text);
    lmc_metrics_free(r);
}

/* A collector mirroring a set that shrinks clears the family, then sets
 * what is there: the series of a member that left are gone, and a full
 * family has room again. */
static void test_clear(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    lmc_metric *usage = lmc_metrics_gauge(r, "usage_bytes", "per tenant",
                                          (const char *const[]){"tenant", NULL});
    char value[32];
    for (int i = 0; i < LMC_METRICS_MAX_SERIES; i++) {
        snprintf(value, sizeof value, "t%d", i);
        lmc_metric_set(usage, (const char *const[]){value}, i);
    }
    lmc_metric_clear(usage);
    lmc_metric_set(usage, (const char *const[]){"late"}, 7);
    assert_true(lmc_metric_value(usage, (const char *const[]){"t1"}) == 0);
    char *text = lmc_metrics_render(r);
    assert_string_equal(strstr(text, "# HELP usage_bytes"),
                        "# HELP usage_bytes per tenant\n# TYPE usage_bytes gauge\n"
                        "usage_bytes{tenant=\"late\"} 7\n");
    assert_non_null(strstr(text, "lmcache_mp_metrics_series_dropped_total 0\n"));
    free(text);
    lmc_metric_clear(NULL); /* ignored, like the other calls */
    lmc_metrics_free(r);
}

static void test_event_bus(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    lmc_event_bus *bus = lmc_event_bus_new(16);
    assert_int_equal(lmc_metrics_attach_event_bus(r, bus), 0);
    for (int i = 0; i < 3; i++)
        lmc_event_bus_publish(bus, "REPORT_BLOCK_ALLOCATION", NULL, NULL);
    lmc_event_bus_publish(bus, "OTHER", NULL, json_object());
    lmc_event_bus_stats st = lmc_event_bus_get_stats(bus);
    assert_int_equal(st.published, 4);
    char *text = lmc_metrics_render(r); /* while the bus is live */
    assert_non_null(strstr(text, "lmcache_mp_event_bus_published_events_total 4\n"));
    assert_non_null(strstr(text, "lmcache_mp_event_bus_dropped_events_total 0\n"));
    assert_non_null(strstr(text, "# TYPE lmcache_mp_event_bus_queue_depth gauge\n"));
    free(text);
    lmc_event_bus_free(bus); /* delivers what is queued */
    static const char *const label[] = {"event_type", NULL};
    lmc_metric *events = lmc_metrics_counter(r, "lmcache_mp_events_total", "", label);
    assert_true(lmc_metric_value(events, (const char *const[]){"REPORT_BLOCK_ALLOCATION"}) == 3);
    assert_true(lmc_metric_value(events, (const char *const[]){"OTHER"}) == 1);
    lmc_metrics_free(r);
}

static lmc_metrics_rpc_counts fake_rpc(void *user)
{
    int *calls = user;
    (*calls)++;
    return (lmc_metrics_rpc_counts){.received = 10, .replied = 7, .dropped = 2,
                                    .error_frames = 1, .inlined = 5};
}

static void test_rpc_source(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    int calls = 0;
    assert_int_equal(lmc_metrics_add_rpc_source(r, fake_rpc, &calls), 0);
    char *text = lmc_metrics_render(r);
    assert_int_equal(calls, 1);
    assert_non_null(strstr(text, "# TYPE lmcache_mp_rpc_received_total counter\n"
                                 "lmcache_mp_rpc_received_total 10\n"));
    assert_non_null(strstr(text, "lmcache_mp_rpc_replied_total 7\n"));
    assert_non_null(strstr(text, "lmcache_mp_rpc_dropped_total 2\n"));
    assert_non_null(strstr(text, "lmcache_mp_rpc_error_frames_total 1\n"));
    assert_non_null(strstr(text, "lmcache_mp_rpc_inline_total 5\n"));
    free(text);
    lmc_metrics_free(r);
}

static void test_process_collector(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    assert_int_equal(lmc_metrics_add_process_collector(r), 0);
    char *text = lmc_metrics_render(r);
    lmc_metric *fds = lmc_metrics_gauge(r, "process_open_fds", "", NULL);
    lmc_metric *rss = lmc_metrics_gauge(r, "process_resident_memory_bytes", "", NULL);
    lmc_metric *start = lmc_metrics_gauge(r, "process_start_time_seconds", "", NULL);
    lmc_metric *cpu = lmc_metrics_counter(r, "process_cpu_seconds_total", "", NULL);
    assert_true(lmc_metric_value(fds, NULL) >= 3);
    assert_true(lmc_metric_value(rss, NULL) > 1e5);
    assert_true(lmc_metric_value(start, NULL) > 1.5e9);
    assert_true(lmc_metric_value(cpu, NULL) >= 0);
    assert_non_null(strstr(text, "# TYPE process_cpu_seconds_total counter\n"));
    free(text);
    lmc_metrics_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_text),      cmocka_unit_test(test_format_value),
        cmocka_unit_test(test_validation),      cmocka_unit_test(test_series_limit),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_event_bus),       cmocka_unit_test(test_rpc_source),
           cmocka_unit_test(test_process_collector),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
