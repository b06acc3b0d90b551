/* Event helpers: metadata builder, deterministic sampling, START/END
 * pairing, the logging subscriber's line, and the bus's drain/drop
 * accounting. */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
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

/* The deferred copy owns everything: the caller's buffers may change
 * before the bus builds the JSON, which must equal the eager one. */
static void test_lookup_info_copy_builds_the_same_metadata(void **state)
{
    (void)state;
    uint8_t hashes[] = {0x00, 0xab, 0xff, 0x10};
    char rid[] = "req-1", model[] = "llama", salt[] = "tenant";
    lmc_lookup_event_info in = {
        .request_id = rid, .request_id_len = 5, .model_name = model, .model_len = 5,
        .cache_salt = salt, .salt_len = 6, .requested_tokens = 512, .hit_tokens = 256,
        .requested_chunks = 2, .hit_chunks = 1, .hashes = hashes, .n_hashes = 2,
        .hash_len = 2, .early_exit = NULL,
    };
    json_t *eager = lmc_event_lookup_metadata(&in);
    lmc_lookup_event_info *copy = lmc_event_lookup_info_dup(&in);
    assert_non_null(copy);
    memset(hashes, 0x77, sizeof hashes);
    memset(rid, 'x', 5), memset(model, 'y', 5), memset(salt, 'z', 6);
    json_t *deferred = lmc_event_lookup_build(copy); /* frees copy */
    assert_true(json_equal(eager, deferred));
    json_decref(eager);
    json_decref(deferred);
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

typedef struct {
    _Atomic int delivered;
    json_int_t seen[16];
} order_sub;

static void record_order(const lmc_event *ev, void *user)
{
    order_sub *sub = user;
    int i = atomic_load(&sub->delivered);
    if (i < 16)
        sub->seen[i] = json_integer_value(json_object_get(ev->metadata, "seq"));
    atomic_store(&sub->delivered, i + 1);
}

/* Polls (never a timing assertion): true once `want` events arrived. */
static bool delivered_within(order_sub *sub, int want, int max_ms)
{
    for (int ms = 0; ms < max_ms && atomic_load(&sub->delivered) < want; ms++)
        usleep(1000);
    return atomic_load(&sub->delivered) == want;
}

/* The drain thread lingers after a wake-up and publishers do not signal
 * it then: what they publish meanwhile must still arrive, in order, both
 * while it lingers and after it fell asleep again. */
static void test_bus_delivers_without_per_event_wakeups(void **state)
{
    (void)state;
    order_sub sub = {0};
    lmc_event_bus *bus = lmc_event_bus_new(64);
    assert_int_equal(lmc_event_bus_subscribe(bus, "X", record_order, &sub), 0);
    lmc_event_bus_publish(bus, "X", NULL, json_pack("{s:I}", "seq", (json_int_t)0));
    assert_true(delivered_within(&sub, 1, 2000));
    for (json_int_t i = 1; i <= 5; i++) /* while it lingers: nobody wakes it */
        lmc_event_bus_publish(bus, "X", NULL, json_pack("{s:I}", "seq", i));
    assert_true(delivered_within(&sub, 6, 2000));
    usleep(50000); /* several lingers with nothing new: asleep again */
    lmc_event_bus_publish(bus, "X", NULL, json_pack("{s:I}", "seq", (json_int_t)6));
    assert_true(delivered_within(&sub, 7, 2000));
    for (json_int_t i = 7; i < 12; i++)
        lmc_event_bus_publish(bus, "X", NULL, json_pack("{s:I}", "seq", i));
    assert_int_equal(lmc_event_bus_drain(bus, 5.0), 0); /* cuts a linger short */
    assert_int_equal(atomic_load(&sub.delivered), 12);
    for (int i = 0; i < 12; i++)
        assert_int_equal(sub.seen[i], i);
    lmc_event_bus_stats st = lmc_event_bus_get_stats(bus);
    assert_int_equal(st.delivered, 12);
    assert_int_equal(st.dropped, 0);
    lmc_event_bus_free(bus);
}

static _Atomic int builds;

static json_t *build_seq(void *arg)
{
    atomic_fetch_add(&builds, 1);
    json_t *m = json_pack("{s:I}", "seq", (json_int_t)*(int *)arg);
    free(arg);
    return m;
}

/* A deferred event is built once, delivered in publish order among eager
 * ones, and a dropped one is still built and freed (no leak under ASan). */
static void test_bus_deferred_metadata(void **state)
{
    (void)state;
    order_sub sub = {0};
    lmc_event_bus *bus = lmc_event_bus_new(4);
    assert_int_equal(lmc_event_bus_subscribe(bus, "X", record_order, &sub), 0);
    for (int i = 0; i < 3; i++) {
        if (i == 1) {
            lmc_event_bus_publish(bus, "X", "s", json_pack("{s:I}", "seq", (json_int_t)i));
            continue;
        }
        int *arg = malloc(sizeof *arg);
        *arg = i;
        lmc_event_bus_publish_deferred(bus, "X", "s", build_seq, arg);
    }
    assert_int_equal(lmc_event_bus_drain(bus, 5.0), 0);
    assert_int_equal(atomic_load(&sub.delivered), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(sub.seen[i], i);
    assert_int_equal(atomic_load(&builds), 2);
    lmc_event_bus_free(bus);

    bus = lmc_event_bus_new(1); /* nobody drains it: the second publish drops */
    slow_sub slow_calls = {0};
    assert_int_equal(lmc_event_bus_subscribe(bus, NULL, slow, &slow_calls), 0);
    for (int i = 0; i < 4; i++) {
        int *arg = malloc(sizeof *arg);
        *arg = i;
        lmc_event_bus_publish_deferred(bus, "X", NULL, build_seq, arg);
    }
    lmc_event_bus_stats st = lmc_event_bus_get_stats(bus);
    assert_true(st.dropped >= 2);
    lmc_event_bus_free(bus); /* delivers what is queued */
    assert_int_equal(atomic_load(&builds), 6);
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
        cmocka_unit_test(test_bus_delivers_without_per_event_wakeups),
        cmocka_unit_test(test_bus_deferred_metadata),
        cmocka_unit_test(test_lookup_info_copy_builds_the_same_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
