/* Layout registry (sizes, refcounts, conflicts), the session table
 * (bounds, idle expiry, cached hashes equal direct hashing) and the
 * request-id table under it (keyed hash, growth). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/services/layout_registry.h"
#include "modules/services/rid_table.h"
#include "modules/services/sessions.h"

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

/* A module's state on a session (the blend stash): released exactly once
 * whichever way the session goes, and only then. */
typedef struct {
    lmc_session_ext ext;
    int *released;
} counted_ext;

static void counted_release(lmc_session_ext *e)
{
    counted_ext *c = (counted_ext *)e;
    (*c->released)++;
    free(c);
}

static void attach(lmc_sessions *s, const char *rid, int *released)
{
    lmc_session *se = lmc_sessions_acquire(s, rid, strlen(rid), true);
    assert_non_null(se);
    counted_ext *c = calloc(1, sizeof *c);
    c->ext.release = counted_release;
    c->released = released;
    se->ext = &c->ext;
    lmc_sessions_release(s, se);
}

static void test_session_ext_released_once(void **st)
{
    (void)st;
    lmc_token_hasher *h;
    assert_int_equal(lmc_token_hasher_new("blake3", 4, NULL, &h, NULL, 0), 0);
    int64_t now = 0;
    lmc_sessions_options o = {.max_sessions = 2, .max_idle_ms = 1000, .hasher = h,
                              .clock = clk, .clock_user = &now};
    lmc_sessions *s = lmc_sessions_new(&o);
    int ended = 0, bounded = 0, idle = 0, at_free = 0;
    attach(s, "end", &ended);
    lmc_session *gone = lmc_sessions_remove(s, "end", 3);     /* END_SESSION */
    assert_non_null(gone->ext);
    assert_int_equal(ended, 0);                                 /* not while held */
    lmc_sessions_release(s, gone);
    assert_int_equal(ended, 1);
    attach(s, "old", &bounded);
    attach(s, "x", &at_free);
    attach(s, "y", &at_free);                                   /* the count bound drops "old" */
    assert_int_equal(bounded, 1);
    now = 5000;
    attach(s, "late", &idle);                                   /* idle ones pruned */
    assert_int_equal(at_free, 2);
    lmc_sessions_free(s);
    assert_int_equal(idle, 1);
    assert_int_equal(ended + bounded, 2);
    lmc_token_hasher_free(h);
}

/* SipHash-2-4's published test vector: key 00..0f, message 00..0e. */
static void test_rid_hash_known_answer(void **st)
{
    (void)st;
    const uint64_t k[2] = {0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL};
    char msg[15];
    for (int i = 0; i < 15; i++)
        msg[i] = (char)i;
    assert_true(lmc_rid_hash(k, msg, 15) == 0xa129ca6149be45e5ULL);
    assert_true(lmc_rid_hash(k, msg, 0) == 0x726fdb47dd0e0e31ULL);
    assert_true(lmc_rid_hash(k, msg, 8) == 0x93f5f5799a932462ULL);
}

/* issue 17: each table draws its own key (ids that collide in one table
 * do not in the next), and the buckets grow with the count, where there
 * used to be 1,024 for up to 65,536 ids. */
static void test_rid_table_seeded_and_growing(void **st)
{
    (void)st;
    enum { N = 20000 };
    lmc_rid_table a, b;
    assert_int_equal(lmc_rid_table_init(&a, 16), 0);
    assert_int_equal(lmc_rid_table_init(&b, 16), 0);
    assert_memory_not_equal(a.key, b.key, sizeof a.key);
    assert_true(lmc_rid_hash(a.key, "req-1", 5) != lmc_rid_hash(b.key, "req-1", 5));
    assert_int_equal(a.nbuckets, 16);
    lmc_rid_node *nodes = calloc(N, sizeof *nodes);
    assert_non_null(nodes);
    char rid[32];
    size_t longest = 0;
    for (int i = 0; i < N; i++) {
        int n = snprintf(rid, sizeof rid, "cmpl-%d", i);
        assert_int_equal(lmc_rid_table_insert(&a, &nodes[i], rid, (size_t)n, i), 0);
        assert_true(a.nbuckets >= a.count);
    }
    assert_int_equal(a.count, N);
    assert_true(a.nbuckets >= N && a.nbuckets <= 2 * (size_t)N);
    for (size_t i = 0; i < a.nbuckets; i++) {
        size_t len = 0;
        for (lmc_rid_node *n = a.buckets[i]; n; n = n->hnext)
            len++;
        longest = len > longest ? len : longest;
    }
    assert_true(longest <= 16);   /* about 8 expected at a load of 1 */
    for (int i = 0; i < N; i += 2)
        lmc_rid_table_remove(&a, &nodes[i]);
    for (int i = 0; i < N; i++) {
        int n = snprintf(rid, sizeof rid, "cmpl-%d", i);
        lmc_rid_node *f = lmc_rid_table_find(&a, rid, (size_t)n);
        assert_ptr_equal(f, i % 2 ? &nodes[i] : NULL);
    }
    /* the recency list survived the rehashes: oldest is the first odd one */
    assert_ptr_equal(a.oldest, &nodes[1]);
    assert_ptr_equal(a.newest, &nodes[N - 1]);
    for (int i = 1; i < N; i += 2)
        lmc_rid_table_remove(&a, &nodes[i]);
    assert_int_equal(a.count, 0);
    free(nodes);
    lmc_rid_table_destroy(&a);
    lmc_rid_table_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_build),
        cmocka_unit_test(test_layout_registry),
        cmocka_unit_test(test_sessions),
        cmocka_unit_test(test_session_ext_released_once),
        cmocka_unit_test(test_rid_hash_known_answer),
        cmocka_unit_test(test_rid_table_seeded_and_growing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
