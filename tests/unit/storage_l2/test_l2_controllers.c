/* Store and prefetch controllers against a real storage manager and the
 * mock / fault_inject adapters.  The storage managers check their L1 books
 * after every mutating call, the tier's own calls included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <pthread.h>
#include <time.h>

#include "gate_backend.h"
#include "storage/l2/l2_internal.h"
#include "storage/l2/l2_service.h"
#include "storage/storage_config.h"
#include "storage/storage_manager.h"
#include "storage/storage_manager_testing.h"

#define OBJ 3000u
#define N 6          /* 3 units of 2 keys */
#define PER 2

typedef struct {
    lmc_config cfg;
    lmc_storage_manager *sm;
    lmc_key_interner *in;
    lmc_object_key keys[N];
    lmc_lease leases[N];   /* the prefetch's READ leases, ours once on_done ran */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int lookup_units, done_units, done_calls;
} fx;

/* lmc_storage_manager_create() with the books checked after every call. */
static lmc_storage_manager *create_checked(const lmc_config *cfg)
{
    lmc_storage_options o;
    char err[512];
    assert_int_equal(lmc_storage_options_from_config(cfg, &o, err, sizeof err), 0);
    o.check_books = true;
    lmc_storage_manager *sm = lmc_storage_manager_create(&o, err, sizeof err);
    if (!sm)
        fail_msg("create: %s", err);
    return sm;
}

static fx *start(const char *adapter, const char *timeout)
{
    fx *f = calloc(1, sizeof *f);
    const char *argv[] = {"lmcached", "--l1-size-gb", "0.01", "--eviction-policy", "LRU",
                          "--shm-name", "", "--l2-adapter", adapter,
                          "--l2-prefetch-load-timeout", timeout ? timeout : "30", NULL};
    char err[512];
    assert_int_equal(lmc_config_parse(&f->cfg, 11, (char *const *)argv, NULL, NULL, err,
                                      sizeof err), LMC_CONFIG_OK);
    f->sm = create_checked(&f->cfg);
    assert_int_equal(lmc_l2_attach(f->sm, &f->cfg, err, sizeof err), 0);
    assert_true(lmc_l2_attached(f->sm));
    f->in = lmc_key_interner_new();
    for (size_t i = 0; i < N; i++) {
        memset(&f->keys[i], 0, sizeof f->keys[i]);
        f->keys[i].chunk_hash_len = 32;
        f->keys[i].chunk_hash[0] = (uint8_t)i;
        f->keys[i].chunk_hash[1] = (uint8_t)(uintptr_t)f;   /* unique per fixture */
        f->keys[i].model_name = lmc_intern(f->in, "m", 1);
        f->keys[i].cache_salt = lmc_intern(f->in, "", 0);
    }
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->lookup_units = f->done_units = -1;
    return f;
}

