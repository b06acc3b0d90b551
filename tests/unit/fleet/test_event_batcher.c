/* The cache-event batcher (docs/fleet.md, "Cache-event stream") driven
 * without any network: coalescing, seq, config batches first, the bounded
 * ring and what a failed post leaves behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fleet/event_batcher.h"
#include "storage/object_key_json.h"

static lmc_object_key key_n(uint8_t n)
{
    lmc_object_key k = {.chunk_hash_len = 32, .kv_rank = 0x02010201u, .object_group_id = 0,
                        .model_name = "m", .cache_salt = ""};
    memset(k.chunk_hash, n, sizeof k.chunk_hash);
    return k;
}

static void keys_from(lmc_object_key *out, uint8_t first, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = key_n((uint8_t)(first + i));
}

static json_t *batches(json_t *body) { return json_object_get(body, "batches"); }

static const char *str_of(const json_t *batch, const char *field)
{
    return json_string_value(json_object_get(batch, field));
}

static json_int_t int_of(const json_t *batch, const char *field)
{
    return json_integer_value(json_object_get(batch, field));
}

/* The first byte of each entry's chunk hash, from its hex. */
static unsigned first_byte(const json_t *entry)
{
    const char *hex = json_string_value(json_object_get(json_object_get(entry, "key"),
                                                        "chunk_hash_hex"));
    unsigned v = 0;
    assert_non_null(hex);
    assert_int_equal(sscanf(hex, "%2x", &v), 1);
    return v;
}

static void test_coalesces_consecutive_runs(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 1700000000, 64);
    lmc_object_key k[8];
    keys_from(k, 1, 8);
    uint64_t sizes[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k, sizes, 0, 2);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k + 2, sizes + 2, 0, 1);
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L1, "dram", false, k + 3, NULL, 0, 1);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k + 4, sizes + 4, 0, 2);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L2, "fs", true, k + 6, sizes + 6, 0, 1);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L2, "fs", false, k + 7, sizes + 7, 0, 1);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 12.5, NULL, NULL, &t);
    assert_non_null(body);
    json_t *list = batches(body);
    assert_int_equal(json_array_size(list), 5);
    const char *types[] = {"store", "delete", "store", "store", "store"};
    const char *tiers[] = {"l1", "l1", "l1", "l2", "l2"};
    const size_t counts[] = {3, 1, 2, 1, 1};
    for (size_t i = 0; i < 5; i++) {
        json_t *x = json_array_get(list, i);
        assert_string_equal(str_of(x, "event_type"), types[i]);
        assert_string_equal(str_of(x, "tier"), tiers[i]);
        assert_int_equal(int_of(x, "seq"), (json_int_t)i + 1);
        assert_int_equal(int_of(x, "incarnation"), 1700000000);
        assert_string_equal(str_of(x, "instance_id"), "mp-1");
        assert_int_equal(json_array_size(json_object_get(x, "entries")), counts[i]);
        assert_true(json_real_value(json_object_get(x, "ts")) == 12.5);
    }
    assert_true(json_is_true(json_object_get(json_array_get(list, 3), "shared")));
    assert_true(json_is_false(json_object_get(json_array_get(list, 4), "shared")));
    json_t *e = json_array_get(json_object_get(json_array_get(list, 0), "entries"), 2);
    assert_int_equal(first_byte(e), 3);
    assert_int_equal(int_of(e, "size_bytes"), 12);
    assert_int_equal(int_of(e, "token_offset"), -1);
    assert_int_equal(json_array_size(json_object_get(e, "token_ids")), 0);
    json_t *del = json_array_get(json_object_get(json_array_get(list, 1), "entries"), 0);
    assert_int_equal(int_of(del, "size_bytes"), 0);
    assert_int_equal(t.placement_batches, 5);
    assert_int_equal(t.placement_entries, 8);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(b);
    assert_int_equal(st.seq, 5);
    assert_int_equal(st.batches_sent, 5);
    assert_int_equal(st.entries_sent, 8);
    assert_int_equal(st.queued, 0);
    json_decref(body);
    /* Nothing queued: no post, and no seq is spent. */
    assert_null(lmc_fleet_event_batcher_take(b, 13, NULL, NULL, &t));
    assert_int_equal(lmc_fleet_event_batcher_stats(b).seq, 5);
    lmc_fleet_event_batcher_free(b);
}

