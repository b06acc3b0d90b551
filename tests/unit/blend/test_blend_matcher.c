/* CacheBlend fingerprint matcher (docs/cacheblend.md, "Matcher"): the
 * fingerprint and its rolling form, registration (start chunk, dedup by
 * hash and by content, slot collisions), matching at new offsets, the
 * namespaces, removal, strikes, the capacity bound and the memory cost. */
#include "modules/blend/blend_matcher.h"

#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define HL 32

static const lmc_blend_ns NS = {"llama", "", 1};

static lmc_blend_matcher *mk(uint32_t cs, size_t max, bool dedup)
{
    lmc_blend_matcher_opts o = {.chunk_size = cs, .hash_len = HL, .max_chunks = max,
                                .dedup_content = dedup};
    lmc_blend_matcher *m = NULL;
    char err[128];
    assert_int_equal(lmc_blend_matcher_new(&o, &m, err, sizeof err), 0);
    return m;
}

/* Chained hash stand-in: chunk key number `id`. */
static void key(uint8_t *h, uint64_t id)
{
    memset(h, 0xa5, HL);
    memcpy(h, &id, sizeof id);
}

/* Hashes id0, id0+1, ... for n chunks into a static buffer. */
static const uint8_t *keys(uint64_t id0, size_t n)
{
    static uint8_t buf[256 * HL];
    assert_true(n <= 256);
    for (size_t i = 0; i < n; i++)
        key(buf + i * HL, id0 + i);
    return buf;
}

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void fill(uint64_t *t, size_t n, uint64_t lo)
{
    for (size_t i = 0; i < n; i++)
        t[i] = lo + rnd() % 50000;
}

static size_t reg(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint64_t *t, size_t n,
                  uint64_t id0, size_t start, uint64_t off)
{
    size_t got = 99;
    assert_int_equal(lmc_blend_matcher_register(m, ns, t, n, keys(id0, 256), 256, start, off, &got),
                     LMC_BLEND_OK);
    return got;
}

static size_t match(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint64_t *t, size_t n,
                    lmc_blend_candidate **out)
{
    size_t k = 0;
    assert_int_equal(lmc_blend_matcher_match(m, ns, t, n, out, &k), LMC_BLEND_OK);
    return k;
}

/* Matches and checks only the number of matches. */
static void expect_n(lmc_blend_matcher *m, const lmc_blend_ns *ns, const uint64_t *t, size_t n,
                     size_t want)
{
    lmc_blend_candidate *r;
    assert_int_equal(match(m, ns, t, n, &r), want);
    free(r);
}

static uint64_t id_of(const lmc_blend_candidate *r)
{
    uint64_t id;
    memcpy(&id, r->hash, sizeof id);
    return id;
}

/* ---- fingerprint ---- */

static void test_fingerprint_matches_spec_vectors(void **state)
{
    (void)state;
    uint64_t a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8}, q[] = {9, 1, 2, 3, 4, 7}, r[3], big[256];
    assert_int_equal(lmc_blend_fingerprint(a, 4), 0xf9792455c84f1fe2ULL);
    assert_int_equal(lmc_blend_fingerprint(b, 4), 0x70913355b61657d2ULL);
    assert_int_equal(lmc_blend_rolling(q, 6, 4, r), 0);
    assert_int_equal(r[0], 0x7e506496e9b40b7bULL);
    assert_int_equal(r[1], 0xf9792455c84f1fe2ULL);
    assert_int_equal(r[2], 0xd73f2815c3c0ede0ULL);
    for (int i = 0; i < 256; i++)
        big[i] = 1000 + (uint64_t)i;
    assert_int_equal(lmc_blend_fingerprint(big, 256), 0x6b39a22dae200f80ULL);
}

static void test_rolling_equals_direct_per_window(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 2, 7, 64, 257, 1000};
    static const size_t ks[] = {1, 2, 3, 16, 256};
    static const uint64_t edge[] = {0, 1, UINT32_MAX, (uint64_t)UINT32_MAX + 1, INT64_MAX,
                                    (uint64_t)INT64_MAX + 1, UINT64_MAX - 1, UINT64_MAX};
    uint64_t t[1000], out[1000];
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            size_t n = lens[li], k = ks[ki];
            for (size_t i = 0; i < n; i++)   /* random 64-bit ids, every third a limit */
                t[i] = i % 3 ? rnd() : edge[rnd() % 8];
            if (n < k) {
                assert_int_equal(lmc_blend_rolling(t, n, k, out), LMC_BLEND_EINVAL);
                continue;
            }
            assert_int_equal(lmc_blend_rolling(t, n, k, out), 0);
            for (size_t p = 0; p + k <= n; p++)
                assert_int_equal(out[p], lmc_blend_fingerprint(t + p, k));
        }
    assert_int_equal(lmc_blend_rolling(t, 4, 0, out), LMC_BLEND_EINVAL);
}

