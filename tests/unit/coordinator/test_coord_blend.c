/* The coordinator's fleet fragment index (docs/coordinator.md, "Blend
 * lookup"): matches at every position, token-exact confirmation of a
 * fingerprint hit, namespaces, one content under several chunk hashes,
 * removal and the bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "coordinator/coord_blend.h"
#include "hash/poly_fingerprint.h"

#define CS 4

static const coordinator_blend_ns NS_A = {"m", "", 1, 0, 1};
static const coordinator_blend_ns NS_SALT = {"m", "t", 1, 1, 1};
static const coordinator_blend_ns NS_WS2 = {"m", "", 1, 0, 2};
static const coordinator_blend_ns NS_OTHER = {"other", "", 5, 0, 1};

static coordinator_blend *make(size_t max_chunks, uint32_t stride, uint64_t mask)
{
    coordinator_blend_opts o = {.chunk_size = CS, .probe_stride = stride,
                                .max_chunks = max_chunks, .fp_mask = mask};
    coordinator_blend *b = coordinator_blend_new(&o);
    assert_non_null(b);
    return b;
}

static int add(coordinator_blend *b, const coordinator_blend_ns *ns, uint8_t h,
               const uint32_t *t, uint64_t old_st)
{
    uint8_t hash[32] = {h};
    return coordinator_blend_add(b, ns, hash, sizeof hash, t, old_st);
}

static size_t match(coordinator_blend *b, const coordinator_blend_ns *ns, const uint32_t *q,
                    size_t n, coordinator_blend_hit **hits)
{
    size_t got;
    assert_int_equal(coordinator_blend_match(b, ns, q, n, hits, &got), 0);
    return got;
}

static void test_options_refused(void **state)
{
    (void)state;
    coordinator_blend_opts o = {.chunk_size = CS, .probe_stride = 1, .max_chunks = 1};
    o.chunk_size = 0;
    assert_null(coordinator_blend_new(&o));
    o.chunk_size = CS, o.probe_stride = 0;
    assert_null(coordinator_blend_new(&o));
    o.probe_stride = 1, o.max_chunks = COORD_BLEND_MAX_MAX_CHUNKS + 1;
    assert_null(coordinator_blend_new(&o));
}

/* A chunk is found at every position of the query, with where it was stored. */
static void test_every_position(void **state)
{
    (void)state;
    coordinator_blend *b = make(16, 1, 0);
    const uint32_t t[CS] = {1000, 2000, 3000, 4000};
    assert_int_equal(add(b, &NS_A, 7, t, 256), COORD_BLEND_ADDED);
    for (size_t p = 0; p + CS <= 12; p++) {
        uint32_t q[12];
        for (size_t i = 0; i < 12; i++)
            q[i] = 9;
        memcpy(q + p, t, sizeof t);
        coordinator_blend_hit *h;
        assert_int_equal(match(b, &NS_A, q, 12, &h), 1);
        assert_int_equal(h[0].cur_st, p);
        assert_int_equal(h[0].old_st, 256);
        assert_int_equal(h[0].hash[0], 7);
        assert_int_equal(h[0].hash_len, 32);
        free(h);
    }
    coordinator_blend_hit *h;
    assert_int_equal(match(b, &NS_A, t, CS - 1, &h), 0); /* shorter than a chunk */
    assert_null(h);
    coordinator_blend_free(b);
}

/* With the fingerprints cut to 4 bits, other tokens collide on it: a hit
 * is confirmed token by token, so only the stored tokens match. */
static void test_collision_rejected(void **state)
{
    (void)state;
    coordinator_blend *b = make(16, 1, 0xf);
    const uint32_t t[CS] = {1, 2, 3, 4};
    assert_int_equal(add(b, &NS_A, 1, t, 0), COORD_BLEND_ADDED);
    uint64_t want = lmc_hash_poly_fingerprint((const uint64_t[]){1, 2, 3, 4}, CS) & 0xf;
    uint32_t other[CS] = {1, 2, 3, 5};
    for (; (lmc_hash_poly_fingerprint((const uint64_t[]){other[0], other[1], other[2],
                                                          other[3]}, CS) & 0xf) != want;)
        other[3]++;
    coordinator_blend_hit *h;
    assert_int_equal(match(b, &NS_A, other, CS, &h), 0);
    /* A colliding content stored too is its own content, found by its tokens. */
    assert_int_equal(add(b, &NS_A, 2, other, 4), COORD_BLEND_ADDED);
    assert_int_equal(coordinator_blend_get_stats(b).contents, 2);
    assert_int_equal(match(b, &NS_A, other, CS, &h), 1);
    assert_int_equal(h[0].hash[0], 2);
    free(h);
    assert_int_equal(match(b, &NS_A, t, CS, &h), 1);
    assert_int_equal(h[0].hash[0], 1);
    free(h);
    coordinator_blend_free(b);
}

/* One content under several chunk hashes and namespaces: each namespace
 * sees only its own claims, each chunk hash once per query. */