static void stop(fx *f)
{
    assert_true(lmc_storage_manager_check_books(f->sm));
    assert_int_equal(lmc_storage_manager_invariant_violations(f->sm), 0);
    lmc_storage_manager_close(f->sm);
    lmc_key_interner_free(f->in);
    lmc_config_free(&f->cfg);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static uint8_t pattern(size_t i, size_t b)
{
    return (uint8_t)(i * 31 + b * 3);
}

/* Writes keys [0, n) through L1, as the engine would. */
static void write_keys(fx *f, size_t n)
{
    lmc_lease w[N];
    lmc_l1_result res[N];
    uint8_t *base = lmc_storage_manager_l1_arena(f->sm)->base;
    assert_int_equal(lmc_storage_manager_lease_write(f->sm, f->keys, n, OBJ, false, "eng", w,
                                                     res), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(res[i], LMC_L1_SUCCESS);
        for (size_t b = 0; b < OBJ; b++)
            base[w[i].offset + b] = pattern(i, b);
    }
    assert_int_equal(lmc_storage_manager_publish_writes(f->sm, f->keys, w, n, 0, res), 0);
}

static json_int_t counter(fx *f, const char *section, const char *name)
{
    json_t *st = lmc_storage_manager_report_status(f->sm);
    json_int_t v = json_integer_value(json_object_get(json_object_get(st, section), name));
    json_decref(st);
    return v;
}

static void wait_for(fx *f, const char *section, const char *name, json_int_t at_least)
{
    for (int i = 0; i < 1000 && counter(f, section, name) < at_least; i++)
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
    assert_true(counter(f, section, name) >= at_least);
}

static void on_lookup(void *user, size_t units)
{
    fx *f = user;
    pthread_mutex_lock(&f->mu);
    f->lookup_units = (int)units;
    pthread_mutex_unlock(&f->mu);
}

static void on_done(void *user, size_t units)
{
    fx *f = user;
    pthread_mutex_lock(&f->mu);
    f->done_units = (int)units;
    f->done_calls++;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static int prefetch(fx *f)
{
    memset(f->leases, 0, sizeof f->leases);
    lmc_l2_prefetch_request req = {.keys = f->keys, .leases = f->leases, .n = N,
                                   .keys_per_unit = PER, .object_size = OBJ, .readers = 1,
                                   .on_lookup_done = on_lookup, .on_done = on_done, .user = f};
    assert_int_equal(lmc_l2_prefetch(f->sm, &req), 0);
    pthread_mutex_lock(&f->mu);
    while (f->done_calls == 0)
        pthread_cond_wait(&f->cv, &f->mu);
    int units = f->done_units;
    f->done_calls = 0;
    pthread_mutex_unlock(&f->mu);
    for (size_t i = 0; i < N; i++) {
        if (i < (size_t)units * PER)
            assert_int_equal(f->leases[i].kind, LMC_LEASE_READ);
        else
            assert_false(lmc_lease_held(&f->leases[i]));   /* nothing more to give back */
    }
    return units;
}

static void test_write_behind_then_prefetch(void **state)
{
    (void)state;
    fx *f = start("{\"type\":\"mock\"}", NULL);
    write_keys(f, 5);   /* key 5 never written: 2 whole units in L2 */
    wait_for(f, "store_controller", "stores_ok", 1);
    wait_for(f, "store_controller", "keys_submitted", 5);
    for (int i = 0; i < 100 && counter(f, "store_controller", "batches_in_flight"); i++)
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
    assert_int_equal(lmc_storage_manager_clear(f->sm, false), 5);
    assert_int_equal(prefetch(f), 2);
    assert_int_equal(f->lookup_units, 2);
    lmc_lease copies[N], probe[N];
    lmc_l1_result res[N];
    /* The engine's retrieve: each copy carries the share the prefetch took. */
    assert_int_equal(lmc_storage_manager_lease_copy(f->sm, f->keys, 4, LMC_COPY_CARRIES_SHARE,
                                                    true, NULL, copies, res), 4);
    uint8_t *base = lmc_storage_manager_l1_arena(f->sm)->base;
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(copies[i].copy, f->leases[i].copy);
        assert_int_equal(copies[i].object_size, OBJ);
        for (size_t b = 0; b < OBJ; b += 97)
            assert_int_equal(base[copies[i].offset + b], pattern(i, b));
    }
    /* Temporary: the last read frees them; L1 is empty again. */
    lmc_storage_manager_give_back(f->sm, f->keys, copies, 4);
    assert_int_equal(lmc_storage_manager_lease_read(f->sm, f->keys, N, 1, true, NULL,
                                                    probe, NULL), 0);
    uint64_t used, total;
    lmc_storage_manager_usage(f->sm, &used, &total);
    assert_int_equal(used, 0);
    json_t *st = lmc_storage_manager_report_status(f->sm);
    assert_int_equal(json_integer_value(json_object_get(st, "num_l2_adapters")), 1);
    assert_int_equal(json_array_size(json_object_get(st, "l2_adapters")), 1);
    assert_non_null(json_object_get(st, "prefetch_controller"));
    json_decref(st);
    stop(f);
}

static void test_slow_adapter_times_out(void **state)
{
    (void)state;
    fx *f = start("{\"type\":\"fault_inject\",\"delay_rate\":1,\"delay_ms\":400,\"seed\":3,"
                  "\"inner\":{\"type\":\"mock\"}}", "0.05");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(prefetch(f), 0);   /* the deadline answers, not the adapter */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 2);
    assert_true(counter(f, "prefetch_controller", "timeouts") >= 1);
    stop(f);   /* late tasks are reaped or dropped at close: no leak, no hang */
}

static void test_failing_store_counted(void **state)
{
    (void)state;
    fx *f = start("{\"type\":\"fault_inject\",\"fail_rate\":1,\"inner\":{\"type\":\"mock\"}}",
                  NULL);
    write_keys(f, N);
    wait_for(f, "store_controller", "stores_failed", 1);
    assert_int_equal(counter(f, "store_controller", "stores_ok"), 0);
    assert_int_equal(prefetch(f), 0);   /* still resident in L1: nothing reserved from L2 */
    stop(f);
}

