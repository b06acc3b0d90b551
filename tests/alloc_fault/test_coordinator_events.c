/* Allocation failures while the coordinator takes a POST /events body
 * (src/coordinator/coord_events_scan.c, coord_events.c, coord_state.c,
 * coord_usage.c), with its database: every failure is answered "out of
 * memory" (-2 from the reader, -1 from the ingest: both a 503), never a
 * refusal that blames the body and never a 200 for events not recorded;
 * the gate is put back, so the same body sent again is applied once, and
 * memory and database then hold exactly what a run without failures
 * holds (docs/coordinator.md, "503: not saved"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "coordinator/coord_db.h"
#include "coordinator/coord_events.h"

/* Two batches already applied: keys 01 and 02 in L2 (100 B each) and in
 * instance a's L1 (10 B each). */
static const char PREFIX[] =
    "{\"batches\": ["
    "{\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 1, \"event_type\": \"store\","
    " \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": ["
    "{\"key\": {\"chunk_hash_hex\": \"0101\", \"model_name\": \"m\", \"kv_rank\": 0},"
    " \"size_bytes\": 100},"
    "{\"key\": {\"chunk_hash_hex\": \"0202\", \"model_name\": \"m\", \"kv_rank\": 0},"
    " \"size_bytes\": 100}]},"
    "{\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 2, \"event_type\": \"store\","
    " \"tier\": \"l1\", \"backend\": \"dram\", \"entries\": ["
    "{\"key\": {\"chunk_hash_hex\": \"0101\", \"model_name\": \"m\", \"kv_rank\": 0},"
    " \"size_bytes\": 10},"
    "{\"key\": {\"chunk_hash_hex\": \"0202\", \"model_name\": \"m\", \"kv_rank\": 0},"
    " \"size_bytes\": 10}]}]}";

/* The request under test, 5 batches of two instances: three new L2 keys
 * of 200 B under a new salt, key 01 deleted from L2, key 03 into a's L1,
 * an access, and a second instance b holding key 01 in its L1. */
static const char BODY[] =
    "{\"batches\": ["
    "{\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 3, \"event_type\": \"store\","
    " \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": ["
    "{\"key\": {\"chunk_hash_hex\": \"0303\", \"model_name\": \"m\", \"kv_rank\": 0,"
    " \"cache_salt\": \"s\"}, \"size_bytes\": 200},"
    "{\"key\": {\"chunk_hash_hex\": \"0404\", \"model_name\": \"m\", \"kv_rank\": 0,"
    " \"cache_salt\": \"s\"}, \"size_bytes\": 200},"
    "{\"key\": {\"chunk_hash_hex\": \"0505\", \"model_name\": \"m\", \"kv_rank\": 0,"
    " \"cache_salt\": \"s\"}, \"size_bytes\": 200}]},"
    "{\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 4, \"event_type\": \"delete\","
    " \"tier\": \"l2\", \"backend\": \"fs\", \"entries\": ["
    "{\"key\": {\"chunk_hash_hex\": \"0101\", \"model_name\": \"m\", \"kv_rank\": 0}}]},"
    "{\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 5, \"event_type\": \"store\","
    " \"tier\": \"l1\", \"backend\": \"dram\", \"entries\": ["
    "{\"key\": {\"chunk_hash_hex\": \"0303\", \"model_name\": \"m\", \"kv_rank\": 0,"
    " \"cache_salt\": \"s\"}, \"size_bytes\": 10}]},"
    "{\"instance_id\": \"a\", \"incarnation\": 1, \"seq\": 6, \"event_type\": \"access\","
    " \"tier\": \"l2\", \"entries\": ["
    "{\"key\": {\"chunk_hash_hex\": \"0202\", \"model_name\": \"m\", \"kv_rank\": 0}}]},"
    "{\"instance_id\": \"b\", \"incarnation\": 7, \"seq\": 1, \"event_type\": \"store\","
    " \"tier\": \"l1\", \"backend\": \"dram\", \"entries\": ["
    "{\"key\": {\"chunk_hash_hex\": \"0101\", \"model_name\": \"m\", \"kv_rank\": 0},"
    " \"size_bytes\": 10}]}]}";
#define BODY_BATCHES 5

static char db_path[96];

static void remove_db(void)
{
    static const char *const suffixes[] = {"", "-wal", "-shm", "-journal"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s%s", db_path, suffixes[i]);
        unlink(p);
    }
}

/* Parses and ingests text; the ingest's result (parse failures as is). */
static int take(coordinator_state *s, coordinator_db *db, const char *text, coordinator_ingest_result *res,
                char *why, size_t whylen)
{
    coordinator_event_request r;
    int rc = coordinator_events_parse(text, strlen(text), &r, why, whylen);
    if (rc != 0)
        return rc == -2 ? -3 : -4; /* -3: the reader ran out of memory; -4: it refused */
    rc = coordinator_events_ingest(s, db, &r, res, why, whylen);
    coordinator_events_request_free(&r);
    return rc;
}

static int cursor_seq(coordinator_state *s, const char *inst)
{
    uint32_t i = coordinator_names_find(&s->instances, inst);
    if (i == COORD_NONE || i >= s->cursor_cap || s->cursor[i].gap)
        return -1;
    return (int)s->cursor[i].last_seq;
}

/* What memory must hold after PREFIX and BODY, however BODY got there. */
static int state_is_complete(coordinator_state *s, const char *where)
{
    if (s->l2_entries != 4 || s->l2_bytes != 700)
        return lmc_fault_violation("%s: L2 holds %llu keys, %llu B (want 4, 700)", where,
                                   (unsigned long long)s->l2_entries,
                                   (unsigned long long)s->l2_bytes);
    if (s->l1_entries != 4 || s->l1_bytes != 40)
        return lmc_fault_violation("%s: L1 holds %llu placements, %llu B (want 4, 40)", where,
                                   (unsigned long long)s->l1_entries,
                                   (unsigned long long)s->l1_bytes);
    if (cursor_seq(s, "a") != 6 || cursor_seq(s, "b") != 1)
        return lmc_fault_violation("%s: cursors a=%d b=%d (want 6, 1, no gap)", where,
                                   cursor_seq(s, "a"), cursor_seq(s, "b"));
    if (s->ingest.applied != 2 + BODY_BATCHES || s->ingest.duplicates || s->ingest.gaps)
        return lmc_fault_violation("%s: %llu applied, %llu duplicates, %llu gaps (want 7, 0, 0)",
                                   where, (unsigned long long)s->ingest.applied,
                                   (unsigned long long)s->ingest.duplicates,
                                   (unsigned long long)s->ingest.gaps);
    return 0;
}

/* What the database must hold: L2 and the cursors (L1 is memory only). */
static int database_is_complete(void)
{
    coordinator_state r;
    coordinator_db *db = NULL;
    char err[256];
    int rc = 0;
    if (coordinator_state_init(&r) != 0)
        return lmc_fault_violation("state init failed with nothing armed");
    if (coordinator_db_open(db_path, &db, err, sizeof err) != 0 ||
        coordinator_db_load(db, &r, err, sizeof err) != 0)
        rc = lmc_fault_violation("reopening the database: %s", err);
    else if (r.l2_entries != 4 || r.l2_bytes != 700 || cursor_seq(&r, "a") != 6 ||
             cursor_seq(&r, "b") != 1)
        rc = lmc_fault_violation("the database holds %llu L2 keys, %llu B, cursors a=%d b=%d "
                                 "(want 4, 700, 6, 1)", (unsigned long long)r.l2_entries,
                                 (unsigned long long)r.l2_bytes, cursor_seq(&r, "a"),
                                 cursor_seq(&r, "b"));
    if (db)
        coordinator_db_close(db);
    coordinator_state_free(&r);
    return rc;
}

static int ingest_body(void *arg)
{
    (void)arg;
    coordinator_state s;
    coordinator_db *db = NULL;
    coordinator_ingest_result res;
    char err[256], why[512] = "";
    int verdict = LMC_FAULT_VIOLATION;

    lmc_fault_pause(); /* the set-up is not what this tests */
    remove_db();
    if (coordinator_state_init(&s) != 0 || coordinator_db_open(db_path, &db, err, sizeof err) != 0 ||
        take(&s, db, PREFIX, &res, why, sizeof why) != 0 || res.applied != 2) {
        lmc_fault_resume();
        verdict = lmc_fault_violation("set-up failed with nothing armed: %s %s", err, why);
        goto out;
    }
    lmc_fault_resume();

    int rc = take(&s, db, BODY, &res, why, sizeof why);

    lmc_fault_pause();
    if (rc == 0) {
        verdict = res.applied == BODY_BATCHES && res.duplicates == 0 && res.stale == 0
                      ? LMC_FAULT_OK
                      : lmc_fault_violation("200 with %llu applied, %llu duplicates",
                                            (unsigned long long)res.applied,
                                            (unsigned long long)res.duplicates);
    } else if (rc == -4 || (rc == -3 && strcmp(why, "out of memory") != 0)) {
        verdict = lmc_fault_violation("the body was refused (a 422): %s", why);
    } else if (rc == -3 || (rc == -1 && (strstr(why, "out of memory") ||
                                         strstr(why, "could not be recorded")))) {
        /* A 503: the sender posts the same body again, and it goes in once. */
        int again = take(&s, db, BODY, &res, why, sizeof why);
        verdict = again == 0 && res.applied == BODY_BATCHES && res.duplicates == 0
                      ? LMC_FAULT_ERROR
                      : lmc_fault_violation("the retry after a 503 answered %d (%s) with "
                                            "%llu applied, %llu duplicates", again, why,
                                            (unsigned long long)res.applied,
                                            (unsigned long long)res.duplicates);
    } else {
        verdict = lmc_fault_violation("the ingest answered %d: %s", rc, why);
    }
    if (verdict != LMC_FAULT_VIOLATION && state_is_complete(&s, "memory") != 0)
        verdict = LMC_FAULT_VIOLATION;
    coordinator_db_close(db);
    db = NULL;
    if (verdict != LMC_FAULT_VIOLATION && database_is_complete() != 0)
        verdict = LMC_FAULT_VIOLATION;
    lmc_fault_resume();
out:
    lmc_fault_pause();
    if (db)
        coordinator_db_close(db);
    coordinator_state_free(&s);
    remove_db();
    lmc_fault_resume();
    return verdict;
}

static void test_ingest(void **state)
{
    (void)state;
    snprintf(db_path, sizeof db_path, "/tmp/lmc-alloc-fault-coord-%d.db", (int)getpid());
    assert_int_equal(lmc_fault_run("coordinator.events_ingest", ingest_body, NULL, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ingest)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
