/* LMCACHE_MP_COORDINATOR_* parsing (docs/coordinator.md, "Configuration"):
 * defaults, values, and every refusal naming its variable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "coordinator/coordinator.h"

#define P "LMCACHE_MP_COORDINATOR_"

extern char **environ;

/* Every variable of the family removed before each test, and the
 * database's default place put under /tmp. */
static int clean_env(void **state)
{
    (void)state;
    unsetenv("STATE_DIRECTORY");
    unsetenv("XDG_STATE_HOME");
    setenv("HOME", "/tmp/lmc-coord-config-home", 1);
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; e && *e; e++) {
            if (strncmp(*e, P, strlen(P)) == 0) {
                char name[256];
                size_t n = strcspn(*e, "=");
                memcpy(name, *e, n);
                name[n] = '\0';
                unsetenv(name);
                again = 1;
                break;
            }
        }
    }
    return 0;
}

static void test_defaults(void **state)
{
    (void)state;
    coordinator_config c;
    char err[256];
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 9300);
    assert_true(c.instance_timeout_s == 30 && c.health_check_interval_s == 10);
    assert_true(c.eviction_check_interval_s == 5 && c.eviction_ratio == 0.2);
    assert_true(c.trigger_watermark == 1.0);
    assert_int_equal(c.chunk_size, 256);
    assert_string_equal(c.hash_algorithm, "blake3");
    assert_true(c.enable_startup_resync && c.metrics_enabled);
    assert_int_equal(c.resync_page_size, 1000);
    assert_string_equal(c.db_path, "/tmp/lmc-coord-config-home/.local/state/lmcached/coordinator.db");
    assert_true(c.db_dir_create);
    assert_string_equal(c.auth_token, "");
}

static void test_values(void **state)
{
    (void)state;
    setenv(P "PORT", "9400", 1);
    setenv(P "EVICTION_RATIO", "0.5", 1);
    setenv(P "TRIGGER_WATERMARK", "0.9", 1);
    setenv(P "INSTANCE_TIMEOUT", "12.5", 1);
    setenv(P "HEALTH_CHECK_INTERVAL", "0", 1); /* 0 disables: allowed */
    setenv(P "CHUNK_SIZE", "16", 1);
    setenv(P "ENABLE_STARTUP_RESYNC", "off", 1);
    setenv(P "METRICS_ENABLED", "YES", 1);
    setenv(P "DB_PATH", "/tmp/x.db", 1);
    setenv(P "AUTH_TOKEN", "s3cret", 1);
    setenv(P "RESYNC_PAGE_SIZE", "5000", 1);
    setenv(P "HASH_ALGORITHM", "sha256_cbor", 1);
    coordinator_config c;
    char err[256];
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
    assert_int_equal(c.port, 9400);
    assert_true(c.eviction_ratio == 0.5);
    assert_true(c.trigger_watermark == 0.9);
    assert_true(c.instance_timeout_s == 12.5);
    assert_true(c.health_check_interval_s == 0);
    assert_int_equal(c.chunk_size, 16);
    assert_false(c.enable_startup_resync);
    assert_true(c.metrics_enabled);
    assert_string_equal(c.db_path, "/tmp/x.db");
    assert_string_equal(c.auth_token, "s3cret");
    assert_int_equal(c.resync_page_size, 5000);
    assert_string_equal(c.hash_algorithm, "sha256_cbor");
}

/* The refusal names the variable (and `why`, a part of the reason). */
static void refused_because(const char *name, const char *value, const char *why)
{
    clean_env(NULL);
    setenv(name, value, 1);
    coordinator_config c;
    char err[512] = "";
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), -1);
    if (!strstr(err, name) || (why && !strstr(err, why)))
        fail_msg("%s=%.40s: '%s' does not name the variable or say '%s'", name, value, err,
                 why ? why : "");
    unsetenv(name);
}

static void refused(const char *name, const char *value)
{
    refused_because(name, value, NULL);
}

/* Issue 29: values that do not parse or are out of range were logged and
 * replaced by the default: a coordinator on a port nobody asked for.  Each
 * is refused now, naming the variable. */
static void test_bad_values_are_refused(void **state)
{
    (void)state;
    refused_because(P "PORT", "70000", "not an integer in 0..65535");
    refused_because(P "PORT", "93OO", "not an integer");
    refused_because(P "PORT", "", "not an integer");
    refused_because(P "PORT", "-1", "not an integer");
    refused_because(P "EVICTION_RATIO", "1.5", "not a number in 0..1");
    refused_because(P "EVICTION_RATIO", "nan", "not a number in 0..1");
    refused_because(P "EVICTION_RATIO", "0,2", "not a number in 0..1");
    refused_because(P "TRIGGER_WATERMARK", "0", "not a number in (0, 1]");
    refused_because(P "INSTANCE_TIMEOUT", "abc", "not a number > 0");
    refused_because(P "HEALTH_CHECK_INTERVAL", "-5", "not a number >= 0");
    refused_because(P "CHUNK_SIZE", "0", "not an integer in 1..1048576");
    refused_because(P "RESYNC_PAGE_SIZE", "100000", "not an integer in 1..5000");
    refused_because(P "METRICS_ENABLED", "maybe", "not a boolean");
    refused_because(P "ENABLE_STARTUP_RESYNC", "2", "not a boolean");
    refused_because(P "HASH_ALGORITHM", "md5", NULL);
    refused_because(P "HASH_ALGORITHM", "BLAKE3", NULL); /* exact, as --hash-algorithm */
}

