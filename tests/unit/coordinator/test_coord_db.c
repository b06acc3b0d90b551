/* SQLite round trip (docs/coordinator.md, "Persistence"): what is saved
 * comes back the same after a reopen, the LRU order included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include <cmocka.h>

#include "coordinator/coord_db_internal.h"
#include "coordinator/coord_events.h"

static char path[64];

static void remove_db(void)
{
    char p[96];
    unlink(path);
    snprintf(p, sizeof p, "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", path);
    unlink(p);
}

static uint32_t add_key(coordinator_state *s, int h, const char *salt, uint64_t size)
{
    coordinator_key k = {.hash_len = 32};
    memset(k.hash, h, 32);
    k.model = coordinator_names_intern(&s->models, "model/a");
    k.salt = coordinator_names_intern(&s->salts, salt);
    uint32_t idx = coordinator_keys_get(&s->keys, &k);
    assert_int_equal(coordinator_usage_l2_store(s, idx, size, coordinator_names_intern(&s->backends, "fs"),
                                          true), 0);
    return idx;
}

static void test_round_trip(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/coord-db-test-%d.db", (int)getpid());
    remove_db();
    coordinator_db *db;
    char err[256];
    coordinator_state s;
    assert_int_equal(coordinator_state_init(&s), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_begin(db), 0);
    for (int h = 1; h <= 5; h++)
        assert_int_equal(coordinator_db_put_l2(db, &s, add_key(&s, h, "t1", 100u * h)), 0);
    uint32_t k2 = add_key(&s, 2, "t1", 200); /* stored again: most recent now */
    assert_int_equal(coordinator_db_put_l2(db, &s, k2), 0);
    uint32_t k3 = add_key(&s, 3, "t1", 300);
    assert_int_equal(coordinator_db_del_l2(db, &s, k3), 0);
    coordinator_usage_l2_delete(&s, k3);
    uint32_t k4 = add_key(&s, 4, "t1", 400);
    assert_int_equal(coordinator_db_put_l2(db, &s, k4), 0);
    s.keys.e[k4].pins = 2;
    assert_int_equal(coordinator_db_put_pin(db, &s, k4), 0);
    coordinator_cursor c = {.used = true, .incarnation = 77, .last_seq = 12, .gap = true};
    assert_int_equal(coordinator_db_put_cursor(db, "inst-1", &c), 0);
    assert_int_equal(coordinator_db_put_cursor(db, "inst-2", &c), 0);
    assert_int_equal(coordinator_db_del_cursor(db, "inst-2"), 0);
    assert_int_equal(coordinator_db_put_quota(db, "t1", 1.5), 0);
    assert_int_equal(coordinator_db_put_quota(db, "t2", 2.0), 0);
    assert_int_equal(coordinator_db_put_quota(db, "t2", -1), 0); /* removed */
    assert_int_equal(coordinator_db_put_default(db, true, 0.25), 0);
    assert_int_equal(coordinator_db_commit(db), 0);
    coordinator_db_close(db);

    coordinator_state r;
    assert_int_equal(coordinator_state_init(&r), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_load(db, &r, err, sizeof err), 0);
    uint32_t t1 = coordinator_names_find(&r.salts, "t1");
    assert_int_not_equal(t1, COORD_NONE);
    assert_int_equal(r.salt[t1].l2_count, 4);
    assert_int_equal(r.salt[t1].l2_bytes, 100 + 200 + 400 + 500);
    assert_true(r.salt[t1].has_quota && r.salt[t1].quota_gb == 1.5);
    uint32_t t2 = coordinator_names_find(&r.salts, "t2");
    assert_true(t2 == COORD_NONE || !r.salt[t2].has_quota);
    assert_true(r.has_default_quota && r.default_quota_gb == 0.25);
    /* LRU order: 1, 5, 2, 4 (4 touched last, by its second store). */
    int want[] = {1, 5, 2, 4}, n = 0;
    for (uint32_t i = r.salt[t1].lru_head; i != COORD_NONE; i = r.keys.e[i].lru_next, n++)
        assert_int_equal(r.keys.e[i].hash[0], want[n]);
    assert_int_equal(n, 4);
    coordinator_key k;
    coordinator_entry_key(&s.keys.e[k4], &k);
    k.model = coordinator_names_find(&r.models, "model/a");
    k.salt = t1;
    uint32_t got = coordinator_keys_find(&r.keys, &k);
    assert_int_not_equal(got, COORD_NONE);
    assert_int_equal(r.keys.e[got].pins, 2);
    assert_true(r.keys.e[got].flags & COORD_IN_L2);
    uint32_t inst = coordinator_names_find(&r.instances, "inst-1");
    assert_int_not_equal(inst, COORD_NONE);
    assert_true(r.cursor[inst].used && r.cursor[inst].incarnation == 77 &&
                r.cursor[inst].last_seq == 12 && r.cursor[inst].gap);
    assert_int_equal(coordinator_names_find(&r.instances, "inst-2"), COORD_NONE);
    coordinator_db_close(db);
    coordinator_state_free(&r);
    coordinator_state_free(&s);
    remove_db();
}