static void test_namespaces_and_shared_content(void **state)
{
    (void)state;
    coordinator_blend *b = make(16, 1, 0);
    const uint32_t t[CS] = {5, 6, 7, 8};
    assert_int_equal(add(b, &NS_A, 1, t, 0), COORD_BLEND_ADDED);
    assert_int_equal(add(b, &NS_A, 1, t, 8), COORD_BLEND_KNOWN); /* moved */
    assert_int_equal(add(b, &NS_OTHER, 2, t, 12), COORD_BLEND_ADDED);
    assert_int_equal(add(b, &NS_SALT, 3, t, 16), COORD_BLEND_ADDED);
    coordinator_blend_stats st = coordinator_blend_get_stats(b);
    assert_int_equal(st.contents, 1);
    assert_int_equal(st.chunks, 3);
    const uint32_t q[2 * CS] = {5, 6, 7, 8, 5, 6, 7, 8};
    const struct {
        const coordinator_blend_ns *ns;
        uint8_t hash;
        uint64_t old_st;
    } want[] = {{&NS_A, 1, 8}, {&NS_OTHER, 2, 12}, {&NS_SALT, 3, 16}};
    for (size_t i = 0; i < 3; i++) {
        coordinator_blend_hit *h;
        assert_int_equal(match(b, want[i].ns, q, 2 * CS, &h), 1);
        assert_int_equal(h[0].hash[0], want[i].hash);
        assert_int_equal(h[0].old_st, want[i].old_st);
        assert_int_equal(h[0].cur_st, 0);
        free(h);
    }
    coordinator_blend_hit *h;
    assert_int_equal(match(b, &NS_WS2, q, 2 * CS, &h), 0);
    coordinator_blend_free(b);
}

static void test_removal(void **state)
{
    (void)state;
    coordinator_blend *b = make(16, 1, 0);
    const uint32_t t[CS] = {5, 6, 7, 8};
    uint8_t h1[32] = {1};
    add(b, &NS_A, 1, t, 0);
    add(b, &NS_OTHER, 2, t, 0);
    assert_false(coordinator_blend_remove(b, &NS_OTHER, h1, sizeof h1)); /* not its claim */
    assert_true(coordinator_blend_remove(b, &NS_A, h1, sizeof h1));
    assert_false(coordinator_blend_remove(b, &NS_A, h1, sizeof h1));
    coordinator_blend_hit *h;
    assert_int_equal(match(b, &NS_A, t, CS, &h), 0);
    assert_int_equal(match(b, &NS_OTHER, t, CS, &h), 1);
    free(h);
    uint8_t h2[32] = {2};
    assert_true(coordinator_blend_remove(b, &NS_OTHER, h2, sizeof h2));
    coordinator_blend_stats st = coordinator_blend_get_stats(b);
    assert_int_equal(st.contents, 0);
    assert_int_equal(st.chunks, 0);
    assert_int_equal(st.removed, 2);
    coordinator_blend_free(b);
}

/* Past max_chunks a new claim is refused and counted; one already there
 * still moves, and removal makes room. */
static void test_bound(void **state)
{
    (void)state;
    coordinator_blend *b = make(2, 1, 0);
    const uint32_t t[3][CS] = {{1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}};
    assert_int_equal(add(b, &NS_A, 1, t[0], 0), COORD_BLEND_ADDED);
    assert_int_equal(add(b, &NS_A, 2, t[1], 4), COORD_BLEND_ADDED);
    assert_int_equal(add(b, &NS_A, 3, t[2], 8), COORD_BLEND_FULL);
    assert_int_equal(add(b, &NS_A, 2, t[1], 12), COORD_BLEND_KNOWN);
    coordinator_blend_stats st = coordinator_blend_get_stats(b);
    assert_int_equal(st.chunks, 2);
    assert_int_equal(st.refused, 1);
    uint8_t h1[32] = {1};
    assert_true(coordinator_blend_remove(b, &NS_A, h1, sizeof h1));
    assert_int_equal(add(b, &NS_A, 3, t[2], 8), COORD_BLEND_ADDED);
    coordinator_blend_free(b);
}

/* BLEND_PROBE_STRIDE: only every stride-th position is probed. */
static void test_probe_stride(void **state)
{
    (void)state;
    coordinator_blend *b = make(16, 2, 0);
    const uint32_t t[CS] = {1, 2, 3, 4};
    add(b, &NS_A, 1, t, 0);
    const uint32_t odd[CS + 1] = {9, 1, 2, 3, 4}, even[CS + 2] = {9, 9, 1, 2, 3, 4};
    coordinator_blend_hit *h;
    assert_int_equal(match(b, &NS_A, odd, CS + 1, &h), 0);
    assert_int_equal(match(b, &NS_A, even, CS + 2, &h), 1);
    assert_int_equal(h[0].cur_st, 2);
    free(h);
    coordinator_blend_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_refused),
        cmocka_unit_test(test_every_position),
        cmocka_unit_test(test_collision_rejected),
        cmocka_unit_test(test_namespaces_and_shared_content),
        cmocka_unit_test(test_removal),
        cmocka_unit_test(test_bound),
        cmocka_unit_test(test_probe_stride),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
