/* lmc_config_to_json (parsed back with jansson), lmc_config_l1_size_bytes,
 * and the random instance id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "config/config.h"

static char err[512];

static void parse_ok(lmc_config *cfg, const char *const *args)
{
    const char *argv[64] = {"lmcached"};
    int argc = 1;
    for (size_t i = 0; args[i]; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    lmc_config_status st = lmc_config_parse(cfg, argc, (char *const *)argv, NULL, NULL, err,
                                            sizeof err);
    if (st != LMC_CONFIG_OK)
        fail_msg("parse failed (%d): %s", st, err);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define LEGACY "--l1-size-gb", "1", "--eviction-policy", "LRU"

static json_t *render(const lmc_config *cfg)
{
    char *text = lmc_config_to_json(cfg);
    assert_non_null(text);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root)
        fail_msg("JSON does not parse back: %s", jerr.text);
    free(text);
    assert_true(json_is_object(root));
    return root;
}

static json_t *field(json_t *root, const char *group, const char *name)
{
    json_t *g = json_object_get(root, group);
    if (!json_is_object(g))
        fail_msg("group %s missing", group);
    json_t *v = json_object_get(g, name);
    if (!v)
        fail_msg("%s.%s missing", group, name);
    return v;
}

#define STR(root, g, n) json_string_value(field((root), (g), (n)))
#define INT(root, g, n) json_integer_value(field((root), (g), (n)))
#define REAL(root, g, n) json_real_value(field((root), (g), (n)))

static void test_json_defaults_mp(void **state)
{
    (void)state;
    lmc_config c;
    parse_ok(&c, ARGS(LEGACY));
    json_t *r = render(&c);
    assert_string_equal(STR(r, "mp_config", "host"), "localhost");
    assert_int_equal(INT(r, "mp_config", "port"), 5555);
    assert_int_equal(INT(r, "mp_config", "chunk_size"), 256);
    assert_int_equal(INT(r, "mp_config", "max_workers"), 1);
    assert_int_equal(INT(r, "mp_config", "max_gpu_workers"), 1);
    assert_int_equal(INT(r, "mp_config", "max_cpu_workers"), 1);
    assert_string_equal(STR(r, "mp_config", "hash_algorithm"), "blake3");
    assert_string_equal(STR(r, "mp_config", "engine_type"), "default");
    assert_true(json_is_true(field(r, "mp_config", "separate_object_groups")));
    assert_string_equal(STR(r, "mp_config", "supported_transfer_mode"), "auto");
    assert_true(json_is_null(field(r, "mp_config", "shm_name")));
    assert_string_equal(STR(r, "mp_config", "instance_id"), c.mp.instance_id);
    assert_true(json_is_real(field(r, "mp_config", "worker_reap_timeout_seconds")));
    assert_true(REAL(r, "mp_config", "worker_reap_timeout_seconds") == 120.0);
    assert_true(REAL(r, "mp_config", "worker_registration_grace_seconds") == 3600.0);
    assert_string_equal(STR(r, "mp_config", "log_level"), "INFO");
    assert_true(json_is_false(field(r, "mp_config", "rpc_error_frames")));
    assert_int_equal(json_array_size(field(r, "mp_config", "script_allowed_imports")), 0);
    json_decref(r);
    lmc_config_free(&c);
}

static void test_json_defaults_other_groups(void **state)
{
    (void)state;
    lmc_config c;
    parse_ok(&c, ARGS(LEGACY));
    json_t *r = render(&c);
    assert_true(REAL(r, "storage_manager_config", "l1_size_gb") == 1.0);
    assert_string_equal(STR(r, "storage_manager_config", "eviction_policy"), "LRU");
    assert_true(json_is_null(field(r, "storage_manager_config", "l2_prefetch_load_timeout")));
    assert_true(json_is_null(field(r, "storage_manager_config", "gds_l1_path")));
    assert_int_equal(json_array_size(field(r, "storage_manager_config", "l1_manager")), 0);
    assert_int_equal(INT(r, "storage_manager_config", "l1_align_bytes"), 4096);
    assert_true(json_is_null(field(r, "obs_config", "otlp_endpoint")));
    assert_int_equal(INT(r, "obs_config", "prometheus_port"), 9090);
    assert_true(REAL(r, "obs_config", "metrics_sample_rate") == 0.01);
    assert_string_equal(STR(r, "http_config", "http_host"), "0.0.0.0");
    assert_int_equal(INT(r, "http_config", "http_port"), 8080);
    assert_string_equal(STR(r, "coordinator_config", "coordinator_url"), "");
    assert_true(REAL(r, "coordinator_config", "coordinator_heartbeat_interval") == 5.0);
    assert_string_equal(STR(r, "p2p_config", "p2p_transfer_engine"), "nixl");
    assert_int_equal(INT(r, "p2p_config", "p2p_rdma_gid_index"), -1);
    json_t *extra = field(r, "runtime_plugin_config", "runtime_plugin_extra_config");
    assert_true(json_is_object(extra));
    assert_int_equal(json_object_size(extra), 0);
    assert_int_equal(json_object_size(r), 7);
    json_decref(r);
    lmc_config_free(&c);
}

/* Every flag shows up under its group with its documented name. */
static void test_json_has_every_flag(void **state)
{
    (void)state;
    lmc_config c;
    parse_ok(&c, ARGS(LEGACY));
    json_t *r = render(&c);
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    size_t total = 0;
    const char *key;
    json_t *g;
    for (size_t i = 0; i < n; i++)
        field(r, lmc_config_group_json(flags[i].group), flags[i].json_name);
    json_object_foreach(r, key, g)
        total += json_object_size(g);
    assert_int_equal(total, n); /* and nothing else */
    json_decref(r);
    lmc_config_free(&c);
}