/* The log is rewritten as a snapshot once it outgrows the live keys, and
 * what comes back from the snapshot is what was there. */
static void test_log_compaction(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/coord-db-compact-%d.db", (int)getpid());
    remove_db();
    coordinator_db *db;
    char err[256];
    coordinator_state s;
    assert_int_equal(coordinator_state_init(&s), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_begin(db), 0);
    uint32_t idx[10];
    for (int h = 0; h < 10; h++)
        assert_int_equal(coordinator_db_put_l2(db, &s, idx[h] = add_key(&s, h + 1, "c", 10)), 0);
    for (int i = 0; i < 120000; i++) { /* accesses: the log grows, the keys do not */
        coordinator_usage_l2_touch(&s, idx[i % 7]);
        assert_int_equal(coordinator_db_touch_l2(db, &s, idx[i % 7]), 0);
    }
    assert_int_equal(coordinator_db_commit(db), 0);
    assert_true(db->log_records > 120000);
    assert_int_equal(coordinator_db_maybe_compact(db, &s), 0);
    assert_int_equal(db->log_records, 10);
    assert_int_equal(coordinator_db_maybe_compact(db, &s), 0); /* nothing to do now */
    assert_int_equal(db->log_records, 10);
    coordinator_db_close(db);

    coordinator_state r;
    assert_int_equal(coordinator_state_init(&r), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_load(db, &r, err, sizeof err), 0);
    uint32_t c = coordinator_names_find(&r.salts, "c");
    assert_int_equal(r.salt[c].l2_count, 10);
    assert_int_equal(r.salt[c].l2_bytes, 100);
    /* LRU order survives: 8, 9, 10 never touched, then 1..7 by last touch. */
    int want[] = {8, 9, 10, 7, 1, 2, 3, 4, 5, 6}, n = 0;
    for (uint32_t i = r.salt[c].lru_head; i != COORD_NONE; i = r.keys.e[i].lru_next, n++)
        assert_int_equal(r.keys.e[i].hash[0], want[n]);
    assert_int_equal(n, 10);
    coordinator_db_close(db);
    coordinator_state_free(&r);
    coordinator_state_free(&s);
    remove_db();
}

static void put_row(coordinator_db *db, const uint8_t *row, size_t n)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db->db, "INSERT INTO l2_log(data) VALUES(?1)", -1, &st,
                                        NULL), SQLITE_OK);
    sqlite3_bind_blob(st, 1, row, (int)n, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
}

/* A record of the first log format: names spelled out, fixed integers. */
static size_t v1_record(uint8_t *p, uint8_t op, int h, const char *salt, uint64_t size,
                        uint64_t touch)
{
    size_t n = 0;
    uint32_t rank = 0, group = 0;
    uint16_t ml = 7, sl = (uint16_t)strlen(salt), bl = 2;
    p[n++] = op;
    p[n++] = 32;
    memset(p + n, h, 32), n += 32;
    memcpy(p + n, &rank, 4), n += 4;
    memcpy(p + n, &group, 4), n += 4;
    memcpy(p + n, &ml, 2), memcpy(p + n + 2, "model/a", ml), n += 2 + ml;
    memcpy(p + n, &sl, 2), memcpy(p + n + 2, salt, sl), n += 2 + sl;
    if (op == 1) {
        uint32_t tokens = 3;
        memcpy(p + n, &size, 8), n += 8;
        memcpy(p + n, &touch, 8), n += 8;
        memcpy(p + n, &tokens, 4), n += 4;
        memcpy(p + n, &bl, 2), memcpy(p + n + 2, "fs", bl), n += 2 + bl;
    }
    return n;
}