/* ---- registration ---- */

static void test_register_skips_chunks_before_start_and_partial_tail(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[14];
    fill(t, 14, 0);
    /* 3 whole chunks + 2 tokens; chunk 0 skipped (a prefix hit) */
    assert_int_equal(reg(m, &NS, t, 14, 100, 1, 512), 2);
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, t, 14, &r), 2);
    assert_int_equal(r[0].cur_st, 4);
    assert_int_equal(r[0].old_st, 512 + 4);
    assert_int_equal(id_of(&r[0]), 101);
    assert_int_equal(r[1].cur_st, 8);
    assert_int_equal(r[1].old_st, 512 + 8);
    free(r);
    size_t got = 1;
    assert_int_equal(lmc_blend_matcher_register(m, &NS, t, 14, keys(0, 3), 3, 3, 0, &got), 0);
    assert_int_equal(got, 0); /* start past the last whole chunk */
    lmc_blend_matcher_free(m);
}

static void test_known_hash_registers_nothing_and_keeps_position(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[8];
    fill(t, 8, 0);
    assert_int_equal(reg(m, &NS, t, 8, 7, 0, 0), 2);
    assert_int_equal(reg(m, &NS, t, 8, 7, 0, 400), 0); /* re-store of known content */
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, t, 8, &r), 2);
    assert_int_equal(r[1].old_st, 4);
    free(r);
    assert_int_equal(lmc_blend_matcher_get_stats(m).live, 2);
    lmc_blend_matcher_free(m);
}

static void test_same_text_after_other_prefix_newest_wins(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[4];
    fill(t, 4, 0);
    assert_int_equal(reg(m, &NS, t, 4, 10, 0, 40), 1);
    assert_int_equal(reg(m, &NS, t, 4, 20, 0, 80), 1); /* other chained hash, same text */
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, t, 4, &r), 1);
    assert_int_equal(id_of(&r[0]), 20);
    assert_int_equal(r[0].old_st, 80);
    free(r);
    assert_int_equal(lmc_blend_matcher_get_stats(m).live, 2);
    lmc_blend_matcher_free(m);
}

static void test_dedup_content_first_wins(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, true);
    uint64_t t[12];
    fill(t, 8, 0);
    memcpy(t + 8, t, 4 * sizeof *t); /* chunk 2 repeats chunk 0 in the same job */
    assert_int_equal(reg(m, &NS, t, 12, 10, 0, 0), 2);
    assert_int_equal(reg(m, &NS, t, 4, 30, 0, 100), 0); /* same text, other prefix */
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, t, 4, &r), 1);
    assert_int_equal(id_of(&r[0]), 10);
    assert_int_equal(r[0].old_st, 0);
    free(r);
    lmc_blend_matcher_free(m);
}

/* Two 4-token windows whose fingerprints share the 20 low bits (so one
 * table slot within a namespace) but differ. */
static void colliding_windows(uint64_t *a, uint64_t *b)
{
    uint32_t *first = calloc((size_t)1 << 20, sizeof *first);
    uint64_t (*w)[4] = malloc(sizeof(uint64_t[4]) * 200000);
    assert_non_null(first);
    assert_non_null(w);
    for (uint32_t i = 0; i < 200000; i++) {
        fill(w[i], 4, 0);
        uint64_t fp = lmc_blend_fingerprint(w[i], 4);
        uint32_t s = (uint32_t)(fp & ((1u << 20) - 1));
        if (first[s] && lmc_blend_fingerprint(w[first[s] - 1], 4) != fp) {
            memcpy(a, w[first[s] - 1], sizeof w[0]);
            memcpy(b, w[i], sizeof w[0]);
            free(first);
            free(w);
            return;
        }
        first[s] = i + 1;
    }
    fail_msg("no slot collision found");
}