/* A value longer than its setting holds is refused, not cut. */
static void test_overlong_values_are_refused(void **state)
{
    (void)state;
    static char value[8192];
    memset(value, 'h', sizeof value - 1);
    refused_because(P "HOST", value, "longer than 255 bytes");
    refused_because(P "DB_PATH", value, "longer than 4095 bytes");
    refused_because(P "AUTH_TOKEN", value, "longer than 1023 bytes");
    refused_because(P "SERVER_AUTH_TOKEN", value, "longer than 1023 bytes");
    refused_because(P "HASH_ALGORITHM", value, "longer than 31 bytes");
    memset(value, '7', sizeof value - 1);
    refused_because(P "PORT", value, "not an integer");
    refused_because(P "EVICTION_RATIO", value, "not a number in 0..1");
}

/* A database path that cannot be opened is refused at start, naming the
 * variable, before any port is bound. */
static void test_unopenable_database_is_refused_at_start(void **state)
{
    (void)state;
    const char *paths[] = {"/nonexistent-dir/sub/coord.db", "/proc/version", "/"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        coordinator_config c;
        coordinator_config_defaults(&c);
        snprintf(c.host, sizeof c.host, "127.0.0.1");
        c.port = 0;
        c.enable_startup_resync = false;
        snprintf(c.db_path, sizeof c.db_path, "%s", paths[i]);
        lmc_coord *co = NULL;
        char err[512] = "";
        assert_int_equal(coordinator_start(&c, &co, err, sizeof err), -1);
        assert_null(co);
        if (!strstr(err, P "DB_PATH"))
            fail_msg("DB_PATH=%s: '%s' does not name the variable", paths[i], err);
    }
}

static void test_refusals_name_the_variable(void **state)
{
    (void)state;
    refused(P "ENABLE_BLEND_LOOKUP", "maybe");
    refused(P "OTLP_ENDPOINT", "http://collector:4317");
    refused(P "BLEND_PROBE_STRIDE", "0");
    refused(P "MAX_BLEND_CHUNKS", "0");
    refused(P "SHARED_L1_PORT", "9400");
    refused(P "DB_PATH", "");
    /* Off is not a refusal; the fleet fragment index is served (issue 35). */
    setenv(P "ENABLE_BLEND_LOOKUP", "true", 1);
    setenv(P "BLEND_PROBE_STRIDE", "2", 1);
    setenv(P "OTLP_ENDPOINT", "", 1);
    coordinator_config c;
    char err[256];
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
}

/* Issue 31: the default database landed in the working directory (a
 * stray lmcached-coordinator.db in a checkout).  It goes to systemd's
 * state directory, else the XDG one; DB_PATH still wins. */
static void test_default_database_place(void **state)
{
    (void)state;
    coordinator_config c;
    char err[512];
    setenv("XDG_STATE_HOME", "/var/xdg", 1);
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
    assert_string_equal(c.db_path, "/var/xdg/lmcached/coordinator.db");
    assert_true(c.db_dir_create);
    setenv("XDG_STATE_HOME", "relative", 1); /* ignored, as XDG says */
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
    assert_string_equal(c.db_path, "/tmp/lmc-coord-config-home/.local/state/lmcached/coordinator.db");
    setenv("STATE_DIRECTORY", "/var/lib/lmcache:/var/lib/other", 1);
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
    assert_string_equal(c.db_path, "/var/lib/lmcache/coordinator.db");
    assert_false(c.db_dir_create); /* systemd made it */
    setenv(P "DB_PATH", "/tmp/x.db", 1);
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
    assert_string_equal(c.db_path, "/tmp/x.db");
    assert_false(c.db_dir_create);
    unsetenv(P "DB_PATH");
    unsetenv("STATE_DIRECTORY");
    unsetenv("XDG_STATE_HOME");
    unsetenv("HOME");
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, P "DB_PATH"));
}

