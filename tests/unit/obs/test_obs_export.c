/* Event-driven metrics, the registry snapshot, OTLP request bodies and the
 * span recorder, driven by synthetic events. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "obs/event_bus.h"
#include "obs/event_metrics.h"
#include "obs/events.h"
#include "obs/metrics.h"
#include "obs/otlp.h"
#include "obs/spans.h"

/* The family named `name` in a snapshot, or NULL. */
static json_t *family(json_t *snap, const char *name)
{
    size_t i;
    json_t *f;
    json_array_foreach(snap, i, f) {
        if (strcmp(json_string_value(json_object_get(f, "name")), name) == 0)
            return f;
    }
    return NULL;
}

static lmc_metric *find(lmc_metrics *r, const char *name, const char *type,
                        const char *const *labels)
{
    if (strcmp(type, "counter") == 0)
        return lmc_metrics_counter(r, name, "", labels);
    return NULL;
}

static void publish_lookup(lmc_event_bus *bus, const char *rid, int req, int hit, int l2,
                           const char *early)
{
    lmc_lookup_event_info in = {.request_id = rid, .request_id_len = strlen(rid),
                                .model_name = "m", .model_len = 1, .cache_salt = "s",
                                .salt_len = 1, .requested_tokens = req, .hit_tokens = hit,
                                .hit_tokens_l2 = l2, .early_exit = early};
    lmc_event_bus_publish(bus, LMC_EVENT_LOOKUP_END, rid, lmc_event_lookup_metadata(&in));
}

static void test_lookup_metrics(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    lmc_event_bus *bus = lmc_event_bus_new(128);
    assert_int_equal(lmc_metrics_attach_event_metrics(r, bus), 0);
    publish_lookup(bus, "a", 512, 256, 0, NULL);
    publish_lookup(bus, "b", 256, 256, 128, NULL);
    publish_lookup(bus, "c", 0, 0, 0, "empty_chunk_hashes");
    assert_int_equal(lmc_event_bus_drain(bus, 5.0), 0);
    static const char *const ms_l[] = {"model_name", "cache_salt", NULL};
    static const char *const msr_l[] = {"model_name", "cache_salt", "reason", NULL};
    const char *ms[] = {"m", "s"};
    const char *msr[] = {"m", "s", "empty_chunk_hashes"};
    assert_true(lmc_metric_value(find(r, "lmcache_mp_lookups_total", "counter", ms_l), ms) == 3);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_lookup_requested_total", "counter", ms_l),
                                 ms) == 768);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_lookup_hit_total", "counter", ms_l), ms) ==
                512);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_lookup_hit_l1_total", "counter", ms_l),
                                 ms) == 384);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_lookup_hit_l2_total", "counter", ms_l),
                                 ms) == 128);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_lookup_early_exit_total", "counter", msr_l),
                                 msr) == 1);
    char *text = lmc_metrics_render(r);
    assert_non_null(strstr(text, "lmcache_mp_lookup_hit_total{model_name=\"m\",cache_salt=\"s\"} 512"));
    free(text);
    lmc_event_bus_free(bus);
    lmc_metrics_free(r);
}

static void publish_transfer(lmc_event_bus *bus, const char *type, const char *rid, int dev,
                             int chunks, double bytes)
{
    json_t *m = json_pack("{s:i, s:i, s:s, s:s, s:s, s:i, s:f}", "device", dev, "worker_id", 0,
                          "model_name", "m", "engine_id", "e", "cache_salt", "", "num_chunks",
                          chunks, "bytes", bytes);
    lmc_event_bus_publish(bus, type, rid, m);
}

