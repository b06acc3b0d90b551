/* L2 eviction (aggregate LRU against capacity, IsolatedLRU against quotas)
 * over the mock adapter, keys recovered by the fs adapter, and the quota
 * registry. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "storage/l2/l2_adapter.h"
#include "storage/l2/l2_eviction.h"
#include "storage/quota.h"

#define OBJ 1000

static uint8_t arena[64 * OBJ];

static lmc_object_key key(int i, const char *salt)
{
    lmc_object_key k = {.chunk_hash_len = 32, .model_name = "m", .cache_salt = salt};
    k.chunk_hash[0] = (uint8_t)i;
    k.chunk_hash[1] = (uint8_t)(i >> 8);
    return k;
}

/* Stores keys[0..n) (each OBJ bytes) and waits for the task. */
static void store(lmc_l2_adapter *a, const lmc_object_key *keys, size_t n)
{
    uint64_t offs[64], sizes[64], id, got;
    int64_t result;
    for (size_t i = 0; i < n; i++)
        offs[i] = i * OBJ, sizes[i] = OBJ;
    id = lmc_l2_adapter_submit_store(a, keys, offs, sizes, n);
    assert_true(id > 0);
    for (int i = 0; i < 2000; i++) {
        if (lmc_l2_adapter_pop_completed_store(a, &got, &result)) {
            assert_int_equal(got, id);
            assert_int_equal(result, (int64_t)(n * OBJ));
            return;
        }
        usleep(1000);
    }
    fail_msg("store did not complete");
}

static bool present(lmc_l2_adapter *a, const lmc_object_key *k)
{
    uint8_t found = 0;
    uint64_t size = OBJ;
    lmc_l2_backend *be = lmc_l2_adapter_backend(a);
    be->ops->lookup_and_lock(be, k, &size, 1, &found);
    if (found)
        be->ops->unlock(be, k, 1);
    return found;
}

static void test_aggregate_lru_evicts_oldest_above_watermark(void **state)
{
    (void)state;
    lmc_l2_adapter *a = lmc_l2_adapter_new(lmc_l2_mock_new(10 * OBJ), arena, 1);
    json_t *ev = json_pack("{s:s, s:f, s:f}", "eviction_policy", "LRU", "trigger_watermark", 0.8,
                           "eviction_ratio", 0.25);
    const json_t *evs[] = {ev};
    lmc_quotas *q = lmc_quotas_new();
    lmc_l2_eviction *e = lmc_l2_eviction_new(&a, evs, 1, q, NULL, 60000);
    lmc_object_key k[8];
    for (int i = 0; i < 8; i++)
        k[i] = key(i, "");
    store(a, k, 4);          /* 4 of 10: below the watermark */
    lmc_l2_eviction_run_once(e);
    for (int i = 0; i < 4; i++)
        assert_true(present(a, &k[i]));
    store(a, k + 4, 4);      /* 8 of 10 = 0.8: evict 25 % of 8 = 2, oldest first */
    lmc_l2_eviction_run_once(e);
    /* The older batch goes first, and within it the last chunks: a cached
     * prefix shrinks from its end. */
    assert_true(present(a, &k[0]));
    assert_true(present(a, &k[1]));
    assert_false(present(a, &k[2]));
    assert_false(present(a, &k[3]));
    for (int i = 4; i < 8; i++)
        assert_true(present(a, &k[i]));
    json_t *st = lmc_l2_eviction_status(e);
    json_t *t0 = json_array_get(json_object_get(st, "adapters"), 0);
    assert_int_equal(json_integer_value(json_object_get(t0, "evicted_keys")), 2);
    assert_int_equal(json_integer_value(json_object_get(t0, "tracked_keys")), 6);
    json_decref(st);
    lmc_l2_eviction_free(e);
    lmc_l2_adapter_close(a);
    lmc_quotas_free(q);
    json_decref(ev);
}

