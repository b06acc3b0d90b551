/* JSON helpers of the HTTP frontend: error shapes and UTF-8, memory
 * pressure, /config view, /cache/clear body validation, /threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "http/http_json.h"

static void assert_json_eq(json_t *got, const char *expected_text)
{
    json_t *expected = json_loads(expected_text, 0, NULL);
    assert_non_null(expected);
    if (!json_equal(got, expected)) {
        char *g = json_dumps(got, JSON_SORT_KEYS | JSON_ENCODE_ANY);
        fail_msg("got %s\nexpected %s", g, expected_text);
    }
    json_decref(expected);
}

/* Error messages echo request bytes; their JSON must still be UTF-8, also
 * when the 511-byte message limit cuts a multibyte character. */
static void test_error_messages_stay_utf8(void **state)
{
    (void)state;
    json_t *d = lmc_http_detail("tier '%s' not supported", "l\x80\xff" "2");
    assert_json_eq(d, "{\"detail\": \"tier 'l??2' not supported\"}");
    json_decref(d);
    json_t *e = lmc_http_error("salt \xe2\x82" " cut");
    assert_json_eq(e, "{\"error\": \"salt ?? cut\"}");
    json_decref(e);
    char long_arg[600];
    memset(long_arg, 'a', sizeof long_arg);
    for (size_t i = 505; i + 1 < sizeof long_arg; i += 2)   /* "\u00e9" = c3 a9 from 505 on */
        long_arg[i] = '\xc3', long_arg[i + 1] = '\xa9';
    long_arg[sizeof long_arg - 1] = '\0';
    d = lmc_http_detail("x%s", long_arg);   /* cut after c3 at byte 511 */
    assert_non_null(d);
    const char *msg = json_string_value(json_object_get(d, "detail"));
    assert_int_equal(strlen(msg), 511);
    assert_int_equal(msg[510], '?');
    json_decref(d);
    /* Valid: ASCII, 2-4 byte forms.  Invalid: overlong, surrogate, > U+10FFFF. */
    assert_int_equal(lmc_http_utf8_prefix("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10), 10);
    assert_int_equal(lmc_http_utf8_prefix("a\xc0\xaf", 3), 1);
    assert_int_equal(lmc_http_utf8_prefix("a\xed\xa0\x80", 4), 1);
    assert_int_equal(lmc_http_utf8_prefix("a\xf4\x90\x80\x80", 5), 1);
}

static void test_levels(void **state)
{
    (void)state;
    assert_string_equal(lmc_http_pressure_level(false, 0, true, 0.8), "unknown");
    assert_string_equal(lmc_http_pressure_level(true, 1.0, true, 0.8), "critical");
    assert_string_equal(lmc_http_pressure_level(true, 0.8, true, 0.8), "high");
    assert_string_equal(lmc_http_pressure_level(true, 0.79, true, 0.8), "normal");
    assert_string_equal(lmc_http_pressure_level(true, 0.95, false, 0), "normal");
}

static void test_memory_pressure(void **state)
{
    (void)state;
    json_t *status = json_loads(
        "{\"instance_id\":\"abc\",\"storage_manager\":{"
        " \"l1_manager\":{\"is_healthy\":true,\"used\":850,\"capacity\":1000,"
        "   \"capacity_bytes_by_backend\":{\"shm\":1000}},"
        " \"l1_eviction_controller\":{\"trigger_watermark\":0.8,\"eviction_policy\":\"LRU\"},"
        " \"l2_adapters\":[{\"type_name\":\"fs\",\"used_bytes\":95,\"capacity_bytes\":100,"
        "   \"trigger_watermark\":0.5,\"eviction_policy\":\"IsolatedLRU\"},"
        "   {\"type_name\":\"redis\"}]}}",
        0, NULL);
    assert_non_null(status);
    json_t *snap = lmc_http_memory_pressure(status, 1234);
    assert_json_eq(snap,
        "{\"instance_id\":\"abc\",\"timestamp_ms\":1234,\"overall_level\":\"high\","
        "\"complete\":false,\"tiers\":["
        "{\"tier\":\"l1\",\"adapter_id\":null,\"backend_type\":\"shm\",\"used_bytes\":850,"
        " \"capacity_bytes\":1000,\"used_ratio\":0.85,\"trigger_watermark\":0.8,"
        " \"eviction_policy\":\"LRU\",\"health\":\"ok\",\"level\":\"high\","
        " \"collection_errors\":[]},"
        "{\"tier\":\"l2\",\"adapter_id\":0,\"backend_type\":\"fs\",\"used_bytes\":95,"
        " \"capacity_bytes\":100,\"used_ratio\":0.95,\"trigger_watermark\":0.5,"
        " \"eviction_policy\":\"IsolatedLRU\",\"health\":\"unknown\",\"level\":\"normal\","
        " \"collection_errors\":[]},"
        "{\"tier\":\"l2\",\"adapter_id\":1,\"backend_type\":\"redis\",\"used_bytes\":null,"
        " \"capacity_bytes\":null,\"used_ratio\":null,\"trigger_watermark\":null,"
        " \"eviction_policy\":null,\"health\":\"unknown\",\"level\":\"unknown\","
        " \"collection_errors\":[\"usage or capacity not reported\"]}]}");
    json_decref(snap);
    json_decref(status);
}

static void test_memory_pressure_empty(void **state)
{
    (void)state;
    json_t *status = json_object();
    json_t *snap = lmc_http_memory_pressure(status, 1);
    assert_string_equal(json_string_value(json_object_get(snap, "overall_level")), "unknown");
    assert_true(json_is_false(json_object_get(snap, "complete")));
    assert_int_equal(json_array_size(json_object_get(snap, "tiers")), 1);
    json_decref(snap);
    json_decref(status);
}

static void test_config_view(void **state)
{
    (void)state;
    json_t *grouped = json_loads("{\"mp_config\":{\"port\":5555},\"storage_manager_config\":{},"
                                 "\"obs_config\":{},\"http_config\":{\"http_port\":8080},"
                                 "\"coordinator_config\":{},\"p2p_config\":{},"
                                 "\"runtime_plugin_config\":{},\"other\":1}",
                                 0, NULL);
    json_t *view = lmc_http_config_view(grouped);
    assert_json_eq(view, "{\"mp\":{\"port\":5555},\"storage_manager\":{},\"observability\":{},"
                         "\"http\":{\"http_port\":8080},\"coordinator\":{},\"p2p\":{},"
                         "\"runtime_plugin\":{},\"other\":1}");
    json_decref(view);
    json_decref(grouped);
}

static unsigned clear(const char *body, bool *force, json_t **err)
{
    return lmc_http_parse_clear_body(body, body ? strlen(body) : 0, force, err);
}

static void test_clear_body(void **state)
{
    (void)state;
    bool force = false;
    json_t *err = NULL;
    assert_int_equal(clear(NULL, &force, &err), 0);
    assert_true(force);
    assert_int_equal(clear("  \n", &force, &err), 0);
    assert_int_equal(clear("{\"tier\":\"l1\",\"force\":false}", &force, &err), 0);
    assert_false(force);
    assert_null(err);
    assert_int_equal(clear("{\"tier\":\"l2\"}", &force, &err), 400);
    assert_json_eq(err, "{\"detail\":\"tier 'l2' not supported; only 'l1'\"}");
    json_decref(err);
    assert_int_equal(clear("{\"tier\":", &force, &err), 422);
    json_t *item = json_array_get(json_object_get(err, "detail"), 0);
    assert_string_equal(json_string_value(json_object_get(item, "type")), "json_invalid");
    json_decref(err);
    assert_int_equal(clear("[1,2]", &force, &err), 422);
    item = json_array_get(json_object_get(err, "detail"), 0);
    assert_string_equal(json_string_value(json_object_get(item, "type")),
                        "model_attributes_type");
    assert_json_eq(json_object_get(item, "input"), "[1,2]");
    json_decref(err);
    assert_int_equal(clear("{\"force\":\"yes\"}", &force, &err), 422);
    assert_json_eq(err, "{\"detail\":[{\"type\":\"bool_type\",\"loc\":[\"body\",\"force\"],"
                        "\"msg\":\"Input should be a valid boolean\",\"input\":\"yes\"}]}");
    json_decref(err);
    assert_int_equal(clear("{\"tier\":5}", &force, &err), 422);
    json_decref(err);
}

static void test_threads(void **state)
{
    (void)state;
    json_t *all = lmc_http_threads(NULL, false, 0);
    assert_true(json_array_size(all) >= 1);
    json_t *first = json_array_get(all, 0);
    assert_int_equal(json_integer_value(json_object_get(first, "thread_id")), getpid());
    assert_string_equal(json_string_value(json_object_get(first, "state")), "running");
    assert_true(json_is_number(json_object_get(first, "cpu_time")));
    json_decref(all);
    json_t *by_id = lmc_http_threads(NULL, true, getpid());
    assert_int_equal(json_array_size(by_id), 1);
    json_decref(by_id);
    json_t *none = lmc_http_threads("no-such-thread-name", false, 0);
    assert_int_equal(json_array_size(none), 1);
    first = json_array_get(none, 0);
    assert_string_equal(json_string_value(json_object_get(first, "name")), "MainThread");
    json_decref(none);
    json_t *by_name = lmc_http_threads("TEST_HTTP", false, 0); /* comm: test_http_json */
    assert_int_equal(json_array_size(by_name), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(by_name, 0), "name")),
                        "test_http_json");
    json_decref(by_name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_messages_stay_utf8),
        cmocka_unit_test(test_levels),      cmocka_unit_test(test_memory_pressure),
        cmocka_unit_test(test_memory_pressure_empty), cmocka_unit_test(test_config_view),
        cmocka_unit_test(test_clear_body),  cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