/* Rows of the compact format over several transactions (names defined
 * again in each row, integers past one varint byte) replay beside rows of
 * the first format; a compact record naming an id its row never defined
 * is refused. */
static void test_log_formats(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/coord-db-formats-%d.db", (int)getpid());
    remove_db();
    coordinator_db *db;
    char err[256];
    coordinator_state s;
    assert_int_equal(coordinator_state_init(&s), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_begin(db), 0);
    uint32_t a = add_key(&s, 1, "x", 5000000000ull);
    s.keys.e[a].num_tokens = 70000;
    assert_int_equal(coordinator_db_put_l2(db, &s, a), 0);
    assert_int_equal(coordinator_db_commit(db), 0);
    assert_int_equal(coordinator_db_begin(db), 0);
    uint32_t b = add_key(&s, 2, "y", 9);
    assert_int_equal(coordinator_db_put_l2(db, &s, b), 0);
    coordinator_usage_l2_touch(&s, a);
    assert_int_equal(coordinator_db_touch_l2(db, &s, a), 0);
    assert_int_equal(coordinator_db_commit(db), 0);
    uint8_t row[512];
    size_t n = v1_record(row, 1, 3, "x", 7, 1000);
    n += v1_record(row + n, 2, 2, "y", 0, 0); /* deletes b */
    put_row(db, row, n);
    coordinator_db_close(db);

    coordinator_state r;
    assert_int_equal(coordinator_state_init(&r), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_load(db, &r, err, sizeof err), 0);
    uint32_t x = coordinator_names_find(&r.salts, "x"), y = coordinator_names_find(&r.salts, "y");
    assert_int_equal(r.salt[x].l2_count, 2);
    assert_int_equal(r.salt[x].l2_bytes, 5000000007ull);
    assert_int_equal(r.salt[y].l2_count, 0);
    uint32_t first = r.salt[x].lru_head, second = r.keys.e[first].lru_next;
    assert_int_equal(r.keys.e[first].hash[0], 1);
    assert_int_equal(r.keys.e[first].num_tokens, 70000);
    assert_int_equal(r.keys.e[first].touch, s.keys.e[a].touch);
    assert_int_equal(r.keys.e[second].hash[0], 3);
    assert_int_equal(r.keys.e[second].num_tokens, 3);
    assert_string_equal(coordinator_names_str(&r.backends, r.keys.e[second].l2_backend), "fs");
    coordinator_state_free(&r);

    static const uint8_t undefined_model[] = {5, 1, 0xab, 0, 0, 0, 0, 1, 0, 0, 0};
    put_row(db, undefined_model, sizeof undefined_model);
    coordinator_db_close(db);
    assert_int_equal(coordinator_state_init(&r), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_load(db, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "malformed"));
    coordinator_db_close(db);
    coordinator_state_free(&r);
    coordinator_state_free(&s);
    remove_db();
}

static uint32_t add_numbered(coordinator_state *s, uint32_t n, const char *salt)
{
    coordinator_key k = {.hash_len = 32};
    memcpy(k.hash, &n, sizeof n);
    k.model = coordinator_names_intern(&s->models, "model/a");
    k.salt = coordinator_names_intern(&s->salts, salt);
    uint32_t idx = coordinator_keys_get(&s->keys, &k);
    assert_int_equal(coordinator_usage_l2_store(s, idx, n + 1, 0, false), 0);
    return idx;
}

/* What a second connection loads from the file equals s: the salt's
 * count and bytes, and its LRU list key by key. */