static void test_isolated_lru_enforces_quotas_as_allowlist(void **state)
{
    (void)state;
    lmc_l2_adapter *a = lmc_l2_adapter_new(lmc_l2_mock_new(0), arena, 1);
    json_t *ev = json_pack("{s:s, s:f, s:f}", "eviction_policy", "IsolatedLRU",
                           "trigger_watermark", 1.0, "eviction_ratio", 0.5);
    const json_t *evs[] = {ev};
    lmc_quotas *q = lmc_quotas_new();
    assert_int_equal(lmc_quotas_set(q, "paid", 4 * OBJ), 0);
    lmc_l2_eviction *e = lmc_l2_eviction_new(&a, evs, 1, q, NULL, 60000);
    lmc_object_key paid[4], rogue[2];
    for (int i = 0; i < 4; i++)
        paid[i] = key(i, "paid");
    for (int i = 0; i < 2; i++)
        rogue[i] = key(100 + i, "rogue");
    store(a, paid, 3);       /* 3 of 4 KB: within quota */
    store(a, rogue, 2);      /* no quota: wiped */
    json_t *usage = lmc_l2_eviction_usage_by_salt(e);
    assert_int_equal(json_integer_value(json_object_get(usage, "paid")), 3 * OBJ);
    assert_int_equal(json_integer_value(json_object_get(usage, "rogue")), 2 * OBJ);
    json_decref(usage);
    lmc_l2_eviction_run_once(e);
    for (int i = 0; i < 3; i++)
        assert_true(present(a, &paid[i]));
    assert_false(present(a, &rogue[0]));
    assert_false(present(a, &rogue[1]));
    usage = lmc_l2_eviction_usage_by_salt(e);
    assert_int_equal(json_integer_value(json_object_get(usage, "rogue")), 0);
    json_decref(usage);
    store(a, paid + 3, 1);   /* 4 of 4: at the watermark, half goes */
    lmc_l2_eviction_run_once(e);
    int left = 0;
    for (int i = 0; i < 4; i++)
        left += present(a, &paid[i]);
    assert_int_equal(left, 2);
    lmc_l2_eviction_free(e);
    lmc_l2_adapter_close(a);
    lmc_quotas_free(q);
    json_decref(ev);
}

static lmc_l2_adapter *open_fs(const char *dir, uint64_t capacity)
{
    char err[256];
    lmc_l2_fs_options o = {.base_path = dir, .capacity_bytes = capacity,
                           .recover_on_start = true};
    lmc_l2_backend *be = lmc_l2_fs_new(&o, err, sizeof err);
    assert_non_null(be);
    return lmc_l2_adapter_new(be, arena, 1);
}