static void test_skip_l1_policy(void **state)
{
    (void)state;
    fx *f = calloc(1, sizeof *f);
    const char *argv[] = {"lmcached", "--l1-size-gb", "0.01", "--eviction-policy", "LRU",
                          "--shm-name", "", "--l2-adapter", "{\"type\":\"mock\"}",
                          "--l2-store-policy", "skip_l1", NULL};
    char err[512];
    assert_int_equal(lmc_config_parse(&f->cfg, 11, (char *const *)argv, NULL, NULL, err,
                                      sizeof err), LMC_CONFIG_OK);
    fx *g = start("{\"type\":\"mock\"}", NULL);   /* reuse the key/interner setup */
    lmc_storage_manager_close(g->sm);
    g->sm = create_checked(&f->cfg);
    assert_int_equal(lmc_l2_attach(g->sm, &f->cfg, err, sizeof err), 0);
    write_keys(g, N);
    wait_for(g, "store_controller", "l1_deleted", N);
    lmc_lease probe[N];
    assert_int_equal(lmc_storage_manager_lease_read(g->sm, g->keys, N, 1, true, NULL,
                                                    probe, NULL), 0);
    assert_int_equal(prefetch(g), N / PER);
    lmc_storage_manager_give_back(g->sm, g->keys, g->leases, N);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(g->leases[i].kind, LMC_LEASE_RETURNED);
    stop(g);
    lmc_config_free(&f->cfg);
    free(f);
}

/* Issue 18: the parts of one load run in parallel and the middle one fails:
 * the hit count is the leading run before it, the staging of the rest goes
 * back, and no L2 lock is left (every key can be deleted afterwards). */
static void test_middle_chunk_fails_to_load(void **state)
{
    (void)state;
    fx *f = start("{\"type\":\"mock\"}", NULL);   /* its tier stays idle */
    gate *g;
    lmc_l2_adapter *ad = lmc_l2_adapter_new(gate_new(lmc_l2_mock_new(0), 3, 3, &g),
                                            lmc_storage_manager_l1_arena(f->sm)->base, 4);
    static uint8_t data[N][OBJ];
    uint8_t *bufs[N];
    uint64_t sizes[N];
    for (size_t i = 0; i < N; i++) {
        memset(data[i], (int)i + 1, OBJ);
        bufs[i] = data[i];
        sizes[i] = OBJ;
    }
    lmc_l2_backend *be = lmc_l2_adapter_backend(ad);
    assert_int_equal(be->ops->store(be, f->keys, bufs, sizes, N), N * OBJ);
    lmc_l2_prefetch_options po = {.max_in_flight = 4};
    lmc_l2_prefetch_ctl *c = lmc_l2_prefetch_ctl_new(f->sm, &ad, 1, &po);
    lmc_l2_prefetch_request req = {.keys = f->keys, .leases = f->leases, .n = N,
                                   .keys_per_unit = PER, .object_size = OBJ, .readers = 1,
                                   .on_lookup_done = on_lookup, .on_done = on_done, .user = f};
    assert_int_equal(lmc_l2_prefetch_ctl_submit(c, &req), 0);
    pthread_mutex_lock(&f->mu);
    while (f->done_calls == 0)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    assert_int_equal(f->lookup_units, N / PER);
    assert_int_equal(f->done_units, 1);   /* key 3 failed: unit 1 is not whole */
    assert_int_equal(gate_max_inside(g), 3);
    uint8_t *base = lmc_storage_manager_l1_arena(f->sm)->base;
    for (size_t i = 0; i < N; i++) {
        if (i < PER) {
            assert_int_equal(f->leases[i].kind, LMC_LEASE_READ);
            assert_int_equal(base[f->leases[i].offset + OBJ - 1], i + 1);
        } else {
            assert_false(lmc_lease_held(&f->leases[i]));
        }
    }
    assert_int_equal(lmc_l2_adapter_delete(ad, f->keys, N), N);   /* nothing locked */
    lmc_storage_manager_give_back(f->sm, f->keys, f->leases, PER);
    lmc_l2_prefetch_ctl_stop(c);
    lmc_l2_adapter_close(ad);
    lmc_l2_prefetch_ctl_free(c);
    stop(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_behind_then_prefetch),
        cmocka_unit_test(test_slow_adapter_times_out),
        cmocka_unit_test(test_failing_store_counted),
        cmocka_unit_test(test_skip_l1_policy),
        cmocka_unit_test(test_middle_chunk_fails_to_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