static void assert_reloads_as(const coordinator_state *s, const char *salt)
{
    coordinator_db *db;
    char err[256];
    coordinator_state r;
    assert_int_equal(coordinator_state_init(&r), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_load(db, &r, err, sizeof err), 0);
    uint32_t a = coordinator_names_find(&s->salts, salt), b = coordinator_names_find(&r.salts, salt);
    assert_int_equal(r.salt[b].l2_count, s->salt[a].l2_count);
    assert_int_equal(r.salt[b].l2_bytes, s->salt[a].l2_bytes);
    uint32_t i = s->salt[a].lru_head, j = r.salt[b].lru_head;
    for (; i != COORD_NONE && j != COORD_NONE; i = s->keys.e[i].lru_next, j = r.keys.e[j].lru_next)
        assert_memory_equal(s->keys.e[i].hash, r.keys.e[j].hash, 32);
    assert_true(i == COORD_NONE && j == COORD_NONE);
    /* No explicit checkpoint from this second connection; close_v2 closes
     * it once coordinator_db_close has finalized its statements. */
    sqlite3_close_v2(db->db);
    db->db = NULL;
    coordinator_db_close(db);
    coordinator_state_free(&r);
}

/* A compaction of more keys than one slice: changes made between its
 * slices (a delete ahead of the walk, a store, a touch behind it) are
 * kept, and the file loads the same before the switch, after it and once
 * the dead rows are gone. */
static void test_compaction_in_slices(void **state)
{
    (void)state;
    enum { N = 70000 };
    snprintf(path, sizeof path, "/tmp/coord-db-slices-%d.db", (int)getpid());
    remove_db();
    coordinator_db *db;
    char err[256];
    coordinator_state s;
    assert_int_equal(coordinator_state_init(&s), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_begin(db), 0);
    uint32_t idx[N];
    for (uint32_t n = 0; n < N; n++)
        assert_int_equal(coordinator_db_put_l2(db, &s, idx[n] = add_numbered(&s, n, "z")), 0);
    for (uint32_t i = 0; i < 2 * N + 100000; i++) {
        coordinator_usage_l2_touch(&s, idx[i % 50]);
        assert_int_equal(coordinator_db_touch_l2(db, &s, idx[i % 50]), 0);
    }
    assert_int_equal(coordinator_db_commit(db), 0);

    assert_int_equal(coordinator_db_maybe_compact(db, &s), 0);
    assert_true(db->compacting);
    assert_reloads_as(&s, "z");
    assert_int_equal(coordinator_db_begin(db), 0);
    assert_int_equal(coordinator_db_del_l2(db, &s, idx[N - 10]), 0);
    coordinator_usage_l2_delete(&s, idx[N - 10]);
    assert_int_equal(coordinator_db_put_l2(db, &s, add_numbered(&s, N + 1, "z")), 0);
    coordinator_usage_l2_touch(&s, idx[7]);
    assert_int_equal(coordinator_db_touch_l2(db, &s, idx[7]), 0);
    assert_int_equal(coordinator_db_commit(db), 0);
    assert_reloads_as(&s, "z");

    assert_int_equal(coordinator_db_maybe_compact(db, &s), 0);
    assert_false(db->compacting);
    assert_true(db->log_records < (uint64_t)N + 10);
    assert_reloads_as(&s, "z");
    for (int i = 0; i < 1000 && db->dead_rows; i++)
        assert_int_equal(coordinator_db_maybe_compact(db, &s), 0);
    assert_false(db->dead_rows);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db->db, "SELECT count(*) FROM l2_log WHERE id < ?1", -1,
                                        &st, NULL), SQLITE_OK);
    sqlite3_bind_int64(st, 1, db->log_start);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(st, 0), 0);
    sqlite3_finalize(st);
    assert_reloads_as(&s, "z");
    coordinator_db_close(db);
    coordinator_state_free(&s);
    remove_db();
}

/* A /events body: store of key byte `stored` (0: none) and delete of key
 * byte `deleted` (0: none), as batches seq, seq+1 of instance "a". */