static void test_transfer_metrics(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    lmc_event_bus *bus = lmc_event_bus_new(128);
    assert_int_equal(lmc_metrics_attach_event_metrics(r, bus), 0);
    publish_transfer(bus, LMC_EVENT_STORE_START, "a", 0, 4, 0);
    usleep(2000); /* END strictly after START (microsecond timestamps) */
    publish_transfer(bus, LMC_EVENT_STORE_END, "a", 0, 4, 4e6);
    publish_transfer(bus, LMC_EVENT_RETRIEVE_START, "a", 1, 2, 0);
    usleep(2000);
    publish_transfer(bus, LMC_EVENT_RETRIEVE_END, "a", 1, 2, 2e6);
    publish_transfer(bus, LMC_EVENT_RETRIEVE_END, "b", 1, 0, 0); /* unpaired, no chunks */
    assert_int_equal(lmc_event_bus_drain(bus, 5.0), 0);
    static const char *const dev_l[] = {"device", NULL};
    static const char *const w_l[] = {"worker_id", "model_name", "cache_salt", "device", NULL};
    const char *d0[] = {"0"}, *d1[] = {"1"}, *w[] = {"0", "m", "", "1"};
    assert_true(lmc_metric_value(find(r, "lmcache_mp_num_submitted_stores_total", "counter",
                                      dev_l), d0) == 1);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_num_finished_stores_total", "counter",
                                      dev_l), d0) == 1);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_num_finished_retrieves_total", "counter",
                                      dev_l), d1) == 2);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_l0_l1_load_requests_total", "counter", w_l),
                                 w) == 1);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_l0_l1_load_bytes_total", "counter", w_l),
                                 w) == 2e6);
    json_t *snap = lmc_metrics_snapshot(r);
    json_t *tput = family(snap, "lmcache_mp_l0_l1_store_throughput_gbs");
    assert_non_null(tput);
    json_t *s0 = json_array_get(json_object_get(tput, "series"), 0);
    assert_int_equal(json_integer_value(json_object_get(s0, "count")), 1);
    json_t *load = family(snap, "lmcache_mp_l0_l1_load_throughput_gbs");
    json_t *l0 = json_array_get(json_object_get(load, "series"), 0);
    assert_int_equal(json_integer_value(json_object_get(l0, "count")), 1); /* "b" unpaired */
    json_decref(snap);
    lmc_event_bus_free(bus);
    lmc_metrics_free(r);
}

static void publish_evictions(lmc_event_bus *bus, int n)
{
    json_t *keys = json_array();
    char hash[32];
    for (int i = 0; i < n; i++) {
        snprintf(hash, sizeof hash, "%016x", i * 40503u);
        json_array_append_new(keys, json_pack("{s:s, s:f, s:f}", "hash", hash, "lifetime_s",
                                              2.0, "idle_s", 0.5));
    }
    lmc_event_bus_publish(bus, LMC_EVENT_L1_KEYS_EVICTED, NULL, json_pack("{s:o}", "keys", keys));
}

/* The producer samples: the lifecycle histograms observe every key an
 * eviction event carries; the counters count what the events say. */
static void test_l1_lifecycle_and_failures(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    lmc_event_bus *bus = lmc_event_bus_new(128);
    assert_int_equal(lmc_metrics_attach_event_metrics(r, bus), 0);
    publish_evictions(bus, 4000);
    lmc_event_bus_publish(bus, LMC_EVENT_L1_WRITE, NULL, json_pack("{s:i}", "num_keys", 7));
    lmc_event_bus_publish(bus, LMC_EVENT_L1_READ, NULL, json_pack("{s:i}", "num_keys", 3));
    lmc_event_bus_publish(bus, LMC_EVENT_L1_ALLOCATION_FAILURE, NULL,
                          json_pack("{s:s, s:s, s:i}", "during", "l1_store", "model_name", "m",
                                    "num_keys", 5));
    lmc_event_bus_publish(bus, LMC_EVENT_L1_READ_FAILURE, NULL,
                          json_pack("{s:s, s:s, s:s}", "during", "l1_retrieve", "reason",
                                    "not_found", "model_name", "m"));
    assert_int_equal(lmc_event_bus_drain(bus, 5.0), 0);
    json_t *snap = lmc_metrics_snapshot(r);
    json_t *lt = json_array_get(
        json_object_get(family(snap, "lmcache_mp_l1_chunk_lifetime_seconds"), "series"), 0);
    assert_int_equal(json_integer_value(json_object_get(lt, "count")), 4000);
    json_decref(snap);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_l1_write_total", "counter", NULL), NULL) ==
                7);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_l1_read_total", "counter", NULL), NULL) ==
                3);
    static const char *const dm_l[] = {"during", "model_name", NULL};
    static const char *const drm_l[] = {"during", "reason", "model_name", NULL};
    assert_true(lmc_metric_value(find(r, "lmcache_mp_l1_allocation_failure_total", "counter",
                                      dm_l), (const char *const[]){"l1_store", "m"}) == 5);
    assert_true(lmc_metric_value(find(r, "lmcache_mp_l1_read_failure_total", "counter", drm_l),
                                 (const char *const[]){"l1_retrieve", "not_found", "m"}) == 1);
    lmc_event_bus_free(bus);
    lmc_metrics_free(r);
}