static void test_slot_collision_newer_wins_older_undiscoverable(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t q[8];
    colliding_windows(q, q + 4);
    assert_int_equal(reg(m, &NS, q, 4, 1, 0, 0), 1);
    assert_int_equal(reg(m, &NS, q + 4, 4, 2, 0, 0), 1);
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, q, 8, &r), 1); /* only the newer one */
    assert_int_equal(id_of(&r[0]), 2);
    assert_int_equal(r[0].cur_st, 4);
    free(r);
    assert_int_equal(reg(m, &NS, q, 4, 1, 0, 0), 0); /* still registered by hash */
    lmc_blend_matcher_free(m);
}

static void test_slot_only_collision_is_not_a_match(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t a[4], b[4];
    colliding_windows(a, b);
    assert_int_equal(reg(m, &NS, a, 4, 1, 0, 0), 1);
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, b, 4, &r), 0);
    assert_null(r);
    lmc_blend_matcher_free(m);
}

static void test_dedup_content_ignores_slot_only_collision(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, true);
    uint64_t q[8];
    colliding_windows(q, q + 4);
    assert_int_equal(reg(m, &NS, q, 4, 1, 0, 0), 1);
    assert_int_equal(reg(m, &NS, q + 4, 4, 2, 0, 0), 1); /* other content: registered */
    lmc_blend_matcher_free(m);
}

/* ---- matching ---- */

static void test_nothing_matches_before_registration_or_below_a_chunk(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[8];
    fill(t, 8, 0);
    lmc_blend_candidate *r = (lmc_blend_candidate *)1;
    assert_int_equal(match(m, &NS, t, 8, &r), 0);
    assert_null(r);
    assert_int_equal(reg(m, &NS, t, 8, 1, 0, 0), 2);
    assert_int_equal(match(m, &NS, t, 3, &r), 0);
    lmc_blend_matcher_free(m);
}

static void test_chunk_reported_once_at_first_occurrence(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t d[4], q[20];
    fill(d, 4, 0);
    fill(q, 20, 100000); /* no token of d */
    memcpy(q + 3, d, sizeof d);
    memcpy(q + 13, d, sizeof d);
    assert_int_equal(reg(m, &NS, d, 4, 5, 0, 0), 1);
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, q, 20, &r), 1);
    assert_int_equal(r[0].cur_st, 3);
    free(r);
    lmc_blend_matcher_free(m);
}

static void test_overlapping_matches_all_reported_ascending(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[8];
    fill(t, 8, 0);
    assert_int_equal(reg(m, &NS, t, 8, 1, 0, 0), 2);  /* [0,4) and [4,8) */
    assert_int_equal(reg(m, &NS, t + 2, 4, 9, 0, 64), 1); /* [2,6) stored elsewhere */
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, t, 8, &r), 3);
    assert_int_equal(r[0].cur_st, 0);
    assert_int_equal(r[1].cur_st, 2);
    assert_int_equal(r[1].old_st, 64);
    assert_int_equal(id_of(&r[1]), 9);
    assert_int_equal(r[2].cur_st, 4);
    free(r);
    lmc_blend_matcher_free(m);
}

#define CS 16
#define DOC 128 /* 8 chunks */

/* Three documents stored as separate prompts (a 1-chunk preamble, then
 * the document; chunk 0 is not fingerprinted), then one query with them
 * in another order between other tokens: every chunk at its new offset. */
static void test_documents_found_at_new_offsets(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(CS, 1024, false);
    uint64_t docs[3][DOC], prompt[CS + DOC], q[1000];
    for (int d = 0; d < 3; d++) {
        fill(docs[d], DOC, 60000 * (uint64_t)(d + 1));
        fill(prompt, CS, 0);
        memcpy(prompt + CS, docs[d], sizeof docs[d]);
        assert_int_equal(reg(m, &NS, prompt, CS + DOC, 1000 * (d + 1), 1, 0), DOC / CS);
    }
    fill(q, 1000, 500000);
    const size_t at[3] = {517, 9, 300}; /* unaligned, other order */
    for (int d = 0; d < 3; d++)
        memcpy(q + at[d], docs[d], sizeof docs[d]);
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, q, 1000, &r), 3 * DOC / CS);
    for (size_t i = 0; i < 3 * DOC / CS; i++) {
        uint64_t id = id_of(&r[i]), d = id / 1000 - 1, c = id % 1000;
        assert_true(d < 3 && c >= 1 && c <= DOC / CS);
        assert_int_equal(r[i].cur_st, at[d] + (c - 1) * CS);
        assert_int_equal(r[i].old_st, c * CS);
        if (i)
            assert_true(r[i].cur_st > r[i - 1].cur_st);
    }
    free(r);
    lmc_blend_matcher_free(m);
}

