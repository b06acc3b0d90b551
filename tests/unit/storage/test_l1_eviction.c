/* LRU / noop policies and the L1 eviction controller. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "storage/eviction_policy.h"
#include "storage/l1/l1_eviction.h"
#include "storage/l1/l1_manager.h"

#define PAGE 4096ull

static lmc_object_key make_key(uint64_t id)
{
    lmc_object_key k;
    memset(&k, 0, sizeof(k));
    k.chunk_hash_len = 32;
    memcpy(k.chunk_hash, &id, sizeof(id));
    k.chunk_hash[31] = 0x5a;
    k.model_name = "m";
    k.cache_salt = "";
    return k;
}

static uint64_t key_id(const lmc_object_key *k)
{
    uint64_t id;
    memcpy(&id, k->chunk_hash, sizeof(id));
    return id;
}

static void make_keys(lmc_object_key *keys, uint64_t first, size_t n)
{
    for (size_t i = 0; i < n; i++)
        keys[i] = make_key(first + i);
}

/* ---- policy alone -------------------------------------------------------- */

typedef struct verdicts {
    uint64_t locked_id;     /* NOT_EVICTABLE */
    uint64_t gone_id;       /* GONE */
} verdicts;

static lmc_l1_evictability judge(void *user, const lmc_object_key *key)
{
    const verdicts *v = user;
    uint64_t id = key_id(key);
    return id == v->locked_id ? LMC_L1_NOT_EVICTABLE
           : id == v->gone_id ? LMC_L1_GONE
                              : LMC_L1_EVICTABLE;
}