static void test_json_set_values(void **state)
{
    (void)state;
    lmc_config c;
    parse_ok(&c, ARGS(LEGACY, "--shm-name", "", "--l2-adapter",
                      "{\"type\":\"fs\",\"base_path\":\"/tmp/l2\"}", "--runtime-plugin-config",
                      "{\"a\":{\"b\":[1,2]}}", "--script-allowed-imports", "math", "json",
                      "--l2-prefetch-load-timeout", "2.5", "--trace-level", "events",
                      "--max-workers", "3", "--rpc-error-frames"));
    json_t *r = render(&c);
    assert_string_equal(STR(r, "mp_config", "shm_name"), "");
    json_t *l2 = field(r, "storage_manager_config", "l2_adapter");
    assert_int_equal(json_array_size(l2), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(l2, 0), "base_path")),
                        "/tmp/l2");
    json_t *extra = field(r, "runtime_plugin_config", "runtime_plugin_extra_config");
    assert_int_equal(json_integer_value(json_array_get(
                         json_object_get(json_object_get(extra, "a"), "b"), 1)),
                     2);
    json_t *imports = field(r, "mp_config", "script_allowed_imports");
    assert_string_equal(json_string_value(json_array_get(imports, 1)), "json");
    assert_true(REAL(r, "storage_manager_config", "l2_prefetch_load_timeout") == 2.5);
    assert_string_equal(STR(r, "obs_config", "trace_level"), "events");
    assert_int_equal(INT(r, "mp_config", "max_cpu_workers"), 3);
    assert_true(json_is_true(field(r, "mp_config", "rpc_error_frames")));
    json_decref(r);
    lmc_config_free(&c);
}

/* A token never leaves the config: "***" when set, null when not
 * (docs/configuration.md, "HTTP Frontend"). */
static void test_json_secret_redacted(void **state)
{
    (void)state;
    lmc_config c;
    parse_ok(&c, ARGS(LEGACY));
    json_t *r = render(&c);
    assert_true(json_is_null(field(r, "http_config", "http_auth_token")));
    assert_int_equal(INT(r, "http_config", "http_max_buffered_mb"), 2048);
    json_decref(r);
    lmc_config_free(&c);
    parse_ok(&c, ARGS(LEGACY, "--http-auth-token", "very-secret-value"));
    char *text = lmc_config_to_json(&c);
    assert_non_null(text);
    assert_null(strstr(text, "very-secret-value"));
    free(text);
    r = render(&c);
    assert_string_equal(STR(r, "http_config", "http_auth_token"), "***");
    json_decref(r);
    lmc_config_free(&c);
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) /* the renderer reads secrets as strings */
        if (flags[i].flags & LMC_FF_SECRET)
            assert_true(flags[i].kind == LMC_FK_STR || flags[i].kind == LMC_FK_NSTR);
}