/* Queued entries outlive the listener's call: a key naming a caller's
 * buffer (a DELETE /cache/objects body) is copied, an interned one holds
 * its names so the interner cannot evict them before the post. */
static void test_queued_keys_keep_their_names(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("i", 1, 8);
    char model[8] = "mm", salt[8] = "ss";
    lmc_object_key body_key = key_n(1);
    body_key.model_name = model;
    body_key.cache_salt = salt;
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L2, "fs", true, &body_key, NULL, 0, 1);
    strcpy(model, "XX");   /* the request's body is gone */
    strcpy(salt, "YY");
    lmc_key_interner *in = lmc_key_interner_new_bounded(2);
    lmc_object_key held = key_n(2);
    lmc_object_key_set_strings(&held, lmc_intern(in, "im", 2), lmc_intern(in, "is", 2));
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L2, "fs", true, &held, NULL, 0, 1);
    lmc_keys_drop(&held, 1);                   /* the caller's copy goes */
    assert_null(lmc_intern(in, "new", 3));     /* both names still in use: the queue's */
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1.0, NULL, NULL, &t);
    json_t *entries = json_object_get(json_array_get(batches(body), 0), "entries");
    assert_int_equal(json_array_size(entries), 2);
    json_t *k0 = json_object_get(json_array_get(entries, 0), "key");
    json_t *k1 = json_object_get(json_array_get(entries, 1), "key");
    assert_string_equal(str_of(k0, "model_name"), "mm");
    assert_string_equal(str_of(k0, "cache_salt"), "ss");
    assert_string_equal(str_of(k1, "model_name"), "im");
    assert_string_equal(str_of(k1, "cache_salt"), "is");
    json_decref(body);
    const char *fresh = lmc_intern(in, "new", 3);   /* taken: the names are free to go */
    assert_non_null(fresh);
    lmc_intern_release(fresh);
    lmc_key_interner_free(in);
    lmc_fleet_event_batcher_free(b);
}

static void test_encoded_key(void **state)
{
    (void)state;
    lmc_object_key k = key_n(0xab);
    k.object_group_id = 3;
    k.cache_salt = "tenant";
    json_t *j = lmc_object_key_json(&k);
    char want[65];
    for (int i = 0; i < 32; i++)
        memcpy(want + 2 * i, "ab", 2);
    want[64] = '\0';
    assert_string_equal(str_of(j, "chunk_hash_hex"), want);
    assert_string_equal(str_of(j, "model_name"), "m");
    assert_int_equal(int_of(j, "kv_rank"), 0x02010201);
    assert_int_equal(int_of(j, "object_group_id"), 3);
    assert_string_equal(str_of(j, "cache_salt"), "tenant");
    assert_int_equal(json_object_size(j), 5);
    json_decref(j);
}

static const lmc_fleet_event_compartment decl[2] = {
    {.tier = LMC_CEV_L1, .backend = "dram", .shared = false, .capacity_bytes = 1u << 30},
    {.tier = LMC_CEV_L2, .backend = "s3", .shared = true, .capacity_bytes = 0},
};

static void assert_config(const json_t *x, json_int_t seq, const char *tier, const char *backend,
                          json_int_t capacity, json_int_t revision)
{
    assert_string_equal(str_of(x, "event_type"), "config");
    assert_int_equal(int_of(x, "seq"), seq);
    assert_string_equal(str_of(x, "tier"), tier);
    assert_string_equal(str_of(x, "backend"), backend);
    assert_int_equal(int_of(x, "capacity_bytes"), capacity);
    assert_int_equal(int_of(x, "capacity_revision"), revision);
    assert_int_equal(json_array_size(json_object_get(x, "entries")), 0);
}