static void expect_order(lmc_eviction_policy *p, verdicts *v, const uint64_t *ids, size_t n)
{
    lmc_object_key out[32];
    assert_int_equal(p->ops->select_victims(p, 32, judge, v, out), n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(key_id(&out[i]), ids[i]);
}

static void test_lru_batch_order_and_touch(void **state)
{
    (void)state;
    lmc_eviction_policy *p = lmc_eviction_policy_new("LRU");
    assert_non_null(p);
    assert_string_equal(p->ops->name, "LRU");
    verdicts v = {UINT64_MAX, UINT64_MAX};
    lmc_object_key keys[8];
    make_keys(keys, 0, 5);
    p->ops->on_keys_added(p, keys, 5);             /* chunks 0..4 of one request */
    uint64_t first[] = {4, 3, 2, 1, 0};             /* last chunk evicted first */
    expect_order(p, &v, first, 5);
    make_keys(keys, 5, 2);
    p->ops->on_keys_added(p, keys, 2);
    uint64_t second[] = {4, 3, 2, 1, 0, 6, 5};
    expect_order(p, &v, second, 7);
    lmc_object_key touched = make_key(4);
    p->ops->on_keys_accessed(p, &touched, 1);       /* 4 becomes newest */
    lmc_object_key unknown = make_key(99);
    p->ops->on_keys_accessed(p, &unknown, 1);       /* not tracked: ignored */
    uint64_t third[] = {3, 2, 1, 0, 6, 5, 4};
    expect_order(p, &v, third, 7);
    /* re-adding an existing key refreshes it */
    lmc_object_key again = make_key(3);
    p->ops->on_keys_added(p, &again, 1);
    uint64_t fourth[] = {2, 1, 0, 6, 5, 4, 3};
    expect_order(p, &v, fourth, 7);
    /* max limits the answer */
    lmc_object_key out[2];
    assert_int_equal(p->ops->select_victims(p, 2, judge, &v, out), 2);
    assert_int_equal(key_id(&out[0]), 2);
    assert_int_equal(key_id(&out[1]), 1);
    lmc_eviction_policy_free(p);
}

static void test_lru_skips_locked_and_forgets_gone(void **state)
{
    (void)state;
    lmc_eviction_policy *p = lmc_eviction_policy_lru_new();
    lmc_object_key keys[4];
    make_keys(keys, 10, 4);
    p->ops->on_keys_added(p, keys, 4);              /* order 13, 12, 11, 10 */
    verdicts v = {.locked_id = 12, .gone_id = 11};
    uint64_t want[] = {13, 10};
    expect_order(p, &v, want, 2);
    assert_int_equal(p->ops->num_tracked(p), 3);    /* 11 forgotten */
    p->ops->on_keys_removed(p, keys + 3, 1);        /* 13 */
    assert_int_equal(p->ops->num_tracked(p), 2);
    v.locked_id = UINT64_MAX;
    uint64_t rest[] = {12, 10};
    expect_order(p, &v, rest, 2);
    lmc_eviction_policy_free(p);
}

static void test_policy_factory(void **state)
{
    (void)state;
    assert_null(lmc_eviction_policy_new("ARC"));
    assert_null(lmc_eviction_policy_new("lru"));
    assert_null(lmc_eviction_policy_new(NULL));
    lmc_eviction_policy *p = lmc_eviction_policy_new("noop");
    assert_non_null(p);
    lmc_object_key keys[2];
    make_keys(keys, 0, 2);
    p->ops->on_keys_added(p, keys, 2);
    verdicts v = {UINT64_MAX, UINT64_MAX};
    lmc_object_key out[2];
    assert_int_equal(p->ops->select_victims(p, 2, judge, &v, out), 0);
    assert_int_equal(p->ops->num_tracked(p), 0);
    lmc_eviction_policy_free(p);
}

/* ---- controller with an L1 manager ---------------------------------------- */

typedef struct env {
    int64_t now;
    lmc_l1_manager *l1;
    lmc_l1_eviction *ev;
} env;

static int64_t env_clock(void *user)
{
    return ((env *)user)->now;
}

static env *new_env(const char *policy, double watermark, double ratio, uint32_t period_ms)
{
    env *e = calloc(1, sizeof(*e));
    lmc_l1_manager_options o = {
        .configured_bytes = 10 * PAGE, .committed_bytes = 10 * PAGE, .align_bytes = PAGE,
        .write_ttl_ms = 1000, .read_ttl_ms = 1000, .clock = env_clock, .clock_user = e,
        .check_books = true,
    };
    e->l1 = lmc_l1_manager_new(&o);
    assert_non_null(e->l1);
    lmc_l1_eviction_options eo = {
        .trigger_watermark = watermark, .eviction_ratio = ratio, .period_ms = period_ms};
    e->ev = lmc_l1_eviction_new(e->l1, lmc_eviction_policy_new(policy), &eo);
    assert_non_null(e->ev);
    return e;
}

static void free_env(env *e)
{
    lmc_l1_eviction_free(e->ev);
    assert_true(lmc_l1_manager_check_books(e->l1));
    assert_int_equal(lmc_l1_manager_invariant_violations(e->l1), 0);
    lmc_l1_manager_free(e->l1);
    free(e);
}

static void store(env *e, uint64_t first, size_t n)
{
    lmc_object_key keys[16];
    lmc_lease leases[16];
    lmc_l1_result res[16];
    make_keys(keys, first, n);
    assert_int_equal(lmc_l1_manager_lease_write(e->l1, keys, NULL, n, PAGE, "w", leases, res), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], LMC_L1_SUCCESS);
    assert_int_equal(lmc_l1_manager_publish_writes(e->l1, keys, leases, n, 0, res), 0);
}

/* Asks without taking a lease, which would touch the key for the LRU
 * policy.  The keys asked about are never only staged, which is_evictable
 * would count as present too. */
static bool resident(env *e, uint64_t id)
{
    lmc_object_key k = make_key(id);
    return lmc_l1_manager_is_evictable(e->l1, &k) != LMC_L1_GONE;
}