static void test_otlp_metrics_body(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    static const char *const l[] = {"op", NULL};
    static const double b[] = {1, 2};
    lmc_metric_add(lmc_metrics_counter(r, "lmcache_mp_rpc_received_total", "rx", NULL), NULL, 42);
    lmc_metric_set(lmc_metrics_gauge(r, "lmcache_mp_l1_objects", "objs", l),
                   (const char *const[]){"x"}, 3);
    lmc_metric *h = lmc_metrics_histogram(r, "lat_seconds", "lat", NULL, b, 2);
    lmc_metric_observe(h, NULL, 1.5);
    lmc_metric_observe(h, NULL, 5);
    json_t *snap = lmc_metrics_snapshot(r);
    json_t *body = lmc_otlp_metrics_body(snap, "inst-1", "0.1.0", 100, 200);
    json_decref(snap);
    json_t *rm = json_array_get(json_object_get(body, "resourceMetrics"), 0);
    json_t *attrs = json_object_get(json_object_get(rm, "resource"), "attributes");
    assert_string_equal(json_string_value(json_object_get(json_array_get(attrs, 1), "key")),
                        "service.instance.id");
    json_t *sm = json_array_get(json_object_get(rm, "scopeMetrics"), 0);
    json_t *metrics = json_object_get(sm, "metrics");
    json_t *rx = json_array_get(metrics, 1); /* after series_dropped */
    assert_string_equal(json_string_value(json_object_get(rx, "name")), "lmcache_mp.rpc_received");
    json_t *sum = json_object_get(rx, "sum");
    assert_true(json_is_true(json_object_get(sum, "isMonotonic")));
    assert_int_equal(json_integer_value(json_object_get(sum, "aggregationTemporality")), 2);
    json_t *p = json_array_get(json_object_get(sum, "dataPoints"), 0);
    assert_true(json_real_value(json_object_get(p, "asDouble")) == 42);
    assert_string_equal(json_string_value(json_object_get(p, "timeUnixNano")), "200");
    json_t *g = json_object_get(json_array_get(metrics, 2), "gauge");
    json_t *gp = json_array_get(json_object_get(g, "dataPoints"), 0);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(json_object_get(gp, "attributes"), 0),
                                            "value"), "stringValue")), "x");
    json_t *hist = json_object_get(json_array_get(metrics, 3), "histogram");
    json_t *hp = json_array_get(json_object_get(hist, "dataPoints"), 0);
    assert_string_equal(json_string_value(json_object_get(hp, "count")), "2");
    json_t *counts = json_object_get(hp, "bucketCounts");
    assert_int_equal(json_array_size(counts), 3);
    assert_string_equal(json_string_value(json_array_get(counts, 1)), "1");
    assert_int_equal(json_array_size(json_object_get(hp, "explicitBounds")), 2);
    json_decref(body);
    lmc_metrics_free(r);
}

static void test_metric_names(void **state)
{
    (void)state;
    char buf[128];
    lmc_otlp_metric_name("lmcache_mp_lookups_total", "counter", buf, sizeof buf);
    assert_string_equal(buf, "lmcache_mp.lookups");
    lmc_otlp_metric_name("lmcache_mp_l1_objects", "gauge", buf, sizeof buf);
    assert_string_equal(buf, "lmcache_mp.l1_objects");
    lmc_otlp_metric_name("process_cpu_seconds_total", "counter", buf, sizeof buf);
    assert_string_equal(buf, "process_cpu_seconds");
}