static void test_config_batches_first_and_after_redeclare(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 5, 64);
    lmc_object_key k = key_n(7);
    lmc_fleet_event_batcher_add(b, LMC_CEV_ACCESS, LMC_CEV_L1, "", false, &k, NULL, 0, 1);
    assert_int_equal(lmc_fleet_event_batcher_declare(b, decl, 2), 0);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1, NULL, NULL, &t);
    json_t *list = batches(body);
    assert_int_equal(json_array_size(list), 3);
    assert_config(json_array_get(list, 0), 1, "l1", "dram", 1 << 30, 1);
    assert_config(json_array_get(list, 1), 2, "l2", "s3", 0, 1);
    assert_true(json_is_true(json_object_get(json_array_get(list, 1), "shared")));
    assert_string_equal(str_of(json_array_get(list, 2), "event_type"), "access");
    assert_string_equal(str_of(json_array_get(list, 2), "backend"), "");
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    assert_false(lmc_fleet_event_batcher_stats(b).capacity_pending);

    /* Delivered: not sent again ... */
    assert_null(lmc_fleet_event_batcher_take(b, 2, NULL, NULL, &t));
    /* ... until a (re-)registration asks for it, with the same revision. */
    lmc_fleet_event_batcher_redeclare(b);
    body = lmc_fleet_event_batcher_take(b, 3, NULL, NULL, &t);
    assert_int_equal(json_array_size(batches(body)), 2);
    assert_config(json_array_get(batches(body), 0), 4, "l1", "dram", 1 << 30, 1);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);

    /* A new declaration gets a new revision. */
    assert_int_equal(lmc_fleet_event_batcher_declare(b, decl, 1), 0);
    body = lmc_fleet_event_batcher_take(b, 4, NULL, NULL, &t);
    assert_int_equal(json_array_size(batches(body)), 1);
    assert_config(json_array_get(batches(body), 0), 6, "l1", "dram", 1 << 30, 2);
    /* A re-registration while that post is in flight: still pending after it. */
    lmc_fleet_event_batcher_redeclare(b);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    assert_true(lmc_fleet_event_batcher_stats(b).capacity_pending);
    lmc_fleet_event_batcher_free(b);
}

static void test_failed_post_leaves_a_gap_and_keeps_the_declaration(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 5, 64);
    lmc_object_key k[4];
    keys_from(k, 1, 4);
    assert_int_equal(lmc_fleet_event_batcher_declare(b, decl, 1), 0);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k, NULL, 5, 3);
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L1, "dram", false, k, NULL, 0, 1);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1, NULL, NULL, &t);
    assert_int_equal(json_array_size(batches(body)), 3);   /* config, store, delete */
    json_decref(body);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_REFUSED);
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(b);
    assert_int_equal(st.batches_dropped, 2);
    assert_int_equal(st.entries_dropped, 4);
    assert_int_equal(st.batches_sent, 0);
    assert_int_equal(st.posts_failed, 1);
    assert_true(st.capacity_pending);

    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k + 3, NULL, 5, 1);
    body = lmc_fleet_event_batcher_take(b, 2, NULL, NULL, &t);
    json_t *list = batches(body);
    assert_int_equal(json_array_size(list), 2);
    /* The declaration again, and seqs after the lost ones (1..3): a gap. */
    assert_config(json_array_get(list, 0), 4, "l1", "dram", 1 << 30, 1);
    assert_int_equal(int_of(json_array_get(list, 1), "seq"), 5);
    json_t *entries = json_object_get(json_array_get(list, 1), "entries");
    assert_int_equal(json_array_size(entries), 1);
    assert_int_equal(first_byte(json_array_get(entries, 0)), 4);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    st = lmc_fleet_event_batcher_stats(b);
    assert_int_equal(st.batches_sent, 2);
    assert_false(st.capacity_pending);
    lmc_fleet_event_batcher_free(b);
}

