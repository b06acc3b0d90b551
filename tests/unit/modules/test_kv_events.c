/* The KV event log (docs/kv_events.md): seqs, the cursor rules with their
 * loss cases, paging, per-model filtering, collapsing of ranks and groups,
 * token bindings and their bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "modules/kv_events.h"

#define CS 4

static lmc_object_key key_of(uint8_t h, const char *model, uint32_t rank, uint32_t group)
{
    lmc_object_key k = {.chunk_hash_len = 32, .kv_rank = rank, .object_group_id = group,
                        .model_name = model, .cache_salt = ""};
    memset(k.chunk_hash, h, 32);
    return k;
}

/* Binds chunk hash h (32 bytes of h) to tokens h*10.. with parent p (0: none). */
static void bind1(lmc_kv_events *ev, uint8_t h, uint8_t p)
{
    uint8_t hash[32], parent[32];
    uint64_t toks[CS];
    memset(hash, h, 32);
    memset(parent, p, 32);
    for (size_t i = 0; i < CS; i++)
        toks[i] = (uint64_t)h * 10 + i;
    lmc_kv_events_bind(ev, hash, 1, 32, toks, CS, p ? parent : NULL, 0);
}

/* One stored record of chunk h for model m (bound first). */
static void store1(lmc_kv_events *ev, uint8_t h, const char *m)
{
    bind1(ev, h, 0);
    lmc_object_key k = key_of(h, m, 0, 0);
    lmc_kv_events_stored(ev, LMC_KV_MEDIUM_CPU, &k, 1);
}

static lmc_kv_events_page read_m(lmc_kv_events *ev, const char *m, uint64_t cursor, size_t max)
{
    lmc_kv_events_page p;
    assert_int_equal(lmc_kv_events_read(ev, m, strlen(m), cursor, max, &p), 0);
    return p;
}

