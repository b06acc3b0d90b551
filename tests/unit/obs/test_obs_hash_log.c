/* Lookup hash log: line format, file naming, rotation by size and by age,
 * deletion of the oldest files, and the LOOKUP_END subscription. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "obs/event_bus.h"
#include "obs/events.h"
#include "obs/lookup_hash_log.h"

typedef struct {
    char dir[64];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/lmc-hashlog-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static int only_logs(const struct dirent *e)
{
    return strncmp(e->d_name, LMC_LOOKUP_HASH_LOG_PREFIX, strlen(LMC_LOOKUP_HASH_LOG_PREFIX)) == 0;
}

/* The log files, sorted; returns the count (names freed by caller). */
static int list_logs(const char *dir, struct dirent ***names)
{
    return scandir(dir, names, only_logs, alphasort);
}

static void free_names(struct dirent **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static lmc_event lookup_event(double t, const char *rid, int hits)
{
    lmc_event ev = {.type = LMC_EVENT_LOOKUP_END, .timestamp = t};
    snprintf(ev.session_id, sizeof ev.session_id, "%s", rid);
    ev.metadata = json_pack("{s:s, s:s, s:s, s:i, s:i, s:[s, s]}", "request_id", rid,
                            "model_name", "m", "cache_salt", "", "requested_chunks", 2,
                            "hit_chunks", hits, "chunk_hashes", "aa01", "bb02");
    return ev;
}

static lmc_lookup_hash_log *open_log(const char *dir, double interval, int64_t size, int files)
{
    lmc_lookup_hash_log_options o = {.dir = dir, .rotation_interval = interval,
                                     .max_size = size, .max_files = files};
    char err[256];
    lmc_lookup_hash_log *log = lmc_lookup_hash_log_open(&o, err, sizeof err);
    assert_non_null(log);
    return log;
}

static void write_event(lmc_lookup_hash_log *log, double t, const char *rid, int hits)
{
    lmc_event ev = lookup_event(t, rid, hits);
    assert_int_equal(lmc_lookup_hash_log_write(log, &ev), 0);
    json_decref(ev.metadata);
}

static json_t *read_first_line(const char *dir, const char *name)
{
    char path[512], line[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    assert_non_null(fgets(line, sizeof line, fp));
    fclose(fp);
    return json_loads(line, 0, NULL);
}

static void test_line_and_name(void **state)
{
    fixture *f = *state;
    lmc_lookup_hash_log *log = open_log(f->dir, 3600, 1 << 20, 10);
    write_event(log, 1764437400.5, "req-1", 1);  /* 2025-11-29 17:30:00.5 UTC */
    write_event(log, 1764437401.0, "req-2", 2);
    lmc_lookup_hash_log_close(log);
    struct dirent **names;
    int n = list_logs(f->dir, &names);
    assert_int_equal(n, 1);
    assert_string_equal(names[0]->d_name, "lookup_hashes_20251129-173000.500000_000001.jsonl");
    json_t *line = read_first_line(f->dir, names[0]->d_name);
    assert_non_null(line);
    assert_true(json_real_value(json_object_get(line, "timestamp")) == 1764437400.5);
    assert_string_equal(json_string_value(json_object_get(line, "request_id")), "req-1");
    assert_string_equal(json_string_value(json_object_get(line, "session_id")), "req-1");
    assert_string_equal(json_string_value(json_object_get(line, "model_name")), "m");
    assert_int_equal(json_integer_value(json_object_get(line, "hit_chunks")), 1);
    assert_int_equal(json_integer_value(json_object_get(line, "requested_chunks")), 2);
    json_t *h = json_object_get(line, "hashes");
    assert_int_equal(json_array_size(h), 2);
    assert_string_equal(json_string_value(json_array_get(h, 1)), "bb02");
    json_decref(line);
    free_names(names, n);
}

static void test_rotation_by_size_keeps_newest(void **state)
{
    fixture *f = *state;
    /* Each line is > 100 bytes: a max size of 100 rotates before every
     * line after the first of a file. */
    lmc_lookup_hash_log *log = open_log(f->dir, 3600, 100, 3);
    char rid[16];
    for (int i = 0; i < 7; i++) {
        snprintf(rid, sizeof rid, "req-%d", i);
        write_event(log, 1000.0 + i * 0.001, rid, i);
    }
    lmc_lookup_hash_log_close(log);
    struct dirent **names;
    int n = list_logs(f->dir, &names);
    assert_int_equal(n, 3); /* 7 files written, the 4 oldest deleted */
    assert_non_null(strstr(names[0]->d_name, "_000005.jsonl"));
    assert_non_null(strstr(names[2]->d_name, "_000007.jsonl"));
    json_t *line = read_first_line(f->dir, names[0]->d_name);
    assert_string_equal(json_string_value(json_object_get(line, "request_id")), "req-4");
    json_decref(line);
    free_names(names, n);
}

static void test_rotation_by_interval(void **state)
{
    fixture *f = *state;
    lmc_lookup_hash_log *log = open_log(f->dir, 10, 1 << 20, 100);
    write_event(log, 2000.0, "a", 0);
    write_event(log, 2009.9, "b", 0);  /* same file */
    write_event(log, 2010.0, "c", 0);  /* 10 s after the file opened: new file */
    write_event(log, 2015.0, "d", 0);
    lmc_lookup_hash_log_close(log);
    struct dirent **names;
    int n = list_logs(f->dir, &names);
    assert_int_equal(n, 2);
    json_t *line = read_first_line(f->dir, names[1]->d_name);
    assert_string_equal(json_string_value(json_object_get(line, "request_id")), "c");
    json_decref(line);
    free_names(names, n);
}

static void test_foreign_files_untouched_and_bad_options(void **state)
{
    fixture *f = *state;
    char path[256];
    snprintf(path, sizeof path, "%s/notes.txt", f->dir);
    FILE *fp = fopen(path, "w");
    fputs("keep me\n", fp);
    fclose(fp);
    lmc_lookup_hash_log *log = open_log(f->dir, 3600, 1, 1);
    write_event(log, 1.0, "x", 0);
    write_event(log, 2.0, "y", 0);
    lmc_lookup_hash_log_close(log);
    assert_int_equal(access(path, F_OK), 0);
    lmc_lookup_hash_log_options bad = {.dir = f->dir, .rotation_interval = 1, .max_size = 1,
                                       .max_files = 0};
    char err[128];
    assert_null(lmc_lookup_hash_log_open(&bad, err, sizeof err));
    bad.max_files = 1;
    bad.dir = "";
    assert_null(lmc_lookup_hash_log_open(&bad, err, sizeof err));
}

static void test_subscriber_on_bus(void **state)
{
    fixture *f = *state;
    char sub[128];
    snprintf(sub, sizeof sub, "%s/a/b", f->dir); /* created on open */
    lmc_lookup_hash_log *log = open_log(sub, 3600, 1 << 20, 5);
    lmc_event_bus *bus = lmc_event_bus_new(64);
    assert_int_equal(lmc_lookup_hash_log_attach(log, bus), 0);
    lmc_event_bus_publish(bus, LMC_EVENT_STORE_END, "ignored", json_object());
    lmc_event ev = lookup_event(0, "bus-req", 2);
    lmc_event_bus_publish(bus, LMC_EVENT_LOOKUP_END, "bus-req", ev.metadata);
    assert_int_equal(lmc_event_bus_drain(bus, 5.0), 0);
    lmc_event_bus_free(bus);
    lmc_lookup_hash_log_close(log);
    struct dirent **names;
    int n = list_logs(sub, &names);
    assert_int_equal(n, 1);
    json_t *line = read_first_line(sub, names[0]->d_name);
    assert_string_equal(json_string_value(json_object_get(line, "session_id")), "bus-req");
    assert_true(json_real_value(json_object_get(line, "timestamp")) > 1.7e9);
    json_decref(line);
    free_names(names, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_line_and_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rotation_by_size_keeps_newest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rotation_by_interval, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_files_untouched_and_bad_options, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_subscriber_on_bus, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