static lmc_event span_event(const char *type, const char *sid, double t)
{
    lmc_event ev = {.type = type, .timestamp = t, .metadata = json_pack("{s:i}", "n", 4)};
    snprintf(ev.session_id, sizeof ev.session_id, "%s", sid);
    return ev;
}

static void record(lmc_span_recorder *r, const char *type, const char *sid, double t)
{
    lmc_event ev = span_event(type, sid, t);
    lmc_span_recorder_record(r, &ev);
    json_decref(ev.metadata);
}

static void test_spans(void **state)
{
    (void)state;
    lmc_span_recorder *r = lmc_span_recorder_new(2);
    record(r, LMC_EVENT_STORE_START, "req", 10.0);
    record(r, LMC_EVENT_STORE_END, "req", 10.5);
    record(r, LMC_EVENT_RETRIEVE_END, "req", 11.0);     /* unpaired */
    record(r, LMC_EVENT_LOOKUP_END, "other", 12.0);     /* over max_pending */
    record(r, LMC_EVENT_REPORT_BLOCK_ALLOCATION, "", 1); /* not a span */
    assert_int_equal(lmc_span_recorder_dropped(r), 1);
    json_t *spans = lmc_span_recorder_take(r);
    assert_int_equal(json_array_size(spans), 2);
    json_t *s0 = json_array_get(spans, 0), *s1 = json_array_get(spans, 1);
    assert_string_equal(json_string_value(json_object_get(s0, "name")), "mp.store");
    assert_string_equal(json_string_value(json_object_get(s0, "startTimeUnixNano")),
                        "10000000000");
    assert_string_equal(json_string_value(json_object_get(s0, "endTimeUnixNano")),
                        "10500000000");
    assert_int_equal(strlen(json_string_value(json_object_get(s0, "traceId"))), 32);
    assert_int_equal(strlen(json_string_value(json_object_get(s0, "spanId"))), 16);
    assert_string_equal(json_string_value(json_object_get(s0, "traceId")),
                        json_string_value(json_object_get(s1, "traceId"))); /* same session */
    assert_string_equal(json_string_value(json_object_get(s1, "name")), "mp.retrieve");
    json_t *a = json_object_get(s1, "attributes");
    assert_string_equal(json_string_value(json_object_get(json_array_get(a, 1), "key")),
                        "lmc.unpaired");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(a, 2), "value"), "stringValue")), "4");
    json_t *body = lmc_otlp_traces_body(spans, "inst", "v");
    json_t *rs = json_array_get(json_object_get(body, "resourceSpans"), 0);
    json_t *ss = json_array_get(json_object_get(rs, "scopeSpans"), 0);
    assert_int_equal(json_array_size(json_object_get(ss, "spans")), 2);
    json_decref(body);
    spans = lmc_span_recorder_take(r);
    assert_int_equal(json_array_size(spans), 0);
    json_decref(spans);
    lmc_span_recorder_free(r);
}

/* An endpoint nobody listens on: exports fail, are counted, and stopping
 * still returns promptly. */
static void test_otlp_unreachable(void **state)
{
    (void)state;
    lmc_metrics *r = lmc_metrics_new();
    lmc_otlp_options o = {.endpoint = "http://127.0.0.1:1/", .instance_id = "i",
                          .version = "v", .interval_s = 0.05, .timeout_s = 1, .metrics = r};
    char err[128];
    lmc_otlp *x = lmc_otlp_start(&o, err, sizeof err);
    assert_non_null(x);
    lmc_otlp_stop(x);
    static const char *const l[] = {"signal", "result", NULL};
    lmc_metric *m = lmc_metrics_counter(r, "lmcache_mp_otlp_exports_total", "", l);
    assert_true(lmc_metric_value(m, (const char *const[]){"metrics", "failure"}) >= 1);
    o.endpoint = "";
    assert_null(lmc_otlp_start(&o, err, sizeof err));
    lmc_metrics_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_metrics),
        cmocka_unit_test(test_transfer_metrics),
        cmocka_unit_test(test_l1_lifecycle_and_failures),
        cmocka_unit_test(test_otlp_metrics_body),
        cmocka_unit_test(test_metric_names),
        cmocka_unit_test(test_spans),
        cmocka_unit_test(test_otlp_unreachable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