static char *events_body(int seq, int stored, int deleted)
{
    static char text[2048];
    char k1[128], k2[128];
    snprintf(k1, sizeof k1, "{\"chunk_hash_hex\": \"%02x%02x\", \"model_name\": \"m\", "
                            "\"kv_rank\": 0}", stored, stored);
    snprintf(k2, sizeof k2, "{\"chunk_hash_hex\": \"%02x%02x\", \"model_name\": \"m\", "
                            "\"kv_rank\": 0}", deleted, deleted);
    snprintf(text, sizeof text,
             "{\"batches\": [{\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": %d, "
             "\"event_type\": \"store\", \"tier\": \"l2\", \"backend\": \"fs\", "
             "\"entries\": [%s%s%s]}, {\"instance_id\": \"a\", \"incarnation\": 1, "
             "\"seq\": %d, \"event_type\": \"delete\", \"tier\": \"l2\", "
             "\"backend\": \"fs\", \"entries\": [%s%s%s]}]}",
             seq, stored ? "{\"key\": " : "", stored ? k1 : "", stored ? ", \"size_bytes\": 100}" : "",
             seq + 1, deleted ? "{\"key\": " : "", deleted ? k2 : "", deleted ? "}" : "");
    return text;
}

static int ingest(coordinator_state *s, coordinator_db *db, const char *text, coordinator_ingest_result *res,
                  char *why, size_t whylen)
{
    coordinator_event_request r;
    assert_int_equal(coordinator_events_parse(text, strlen(text), &r, why, whylen), 0);
    int rc = coordinator_events_ingest(s, db, &r, res, why, whylen);
    coordinator_events_request_free(&r);
    return rc;
}

/* Sets the file-size limit of this process (writes past it fail with
 * EFBIG; SIGXFSZ is ignored, as the coordinator does). */
static void file_size_limit(rlim_t bytes)
{
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &rl), 0);
    rl.rlim_cur = bytes;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
}

/* Issue 29: a request whose commit fails is answered 503 (-2) with the
 * gate as before it, so that its retry is applied once, and the database
 * catches up with what stayed in memory (the delete included). */
static void test_failed_commit_is_retried_once(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/coord-db-fail-%d.db", (int)getpid());
    remove_db();
    coordinator_db *db;
    char err[256], why[512];
    coordinator_state s;
    coordinator_ingest_result res;
    assert_int_equal(coordinator_state_init(&s), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(ingest(&s, db, events_body(1, 1, 0), &res, why, sizeof why), 0);
    assert_int_equal(res.applied, 2);

    struct rlimit saved;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, SIG_IGN);
    file_size_limit(0);
    int rc = ingest(&s, db, events_body(3, 2, 1), &res, why, sizeof why);
    file_size_limit(saved.rlim_cur);
    assert_int_equal(rc, -2); /* the database's failure: 503 */
    assert_non_null(strstr(why, "could not be saved"));
    uint32_t inst = coordinator_names_find(&s.instances, "a");
    assert_int_equal(s.cursor[inst].last_seq, 2);
    assert_int_equal(s.ingest.applied, 2);

    /* The retry: applied, not a duplicate; once more: duplicates. */
    assert_int_equal(ingest(&s, db, events_body(3, 2, 1), &res, why, sizeof why), 0);
    assert_int_equal(res.applied, 2);
    assert_int_equal(res.duplicates, 0);
    assert_int_equal(ingest(&s, db, events_body(3, 2, 1), &res, why, sizeof why), 0);
    assert_int_equal(res.duplicates, 2);
    assert_int_equal(s.ingest.applied, 4);
    assert_int_equal(s.ingest.gaps, 0);
    coordinator_db_close(db);

    coordinator_state r;
    assert_int_equal(coordinator_state_init(&r), 0);
    assert_int_equal(coordinator_db_open(path, &db, err, sizeof err), 0);
    assert_int_equal(coordinator_db_load(db, &r, err, sizeof err), 0);
    assert_int_equal(r.l2_entries, 1); /* key 2; key 1 deleted by the failed request */
    assert_int_equal(r.l2_bytes, 100);
    inst = coordinator_names_find(&r.instances, "a");
    assert_true(r.cursor[inst].last_seq == 4 && !r.cursor[inst].gap);
    coordinator_db_close(db);
    coordinator_state_free(&r);
    coordinator_state_free(&s);
    remove_db();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_log_compaction),
        cmocka_unit_test(test_log_formats),
        cmocka_unit_test(test_compaction_in_slices),
        cmocka_unit_test(test_failed_commit_is_retried_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
