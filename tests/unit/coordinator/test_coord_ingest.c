/* The coordinator's ingest gate, usage accounting, quota arithmetic and
 * eviction choice (docs/coordinator.md, "Cache events" and "Usage and
 * eviction"), on the state alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "coordinator/coord_events.h"

static coordinator_state S;

static int setup(void **state)
{
    (void)state;
    return coordinator_state_init(&S);
}

static int teardown(void **state)
{
    (void)state;
    coordinator_state_free(&S);
    return 0;
}

/* A key JSON: hash byte h, salt. */
static json_t *key(int h, const char *salt)
{
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", (h + i) & 0xff);
    return json_pack("{s:s, s:s, s:i, s:i, s:s}", "chunk_hash_hex", hex, "model_name", "m",
                     "kv_rank", 0, "object_group_id", 0, "cache_salt", salt);
}

/* One batch of `type` with keys h0..h0+n-1 of `size` bytes. */
static json_t *batch(const char *inst, int inc, int seq, const char *type, const char *tier,
                     int h0, int n, int size, const char *salt)
{
    json_t *entries = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(entries, json_pack("{s:o, s:i}", "key", key(h0 + i, salt),
                                                 "size_bytes", size));
    return json_pack("{s:s, s:i, s:i, s:s, s:s, s:s, s:o}", "instance_id", inst, "incarnation",
                     inc, "seq", seq, "event_type", type, "tier", tier, "backend", "fs",
                     "entries", entries);
}

/* Parses and applies {"batches": [b...]} (NULL-terminated); the result. */
static coordinator_ingest_result post(json_t *b, ...)
{
    json_t *batches = json_array();
    va_list ap;
    va_start(ap, b);
    for (json_t *x = b; x; x = va_arg(ap, json_t *))
        json_array_append_new(batches, x);
    va_end(ap);
    json_t *body = json_pack("{s:o}", "batches", batches);
    char *text = json_dumps(body, JSON_COMPACT);
    coordinator_event_request r;
    char why[512];
    assert_int_equal(coordinator_events_parse(text, strlen(text), &r, why, sizeof why), 0);
    free(text);
    coordinator_ingest_result res;
    assert_int_equal(coordinator_events_apply(&S, NULL, &r, &res, why, sizeof why), 0);
    coordinator_events_request_free(&r);
    json_decref(body);
    return res;
}

static uint32_t salt_id(const char *salt)
{
    return coordinator_names_find(&S.salts, salt);
}

static void test_gate_duplicates_gaps_stale(void **state)
{
    (void)state;
    coordinator_ingest_result r = post(batch("a", 5, 1, "store", "l2", 0, 2, 100, "s"), NULL);
    assert_int_equal(r.applied, 1);
    r = post(batch("a", 5, 1, "store", "l2", 10, 1, 100, "s"), NULL); /* same seq */
    assert_int_equal(r.duplicates, 1);
    assert_int_equal(r.applied, 0);
    assert_int_equal(S.salt[salt_id("s")].l2_count, 2); /* the duplicate changed nothing */
    r = post(batch("a", 5, 4, "store", "l2", 10, 1, 100, "s"), NULL); /* 2 and 3 missing */
    assert_int_equal(r.applied, 1);
    uint32_t inst = coordinator_names_find(&S.instances, "a");
    assert_true(S.cursor[inst].gap);
    assert_int_equal(S.cursor[inst].last_seq, 4);
    assert_int_equal(S.ingest.gaps, 1);
    r = post(batch("a", 4, 9, "store", "l2", 20, 1, 100, "s"), NULL); /* older incarnation */
    assert_int_equal(r.stale, 1);
    assert_int_equal(S.salt[salt_id("s")].l2_count, 3);
    /* Several batches of one request go through the gate in order. */
    r = post(batch("b", 1, 1, "store", "l2", 30, 1, 1, "s"),
             batch("b", 1, 2, "store", "l2", 31, 1, 1, "s"),
             batch("b", 1, 2, "store", "l2", 32, 1, 1, "s"), NULL);
    assert_int_equal(r.applied, 2);
    assert_int_equal(r.duplicates, 1);
    assert_false(S.cursor[coordinator_names_find(&S.instances, "b")].gap);
}