static void test_full_ring_drops_the_oldest(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 5, 4);
    lmc_object_key k[6];
    keys_from(k, 1, 6);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k, NULL, 1, 3);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k + 3, NULL, 1, 3);
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(b);
    assert_int_equal(st.queued, 4);
    assert_int_equal(st.entries_overflowed, 2);
    assert_int_equal(st.entries_dropped, 2);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1, NULL, NULL, &t);
    json_t *entries = json_object_get(json_array_get(batches(body), 0), "entries");
    assert_int_equal(json_array_size(entries), 4);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(first_byte(json_array_get(entries, i)), 3 + i);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    /* The ring is usable again after wrapping around. */
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L1, "dram", false, k, NULL, 0, 2);
    assert_int_equal(lmc_fleet_event_batcher_stats(b).queued, 2);
    lmc_fleet_event_batcher_free(b);
}

static void resolve_by_first_byte(void *user, const lmc_object_key *keys, size_t n,
                                  uint64_t *sizes)
{
    size_t *calls = user;
    ++*calls;
    for (size_t i = 0; i < n; i++)
        sizes[i] = keys[i].chunk_hash[0] == 2 ? 0 : 1000u + keys[i].chunk_hash[0];
}

static void test_unknown_sizes_resolved_at_take(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 5, 600);
    lmc_object_key k[300];
    for (size_t i = 0; i < 300; i++)
        k[i] = key_n((uint8_t)(i % 200 + 1));
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k, NULL,
                        LMC_CEV_SIZE_UNKNOWN, 300);
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L1, "dram", false, k, NULL, 0, 1);
    size_t calls = 0;
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1, resolve_by_first_byte, &calls, &t);
    assert_int_equal(calls, 2);   /* in chunks, off the request path */
    json_t *entries = json_object_get(json_array_get(batches(body), 0), "entries");
    assert_int_equal(json_array_size(entries), 300);
    assert_int_equal(int_of(json_array_get(entries, 0), "size_bytes"), 1001);
    assert_int_equal(int_of(json_array_get(entries, 1), "size_bytes"), 0);   /* gone meanwhile */
    assert_int_equal(int_of(json_array_get(entries, 299), "size_bytes"), 1000 + 100);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    /* Without a resolver an unknown size reads 0. */
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k, NULL,
                        LMC_CEV_SIZE_UNKNOWN, 1);
    body = lmc_fleet_event_batcher_take(b, 1, NULL, NULL, &t);
    entries = json_object_get(json_array_get(batches(body), 0), "entries");
    assert_int_equal(int_of(json_array_get(entries, 0), "size_bytes"), 0);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    lmc_fleet_event_batcher_free(b);
}

/* Issue 29: a post that got no answer or a 5xx (the coordinator's 503 "not
 * saved") is held and sent again, unchanged, so that the coordinator
 * applies it once; what queued meanwhile follows it with the next seqs. */