static void test_namespaces_do_not_see_each_other(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[8];
    fill(t, 8, 0);
    const lmc_blend_ns other[] = {{"mistral", "", 1}, {"llama", "tenant-b", 1}, {"llama", NULL, 2},
                                  {"llam", "a", 1}};
    assert_int_equal(reg(m, &NS, t, 8, 1, 0, 0), 2);
    lmc_blend_candidate *r;
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(match(m, &other[i], t, 8, &r), 0);
        assert_false(lmc_blend_matcher_remove(m, &other[i], keys(1, 1)));
        assert_false(lmc_blend_matcher_stale(m, &other[i], keys(1, 1)));
        assert_false(lmc_blend_matcher_stale(m, &other[i], keys(1, 1)));
    }
    /* the same hashes register anew under another namespace */
    assert_int_equal(reg(m, &other[0], t, 8, 1, 0, 0), 2);
    expect_n(m, &NS, t, 8, 2);
    const lmc_blend_ns null_salt = {"llama", NULL, 1};
    expect_n(m, &null_salt, t, 8, 2);
    lmc_blend_matcher_free(m);
}

/* Namespaces share the table: one namespace's chunk can take the slot of
 * another's, and then the other's query must not get it even for the same
 * tokens.  4000 namespaces holding token 0 (chunk size 1) meet in a slot
 * several times over. */
static void test_other_namespace_in_the_same_slot_is_not_a_match(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(1, 4096, false);
    uint64_t zero = 0;
    char name[16];
    size_t lost = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t i = 0; i < 4000; i++) {
            snprintf(name, sizeof name, "m%llu", (unsigned long long)i);
            lmc_blend_ns ns = {name, "", 1};
            lmc_blend_candidate *r;
            if (pass == 0) {
                assert_int_equal(reg(m, &ns, &zero, 1, i, 0, 0), 1);
                continue;
            }
            size_t n = match(m, &ns, &zero, 1, &r);
            if (n == 0)
                lost++;
            else
                assert_int_equal(id_of(&r[0]), i);
            free(r);
        }
    assert_true(lost > 0);
    lmc_blend_matcher_free(m);
}

/* ---- removal and strikes ---- */

static void test_removed_chunk_no_longer_matched(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[8];
    fill(t, 8, 0);
    assert_int_equal(reg(m, &NS, t, 8, 1, 0, 0), 2);
    assert_true(lmc_blend_matcher_remove(m, &NS, keys(1, 1)));
    assert_false(lmc_blend_matcher_remove(m, &NS, keys(1, 1)));
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, t, 8, &r), 1);
    assert_int_equal(id_of(&r[0]), 2);
    free(r);
    assert_int_equal(lmc_blend_matcher_get_stats(m).live, 1);
    assert_int_equal(reg(m, &NS, t, 8, 1, 0, 0), 1); /* a re-store registers it again */
    lmc_blend_matcher_free(m);
}

static void test_remove_keeps_newer_slot_owner(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t q[8];
    colliding_windows(q, q + 4);
    assert_int_equal(reg(m, &NS, q, 4, 1, 0, 0), 1);
    assert_int_equal(reg(m, &NS, q + 4, 4, 2, 0, 0), 1);
    assert_true(lmc_blend_matcher_remove(m, &NS, keys(1, 1)));
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, q, 8, &r), 1);
    assert_int_equal(id_of(&r[0]), 2);
    free(r);
    lmc_blend_matcher_free(m);
}

static void test_second_stale_strike_removes(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[4];
    fill(t, 4, 0);
    assert_int_equal(reg(m, &NS, t, 4, 1, 0, 0), 1);
    assert_false(lmc_blend_matcher_stale(m, &NS, keys(1, 1)));
    lmc_blend_candidate *r;
    expect_n(m, &NS, t, 4, 1);
    assert_true(lmc_blend_matcher_stale(m, &NS, keys(1, 1)));
    assert_int_equal(match(m, &NS, t, 4, &r), 0);
    assert_int_equal(lmc_blend_matcher_get_stats(m).removed, 1);
    lmc_blend_matcher_free(m);
}

