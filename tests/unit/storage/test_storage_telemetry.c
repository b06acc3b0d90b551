/* Storage telemetry: the events the storage manager publishes for the
 * metrics (obs/events.h), checked on a real event bus with an injected
 * clock so that lifetimes and gaps are exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obs/events.h"
#include "storage/storage_events.h"
#include "storage/storage_manager.h"
#include "storage/storage_manager_testing.h"

#define OBJ 4096ull

typedef struct {
    int64_t now_ms;
    json_t *events;   /* [[type, metadata]], appended by the drain thread */
} env;

static int64_t env_clock(void *user)
{
    return ((env *)user)->now_ms;
}

static void record(const lmc_event *ev, void *user)
{
    env *e = user;
    json_array_append_new(e->events,
                          json_pack("[s, O]", ev->type, ev->metadata ? ev->metadata : json_null()));
}

static lmc_object_key make_key(uint64_t id, const char *salt)
{
    lmc_object_key k;
    memset(&k, 0, sizeof k);
    k.chunk_hash_len = 32;
    memcpy(k.chunk_hash, &id, sizeof id);
    k.kv_rank = lmc_kv_rank_for_worker(1, 0);
    k.model_name = "model";
    k.cache_salt = salt;
    return k;
}

static lmc_storage_manager *create(env *e, uint64_t objects, double sample_rate,
                                   lmc_event_bus *bus)
{
    lmc_storage_options o;
    lmc_storage_options_defaults(&o);
    o.l1_size_bytes = objects * OBJ;
    o.l1_use_lazy = false;
    o.eviction_period_ms = 0;
    o.eviction_trigger_watermark = 0;   /* every cycle evicts */
    o.eviction_ratio = 1;
    o.clock = env_clock;
    o.clock_user = e;
    o.check_books = true;
    char err[256] = "";
    lmc_storage_manager *sm = lmc_storage_manager_create(&o, err, sizeof err);
    if (!sm)
        fail_msg("create: %s", err);
    lmc_storage_manager_set_event_bus(sm, bus, sample_rate);
    return sm;
}

/* A storage manager of `objects` objects whose events `e` records. */
static lmc_storage_manager *start(env *e, lmc_event_bus **bus, uint64_t objects,
                                  double sample_rate)
{
    *e = (env){.now_ms = 1000, .events = json_array()};
    *bus = lmc_event_bus_new(1024);
    assert_int_equal(lmc_event_bus_subscribe(*bus, NULL, record, e), 0);
    return create(e, objects, sample_rate, *bus);
}

static void finish(env *e, lmc_storage_manager *sm, lmc_event_bus *bus)
{
    assert_true(lmc_storage_manager_check_books(sm));
    assert_int_equal(lmc_storage_manager_invariant_violations(sm), 0);
    lmc_storage_manager_close(sm);
    lmc_event_bus_free(bus);
    json_decref(e->events);
}

static void store(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n, const char *tag)
{
    lmc_lease leases[8];
    lmc_l1_result res[8];
    assert_int_equal(lmc_storage_manager_lease_write(sm, keys, n, OBJ, false, tag, leases, res),
                     0);
    assert_int_equal(lmc_storage_manager_publish_writes(sm, keys, leases, n, 0, res), 0);
}

/* The events of `type` recorded so far (borrowed metadata). */
static size_t events_of(env *e, const char *type, json_t **out, size_t cap)
{
    size_t k = 0, i;
    json_t *ev;
    json_array_foreach(e->events, i, ev) {
        if (strcmp(json_string_value(json_array_get(ev, 0)), type) == 0 && k < cap)
            out[k++] = json_array_get(ev, 1);
    }
    return k;
}

static json_int_t salt_count(const json_t *meta, const char *salt, const char *field)
{
    const json_t *c = json_object_get(json_object_get(meta, "by_salt"), salt);
    return json_integer_value(json_object_get(c, field));
}