static void test_failed_post_is_sent_again_unchanged(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 5, 64);
    lmc_object_key k[4];
    keys_from(k, 1, 4);
    assert_int_equal(lmc_fleet_event_batcher_declare(b, decl, 1), 0);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L1, "dram", false, k, NULL, 5, 2);
    lmc_fleet_event_take t;
    json_t *first = lmc_fleet_event_batcher_take(b, 1, NULL, NULL, &t);
    assert_int_equal(json_array_size(batches(first)), 2);   /* config, store */
    assert_false(t.retried);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_RETRY);
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(b);
    assert_true(st.retry_pending);
    assert_int_equal(st.batches_dropped, 0);
    assert_int_equal(st.entries_dropped, 0);
    assert_int_equal(st.posts_failed, 1);

    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L1, "dram", false, k + 2, NULL, 0, 2);
    for (int attempt = 0; attempt < 2; attempt++) {
        json_t *again = lmc_fleet_event_batcher_take(b, 2 + attempt, NULL, NULL, &t);
        assert_true(json_equal(again, first));   /* same seqs, same ts */
        assert_true(t.retried);
        assert_int_equal(t.placement_entries, 2);
        lmc_fleet_event_batcher_settle(b, &t, attempt == 0 ? LMC_CEV_RETRY : LMC_CEV_DELIVERED);
        json_decref(again);
    }
    st = lmc_fleet_event_batcher_stats(b);
    assert_false(st.retry_pending);
    assert_false(st.capacity_pending);
    assert_int_equal(st.posts_retried, 2);
    assert_int_equal(st.batches_sent, 2);
    assert_int_equal(st.entries_sent, 2);
    assert_int_equal(st.batches_dropped, 0);
    json_decref(first);

    /* Then what queued meanwhile, after the held seqs (1, 2): no gap. */
    json_t *next = lmc_fleet_event_batcher_take(b, 5, NULL, NULL, &t);
    assert_false(t.retried);
    assert_int_equal(json_array_size(batches(next)), 1);
    assert_string_equal(str_of(json_array_get(batches(next), 0), "event_type"), "delete");
    assert_int_equal(int_of(json_array_get(batches(next), 0), "seq"), 3);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(next);
    lmc_fleet_event_batcher_free(b);
}

/* A held post is not sent for ever: past the retry window it is dropped
 * (a gap the coordinator sees) and its declaration goes with the next. */
static void test_held_post_dropped_after_the_retry_window(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 5, 64);
    lmc_fleet_event_batcher_set_retry_window(b, 10);
    lmc_object_key k[2];
    keys_from(k, 1, 2);
    assert_int_equal(lmc_fleet_event_batcher_declare(b, decl, 1), 0);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L2, "fs", true, k, NULL, 5, 2);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 100, NULL, NULL, &t);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_RETRY);
    json_decref(body);
    body = lmc_fleet_event_batcher_take(b, 109, NULL, NULL, &t);     /* within the window */
    assert_true(t.retried);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_RETRY);
    json_decref(body);
    body = lmc_fleet_event_batcher_take(b, 111, NULL, NULL, &t);     /* past it: dropped */
    assert_false(t.retried);
    assert_int_equal(json_array_size(batches(body)), 1);
    assert_config(json_array_get(batches(body), 0), 3, "l1", "dram", 1 << 30, 1);
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(b);
    assert_int_equal(st.batches_dropped, 1);
    assert_int_equal(st.entries_dropped, 2);
    assert_false(st.retry_pending);
    /* A refused post (4xx) is dropped at once, never held: the next take
     * is a fresh one (its declaration again, with a new seq). */
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_REFUSED);
    json_decref(body);
    assert_false(lmc_fleet_event_batcher_stats(b).retry_pending);
    body = lmc_fleet_event_batcher_take(b, 112, NULL, NULL, &t);
    assert_false(t.retried);
    assert_config(json_array_get(batches(body), 0), 4, "l1", "dram", 1 << 30, 1);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    lmc_fleet_event_batcher_free(b);
}

/* Issue 29: an entry jansson cannot encode (a model name that is not
 * UTF-8) is left out of its batch, counted, and the other tenants' events
 * still go in the same post. */
static void test_unencodable_entry_costs_only_itself(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 5, 64);
    lmc_object_key k[5];
    keys_from(k, 1, 5);
    k[1].model_name = "bad\xff\xfe";   /* tenant b's model, not UTF-8 */
    k[3].cache_salt = "\xc3";           /* a cut sequence */
    k[4].model_name = "bad\xff\xfe";
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L2, "fs", true, k, NULL, 7, 3);
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L2, "fs", true, k + 3, NULL, 0, 2);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1, NULL, NULL, &t);
    assert_non_null(body);
    json_t *list = batches(body);
    assert_int_equal(json_array_size(list), 2);   /* the delete batch stays: its seq is spent */
    json_t *stored = json_object_get(json_array_get(list, 0), "entries");
    assert_int_equal(json_array_size(stored), 2);
    assert_int_equal(first_byte(json_array_get(stored, 0)), 1);
    assert_int_equal(first_byte(json_array_get(stored, 1)), 3);
    assert_int_equal(json_array_size(json_object_get(json_array_get(list, 1), "entries")), 0);
    assert_int_equal(t.placement_entries, 2);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    json_decref(body);
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(b);
    assert_int_equal(st.entries_unencodable, 3);
    assert_int_equal(st.entries_dropped, 3);
    assert_int_equal(st.entries_sent, 2);
    assert_int_equal(st.batches_sent, 2);
    lmc_fleet_event_batcher_free(b);
}