static void test_json_l1_manager_embedded(void **state)
{
    (void)state;
    lmc_config c;
    parse_ok(&c, ARGS("--eviction-policy", "ARC", "--l1-manager",
                      "{\"type\":\"DRAM\",\"tag\":\"m\",\"size_gb\":2}", "--l1-manager",
                      "{\"type\":\"DEVDAX\",\"tag\":\"d\",\"size_gb\":8,\"path\":\"/dev/dax\"}"));
    json_t *r = render(&c);
    json_t *l1 = field(r, "storage_manager_config", "l1_manager");
    assert_int_equal(json_array_size(l1), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(l1, 1), "path")),
                        "/dev/dax");
    assert_true(json_is_null(field(r, "storage_manager_config", "l1_size_gb")));
    json_decref(r);
    lmc_config_free(&c);
}

static void test_l1_size_bytes(void **state)
{
    (void)state;
    lmc_config c;
    parse_ok(&c, ARGS("--l1-size-gb", "2.5", "--eviction-policy", "LRU"));
    assert_int_equal(lmc_config_l1_size_bytes(&c), 2684354560ULL);
    lmc_config_free(&c);
    parse_ok(&c, ARGS("--eviction-policy", "LRU", "--l1-manager",
                      "{\"type\":\"DRAM\",\"tag\":\"a\",\"size_gb\":4}", "--l1-manager",
                      "{\"type\":\"DRAM\",\"tag\":\"b\",\"size_gb\":1}"));
    assert_int_equal(lmc_config_l1_size_bytes(&c), 4ULL << 30);
    lmc_config_free(&c);
    assert_int_equal(lmc_config_init_defaults(&c), 0);
    assert_int_equal(lmc_config_l1_size_bytes(&c), 0);
    lmc_config_free(&c);
}

static void assert_uuid4(const char *id)
{
    assert_non_null(id);
    assert_int_equal(strlen(id), 36);
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            assert_int_equal(id[i], '-');
            continue;
        }
        if (!strchr("0123456789abcdef", id[i]))
            fail_msg("non lower-case hex '%c' in %s", id[i], id);
    }
    assert_int_equal(id[14], '4');
    assert_non_null(strchr("89ab", id[19]));
}

static void test_instance_id(void **state)
{
    (void)state;
    lmc_config a, b, d;
    parse_ok(&a, ARGS(LEGACY));
    parse_ok(&b, ARGS(LEGACY));
    assert_uuid4(a.mp.instance_id);
    assert_uuid4(b.mp.instance_id);
    assert_string_not_equal(a.mp.instance_id, b.mp.instance_id);
    assert_int_equal(lmc_config_init_defaults(&d), 0);
    assert_uuid4(d.mp.instance_id);
    assert_string_not_equal(a.mp.instance_id, d.mp.instance_id);
    lmc_config_free(&a);
    lmc_config_free(&b);
    lmc_config_free(&d);
    parse_ok(&a, ARGS(LEGACY, "--instance-id", "worker-7"));
    assert_string_equal(a.mp.instance_id, "worker-7");
    lmc_config_free(&a);
}

static void test_group_names(void **state)
{
    (void)state;
    assert_string_equal(lmc_config_group_json(LMC_FG_MP), "mp_config");
    assert_string_equal(lmc_config_group_json(LMC_FG_L1), "storage_manager_config");
    assert_string_equal(lmc_config_group_json(LMC_FG_L2), "storage_manager_config");
    assert_string_equal(lmc_config_group_json(LMC_FG_OBS), "obs_config");
    assert_string_equal(lmc_config_group_title(LMC_FG_HTTP), "HTTP Frontend");
    assert_string_equal(lmc_config_group_title(LMC_FG_COORD), "Coordinator");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_defaults_mp),
        cmocka_unit_test(test_json_defaults_other_groups),
        cmocka_unit_test(test_json_has_every_flag),
        cmocka_unit_test(test_json_set_values),
        cmocka_unit_test(test_json_l1_manager_embedded),
        cmocka_unit_test(test_json_secret_redacted),
        cmocka_unit_test(test_l1_size_bytes),
        cmocka_unit_test(test_instance_id),
        cmocka_unit_test(test_group_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