static void test_write_read_and_sm_counts(void **state)
{
    (void)state;
    env e;
    lmc_event_bus *bus;
    lmc_storage_manager *sm = start(&e, &bus, 8, 1.0);
    lmc_object_key keys[4] = {make_key(1, "a"), make_key(2, "a"), make_key(3, "b"),
                              make_key(4, "b")};
    store(sm, keys, 3, NULL);
    /* keys 0..2 resident, 3 missing: the prefix lock takes 3 of 4 */
    lmc_lease locks[4];
    assert_int_equal(lmc_storage_manager_lease_read(sm, keys, 4, 1, true, NULL, locks, NULL), 3);
    lmc_storage_manager_give_back(sm, keys, locks, 2);
    assert_int_equal(lmc_event_bus_drain(bus, 5), 0);

    json_t *ev[8];
    assert_int_equal(events_of(&e, LMC_EVENT_L1_WRITE, ev, 8), 1);
    assert_int_equal(json_integer_value(json_object_get(ev[0], "num_keys")), 3);
    assert_int_equal(events_of(&e, LMC_EVENT_L1_READ, ev, 8), 1);
    assert_int_equal(json_integer_value(json_object_get(ev[0], "num_keys")), 2);
    assert_int_equal(events_of(&e, LMC_EVENT_SM_WRITE, ev, 8), 1);
    assert_int_equal(salt_count(ev[0], "a", "ok"), 2);
    assert_int_equal(salt_count(ev[0], "b", "ok"), 1);
    assert_int_equal(salt_count(ev[0], "b", "failed"), 0);
    assert_int_equal(events_of(&e, LMC_EVENT_SM_READ, ev, 8), 1);
    assert_int_equal(salt_count(ev[0], "a", "ok"), 2);
    assert_int_equal(salt_count(ev[0], "b", "ok"), 1);
    assert_int_equal(salt_count(ev[0], "b", "failed"), 1);
    lmc_storage_manager_give_back(sm, keys + 2, locks + 2, 1);
    finish(&e, sm, bus);
}

static void test_allocation_failure_names_the_phase(void **state)
{
    (void)state;
    env e;
    lmc_event_bus *bus;
    lmc_storage_manager *sm = start(&e, &bus, 2, 1.0);
    lmc_object_key keys[3] = {make_key(1, ""), make_key(2, ""), make_key(3, "")};
    lmc_lease leases[3];
    lmc_l1_result res[3];
    /* 3 objects do not fit in 2: the batch fails as a whole */
    lmc_storage_manager_lease_write(sm, keys, 3, OBJ, false, NULL, leases, res);
    lmc_storage_manager_lease_write(sm, keys, 3, OBJ, true, LMC_STORAGE_L2_PREFETCH_TAG, leases,
                                    res);
    assert_int_equal(res[0], LMC_L1_OUT_OF_MEMORY);
    assert_int_equal(leases[0].kind, LMC_LEASE_NONE);
    assert_int_equal(lmc_event_bus_drain(bus, 5), 0);
    json_t *ev[8];
    assert_int_equal(events_of(&e, LMC_EVENT_L1_ALLOCATION_FAILURE, ev, 8), 2);
    assert_string_equal(json_string_value(json_object_get(ev[0], "during")), "l1_store");
    assert_string_equal(json_string_value(json_object_get(ev[1], "during")), "l2_prefetch");
    assert_string_equal(json_string_value(json_object_get(ev[1], "model_name")), "model");
    assert_int_equal(json_integer_value(json_object_get(ev[1], "num_keys")), 3);
    assert_int_equal(events_of(&e, LMC_EVENT_SM_WRITE, ev, 8), 2);
    assert_int_equal(salt_count(ev[0], "", "failed"), 3);
    finish(&e, sm, bus);
}

/* Admitted at 1 s, read at 4 s and 6 s, evicted at 10 s, rewritten at
 * 13 s: lifetime 9 s, idle 4 s, reuse gaps 3 s and 2 s, evict-reuse 3 s. */
static void test_lifecycle_times(void **state)
{
    (void)state;
    env e;
    lmc_event_bus *bus;
    lmc_storage_manager *sm = start(&e, &bus, 8, 1.0);
    lmc_object_key k = make_key(7, "");
    store(sm, &k, 1, NULL);
    e.now_ms = 4000;
    lmc_lease lock;
    assert_int_equal(lmc_storage_manager_lease_read(sm, &k, 1, 1, true, NULL, &lock, NULL), 1);
    lmc_storage_manager_give_back(sm, &k, &lock, 1);
    e.now_ms = 6000;
    lmc_storage_manager_touch(sm, &k, 1);
    e.now_ms = 10000;
    assert_int_equal(lmc_storage_manager_run_eviction_once(sm), 1);
    e.now_ms = 13000;
    store(sm, &k, 1, NULL);
    assert_int_equal(lmc_storage_manager_run_eviction_once(sm), 1);
    assert_int_equal(lmc_event_bus_drain(bus, 5), 0);

    json_t *ev[8];
    assert_int_equal(events_of(&e, LMC_EVENT_L1_KEYS_EVICTED, ev, 8), 2);
    json_t *first = json_array_get(json_object_get(ev[0], "keys"), 0);
    assert_true(json_real_value(json_object_get(first, "lifetime_s")) == 9.0);
    assert_true(json_real_value(json_object_get(first, "idle_s")) == 4.0);
    assert_int_equal(strlen(json_string_value(json_object_get(first, "hash"))), 64);
    assert_memory_equal(json_string_value(json_object_get(first, "hash")), "0700000000000000", 16);
    assert_int_equal(events_of(&e, LMC_EVENT_L1_USAGE, ev, 8), 2);
    assert_true(json_real_value(json_object_get(ev[0], "usage_ratio")) > 0);
    assert_int_equal(events_of(&e, LMC_EVENT_L1_REUSE_GAPS, ev, 8), 2);
    json_t *gaps = json_object_get(ev[0], "reuse_gaps_s");
    assert_int_equal(json_array_size(gaps), 2);
    assert_true(json_real_value(json_array_get(gaps, 0)) == 3.0);
    assert_true(json_real_value(json_array_get(gaps, 1)) == 2.0);
    json_t *rewrite = json_object_get(ev[1], "evict_reuse_gaps_s");
    assert_int_equal(json_array_size(rewrite), 1);
    assert_true(json_real_value(json_array_get(rewrite, 0)) == 3.0);
    finish(&e, sm, bus);
}