static void test_new_incarnation_fences_l1(void **state)
{
    (void)state;
    post(batch("a", 1, 1, "store", "l1", 0, 3, 10, ""), NULL);
    post(batch("a", 1, 2, "store", "l2", 0, 1, 10, ""), NULL);
    post(batch("b", 1, 1, "store", "l1", 0, 1, 10, ""), NULL);
    assert_int_equal(S.l1_entries, 4);
    coordinator_ingest_result r = post(batch("a", 2, 1, "access", "l2", 0, 1, 0, ""), NULL);
    assert_int_equal(r.applied, 1);
    assert_int_equal(S.l1_entries, 1);        /* only b's placement is left */
    assert_int_equal(S.l2_entries, 1);        /* L2 is shared: not fenced */
    assert_int_equal(S.salt[salt_id("")].l1_bytes, 10);
    assert_int_equal(S.ingest.fenced, 1);
    uint32_t inst = coordinator_names_find(&S.instances, "a");
    assert_int_equal(S.cursor[inst].incarnation, 2);
    assert_int_equal(S.cursor[inst].last_seq, 1);
    /* The old incarnation is stale now. */
    assert_int_equal(post(batch("a", 1, 3, "store", "l1", 5, 1, 10, ""), NULL).stale, 1);
    assert_int_equal(S.l1_entries, 1);
}

static void test_usage_counts_a_key_once(void **state)
{
    (void)state;
    post(batch("a", 1, 1, "store", "l2", 0, 4, 100, "t"), NULL);
    post(batch("b", 1, 1, "store", "l2", 0, 2, 250, "t"), NULL); /* stored again, new size */
    coordinator_salt *sa = &S.salt[salt_id("t")];
    assert_int_equal(sa->l2_count, 4);
    assert_int_equal(sa->l2_bytes, 2 * 250 + 2 * 100);
    post(batch("a", 1, 2, "delete", "l2", 0, 1, 0, "t"), NULL);
    post(batch("a", 1, 3, "delete", "l2", 0, 1, 0, "t"), NULL); /* again: nothing more */
    post(batch("a", 1, 4, "delete", "l2", 99, 1, 0, "t"), NULL); /* never stored */
    assert_int_equal(sa->l2_count, 3);
    assert_int_equal(sa->l2_bytes, 250 + 2 * 100);
    assert_int_equal(S.keys.n_live, 3);
    post(batch("a", 1, 5, "store", "l2", 0, 1, 100, "u"), NULL); /* another salt */
    assert_int_equal(S.salt[salt_id("u")].l2_bytes, 100);
    assert_int_equal(sa->l2_bytes, 250 + 2 * 100);
    assert_int_equal(S.l2_bytes, 250 + 3 * 100);
}

static void test_quota_watermark(void **state)
{
    (void)state;
    post(batch("a", 1, 1, "store", "l2", 0, 10, 100, "q"), NULL); /* 1000 bytes */
    uint32_t q = salt_id("q");
    assert_false(coordinator_quota_over(&S, q, 1.0)); /* no quota, no default: exempt */
    S.has_default_quota = true;
    S.default_quota_gb = 1000.0 / COORD_GB;
    assert_true(coordinator_quota_over(&S, q, 1.0));  /* usage == limit */
    S.default_quota_gb = 1001.0 / COORD_GB;
    assert_false(coordinator_quota_over(&S, q, 1.0));
    assert_true(coordinator_quota_over(&S, q, 0.9));
    S.salt[q].has_quota = true;                 /* an explicit quota wins over the default */
    S.salt[q].quota_gb = 5000.0 / COORD_GB;
    assert_false(coordinator_quota_over(&S, q, 0.9));
    assert_true(coordinator_quota_over(&S, q, 0.2));
    S.salt[q].quota_gb = 0;                     /* zero: everything goes */
    assert_true(coordinator_quota_over(&S, q, 1.0));
    uint32_t out[16];
    assert_int_equal(coordinator_evict_choose(&S, q, 0.2, out, 16), 10);
}

static void test_eviction_takes_lru_skipping_pins(void **state)
{
    (void)state;
    post(batch("a", 1, 1, "store", "l2", 0, 10, 100, "e"), NULL);
    post(batch("a", 1, 2, "access", "l2", 0, 2, 0, "e"), NULL); /* keys 0,1 most recent */
    uint32_t e = salt_id("e");
    S.salt[e].has_quota = true;
    S.salt[e].quota_gb = 500.0 / COORD_GB;
    coordinator_key k;
    coordinator_entry_key(&S.keys.e[S.salt[e].lru_head], &k);   /* the oldest is key 2 */
    assert_int_equal(k.hash[0], 2);
    S.keys.e[S.salt[e].lru_head].pins = 1;                /* pin it */
    uint32_t out[16];
    size_t n = coordinator_evict_choose(&S, e, 0.3, out, 16);  /* ceil(0.3 x 10) = 3 */
    assert_int_equal(n, 3);
    int want[] = {3, 4, 5};
    for (size_t i = 0; i < n; i++)
        assert_int_equal(S.keys.e[out[i]].hash[0], want[i]);
    /* Chosen keys stay until their delete event comes back. */
    assert_int_equal(coordinator_evict_choose(&S, e, 0.3, out, 16), 3);
    post(batch("a", 1, 3, "delete", "l2", 3, 3, 0, "e"), NULL);
    n = coordinator_evict_choose(&S, e, 0.3, out, 16);
    assert_int_equal(n, 3);                              /* ceil(0.3 x 7) */
    assert_int_equal(S.keys.e[out[0]].hash[0], 6);
    assert_int_equal(S.salt[e].l2_bytes, 700);
}