static void test_found_resets_strikes(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    uint64_t t[4];
    fill(t, 4, 0);
    assert_int_equal(reg(m, &NS, t, 4, 1, 0, 0), 1);
    assert_false(lmc_blend_matcher_stale(m, &NS, keys(1, 1)));
    lmc_blend_matcher_found(m, &NS, keys(1, 1));
    assert_false(lmc_blend_matcher_stale(m, &NS, keys(1, 1)));
    expect_n(m, &NS, t, 4, 1);
    lmc_blend_matcher_free(m);
}

/* ---- capacity, memory, arguments ---- */

static void test_job_past_capacity_registers_nothing_and_is_counted(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 5, false);
    uint64_t t[16], u[16];
    fill(t, 16, 0);
    fill(u, 16, 100000);
    assert_int_equal(reg(m, &NS, t, 16, 1, 0, 0), 4);
    size_t got = 9;
    assert_int_equal(lmc_blend_matcher_register(m, &NS, u, 8, keys(100, 2), 2, 0, 0, &got),
                     LMC_BLEND_EFULL);
    assert_int_equal(got, 0);
    lmc_blend_candidate *r;
    assert_int_equal(match(m, &NS, u, 8, &r), 0);
    lmc_blend_matcher_stats s = lmc_blend_matcher_get_stats(m);
    assert_int_equal(s.live, 4);
    assert_int_equal(s.refused, 2);
    assert_false(s.near_full); /* 80 % is not past 80 % */
    /* a removal makes room again: the bound is on live chunks */
    assert_true(lmc_blend_matcher_remove(m, &NS, keys(1, 1)));
    assert_int_equal(reg(m, &NS, u, 8, 100, 0, 0), 2);
    expect_n(m, &NS, u, 8, 2);
    assert_int_equal(lmc_blend_matcher_get_stats(m).live, 5);
    assert_true(lmc_blend_matcher_get_stats(m).near_full);
    lmc_blend_matcher_free(m);
}

/* The sanitizers' allocators do not feed mallinfo2: there only the
 * formula is checked. */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define MEASURE_HEAP 1
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}
#endif

static void test_bytes_per_chunk_is_entry_plus_bucket(void **state)
{
    (void)state;
    size_t fixed = lmc_blend_matcher_bytes(1) - LMC_BLEND_ENTRY_BYTES - 4;
    assert_true(fixed >= ((size_t)4 << 20));
    for (size_t n = 2; n <= LMC_BLEND_MAX_CHUNKS; n *= 2)
        assert_int_equal(lmc_blend_matcher_bytes(n) - fixed, n * (LMC_BLEND_ENTRY_BYTES + 4));
    assert_int_equal(lmc_blend_matcher_bytes(0), 0);
    assert_int_equal(lmc_blend_matcher_bytes(LMC_BLEND_MAX_CHUNKS + 1), 0);
#ifdef MEASURE_HEAP
    size_t before = heap_in_use();
    lmc_blend_matcher *m = mk(16, 100000, false);
    size_t used = heap_in_use() - before, want = lmc_blend_matcher_bytes(100000);
    assert_true(used >= want && used <= want + 64 * 1024);
    lmc_blend_matcher_free(m);
    assert_true(heap_in_use() <= before + 4096);
#endif
}