static void assert_seqs(const lmc_kv_events_page *p, const uint64_t *seqs, size_t n)
{
    assert_int_equal(p->n, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(p->entries[i].seq, seqs[i]);
}

/* Capacity 3 holding seqs 1..5: a cursor before the oldest is lost. */
static void test_cursor_before_the_oldest_is_lost(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(3, 16, 7);
    for (uint8_t h = 1; h <= 5; h++)
        store1(ev, h, "m");
    lmc_kv_events_page p = read_m(ev, "m", 0, 10);
    assert_seqs(&p, (uint64_t[]){3, 4, 5}, 3);
    assert_int_equal(p.next_cursor, 5);
    assert_true(p.lost);
    lmc_kv_events_page_free(&p);
    p = read_m(ev, "m", 2, 10);
    assert_seqs(&p, (uint64_t[]){3, 4, 5}, 3);
    assert_false(p.lost);
    lmc_kv_events_page_free(&p);
    p = read_m(ev, "m", 5, 10);
    assert_int_equal(p.n, 0);
    assert_int_equal(p.next_cursor, 5);
    assert_false(p.lost);
    lmc_kv_events_page_free(&p);
    assert_int_equal(lmc_kv_events_incarnation(ev), 7);
    lmc_kv_events_free(ev);
}

/* A cursor never issued: past the last seq, on an empty log or not. */
static void test_cursor_never_issued_is_lost(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(8, 16, 1);
    lmc_kv_events_page p = read_m(ev, "m", 5, 10);
    assert_int_equal(p.n, 0);
    assert_int_equal(p.next_cursor, 0);
    assert_true(p.lost);
    lmc_kv_events_page_free(&p);
    p = read_m(ev, "m", 0, 10);
    assert_int_equal(p.next_cursor, 0);
    assert_false(p.lost);
    lmc_kv_events_page_free(&p);
    store1(ev, 1, "m");
    store1(ev, 2, "m");
    p = read_m(ev, "m", 9, 10);
    assert_int_equal(p.n, 0);
    assert_int_equal(p.next_cursor, 2);
    assert_true(p.lost);
    lmc_kv_events_page_free(&p);
    lmc_kv_events_free(ev);
}

/* rec1, marker(2), rec3: across the marker only what follows it comes. */
static void test_loss_marker(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(8, 16, 1);
    store1(ev, 1, "m");
    lmc_kv_events_mark_lost(ev);
    store1(ev, 3, "m");
    lmc_kv_events_page p = read_m(ev, "m", 0, 10);
    assert_seqs(&p, (uint64_t[]){3}, 1);
    assert_int_equal(p.next_cursor, 3);
    assert_true(p.lost);
    lmc_kv_events_page_free(&p);
    p = read_m(ev, "m", 3, 10);
    assert_int_equal(p.n, 0);
    assert_int_equal(p.next_cursor, 3);
    assert_false(p.lost);
    lmc_kv_events_page_free(&p);
    lmc_kv_events_stats s;
    lmc_kv_events_get_stats(ev, &s);
    assert_int_equal(s.lost_markers, 1);
    assert_int_equal(s.log_depth, 3);
    assert_int_equal(s.next_seq, 4);
    lmc_kv_events_free(ev);
}

/* max_events pages; another model's records move the cursor only. */
static void test_paging_and_models(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(16, 16, 1);
    store1(ev, 1, "a");
    store1(ev, 2, "b");
    store1(ev, 3, "a");
    store1(ev, 4, "a");
    store1(ev, 5, "b");
    lmc_kv_events_page p = read_m(ev, "a", 0, 2);
    assert_seqs(&p, (uint64_t[]){1, 3}, 2);
    assert_int_equal(p.next_cursor, 3);
    assert_false(p.lost);
    lmc_kv_events_page_free(&p);
    p = read_m(ev, "a", 3, 2);
    assert_seqs(&p, (uint64_t[]){4}, 1);
    assert_int_equal(p.next_cursor, 5);
    lmc_kv_events_page_free(&p);
    p = read_m(ev, "c", 0, 2);
    assert_int_equal(p.n, 0);
    assert_int_equal(p.next_cursor, 5);
    lmc_kv_events_page_free(&p);
    /* the empty name is a model of its own */
    p = read_m(ev, "", 0, 8);
    assert_int_equal(p.n, 0);
    lmc_kv_events_page_free(&p);
    lmc_kv_events_free(ev);
}

static void test_max_events_is_capped(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(LMC_KV_EVENTS_MAX_POLL + 10, 4, 1);
    lmc_object_key k = key_of(9, "m", 0, 0);
    for (size_t i = 0; i < LMC_KV_EVENTS_MAX_POLL + 10; i++)
        lmc_kv_events_removed(ev, LMC_KV_MEDIUM_CPU, &k, 1);
    lmc_kv_events_page p = read_m(ev, "m", 0, (size_t)1 << 40);
    assert_int_equal(p.n, LMC_KV_EVENTS_MAX_POLL);
    assert_int_equal(p.next_cursor, LMC_KV_EVENTS_MAX_POLL);
    lmc_kv_events_page_free(&p);
    lmc_kv_events_free(ev);
}

/* Ranks and groups of a chunk collapse into one stored record carrying
 * its tokens and parent, in the order the chunks came. */
static void test_stored_collapses_and_carries_tokens(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(16, 16, 1);
    uint8_t hashes[3 * 32];
    uint64_t toks[3 * CS];
    for (int c = 0; c < 3; c++)
        memset(hashes + c * 32, 0x30 - c, 32);   /* descending, so sorting would show */
    for (size_t i = 0; i < 3 * CS; i++)
        toks[i] = 1000 + i;
    uint8_t parent[32];
    memset(parent, 0x77, 32);
    lmc_kv_events_bind(ev, hashes, 3, 32, toks, CS, parent, 2 * CS);
    lmc_object_key keys[6];
    for (int c = 0; c < 3; c++)
        for (int g = 0; g < 2; g++)
            keys[c * 2 + g] = key_of((uint8_t)(0x30 - c), "m", 0, (uint32_t)g);
    lmc_kv_events_stored(ev, LMC_KV_MEDIUM_STORAGE, keys, 6);
    lmc_kv_events_page p = read_m(ev, "m", 0, 10);
    assert_int_equal(p.n, 3);
    for (int c = 0; c < 3; c++) {
        const lmc_kv_event *e = p.entries[c].event;
        assert_int_equal(e->kind, LMC_KV_EVENT_STORED);
        assert_int_equal(e->medium, LMC_KV_MEDIUM_STORAGE);
        assert_int_equal(e->n_hashes, 1);
        assert_memory_equal(e->hashes, hashes + c * 32, 32);
        assert_true(e->has_parent);
        assert_memory_equal(e->parent, c ? hashes + (c - 1) * 32 : parent, 32);
        assert_int_equal(e->n_tokens, CS);
        for (int i = 0; i < CS; i++)
            assert_int_equal(e->tokens[i], 1000 + c * CS + i);
    }
    lmc_kv_events_page_free(&p);
    /* What the fleet's cache-event stream reports of a stored chunk. */
    uint32_t got[CS];
    uint64_t pos = 0;
    assert_int_equal(lmc_kv_events_tokens_of(ev, hashes + 32, 32, got, CS, &pos), CS);
    assert_int_equal(pos, 3 * CS);
    assert_int_equal(got[0], 1000 + CS);
    assert_int_equal(lmc_kv_events_tokens_of(ev, hashes + 32, 32, got, CS - 1, &pos), 0);
    uint8_t unknown[32] = {1};
    assert_int_equal(lmc_kv_events_tokens_of(ev, unknown, 32, got, CS, &pos), 0);
    lmc_kv_events_free(ev);
}

/* A store of unknown tokens is counted and not logged. */
static void test_unbound_store_is_skipped(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(16, 16, 1);
    lmc_object_key k[2] = {key_of(1, "m", 0, 0), key_of(1, "m", 1, 0)};
    lmc_kv_events_stored(ev, LMC_KV_MEDIUM_CPU, k, 2);
    lmc_kv_events_stats s;
    lmc_kv_events_get_stats(ev, &s);
    assert_int_equal(s.unbound_stores, 1);
    assert_int_equal(s.next_seq, 1);
    assert_int_equal(s.log_depth, 0);
    lmc_kv_events_free(ev);
}

/* Bindings are bounded: the least recently bound is forgotten first. */
static void test_bindings_are_bounded(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(16, 2, 1);
    bind1(ev, 1, 0);
    bind1(ev, 2, 0);
    bind1(ev, 1, 0);   /* 1 is the most recent again */
    bind1(ev, 3, 0);   /* 2 goes */
    lmc_object_key k[3] = {key_of(1, "m", 0, 0), key_of(2, "m", 0, 0), key_of(3, "m", 0, 0)};
    lmc_kv_events_stored(ev, LMC_KV_MEDIUM_CPU, k, 3);
    lmc_kv_events_stats s;
    lmc_kv_events_get_stats(ev, &s);
    assert_int_equal(s.bindings, 2);
    assert_int_equal(s.unbound_stores, 1);
    lmc_kv_events_page p = read_m(ev, "m", 0, 10);
    assert_int_equal(p.n, 2);
    assert_int_equal(p.entries[0].event->hashes[0], 1);
    assert_int_equal(p.entries[1].event->hashes[0], 3);
    lmc_kv_events_page_free(&p);
    lmc_kv_events_free(ev);
}

/* One removed record per model with its distinct hashes; no tokens. */
static void test_removed_groups_by_model(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(16, 2, 1);
    lmc_object_key k[5] = {key_of(1, "a", 0, 0), key_of(2, "b", 0, 0), key_of(1, "a", 1, 0),
                           key_of(3, "a", 0, 1), key_of(2, "b", 0, 1)};
    lmc_kv_events_removed(ev, LMC_KV_MEDIUM_CPU, k, 5);
    lmc_kv_events_page p = read_m(ev, "a", 0, 10);
    assert_int_equal(p.n, 1);
    const lmc_kv_event *e = p.entries[0].event;
    assert_int_equal(e->kind, LMC_KV_EVENT_REMOVED);
    assert_int_equal(e->n_hashes, 2);
    assert_int_equal(e->n_tokens, 0);
    assert_false(e->has_parent);
    lmc_kv_events_page_free(&p);
    p = read_m(ev, "b", 0, 10);
    assert_int_equal(p.n, 1);
    assert_int_equal(p.entries[0].event->n_hashes, 1);
    lmc_kv_events_page_free(&p);
    lmc_kv_events_free(ev);
}

/* A page keeps its records, and they their tokens, after the ring moved
 * past them and the bindings forgot their chunks. */
static void test_page_outlives_the_ring(void **st)
{
    (void)st;
    lmc_kv_events *ev = lmc_kv_events_new(1, 1, 1);
    store1(ev, 1, "m");
    lmc_kv_events_page p = read_m(ev, "m", 0, 10);
    store1(ev, 2, "m");
    store1(ev, 3, "m");
    assert_int_equal(p.n, 1);
    assert_int_equal(p.entries[0].event->tokens[0], 10);
    lmc_kv_events_page_free(&p);
    lmc_kv_events_free(ev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cursor_before_the_oldest_is_lost),
        cmocka_unit_test(test_cursor_never_issued_is_lost),
        cmocka_unit_test(test_loss_marker),
        cmocka_unit_test(test_paging_and_models),
        cmocka_unit_test(test_max_events_is_capped),
        cmocka_unit_test(test_stored_collapses_and_carries_tokens),
        cmocka_unit_test(test_unbound_store_is_skipped),
        cmocka_unit_test(test_bindings_are_bounded),
        cmocka_unit_test(test_removed_groups_by_model),
        cmocka_unit_test(test_page_outlives_the_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