static const char *write_file(const char *text)
{
    static char path[] = "/tmp/lmc-coord-config-XXXXXX.json";
    snprintf(path, sizeof path, "/tmp/lmc-coord-config-XXXXXX.json");
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* --config FILE: the settings' names in lower case; the environment wins. */
static void test_config_file(void **state)
{
    (void)state;
    const char *f = write_file("{\"port\": 9555, \"eviction_ratio\": 0.5, \"db_path\": \"/tmp/f.db\", "
                               "\"metrics_enabled\": false, \"auth_token\": \"t\", \"max_keys\": 7, "
                               "\"instance_timeout\": 3}");
    setenv(P "EVICTION_RATIO", "0.25", 1);
    coordinator_config c;
    char err[8192];
    assert_int_equal(coordinator_config_load(&c, f, err, sizeof err), 0);
    assert_int_equal(c.port, 9555);
    assert_true(c.eviction_ratio == 0.25);
    assert_string_equal(c.db_path, "/tmp/f.db");
    assert_false(c.metrics_enabled || c.db_dir_create);
    assert_string_equal(c.auth_token, "t");
    assert_int_equal(c.max_keys, 7);
    assert_true(c.instance_timeout_s == 3);
    unlink(f);
}

static void file_refused(const char *text, const char *why1, const char *why2)
{
    const char *f = write_file(text);
    coordinator_config c;
    char err[8192] = "";
    assert_int_equal(coordinator_config_load(&c, f, err, sizeof err), -1);
    if (!strstr(err, f) || !strstr(err, why1) || (why2 && !strstr(err, why2)))
        fail_msg("%s: '%s' does not name the file or say '%s' '%s'", text, err, why1,
                 why2 ? why2 : "");
    unlink(f);
}

static void test_config_file_refusals(void **state)
{
    (void)state;
    file_refused("{\"prot\": 1}", "unknown key \"prot\"", NULL);
    file_refused("{\"PORT\": 1}", "unknown key \"PORT\"", NULL);
    file_refused("{\"port\": \"9300\"}", "\"port\" must be an integer", NULL);
    file_refused("{\"port\": 9300.5}", "\"port\" must be an integer", NULL);
    file_refused("{\"eviction_ratio\": true}", "\"eviction_ratio\" must be a number", NULL);
    file_refused("{\"metrics_enabled\": 1}", "\"metrics_enabled\" must be a boolean", NULL);
    file_refused("{\"host\": null}", "\"host\" must be a string", NULL);
    file_refused("{\"port\": 70000}", "port=70000", "not an integer in 0..65535");
    file_refused("{\"eviction_ratio\": 2}", "eviction_ratio=2", "not a number in 0..1");
    file_refused("{\"hash_algorithm\": \"md5\"}", "hash_algorithm=md5", NULL);
    file_refused("{\"db_path\": \"\"}", "db_path must not be empty", NULL);
    file_refused("{\"blend_probe_stride\": 0}", "blend_probe_stride=0", NULL);
    file_refused("{\"max_blend_chunks\": 16777217}", "max_blend_chunks=16777217", NULL);
    file_refused("{\"otlp_endpoint\": \"http://x\"}", "otlp_endpoint", "not implemented");
    file_refused("{\"port\": 1, \"port\": 2}", "duplicate", NULL);
    file_refused("[1]", "must be a JSON object", NULL);
    file_refused("{\"port\": ", "--config", NULL);
    coordinator_config c;
    char err[8192] = "";
    assert_int_equal(coordinator_config_load(&c, "/nonexistent/c.json", err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/c.json"));
}

/* --print-config: every setting, the tokens redacted. */
static void test_print_config(void **state)
{
    (void)state;
    setenv(P "AUTH_TOKEN", "s3cret", 1);
    setenv(P "PORT", "9401", 1);
    coordinator_config c;
    char err[512];
    assert_int_equal(coordinator_config_from_env(&c, err, sizeof err), 0);
    char *text = coordinator_config_print(&c);
    assert_non_null(text);
    assert_null(strstr(text, "s3cret"));
    assert_non_null(strstr(text, "\"auth_token\": \"***\""));
    assert_non_null(strstr(text, "\"server_auth_token\": \"\""));
    assert_non_null(strstr(text, "\"port\": 9401"));
    assert_non_null(strstr(text, "\"eviction_ratio\": 0.2,"));
    static const char *const keys[] = {
        "host", "port", "instance_timeout", "health_check_interval", "eviction_check_interval",
        "eviction_ratio", "trigger_watermark", "chunk_size", "hash_algorithm",
        "enable_startup_resync", "resync_poll_interval", "resync_max_wait", "resync_page_size",
        "timeout_keep_alive", "metrics_enabled", "otlp_endpoint", "enable_blend_lookup", "blend_probe_stride", "max_blend_chunks",
        "db_path", "server_auth_token", "max_keys", "max_buffered_mb"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char q[64];
        snprintf(q, sizeof q, "\"%s\":", keys[i]);
        if (!strstr(text, q))
            fail_msg("--print-config lacks %s: %s", keys[i], text);
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clean_env),
        cmocka_unit_test_setup(test_values, clean_env),
        cmocka_unit_test_setup(test_bad_values_are_refused, clean_env),
        cmocka_unit_test_setup(test_overlong_values_are_refused, clean_env),
        cmocka_unit_test_setup(test_unopenable_database_is_refused_at_start, clean_env),
        cmocka_unit_test_setup(test_refusals_name_the_variable, clean_env),
        cmocka_unit_test_setup(test_default_database_place, clean_env),
        cmocka_unit_test_setup(test_config_file, clean_env),
        cmocka_unit_test_setup(test_config_file_refusals, clean_env),
        cmocka_unit_test_setup(test_print_config, clean_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