/* One batch with `fields` (JSON members, without braces) in a body. */
#define BODY(fields) "{\"batches\": [{" fields "}]}"
#define HEAD "\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 1, "
#define STORE_L2 HEAD "\"event_type\": \"store\", \"tier\": \"l2\", \"backend\": \"fs\", "
#define KEY_AB "{\"chunk_hash_hex\": \"ab\", \"model_name\": \"m\", \"kv_rank\": 0}"

typedef struct {
    const char *body;
    const char *reason; /* a part of the 422's detail that names the field */
} bad_body;

static const bad_body BAD_BODIES[] = {
    {"{}", "body must be {\"batches\": [CacheEventBatch]}"},
    {"{\"batches\": 3}", "body must be {\"batches\": [CacheEventBatch]}"},
    {BODY("\"instance_id\": \"\", \"incarnation\": 1, \"seq\": 1, \"event_type\": "
          "\"store\", \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": []"),
     "batches[0]: instance_id must be a non-empty str"},
    {BODY("\"instance_id\": \"a\", \"incarnation\": -1, \"seq\": 1, \"event_type\": "
          "\"store\", \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": []"),
     "batches[0]: incarnation must be a non-negative integer"},
    {BODY("\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 0, \"event_type\": "
          "\"store\", \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": []"),
     "batches[0]: seq must be an integer >= 1"},
    {BODY(HEAD "\"event_type\": \"store\", \"tier\": \"l3\", \"backend\": \"fs\", "
               "\"entries\": []"),
     "batches[0]: tier must be a str: l1 or l2"},
    {BODY(HEAD "\"event_type\": \"store\", \"tier\": \"l2\", \"entries\": []"),
     "batches[0]: backend is required for store batches"},
    {BODY(HEAD "\"event_type\": \"config\", \"tier\": \"l2\", \"backend\": \"fs\", "
               "\"entries\": [{\"key\": " KEY_AB ", \"size_bytes\": 1}]"),
     "batches[0]: a config batch has no entries"},
    {BODY(STORE_L2 "\"entries\": [{\"key\": {\"chunk_hash_hex\": \"AB\", "
                   "\"model_name\": \"m\", \"kv_rank\": 0}, \"size_bytes\": 1}]"),
     "batches[0]: entries[0]: key: chunk_hash_hex must be lower-case hex"},
    {BODY(STORE_L2 "\"entries\": [{\"key\": " KEY_AB "}]"),
     "batches[0]: entries[0]: size_bytes must be a non-negative integer (required for store)"},
    {BODY(STORE_L2 "\"entries\": [], \"ts\": -1"), "batches[0]: ts must be a finite number"},
    /* Issue 29: a missing required member was read as a string with no
     * text (a crash in strcmp); each is now refused by name. */
    {BODY("\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 1, \"tier\": \"l2\", "
          "\"backend\": \"fs\", \"entries\": []"),
     "batches[0]: event_type is required"},
    {BODY(HEAD "\"event_type\": \"store\", \"backend\": \"fs\", \"entries\": []"),
     "batches[0]: tier is required"},
    {BODY("\"incarnation\": 1, \"seq\": 1, \"event_type\": \"store\", \"tier\": \"l2\", "
          "\"backend\": \"fs\", \"entries\": []"),
     "batches[0]: instance_id is required"},
    {BODY(HEAD "\"event_type\": \"store\", \"tier\": \"l2\", \"backend\": \"fs\""),
     "batches[0]: entries is required"},
    {BODY(HEAD "\"event_type\": 5, \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": []"),
     "batches[0]: event_type must be a str"},
    {BODY(HEAD "\"event_type\": [\"store\"], \"tier\": \"l2\", \"backend\": \"fs\", "
               "\"entries\": []"),
     "batches[0]: event_type must be a str"},
    {BODY(HEAD "\"event_type\": \"store\", \"tier\": null, \"backend\": \"fs\", "
               "\"entries\": []"),
     "batches[0]: tier must be a str"},
    {BODY(HEAD "\"event_type\": \"store\", \"tier\": \"l2\", \"backend\": \"\", "
               "\"entries\": []"),
     "batches[0]: backend is required for store batches"},
    {BODY(HEAD "\"event_type\": \"delete\", \"tier\": \"l1\", \"backend\": 7, "
               "\"entries\": []"),
     "batches[0]: backend is required for delete batches"},
    {"{\"batches\": [{" STORE_L2 "\"entries\": []}, {\"seq\": 2}]}",
     "batches[1]: instance_id is required"},
};

static void test_parse_rejects_bad_batches(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof BAD_BODIES / sizeof *BAD_BODIES; i++) {
        const bad_body *bad = &BAD_BODIES[i];
        coordinator_event_request r;
        char why[512] = "";
        assert_int_equal(coordinator_events_parse(bad->body, strlen(bad->body), &r, why, sizeof why),
                         -1);
        if (!strstr(why, bad->reason))
            fail_msg("body %zu (%s): reason '%s', expected '%s'", i, bad->body, why, bad->reason);
    }
    /* An access batch needs no backend; a config batch records capacity. */
    const char *ok = ("{\"batches\": [{\"instance_id\": \"a\", \"incarnation\": 1, "
                            "\"seq\": 1, \"event_type\": \"config\", \"tier\": \"l2\", "
                            "\"backend\": \"fs\", \"capacity_bytes\": 4096, "
                            "\"capacity_revision\": 2, \"shared\": true, \"entries\": []}, "
                            "{\"instance_id\": "
                            "\"a\", \"incarnation\": 1, \"seq\": 2, \"event_type\": \"access\", "
                            "\"tier\": \"l1\", \"entries\": []}]}");
    coordinator_event_request r;
    char why[512];
    assert_int_equal(coordinator_events_parse(ok, strlen(ok), &r, why, sizeof why), 0);
    coordinator_ingest_result res;
    assert_int_equal(coordinator_events_apply(&S, NULL, &r, &res, why, sizeof why), 0);
    assert_int_equal(res.applied, 2);
    coordinator_cursor *c = &S.cursor[coordinator_names_find(&S.instances, "a")];
    assert_int_equal(c->n_caps, 1);
    assert_int_equal(c->caps[0].capacity_bytes, 4096);
    coordinator_events_request_free(&r);
}

/* The text reader behind /events: JSON syntax and text rules as a
 * conforming parser has them, the schema checked on top. */
static void test_scanner_syntax(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", "{", "{\"batches\": [}", "{\"batches\": [],}", "{\"batches\": []} x",
        "{\"batches\": [1,]}", "{\"batches\" []}", "{'batches': []}",
        "{\"batches\": [], \"x\": 01}", "{\"batches\": [], \"x\": 1.}",
        "{\"batches\": [], \"x\": \"\\u0000\"}", "{\"batches\": [], \"x\": \"\\ud800\"}",
        "{\"batches\": [], \"x\": \"\xff\"}", "{\"batches\": [], \"x\": \"\xc0\xaf\"}",
        "{\"batches\": [], \"x\": 99999999999999999999}", "{\"batches\": [], \"x\": tru}",
        "{\"batches\": [], \"x\": \"a\tb\"}", "[]", "{}", "{\"batches\": {}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        coordinator_event_request r;
        char why[512] = "";
        assert_int_equal(coordinator_events_parse(bad[i], strlen(bad[i]), &r, why, sizeof why), -1);
        assert_true(why[0]);
    }
    char deep[400];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{\"batches\": [], \"x\": ");
    for (int i = 0; i < 100; i++)
        deep[n++] = '[';
    deep[n] = '\0';
    coordinator_event_request r;
    char why[512] = "";
    assert_int_equal(coordinator_events_parse(deep, n, &r, why, sizeof why), -1);
    assert_non_null(strstr(why, "nested too deep"));
    /* Escapes, unknown fields and their values, a repeated key (the last
     * wins) are all read. */
    const char *good =
        " {\"v\": {\"a\": [1, -2.5e3, true, null, \"\\u00e9\\ud83d\\ude00\"]},"
        " \"batches\": [{\"instance_id\": \"\\u0061\\/\\\"\", \"incarnation\": 0,"
        " \"seq\": 1, \"seq\": 2, \"event_type\": \"store\", \"tier\": \"l2\","
        " \"backend\": \"caf\xc3\xa9\", \"entries\": [{\"key\": {\"chunk_hash_hex\": \"0a\","
        " \"model_name\": \"m\", \"kv_rank\": 3, \"extra\": {}}, \"size_bytes\": 7}]}]} ";
    assert_int_equal(coordinator_events_parse(good, strlen(good), &r, why, sizeof why), 0);
    assert_int_equal(r.n, 1);
    assert_string_equal(r.batches[0].instance_id, "a/\"");
    assert_int_equal(r.batches[0].seq, 2);
    assert_string_equal(r.batches[0].backend, "caf\xc3\xa9");
    assert_int_equal(r.batches[0].n, 1);
    assert_int_equal(r.batches[0].entries[0].key.kv_rank, 3);
    assert_int_equal(r.batches[0].entries[0].key.hash[0], 10);
    assert_string_equal(r.batches[0].entries[0].key.salt, "");
    assert_int_equal(r.batches[0].entries[0].size, 7);
    coordinator_events_request_free(&r);
}

/* The key table under churn: every live key is found, every removed one
 * is not, through growth and backward-shift deletion. */
static void test_key_table_churn(void **state)
{
    (void)state;
    enum { N = 20000 };
    coordinator_key k = {.hash_len = 32, .model = 0, .salt = 0};
    for (uint32_t i = 0; i < N; i++) {
        memcpy(k.hash, &i, sizeof i);
        uint32_t idx = coordinator_keys_get(&S.keys, &k);
        assert_int_not_equal(idx, COORD_NONE);
        S.keys.e[idx].pins = 1;
    }
    for (uint32_t i = 0; i < N; i += 3) {
        memcpy(k.hash, &i, sizeof i);
        uint32_t idx = coordinator_keys_find(&S.keys, &k);
        S.keys.e[idx].pins = 0;
        coordinator_keys_release(&S.keys, idx);
    }
    for (uint32_t i = 0; i < N; i++) {
        memcpy(k.hash, &i, sizeof i);
        uint32_t idx = coordinator_keys_find(&S.keys, &k);
        if (i % 3 == 0)
            assert_int_equal(idx, COORD_NONE);
        else
            assert_true(idx != COORD_NONE && memcmp(S.keys.e[idx].hash, &i, 4) == 0);
    }
    assert_int_equal(S.keys.n_live, N - (N + 2) / 3);
    assert_true(sizeof(coordinator_entry) <= 96);
}

/* Issue 29: the key directory is bounded.  Past max_live new keys are not
 * recorded (counted in keys.refused); known keys keep changing, the
 * request is still applied, and a delete makes room again. */
static void test_key_directory_bound(void **state)
{
    (void)state;
    S.keys.max_live = 3;
    coordinator_ingest_result res = post(batch("a", 1, 1, "store", "l2", 1, 5, 100, "t"), NULL);
    assert_int_equal(res.applied, 1);
    assert_int_equal(S.keys.n_live, 3);
    assert_int_equal(S.keys.refused, 2);
    uint32_t t = salt_id("t");
    assert_int_equal(S.salt[t].l2_count, 3);
    assert_int_equal(S.salt[t].l2_bytes, 300);
    /* Known keys still change: stored again (the size replaced), in L1. */
    post(batch("a", 1, 2, "store", "l2", 1, 1, 250, "t"), NULL);
    post(batch("a", 1, 3, "store", "l1", 2, 1, 10, "t"), NULL);
    assert_int_equal(S.salt[t].l2_bytes, 450);
    assert_int_equal(S.l1_entries, 1);
    assert_int_equal(S.keys.refused, 2);
    /* A new key in L1 is refused too; a delete makes room for one. */
    post(batch("a", 1, 4, "store", "l1", 9, 1, 10, "t"), NULL);
    assert_int_equal(S.keys.refused, 3);
    post(batch("a", 1, 5, "delete", "l2", 3, 1, 0, "t"), NULL);
    assert_int_equal(S.keys.n_live, 2);
    post(batch("a", 1, 6, "store", "l2", 4, 2, 100, "t"), NULL);
    assert_int_equal(S.keys.n_live, 3);
    assert_int_equal(S.keys.refused, 4);
    assert_int_equal(S.salt[t].l2_count, 3);
    assert_int_equal(S.ingest.applied, 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gate_duplicates_gaps_stale, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_incarnation_fences_l1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usage_counts_a_key_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quota_watermark, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eviction_takes_lru_skipping_pins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_rejects_bad_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_table_churn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_directory_bound, setup, teardown),
        cmocka_unit_test(test_scanner_syntax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