/* Stores carry the tokens and position of a chunk the source knows all
 * chunk_size tokens of; a chunk it does not know, and every delete, go
 * with [] and -1 (docs/fleet.md, "Cache-event stream"). */
static size_t tokens_of_odd(void *user, const lmc_object_key *key, uint32_t *tokens, size_t cap,
                            uint64_t *position)
{
    size_t *calls = user;
    ++*calls;
    if (key->chunk_hash[0] % 2 == 0)
        return 0;
    for (size_t i = 0; i < cap; i++)
        tokens[i] = (uint32_t)(100 * key->chunk_hash[0] + i);
    *position = 4u * key->chunk_hash[0];
    return cap;
}

static void test_store_entries_carry_known_tokens(void **state)
{
    (void)state;
    lmc_fleet_event_batcher *b = lmc_fleet_event_batcher_new("mp-1", 1, 64);
    size_t calls = 0;
    lmc_fleet_event_batcher_set_tokens(b, tokens_of_odd, &calls, 4);
    lmc_object_key k[2];
    keys_from(k, 1, 2);
    lmc_fleet_event_batcher_add(b, LMC_CEV_STORE, LMC_CEV_L2, "fs", true, k, NULL, 5, 2);
    lmc_fleet_event_batcher_add(b, LMC_CEV_DELETE, LMC_CEV_L2, "fs", true, k, NULL, 0, 1);
    lmc_fleet_event_take t;
    json_t *body = lmc_fleet_event_batcher_take(b, 1.0, NULL, NULL, &t);
    assert_non_null(body);
    json_t *stores = json_object_get(json_array_get(batches(body), 0), "entries");
    json_t *known = json_array_get(stores, 0), *unknown = json_array_get(stores, 1);
    json_t *ids = json_object_get(known, "token_ids");
    assert_int_equal(json_array_size(ids), 4);
    assert_int_equal(json_integer_value(json_array_get(ids, 3)), 103);
    assert_int_equal(int_of(known, "token_offset"), 4);
    assert_int_equal(json_array_size(json_object_get(unknown, "token_ids")), 0);
    assert_int_equal(int_of(unknown, "token_offset"), -1);
    json_t *del = json_array_get(json_object_get(json_array_get(batches(body), 1), "entries"), 0);
    assert_int_equal(json_array_size(json_object_get(del, "token_ids")), 0);
    assert_int_equal(int_of(del, "token_offset"), -1);
    assert_int_equal(calls, 2); /* never asked for a delete */
    json_decref(body);
    lmc_fleet_event_batcher_settle(b, &t, LMC_CEV_DELIVERED);
    lmc_fleet_event_batcher_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coalesces_consecutive_runs),
        cmocka_unit_test(test_encoded_key),
        cmocka_unit_test(test_queued_keys_keep_their_names),
        cmocka_unit_test(test_config_batches_first_and_after_redeclare),
        cmocka_unit_test(test_failed_post_leaves_a_gap_and_keeps_the_declaration),
        cmocka_unit_test(test_full_ring_drops_the_oldest),
        cmocka_unit_test(test_unknown_sizes_resolved_at_take),
        cmocka_unit_test(test_failed_post_is_sent_again_unchanged),
        cmocka_unit_test(test_held_post_dropped_after_the_retry_window),
        cmocka_unit_test(test_unencodable_entry_costs_only_itself),
        cmocka_unit_test(test_store_entries_carry_known_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