static void test_watermark_trigger_and_order(void **state)
{
    (void)state;
    env *e = new_env("LRU", 0.5, 0.2, 0);
    store(e, 0, 4);                              /* 40 %: below the watermark */
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 0);
    store(e, 4, 6);                              /* 100 % */
    /* 10 tracked x 0.2 = 2 victims: the first batch's last chunks */
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 2);
    assert_false(resident(e, 3));
    assert_false(resident(e, 2));
    assert_true(resident(e, 1));
    /* touch 0 and 1: the second batch's last chunks go next */
    lmc_object_key touched[2] = {make_key(0), make_key(1)};
    lmc_l1_manager_touch(e->l1, touched, 2);
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 1);   /* 8 x 0.2 = 1 */
    assert_false(resident(e, 9));
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 1);   /* 70 % */
    assert_false(resident(e, 8));
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 1);   /* 60 % */
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 1);   /* 50 % */
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 0);   /* 40 %: stop */
    assert_true(resident(e, 0) && resident(e, 1) && resident(e, 4) && resident(e, 5));
    json_t *st = lmc_l1_eviction_report_status(e->ev);
    assert_int_equal(json_integer_value(json_object_get(st, "evicted_keys")), 6);
    assert_int_equal(json_integer_value(json_object_get(st, "num_tracked_keys")), 4);
    assert_string_equal(json_string_value(json_object_get(st, "eviction_policy")), "LRU");
    json_decref(st);
    free_env(e);
}

static void test_locked_and_staging_never_evicted(void **state)
{
    (void)state;
    env *e = new_env("LRU", 0.1, 1.0, 0);
    store(e, 0, 6);
    lmc_object_key k[2] = {make_key(5), make_key(3)};
    lmc_lease locks[2], staging[2];
    lmc_l1_result res[2];
    assert_int_equal(lmc_l1_manager_lease_read(e->l1, k, 2, 1, false, NULL, locks, res), 2);
    lmc_object_key staged[2] = {make_key(20), make_key(21)};
    assert_int_equal(
        lmc_l1_manager_lease_write(e->l1, staged, NULL, 2, PAGE, "s", staging, res), 0);
    /* ratio 1.0: everything evictable goes in one cycle */
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 4);
    assert_true(resident(e, 5) && resident(e, 3));
    lmc_l1_stats s;
    lmc_l1_manager_stats(e->l1, &s);
    assert_int_equal(s.num_objects, 2);
    assert_int_equal(s.num_staging, 2);
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 0);
    /* once the locks expire, both kinds become evictable */
    e->now += 1000;
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 4);
    lmc_l1_manager_stats(e->l1, &s);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.leases.lapsed[LMC_LEASE_WRITE], 2);
    /* Their holders coming back after all that changes nothing. */
    lmc_l1_manager_give_back(e->l1, k, locks, 2);
    lmc_l1_manager_give_back(e->l1, staged, staging, 2);
    lmc_l1_manager_stats(e->l1, &s);
    assert_int_equal(s.leases.returned_stale, 4);
    assert_int_equal(s.used_bytes, 0);
    free_env(e);
}

static void test_noop_never_evicts(void **state)
{
    (void)state;
    env *e = new_env("noop", 0.1, 1.0, 0);
    store(e, 0, 10);
    assert_int_equal(lmc_l1_eviction_run_once(e->ev), 0);
    uint64_t used, total;
    lmc_l1_manager_usage(e->l1, &used, &total);
    assert_int_equal(used, total);
    free_env(e);
}

static void test_controller_thread(void **state)
{
    (void)state;
    env *e = new_env("LRU", 0.5, 0.5, 5);
    assert_int_equal(lmc_l1_eviction_start(e->ev), 0);
    store(e, 0, 10);
    uint64_t used = 0, total = 0;
    for (int i = 0; i < 400; i++) {
        lmc_l1_manager_usage(e->l1, &used, &total);
        if (used * 2 < total)
            break;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_true(used * 2 < total);   /* the thread brought usage under 50 % */
    lmc_l1_eviction_stop(e->ev);
    lmc_l1_eviction_stop(e->ev);     /* idempotent */
    free_env(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_batch_order_and_touch),
        cmocka_unit_test(test_lru_skips_locked_and_forgets_gone),
        cmocka_unit_test(test_policy_factory),
        cmocka_unit_test(test_watermark_trigger_and_order),
        cmocka_unit_test(test_locked_and_staging_never_evicted),
        cmocka_unit_test(test_noop_never_evicts),
        cmocka_unit_test(test_controller_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
