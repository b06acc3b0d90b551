/* Layout registry (sizes, refcounts, conflicts) and the session table
 * (bounds, idle expiry, cached hashes equal direct hashing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "modules/layout_registry.h"
#include "modules/sessions.h"

static void test_layout_build(void **st)
{
    (void)st;
    lmc_layout l;
    char err[128];
    assert_int_equal(lmc_layout_build(&l, 16, 2, 8, "float16", 7, false, err, sizeof err), 0);
    assert_int_equal(l.ndim, 4);
    assert_int_equal(l.object_size, 2 * 2 * 16 * 8 * 2);
    assert_int_equal(lmc_layout_build(&l, 256, 3, 576, "bfloat16", 8, true, err, sizeof err), 0);
    assert_int_equal(l.ndim, 3);
    assert_int_equal(l.shape[0], 3);
    assert_int_equal(l.object_size, 3 * 256 * 576 * 2);
    assert_int_equal(lmc_dtype_itemsize("float32", 7), 4);
    assert_int_equal(lmc_dtype_itemsize("float8_e4m3fn", 13), 1);
    assert_int_equal(lmc_dtype_itemsize("complex64", 9), 0);
    assert_int_equal(lmc_layout_build(&l, 16, 2, 8, "complex64", 9, false, err, sizeof err), -1);
    assert_int_equal(lmc_layout_build(&l, 16, 0, 8, "float16", 7, false, err, sizeof err), -1);
}

static void test_layout_registry(void **st)
{
    (void)st;
    lmc_layout_registry *r = lmc_layout_registry_new();
    lmc_layout a, b, got;
    char err[64];
    lmc_layout_build(&a, 16, 2, 8, "float16", 7, false, err, sizeof err);
    lmc_layout_build(&b, 16, 2, 16, "float16", 7, false, err, sizeof err);
    assert_false(lmc_layout_registry_get(r, "m", 1, 2, &got));
    assert_int_equal(lmc_layout_registry_acquire(r, "m", 2, &a), 0);
    assert_int_equal(lmc_layout_registry_acquire(r, "m", 2, &a), 0);
    assert_int_equal(lmc_layout_registry_acquire(r, "m", 2, &b), -1);   /* conflict */
    assert_int_equal(lmc_layout_registry_acquire(r, "m", 1, &b), 0);    /* other world size */
    assert_true(lmc_layout_registry_get(r, "m", 1, 2, &got));
    assert_int_equal(got.object_size, a.object_size);
    lmc_layout_registry_release(r, "m", 2);
    assert_true(lmc_layout_registry_get(r, "m", 1, 2, NULL));
    lmc_layout_registry_release(r, "m", 2);
    assert_false(lmc_layout_registry_get(r, "m", 1, 2, NULL));
    assert_int_equal(lmc_layout_registry_count(r), 1);
    json_t *j = lmc_layout_registry_to_json(r);
    assert_int_equal(json_array_size(j), 1);
    json_decref(j);
    lmc_layout_registry_free(r);
}

static int64_t clk(void *u)
{
    return *(int64_t *)u;
}

static void test_sessions(void **st)
{
    (void)st;
    lmc_token_hasher *h;
    assert_int_equal(lmc_token_hasher_new("blake3", 4, NULL, &h, NULL, 0), 0);
    int64_t now = 0;
    lmc_sessions_options o = {.max_sessions = 3, .max_idle_ms = 1000, .hasher = h,
                              .clock = clk, .clock_user = &now};
    lmc_sessions *s = lmc_sessions_new(&o);
    assert_null(lmc_sessions_acquire(s, "a", 1, false));
    char rid[8];
    for (int i = 0; i < 5; i++) {
        snprintf(rid, sizeof rid, "s%d", i);
        lmc_session *se = lmc_sessions_acquire(s, rid, strlen(rid), true);
        assert_non_null(se);
        lmc_sessions_release(s, se);
    }
    assert_int_equal(lmc_sessions_count(s), 3);            /* the oldest went */
    assert_null(lmc_sessions_acquire(s, "s0", 2, false));
    uint64_t toks[12];
    for (int i = 0; i < 12; i++)
        toks[i] = (uint64_t)i * 3;
    uint8_t direct[3 * 32], cached[2 * 32];
    assert_int_equal(lmc_hash_chunks(h, toks, 12, 0, 12, direct), 0);
    lmc_session *se = lmc_sessions_acquire(s, "s4", 2, false);
    const uint8_t *p;
    assert_int_equal(lmc_session_hashes(se, toks, 12, 0, 12, &p), 0);
    assert_memory_equal(p, direct, sizeof direct);
    lmc_sessions_release(s, se);
    assert_int_equal(lmc_sessions_hash_range(s, "s4", 2, toks, 12, 4, 12, cached), 0);
    assert_memory_equal(cached, direct + 32, sizeof cached);
    assert_int_equal(lmc_sessions_hash_range(s, "none", 4, toks, 12, 4, 12, cached), 0);
    assert_memory_equal(cached, direct + 32, sizeof cached);
    se = lmc_sessions_remove(s, "s4", 2);
    assert_non_null(se);
    lmc_sessions_release(s, se);
    assert_int_equal(lmc_sessions_count(s), 2);
    now = 5000;                                              /* idle beyond 1 s */
    assert_null(lmc_sessions_acquire(s, "s3", 2, false));
    lmc_sessions_free(s);
    lmc_token_hasher_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_build),
        cmocka_unit_test(test_layout_registry),
        cmocka_unit_test(test_sessions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
