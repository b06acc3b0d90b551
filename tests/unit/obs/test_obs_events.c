/* Event helpers: metadata builder, deterministic sampling, START/END
 * pairing, the logging subscriber's line, and the bus's drain/drop
 * accounting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "obs/event_bus.h"
#include "obs/event_logging.h"
#include "obs/event_pairs.h"
#include "obs/events.h"

static void test_lookup_metadata(void **state)
{
    (void)state;
    const uint8_t hashes[] = {0x00, 0xab, 0xff, 0x10};
    lmc_lookup_event_info in = {
        .request_id = "req-1xyz", .request_id_len = 5, .model_name = "llama",
        .model_len = 5, .cache_salt = NULL, .requested_tokens = 512, .hit_tokens = 256,
        .requested_chunks = 2, .hit_chunks = 1, .hashes = hashes, .n_hashes = 2,
        .hash_len = 2,
    };
    json_t *m = lmc_event_lookup_metadata(&in);
    assert_non_null(m);
    assert_string_equal(lmc_event_str(m, "request_id"), "req-1");
    assert_string_equal(lmc_event_str(m, "cache_salt"), "");
    assert_int_equal((int)lmc_event_num(m, "requested_tokens"), 512);
    assert_int_equal((int)lmc_event_num(m, "hit_chunks"), 1);
    json_t *h = json_object_get(m, "chunk_hashes");
    assert_int_equal(json_array_size(h), 2);
    assert_string_equal(json_string_value(json_array_get(h, 0)), "00ab");
    assert_string_equal(json_string_value(json_array_get(h, 1)), "ff10");
    assert_null(json_object_get(m, "early_exit"));
    json_decref(m);
    in.hashes = NULL;
    in.early_exit = "empty_chunk_hashes";
    m = lmc_event_lookup_metadata(&in);
    assert_null(json_object_get(m, "chunk_hashes"));
    assert_string_equal(lmc_event_str(m, "early_exit"), "empty_chunk_hashes");
    json_decref(m);
}

static void test_accessors(void **state)
{
    (void)state;
    json_t *m = json_pack("{s:i, s:s, s:f}", "device", 3, "name", "x", "bytes", 1.5);
    char buf[16];
    assert_string_equal(lmc_event_label(m, "device", buf, sizeof buf), "3");
    assert_string_equal(lmc_event_label(m, "name", buf, sizeof buf), "x");
    assert_string_equal(lmc_event_label(m, "missing", buf, sizeof buf), "");
    assert_true(lmc_event_num(m, "bytes") == 1.5);
    assert_true(lmc_event_num(m, "name") == 0);
    assert_true(lmc_event_num(NULL, "bytes") == 0);
    json_decref(m);
}

static void test_sampling(void **state)
{
    (void)state;
    int hit = 0;
    char key[32];
    for (int i = 0; i < 20000; i++) {
        snprintf(key, sizeof key, "%08x", i * 2654435761u);
        bool a = lmc_obs_sampled(key, 0.1);
        assert_true(a == lmc_obs_sampled(key, 0.1)); /* deterministic */
        if (a) {
            hit++;
            assert_true(lmc_obs_sampled(key, 0.5)); /* nested: a larger rate keeps it */
        }
        assert_true(lmc_obs_sampled(key, 1.0));
        assert_false(lmc_obs_sampled(key, 0.0));
    }
    assert_in_range(hit, 1700, 2300);
    assert_false(lmc_obs_sampled(NULL, 0.5));
}

static void test_pairs(void **state)
{
    (void)state;
    lmc_event_pairs *p = calloc(1, sizeof *p);
    char k1[LMC_EVENT_PAIRS_KEY], k2[LMC_EVENT_PAIRS_KEY];
    double t;
    lmc_event_pairs_key(k1, "S", "req", "0");
    lmc_event_pairs_key(k2, "S", "req", "1");
    assert_string_equal(k1, "S|req|0");
    assert_false(lmc_event_pairs_take(p, k1, &t));
    lmc_event_pairs_put(p, k1, 10.5);
    assert_false(lmc_event_pairs_take(p, k2, &t));
    assert_true(lmc_event_pairs_take(p, k1, &t));
    assert_true(t == 10.5);
    assert_false(lmc_event_pairs_take(p, k1, &t)); /* taken once */
    free(p);
}

static void test_logging_format(void **state)
{
    (void)state;
    lmc_event ev = {.type = "STORE_END", .timestamp = 12.25,
                    .metadata = json_pack("{s:i}", "bytes", 7)};
    snprintf(ev.session_id, sizeof ev.session_id, "r1");
    char line[2048];
    lmc_event_logging_format(&ev, line, sizeof line);
    assert_string_equal(line, "event STORE_END session=r1 t=12.250000 {\"bytes\":7}");
    json_decref(ev.metadata);
    ev.metadata = json_pack("{s:s}", "big", "");
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    json_object_set_new(ev.metadata, "big", json_string(big));
    lmc_event_logging_format(&ev, line, sizeof line);
    assert_true(strlen(line) < LMC_EVENT_LOG_MAX_META + 100);
    assert_non_null(strstr(line, "..."));
    json_decref(ev.metadata);
}

typedef struct {
    int calls;
} slow_sub;

static void slow(const lmc_event *ev, void *user)
{
    (void)ev;
    ((slow_sub *)user)->calls++;
    usleep(20000);
}

static void test_bus_drops_and_drains(void **state)
{
    (void)state;
    slow_sub sub = {0};
    lmc_event_bus *bus = lmc_event_bus_new(2);
    assert_int_equal(lmc_event_bus_subscribe(bus, NULL, slow, &sub), 0);
    for (int i = 0; i < 10; i++)
        lmc_event_bus_publish(bus, "X", NULL, json_object());
    lmc_event_bus_stats st = lmc_event_bus_get_stats(bus);
    assert_int_equal(st.published, 10);
    assert_true(st.dropped >= 7); /* capacity 2 + the one being delivered */
    assert_int_equal(lmc_event_bus_drain(bus, 5.0), 0);
    st = lmc_event_bus_get_stats(bus);
    assert_int_equal(st.queued, 0);
    assert_true(st.oldest_timestamp == 0);
    assert_int_equal(st.delivered + st.dropped, 10);
    assert_int_equal(sub.calls, (int)st.delivered);
    lmc_event_bus_free(bus);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_metadata),
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_pairs),
        cmocka_unit_test(test_logging_format),
        cmocka_unit_test(test_bus_drops_and_drains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
