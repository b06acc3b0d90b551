/* LMCACHE_MP_COORDINATOR_* parsing (docs/coordinator.md, "Configuration"):
 * defaults, invalid numbers replaced by defaults, refusals by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "coordinator/coordinator.h"

#define P "LMCACHE_MP_COORDINATOR_"

extern char **environ;

/* Every variable of the family removed before each test. */
static int clean_env(void **state)
{
    (void)state;
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
    lmc_coord_config c;
    char err[256];
    assert_int_equal(lmc_coord_config_from_env(&c, err, sizeof err), 0);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 9300);
    assert_true(c.instance_timeout_s == 30 && c.health_check_interval_s == 10);
    assert_true(c.eviction_check_interval_s == 5 && c.eviction_ratio == 0.2);
    assert_true(c.trigger_watermark == 1.0);
    assert_int_equal(c.chunk_size, 256);
    assert_string_equal(c.hash_algorithm, "blake3");
    assert_true(c.enable_startup_resync && c.metrics_enabled);
    assert_int_equal(c.resync_page_size, 1000);
    assert_string_equal(c.db_path, "./lmcached-coordinator.db");
    assert_string_equal(c.auth_token, "");
}

static void test_values_and_invalid_numbers(void **state)
{
    (void)state;
    setenv(P "PORT", "9400", 1);
    setenv(P "EVICTION_RATIO", "0.5", 1);
    setenv(P "TRIGGER_WATERMARK", "0", 1);     /* must be > 0: default */
    setenv(P "INSTANCE_TIMEOUT", "abc", 1);    /* not a number: default */
    setenv(P "HEALTH_CHECK_INTERVAL", "0", 1); /* 0 disables: allowed */
    setenv(P "CHUNK_SIZE", "16", 1);
    setenv(P "ENABLE_STARTUP_RESYNC", "off", 1);
    setenv(P "METRICS_ENABLED", "maybe", 1);   /* not a boolean: default */
    setenv(P "DB_PATH", "/tmp/x.db", 1);
    setenv(P "AUTH_TOKEN", "s3cret", 1);
    setenv(P "RESYNC_PAGE_SIZE", "100000", 1); /* over 5000: default */
    lmc_coord_config c;
    char err[256];
    assert_int_equal(lmc_coord_config_from_env(&c, err, sizeof err), 0);
    assert_int_equal(c.port, 9400);
    assert_true(c.eviction_ratio == 0.5);
    assert_true(c.trigger_watermark == 1.0);
    assert_true(c.instance_timeout_s == 30);
    assert_true(c.health_check_interval_s == 0);
    assert_int_equal(c.chunk_size, 16);
    assert_false(c.enable_startup_resync);
    assert_true(c.metrics_enabled);
    assert_string_equal(c.db_path, "/tmp/x.db");
    assert_string_equal(c.auth_token, "s3cret");
    assert_int_equal(c.resync_page_size, 1000);
}

static void refused(const char *name, const char *value)
{
    clean_env(NULL);
    setenv(name, value, 1);
    lmc_coord_config c;
    char err[256] = "";
    assert_int_equal(lmc_coord_config_from_env(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, name));
    unsetenv(name);
}

static void test_refusals_name_the_variable(void **state)
{
    (void)state;
    refused(P "ENABLE_BLEND_LOOKUP", "true");
    refused(P "OTLP_ENDPOINT", "http://collector:4317");
    refused(P "BLEND_PROBE_STRIDE", "2");
    refused(P "SHARED_L1_PORT", "9400");
    refused(P "DB_PATH", "");
    /* Off is not a refusal. */
    setenv(P "ENABLE_BLEND_LOOKUP", "false", 1);
    setenv(P "OTLP_ENDPOINT", "", 1);
    lmc_coord_config c;
    char err[256];
    assert_int_equal(lmc_coord_config_from_env(&c, err, sizeof err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clean_env),
        cmocka_unit_test_setup(test_values_and_invalid_numbers, clean_env),
        cmocka_unit_test_setup(test_refusals_name_the_variable, clean_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