/* Evicted and never written again: reported as the 300 s cap once it
 * passes; with sample rate 0 no lifecycle event at all. */
static void test_evict_reuse_cap_and_no_sampling(void **state)
{
    (void)state;
    env e;
    lmc_event_bus *bus;
    lmc_storage_manager *sm = start(&e, &bus, 8, 1.0);
    lmc_object_key k = make_key(9, "");
    store(sm, &k, 1, NULL);
    assert_int_equal(lmc_storage_manager_run_eviction_once(sm), 1);
    e.now_ms += 299000;
    lmc_storage_manager_run_eviction_once(sm);
    e.now_ms += 1000;
    lmc_storage_manager_run_eviction_once(sm);
    assert_int_equal(lmc_event_bus_drain(bus, 5), 0);
    json_t *ev[8];
    assert_int_equal(events_of(&e, LMC_EVENT_L1_REUSE_GAPS, ev, 8), 1);
    json_t *capped = json_object_get(ev[0], "evict_reuse_gaps_s");
    assert_true(json_real_value(json_array_get(capped, 0)) == 300.0);
    lmc_storage_manager_close(sm);

    json_array_clear(e.events);
    sm = create(&e, 8, 0.0, bus);
    store(sm, &k, 1, NULL);
    lmc_lease lock;
    assert_int_equal(lmc_storage_manager_lease_read(sm, &k, 1, 1, true, NULL, &lock, NULL), 1);
    lmc_storage_manager_give_back(sm, &k, &lock, 1);
    assert_int_equal(lmc_storage_manager_run_eviction_once(sm), 1);
    assert_int_equal(lmc_event_bus_drain(bus, 5), 0);
    assert_int_equal(events_of(&e, LMC_EVENT_L1_KEYS_EVICTED, ev, 8), 0);
    assert_int_equal(events_of(&e, LMC_EVENT_L1_REUSE_GAPS, ev, 8), 0);
    assert_int_equal(events_of(&e, LMC_EVENT_L1_WRITE, ev, 8), 1);   /* counters still count */
    finish(&e, sm, bus);
}

static void test_silent_without_bus(void **state)
{
    (void)state;
    env e = {.now_ms = 1000, .events = json_array()};
    lmc_storage_options o;
    lmc_storage_options_defaults(&o);
    o.l1_size_bytes = 8 * OBJ;
    o.l1_use_lazy = false;
    o.eviction_period_ms = 0;
    o.check_books = true;
    char err[256];
    lmc_storage_manager *sm = lmc_storage_manager_create(&o, err, sizeof err);
    assert_non_null(sm);
    assert_false(lmc_storage_manager_events_enabled(sm));
    lmc_object_key k = make_key(1, "");
    store(sm, &k, 1, NULL);
    lmc_storage_manager_publish(sm, LMC_EVENT_L1_WRITE, json_object());   /* dropped, freed */
    lmc_storage_manager_close(sm);
    json_decref(e.events);
}

static void test_keys_by_salt(void **state)
{
    (void)state;
    lmc_object_key keys[5] = {make_key(1, "x"), make_key(2, "x"), make_key(3, "y"),
                              make_key(4, "x"), make_key(5, "")};
    json_t *c = lmc_storage_keys_by_salt(keys, 5);
    assert_int_equal(json_integer_value(json_object_get(c, "x")), 3);
    assert_int_equal(json_integer_value(json_object_get(c, "y")), 1);
    assert_int_equal(json_integer_value(json_object_get(c, "")), 1);
    assert_int_equal(json_object_size(c), 3);
    json_decref(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read_and_sm_counts),
        cmocka_unit_test(test_allocation_failure_names_the_phase),
        cmocka_unit_test(test_lifecycle_times),
        cmocka_unit_test(test_evict_reuse_cap_and_no_sampling),
        cmocka_unit_test(test_silent_without_bus),
        cmocka_unit_test(test_keys_by_salt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