/* Gives k's file the modification time `sec` s + `ns` ns after the epoch. */
static void set_mtime(const char *dir, const lmc_object_key *k, time_t sec, long ns)
{
    char name[512], path[1024];
    assert_true(lmc_object_key_to_filename(k, name, sizeof name) > 0);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct timespec ts[2] = {{sec, ns}, {sec, ns}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static json_int_t tracker_field(lmc_l2_eviction *e, const char *name)
{
    json_t *st = lmc_l2_eviction_status(e);
    json_int_t v = json_integer_value(
        json_object_get(json_array_get(json_object_get(st, "adapters"), 0), name));
    json_decref(st);
    return v;
}

/* Files an earlier process left in an fs L2 are tracked from the start as
 * the least recently used: the oldest batch (by modification time, files of
 * one second being one batch) goes first, its newest file first, and keys
 * stored after the restart survive. */
static void test_recovered_fs_keys_are_evicted_first(void **state)
{
    (void)state;
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/lmc-l2-evict-%ld", (long)getpid());
    scratch_dir_remove(dir);
    lmc_object_key k[8];
    for (int i = 0; i < 8; i++)
        k[i] = key(i, "");
    lmc_l2_adapter *before = open_fs(dir, 10 * OBJ);
    store(before, k, 6);
    lmc_l2_adapter_close(before);
    /* k0..k2 were written together long ago, k3..k5 later. */
    for (int i = 0; i < 3; i++)
        set_mtime(dir, &k[i], 1000000, i * 1000000L);
    for (int i = 3; i < 6; i++)
        set_mtime(dir, &k[i], 2000000, i * 1000000L);

    lmc_l2_adapter *a = open_fs(dir, 10 * OBJ);
    json_t *ev = json_pack("{s:s, s:f, s:f}", "eviction_policy", "LRU", "trigger_watermark", 0.8,
                           "eviction_ratio", 0.25);
    const json_t *evs[] = {ev};
    lmc_quotas *q = lmc_quotas_new();
    lmc_l2_eviction *e = lmc_l2_eviction_new(&a, evs, 1, q, NULL, 60000);
    assert_non_null(e);
    assert_int_equal(tracker_field(e, "recovered_keys"), 6);
    assert_int_equal(tracker_field(e, "tracked_bytes"), 6 * OBJ);
    store(a, k + 6, 2);      /* 8 of 10 = 0.8: evict 25 % of 8 = 2 */
    lmc_l2_eviction_run_once(e);
    assert_true(present(a, &k[0]));
    assert_false(present(a, &k[1]));
    assert_false(present(a, &k[2]));
    for (int i = 3; i < 8; i++)
        assert_true(present(a, &k[i]));
    assert_int_equal(tracker_field(e, "tracked_keys"), 6);
    lmc_l2_eviction_free(e);
    lmc_l2_adapter_close(a);
    lmc_quotas_free(q);
    json_decref(ev);
    scratch_dir_remove(dir);
}

/* Without an eviction object nothing is tracked, recovered or not; the
 * mock keeps nothing across processes, so it recovers nothing. */
static void test_mock_recovers_nothing(void **state)
{
    (void)state;
    lmc_l2_adapter *a = lmc_l2_adapter_new(lmc_l2_mock_new(10 * OBJ), arena, 1);
    json_t *ev = json_pack("{s:s}", "eviction_policy", "LRU");
    const json_t *evs[] = {ev};
    lmc_quotas *q = lmc_quotas_new();
    lmc_l2_eviction *e = lmc_l2_eviction_new(&a, evs, 1, q, NULL, 60000);
    assert_int_equal(tracker_field(e, "recovered_keys"), 0);
    assert_int_equal(tracker_field(e, "tracked_keys"), 0);
    lmc_l2_eviction_free(e);
    lmc_l2_adapter_close(a);
    lmc_quotas_free(q);
    json_decref(ev);
}

static void test_quota_registry(void **state)
{
    (void)state;
    lmc_quotas *q = lmc_quotas_new();
    uint64_t lim;
    assert_false(lmc_quotas_has(q, "a"));
    assert_int_equal(lmc_quotas_get_limit(q, "a"), 0);
    assert_false(lmc_quotas_effective_limit(q, "a", &lim));   /* exempt without default */
    assert_int_equal(lmc_quotas_set(q, "a", 0), 0);           /* 0 is registered */
    assert_true(lmc_quotas_has(q, "a"));
    lmc_quotas_set(q, "b", 5);
    lmc_quotas_set_default(q, true, 7);
    assert_true(lmc_quotas_effective_limit(q, "zzz", &lim) && lim == 7);
    assert_true(lmc_quotas_effective_limit(q, "b", &lim) && lim == 5);
    json_t *snap = lmc_quotas_capture(q);
    assert_true(lmc_quotas_delete(q, "b"));
    assert_false(lmc_quotas_delete(q, "b"));
    lmc_quotas *r = lmc_quotas_new();
    assert_int_equal(lmc_quotas_restore(r, snap), 0);
    assert_int_equal(lmc_quotas_get_limit(r, "b"), 5);
    assert_true(lmc_quotas_effective_limit(r, "x", &lim) && lim == 7);
    json_t *bad = json_pack("{s:{s:i}}", "limits", "a", -1);
    assert_int_equal(lmc_quotas_restore(r, bad), -1);
    assert_int_equal(lmc_quotas_get_limit(r, "b"), 5);        /* unchanged */
    json_decref(bad);
    json_decref(snap);
    lmc_quotas_free(q);
    lmc_quotas_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_aggregate_lru_evicts_oldest_above_watermark),
        cmocka_unit_test(test_isolated_lru_enforces_quotas_as_allowlist),
        cmocka_unit_test(test_recovered_fs_keys_are_evicted_first),
        cmocka_unit_test(test_mock_recovers_nothing),
        cmocka_unit_test(test_quota_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
