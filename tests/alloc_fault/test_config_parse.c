/* Allocation failures in configuration parsing (src/config): a command
 * line with --l1-manager and --l2-adapter JSON, list flags and environment
 * fallbacks; a command line that must be rejected however memory goes; and
 * the JSON rendering of a configuration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "config/config.h"

#define L1_FAST "{\"type\": \"DRAM\", \"tag\": \"fast\", \"size_gb\": 2, \"eviction\": " \
                "{\"eviction_policy\": \"LRU\", \"trigger_watermark\": 0.9}}"
#define L1_DEFAULT "{\"type\": \"DRAM\", \"size_gb\": 1, \"use_lazy\": false, " \
                   "\"shm_name\": \"lmc-test\"}"
#define L2_FS "{\"type\": \"fs\", \"base_path\": \"/tmp/l2\", \"affinity_tag\": \"fast\", " \
              "\"num_workers\": 2, \"eviction\": {\"eviction_policy\": \"LRU\"}}"
#define L2_FAULT "{\"type\": \"fault_inject\", \"fail_rate\": 0.1, \"inner\": " \
                 "{\"type\": \"mock\", \"num_workers\": 1}}"

static char *const argv_ok[] = {
    "lmcached", "--l1-manager", L1_FAST, "--l1-manager=" L1_DEFAULT, "--eviction-policy", "LRU",
    "--l2-adapter", L2_FS, "--l2-adapter", L2_FAULT, "--host", "0.0.0.0", "--port=6000",
    "--runtime-plugin-locations", "/opt/a", "/opt/b", "--runtime-plugin-config",
    "{\"k\": [1, 2, {\"n\": null}]}", "--script-allowed-imports", "json", "math",
    "--no-http", "--log-level", "warn", "--metrics-sample-rate", "0.5", NULL,
};
static char *const envp_ok[] = {
    "LMCACHE_COORDINATOR_URL=http://coord:9000", "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL=2.5",
    "PATH=/usr/bin", NULL,
};

/* P2P needs a single DRAM L1: this must never pass, out of memory or not. */
static char *const argv_bad[] = {
    "lmcached", "--l1-manager",
    "{\"type\": \"DEVDAX\", \"tag\": \"pmem\", \"size_gb\": 1, \"path\": \"/dev/dax0.0\", "
    "\"eviction\": {\"eviction_policy\": \"LRU\"}}",
    "--p2p-advertise-url", "tcp://10.0.0.1:7000", "--coordinator-url", "http://coord:9000",
    NULL,
};

static int argc_of(char *const *argv)
{
    int n = 0;
    while (argv[n])
        n++;
    return n;
}

/* "nothing that needs freeing": lmc_config_free() zeroes the struct. */
static bool all_zero(const lmc_config *cfg)
{
    const unsigned char *p = (const unsigned char *)cfg;
    for (size_t i = 0; i < sizeof *cfg; i++)
        if (p[i])
            return false;
    return true;
}

/* A failed parse under an injected failure: an error that says memory, on
 * one line, and an empty config. */
static int failed_parse(lmc_config_status st, const lmc_config *cfg, const char *err)
{
    if (st != LMC_CONFIG_ERROR)
        return lmc_fault_violation("parse returned %d", (int)st);
    if (!all_zero(cfg))
        return lmc_fault_violation("a failed parse left the config non-empty");
    if (strchr(err, '\n'))
        return lmc_fault_violation("error is not one line: %s", err);
    if (!lmc_fault_fired())
        return lmc_fault_violation("parse failed with memory left: %s", err);
    if (!strstr(err, "memory"))
        return lmc_fault_violation("an allocation failure was reported as '%s'", err);
    return LMC_FAULT_ERROR;
}

static bool list_is(const lmc_strlist *l, size_t n, const char *const *want)
{
    if (l->count != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(l->items[i], want[i]) != 0)
            return false;
    return true;
}