static void test_bad_arguments_refused_with_the_option_named(void **state)
{
    (void)state;
    lmc_blend_matcher *m = NULL;
    char err[128];
    lmc_blend_matcher_opts o = {.chunk_size = 0, .hash_len = HL, .max_chunks = 4};
    assert_int_equal(lmc_blend_matcher_new(&o, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "chunk_size"));
    o.chunk_size = 4;
    o.hash_len = 33;
    assert_int_equal(lmc_blend_matcher_new(&o, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "hash_len"));
    o.hash_len = HL;
    o.max_chunks = LMC_BLEND_MAX_CHUNKS + 1;
    assert_int_equal(lmc_blend_matcher_new(&o, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_chunks"));
    assert_null(m);
    m = mk(4, 8, false);
    uint64_t t[8] = {0};
    size_t got;
    const lmc_blend_ns nomodel = {NULL, "", 1};
    assert_int_equal(lmc_blend_matcher_register(m, &NS, t, 8, keys(0, 1), 1, 0, 0, &got),
                     LMC_BLEND_EINVAL); /* two chunks, one hash */
    assert_int_equal(lmc_blend_matcher_register(m, &NS, t, 8, keys(0, 2), 2, 0, UINT64_MAX - 7,
                                                &got),
                     LMC_BLEND_EINVAL); /* old_st + chunk_size past 2^64 */
    assert_int_equal(lmc_blend_matcher_register(m, &nomodel, t, 8, keys(0, 2), 2, 0, 0, &got),
                     LMC_BLEND_EINVAL);
    lmc_blend_candidate *r;
    assert_int_equal(lmc_blend_matcher_match(m, &NS, NULL, 8, &r, &got), LMC_BLEND_EINVAL);
    assert_int_equal(lmc_blend_matcher_get_stats(m).live, 0);
    assert_int_equal(lmc_blend_matcher_register(m, &NS, t, 8, keys(0, 2), 2, 0, UINT64_MAX - 8,
                                                &got),
                     LMC_BLEND_OK); /* the last chunk ends exactly at 2^64 - 1 */
    lmc_blend_matcher_free(m);
}

/* Registration (exclusive) and matching (shared) from several threads:
 * every match sees whole entries (run under TSan: LMC_SANITIZE=thread). */
struct thr {
    lmc_blend_matcher *m;
    int id;
};

static void *worker(void *arg)
{
    struct thr *a = arg;
    uint64_t t[64];
    uint8_t h[16 * HL]; /* keys() is not for threads: its buffer is shared */
    for (size_t i = 0; i < 64; i++)
        t[i] = (uint64_t)a->id * 1000003 + i * 7919;
    for (size_t c = 0; c < 16; c++)
        key(h + c * HL, (uint64_t)a->id << 32 | c);
    for (int round = 0; round < 200; round++) {
        size_t got, n;
        lmc_blend_candidate *r;
        if (lmc_blend_matcher_register(a->m, &NS, t, 64, h, 16, 0, 0, &got) != 0 ||
            lmc_blend_matcher_match(a->m, &NS, t, 64, &r, &n) != 0 || n != 16)
            return (void *)1;
        for (size_t i = 0; i < n; i++)
            if (r[i].cur_st != r[i].old_st || r[i].cur_st != 4 * i)
                return (void *)1;
        free(r);
        if (!lmc_blend_matcher_remove(a->m, &NS, h + (size_t)(round % 16) * HL))
            return (void *)1;
    }
    return NULL;
}

static void test_threads_register_and_match_concurrently(void **state)
{
    (void)state;
    lmc_blend_matcher *m = mk(4, 64, false);
    pthread_t th[4];
    struct thr a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct thr){m, i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        assert_null(rv);
    }
    lmc_blend_matcher_stats s = lmc_blend_matcher_get_stats(m);
    assert_int_equal(s.live, 60);
    assert_int_equal(s.removed, 800);
    lmc_blend_matcher_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fingerprint_matches_spec_vectors),
        cmocka_unit_test(test_rolling_equals_direct_per_window),
        cmocka_unit_test(test_register_skips_chunks_before_start_and_partial_tail),
        cmocka_unit_test(test_known_hash_registers_nothing_and_keeps_position),
        cmocka_unit_test(test_same_text_after_other_prefix_newest_wins),
        cmocka_unit_test(test_dedup_content_first_wins),
        cmocka_unit_test(test_slot_collision_newer_wins_older_undiscoverable),
        cmocka_unit_test(test_slot_only_collision_is_not_a_match),
        cmocka_unit_test(test_dedup_content_ignores_slot_only_collision),
        cmocka_unit_test(test_nothing_matches_before_registration_or_below_a_chunk),
        cmocka_unit_test(test_chunk_reported_once_at_first_occurrence),
        cmocka_unit_test(test_overlapping_matches_all_reported_ascending),
        cmocka_unit_test(test_documents_found_at_new_offsets),
        cmocka_unit_test(test_namespaces_do_not_see_each_other),
        cmocka_unit_test(test_other_namespace_in_the_same_slot_is_not_a_match),
        cmocka_unit_test(test_removed_chunk_no_longer_matched),
        cmocka_unit_test(test_remove_keeps_newer_slot_owner),
        cmocka_unit_test(test_second_stale_strike_removes),
        cmocka_unit_test(test_found_resets_strikes),
        cmocka_unit_test(test_job_past_capacity_registers_nothing_and_is_counted),
        cmocka_unit_test(test_bytes_per_chunk_is_entry_plus_bucket),
        cmocka_unit_test(test_bad_arguments_refused_with_the_option_named),
        cmocka_unit_test(test_threads_register_and_match_concurrently),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