static int scenario_parse(void *arg)
{
    (void)arg;
    lmc_config cfg;
    char err[512] = "";
    lmc_config_status st = lmc_config_parse(&cfg, argc_of(argv_ok), argv_ok, envp_ok, NULL, err,
                                            sizeof err);
    if (st != LMC_CONFIG_OK)
        return failed_parse(st, &cfg, err);
    int rc = LMC_FAULT_OK;
    const lmc_storage_config *s = &cfg.storage;
    if (!list_is(&s->l1_manager_json, 2, (const char *const[]){L1_FAST, L1_DEFAULT}) ||
        !list_is(&s->l2_adapter_json, 2, (const char *const[]){L2_FS, L2_FAULT}) ||
        !list_is(&cfg.plugins.locations, 2, (const char *const[]){"/opt/a", "/opt/b"}) ||
        !list_is(&cfg.mp.script_allowed_imports, 2, (const char *const[]){"json", "math"}))
        rc = lmc_fault_violation("a list flag came out wrong");
    else if (strcmp(cfg.mp.host, "0.0.0.0") != 0 || cfg.mp.port != 6000 || cfg.http.enabled ||
             strcmp(cfg.mp.log_level, "WARNING") != 0 || cfg.obs.metrics_sample_rate != 0.5 ||
             strcmp(cfg.coordinator.url, "http://coord:9000") != 0 ||
             cfg.coordinator.heartbeat_interval != 2.5 || !cfg.mp.instance_id ||
             strlen(cfg.mp.instance_id) != 36 || strcmp(cfg.storage.eviction_policy, "LRU") != 0)
        rc = lmc_fault_violation("a scalar flag came out wrong");
    lmc_config_free(&cfg);
    return rc;
}

static int scenario_reject(void *arg)
{
    (void)arg;
    lmc_config cfg;
    char err[512] = "";
    lmc_config_status st = lmc_config_parse(&cfg, argc_of(argv_bad), argv_bad, NULL, NULL, err,
                                            sizeof err);
    if (st == LMC_CONFIG_OK) {
        lmc_config_free(&cfg);
        return lmc_fault_violation("P2P with a DEVDAX L1 was accepted");
    }
    if (st == LMC_CONFIG_ERROR && strstr(err, "DRAM") && all_zero(&cfg))
        return lmc_fault_fired() ? LMC_FAULT_ERROR : LMC_FAULT_OK; /* the real reason */
    return failed_parse(st, &cfg, err);
}

/* ---- rendering ---------------------------------------------------------- */

typedef struct {
    lmc_config cfg;
    char *want;          /* the text with nothing failing */
} render_fixture;

static int scenario_to_json(void *arg)
{
    const render_fixture *fx = arg;
    char *text = lmc_config_to_json(&fx->cfg);
    if (!text)
        return lmc_fault_fired() ? LMC_FAULT_ERROR
                                 : lmc_fault_violation("to_json failed with memory left");
    int rc = strcmp(text, fx->want) == 0
                 ? LMC_FAULT_OK
                 : lmc_fault_violation("to_json gave a different text (%zu bytes, want %zu)",
                                       strlen(text), strlen(fx->want));
    free(text);
    return rc;
}

/* ---- cmocka ----------------------------------------------------------------- */

static void test_parse(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("config.parse", scenario_parse, NULL, NULL, 0), 0);
}

static void test_reject(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("config.reject", scenario_reject, NULL, NULL, 0), 0);
}

static void test_to_json(void **state)
{
    (void)state;
    static render_fixture fx;
    char err[512];
    assert_int_equal(lmc_config_parse(&fx.cfg, argc_of(argv_ok), argv_ok, envp_ok, NULL, err,
                                      sizeof err),
                     LMC_CONFIG_OK);
    fx.want = lmc_config_to_json(&fx.cfg);
    assert_non_null(fx.want);
    int problems = lmc_fault_run("config.to_json", scenario_to_json, &fx, NULL, 0);
    free(fx.want);
    lmc_config_free(&fx.cfg);
    assert_int_equal(problems, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_reject),
        cmocka_unit_test(test_to_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
