/* Validation rules: each one accepted at its edge and rejected with a
 * one-line message naming the flag (and the bad value). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"

static char err[512];

/* `legacy` prepends --l1-size-gb 1 --eviction-policy LRU. */
static lmc_config_status run(char *const *envp, bool legacy, const char *const *args)
{
    const char *argv[128] = {"lmcached"};
    int argc = 1;
    if (legacy) {
        argv[argc++] = "--l1-size-gb";
        argv[argc++] = "1";
        argv[argc++] = "--eviction-policy";
        argv[argc++] = "LRU";
    }
    for (size_t i = 0; args[i]; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    err[0] = '\0';
    lmc_config c;
    lmc_config_status st = lmc_config_parse(&c, argc, (char *const *)argv, envp, NULL, err,
                                            sizeof err);
    if (st == LMC_CONFIG_OK)
        lmc_config_free(&c);
    else
        assert_null(c.mp.instance_id); /* nothing to free after an error */
    if (st == LMC_CONFIG_ERROR)
        assert_null(strchr(err, '\n'));
    return st;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect_err(lmc_config_status st, const char *needle)
{
    if (st != LMC_CONFIG_ERROR)
        fail_msg("expected an error containing '%s', got status %d", needle, st);
    if (!strstr(err, needle))
        fail_msg("error '%s' lacks '%s'", err, needle);
}

static void expect_ok(lmc_config_status st)
{
    if (st != LMC_CONFIG_OK)
        fail_msg("expected OK, got %d: %s", st, err);
}

#define OK(...) expect_ok(run(NULL, true, ARGS(__VA_ARGS__)))
#define ERR(needle, ...) expect_err(run(NULL, true, ARGS(__VA_ARGS__)), (needle))
#define MGR_OK(...) expect_ok(run(NULL, false, ARGS(__VA_ARGS__)))
#define MGR_ERR(needle, ...) expect_err(run(NULL, false, ARGS(__VA_ARGS__)), (needle))

/* ------------------------------------------------------------- MP server */

static void test_reap_timeout(void **state)
{
    (void)state;
    OK("--worker-reap-timeout-seconds", "0");
    OK("--worker-reap-timeout-seconds", "30");
    ERR("--worker-reap-timeout-seconds: must be 0 (disabled) or >= 30, got 10",
        "--worker-reap-timeout-seconds", "10");
    ERR("--worker-reap-timeout-seconds: must be 0 (disabled) or >= 30, got 29.9",
        "--worker-reap-timeout-seconds", "29.9");
    ERR("--worker-reap-timeout-seconds", "--worker-reap-timeout-seconds", "-1");
    ERR("--hash-memo-mb", "--hash-memo-mb", "-1");
    ERR("--hash-memo-mb", "--hash-memo-mb", "65537");
    ERR("got inf", "--worker-reap-timeout-seconds", "inf");
    ERR("--worker-reap-timeout-seconds", "--worker-reap-timeout-seconds", "nan");
}

static void test_registration_grace(void **state)
{
    (void)state;
    OK("--worker-reap-timeout-seconds", "60", "--worker-registration-grace-seconds", "60");
    OK("--worker-reap-timeout-seconds", "0", "--worker-registration-grace-seconds", "0");
    ERR("--worker-registration-grace-seconds: must be finite and >= "
        "--worker-reap-timeout-seconds (120), got 100",
        "--worker-registration-grace-seconds", "100");
    ERR("--worker-registration-grace-seconds", "--worker-registration-grace-seconds", "inf");
}

static void test_hash_builtin(void **state)
{
    (void)state;
    OK("--hash-algorithm", "sha256_cbor");
    OK("--hash-algorithm", "blake3");
    ERR("--hash-algorithm: 'builtin' is not supported", "--hash-algorithm", "builtin");
    assert_non_null(strstr(err, "CPython"));
}

static void test_engine_transfer_mode(void **state)
{
    (void)state;
    OK("--engine-type", "default", "--supported-transfer-mode", "engine_driven");
    OK("--engine-type", "blend", "--supported-transfer-mode", "auto");
    OK("--engine-type", "blend_legacy", "--supported-transfer-mode", "lmcache_driven");
    ERR("--supported-transfer-mode: engine_driven is not supported with --engine-type blend",
        "--engine-type", "blend", "--supported-transfer-mode", "engine_driven");
    ERR("--engine-type blend_legacy", "--engine-type", "blend_legacy",
        "--supported-transfer-mode", "engine_driven");
    /* Blend-only flags do nothing without blend: refused, naming them. */
    OK("--engine-type", "blend", "--enable-segmented-prefix", "--enable-dedup-content");
    ERR("--enable-segmented-prefix: applies to --engine-type blend only",
        "--enable-segmented-prefix");
    ERR("--enable-segmented-prefix: applies to --engine-type blend only (got --engine-type "
        "blend_legacy)", "--engine-type", "blend_legacy", "--enable-segmented-prefix");
    ERR("--enable-dedup-content: applies to --engine-type blend only", "--enable-dedup-content");
}

static void test_ports(void **state)
{
    (void)state;
    static const char *const flags[] = {"--port", "--http-port", "--prometheus-port"};
    for (size_t i = 0; i < 3; i++) {
        OK(flags[i], "1");
        OK(flags[i], "65535");
        ERR("must be in [1, 65535], got 0", flags[i], "0");
        assert_non_null(strstr(err, flags[i]));
        ERR("got 65536", flags[i], "65536");
        assert_non_null(strstr(err, flags[i]));
    }
}

static void test_positive_ints(void **state)
{
    (void)state;
    static const char *const ge1[] = {"--chunk-size", "--max-workers", "--max-gpu-workers",
                                      "--max-cpu-workers", "--lookup-hash-log-max-files"};
    static const char *const gt0[] = {"--l1-init-size-gb", "--l1-write-ttl-seconds",
                                      "--l1-read-ttl-seconds", "--event-bus-queue-size",
                                      "--l2-prefetch-max-in-flight",
                                      "--periodic-notifier-interval-ms",
                                      "--lookup-hash-log-rotation-max-size"};
    char want[160];
    for (size_t i = 0; i < sizeof ge1 / sizeof ge1[0]; i++) {
        OK(ge1[i], "1");
        snprintf(want, sizeof want, "%s: must be >= 1, got 0", ge1[i]);
        ERR(want, ge1[i], "0");
    }
    for (size_t i = 0; i < sizeof gt0 / sizeof gt0[0]; i++) {
        OK(gt0[i], "1");
        snprintf(want, sizeof want, "%s: must be > 0, got -5", gt0[i]);
        ERR(want, gt0[i], "-5");
    }
}

static void test_positive_floats(void **state)
{
    (void)state;
    static const char *const flags[] = {
        "--coordinator-heartbeat-interval", "--coordinator-l2-event-flush-interval",
        "--extra-logging-interval", "--l2-prefetch-load-timeout", "--p2p-lookup-timeout",
        "--p2p-load-timeout", "--lookup-hash-log-rotation-interval", "--l1-size-gb"};
    char want[160];
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        OK(flags[i], "0.25");
        snprintf(want, sizeof want, "%s: must be finite and > 0, got 0", flags[i]);
        ERR(want, flags[i], "0");
        ERR(flags[i], flags[i], "-1");
        snprintf(want, sizeof want, "%s: must be finite and > 0, got inf", flags[i]);
        ERR(want, flags[i], "inf");
        ERR(flags[i], flags[i], "nan");
    }
}

static void test_fractions(void **state)
{
    (void)state;
    static const char *const flags[] = {"--eviction-trigger-watermark", "--eviction-ratio",
                                        "--metrics-sample-rate"};
    char want[160];
    for (size_t i = 0; i < 3; i++) {
        OK(flags[i], "1");
        OK(flags[i], "0.001");
        snprintf(want, sizeof want, "%s: must be finite and in (0, 1], got 0", flags[i]);
        ERR(want, flags[i], "0");
        snprintf(want, sizeof want, "%s: must be finite and in (0, 1], got 1.5", flags[i]);
        ERR(want, flags[i], "1.5");
    }
}

static void test_plugin_config(void **state)
{
    (void)state;
    OK("--runtime-plugin-config", "{\"plugin.frontend.heartbeat_url\":\"http://x\"}");
    OK("--runtime-plugin-config", "{}");
    ERR("--runtime-plugin-config: must be a JSON object, got '[1]'", "--runtime-plugin-config",
        "[1]");
    ERR("--runtime-plugin-config: must be a JSON object", "--runtime-plugin-config", "\"s\"");
    ERR("--runtime-plugin-config: invalid JSON", "--runtime-plugin-config", "{nope");
    assert_non_null(strstr(err, "'{nope'"));
}

static void test_tracing(void **state)
{
    (void)state;
    OK("--enable-tracing", "--otlp-endpoint", "http://otel:4317");
    OK("--otlp-endpoint", "http://otel:4317");
    ERR("--enable-tracing: requires --otlp-endpoint", "--enable-tracing");
    ERR("--enable-tracing: requires --otlp-endpoint", "--enable-tracing", "--otlp-endpoint", "");
}

/* ------------------------------------------------------------- P2P */

static void test_p2p_enable(void **state)
{
    (void)state;
    OK("--p2p-advertise-url", "10.0.0.1:9000", "--coordinator-url", "http://c:8000");
    char *env[] = {"LMCACHE_COORDINATOR_URL=http://c:8000", NULL};
    expect_ok(run(env, true, ARGS("--p2p-advertise-url", "10.0.0.1:9000")));
    ERR("--p2p-advertise-url: P2P (10.0.0.1:9000) requires --coordinator-url",
        "--p2p-advertise-url", "10.0.0.1:9000");
    ERR("--p2p-advertise-url: P2P needs a single DRAM L1 region, not --gds-l1-path",
        "--p2p-advertise-url", "h:1", "--coordinator-url", "http://c", "--gds-l1-path", "/x");
}

static void test_p2p_single_region(void **state)
{
    (void)state;
    const char *a = "{\"type\":\"DRAM\",\"tag\":\"a\",\"size_gb\":1}";
    const char *b = "{\"type\":\"DRAM\",\"tag\":\"b\",\"size_gb\":1}";
    const char *g = "{\"type\":\"GDS\",\"tag\":\"g\",\"size_gb\":1,\"path\":\"/nvme\"}";
    MGR_OK("--eviction-policy", "LRU", "--l1-manager", a, "--p2p-advertise-url", "h:1",
           "--coordinator-url", "http://c");
    MGR_ERR("--p2p-advertise-url: P2P needs a single L1 memory region, got 2 --l1-manager",
            "--eviction-policy", "LRU", "--l1-manager", a, "--l1-manager", b,
            "--p2p-advertise-url", "h:1", "--coordinator-url", "http://c");
    MGR_ERR("--p2p-advertise-url: P2P needs a single DRAM L1 region, got a GDS",
            "--eviction-policy", "LRU", "--l1-manager", g, "--p2p-advertise-url", "h:1",
            "--coordinator-url", "http://c");
}

static void test_verbs(void **state)
{
    (void)state;
    /* Not checked unless the engine is verbs. */
    OK("--p2p-rdma-port", "0", "--p2p-rdma-gid-index", "999", "--p2p-rdma-queue-depth", "0");
#define V "--p2p-transfer-engine", "verbs"
    OK(V, "--p2p-rdma-device", "mlx5_0,mlx5_1", "--p2p-rdma-gid-indices", "3,-1",
       "--p2p-rdma-port", "255", "--p2p-rdma-gid-index", "255", "--p2p-rdma-queue-depth",
       "4294967295", "--p2p-rdma-handshake-timeout-ms", "2147483647");
    OK(V, "--p2p-rdma-device", "mlx5_0", "--p2p-rdma-gid-index", "-1");
    ERR("--p2p-rdma-device: required", V);
    ERR("--p2p-rdma-device: duplicate device 'mlx5_0'", V, "--p2p-rdma-device", "mlx5_0,mlx5_0");
    ERR("--p2p-rdma-device: empty device name in 'a,,b'", V, "--p2p-rdma-device", "a,,b");
    ERR("--p2p-rdma-port: must be in 1..255, got 0", V, "--p2p-rdma-device", "a",
        "--p2p-rdma-port", "0");
    ERR("--p2p-rdma-port: must be in 1..255, got 256", V, "--p2p-rdma-device", "a",
        "--p2p-rdma-port", "256");
    ERR("--p2p-rdma-gid-index: must be in -1..255, got -2", V, "--p2p-rdma-device", "a",
        "--p2p-rdma-gid-index", "-2");
    ERR("--p2p-rdma-gid-indices: need one entry per device (2), got 1", V,
        "--p2p-rdma-device", "a,b", "--p2p-rdma-gid-indices", "1");
    ERR("--p2p-rdma-gid-indices: each entry must be an integer in -1..255, got '300'", V,
        "--p2p-rdma-device", "a", "--p2p-rdma-gid-indices", "300");
    ERR("got 'x'", V, "--p2p-rdma-device", "a", "--p2p-rdma-gid-indices", "x");
    ERR("--p2p-rdma-queue-depth: must be in 1..4294967295, got 0", V, "--p2p-rdma-device", "a",
        "--p2p-rdma-queue-depth", "0");
    ERR("got 4294967296", V, "--p2p-rdma-device", "a", "--p2p-rdma-queue-depth", "4294967296");
    ERR("--p2p-rdma-handshake-timeout-ms: must be in 1..2147483647, got 0", V,
        "--p2p-rdma-device", "a", "--p2p-rdma-handshake-timeout-ms", "0");
    ERR("got 2147483648", V, "--p2p-rdma-device", "a", "--p2p-rdma-handshake-timeout-ms",
        "2147483648");
#undef V
}

/* ------------------------------------------------------------- storage */

static void test_legacy_mode(void **state)
{
    (void)state;
    MGR_OK("--l1-size-gb", "0.5", "--eviction-policy", "noop");
    MGR_ERR("--l1-size-gb: required", "--eviction-policy", "LRU");
    MGR_ERR("--eviction-policy: required", "--l1-size-gb", "1");
    ERR("--gds-l1-path: cannot be combined with --l1-devdax-path '/dev/dax0.0'", "--gds-l1-path",
        "/x", "--l1-devdax-path", "/dev/dax0.0", "--no-l1-use-lazy", "--shm-name", "");
}

static void test_l1_manager_not_mixed(void **state)
{
    (void)state;
    const char *m = "{\"type\":\"DRAM\",\"size_gb\":1}";
    MGR_OK("--l1-manager", m, "--eviction-policy", "LRU");
    MGR_ERR("--l1-manager: cannot be mixed with --l1-size-gb", "--l1-manager", m,
            "--eviction-policy", "LRU", "--l1-size-gb", "1");
    MGR_ERR("--l1-manager: cannot be mixed with --gds-l1-path", "--l1-manager", m,
            "--eviction-policy", "LRU", "--gds-l1-path", "/x");
    MGR_ERR("--l1-manager: cannot be mixed with --l1-devdax-path", "--l1-manager", m,
            "--eviction-policy", "LRU", "--l1-devdax-path", "/dev/dax0.0");
}

static void test_align_power_of_two(void **state)
{
    (void)state;
    OK("--l1-align-bytes", "1");
    OK("--l1-align-bytes", "2097152");
    ERR("--l1-align-bytes: must be a power of two, got 3000", "--l1-align-bytes", "3000");
    ERR("--l1-align-bytes: must be a power of two, got 0", "--l1-align-bytes", "0");
    ERR("--l1-align-bytes: must be a power of two, got -4096", "--l1-align-bytes", "-4096");
}

static void test_hugepages_and_devdax(void **state)
{
    (void)state;
    OK("--l1-use-hugepages", "--shm-name", "");
    OK("--l1-use-hugepages", "--shm-name", "", "--l1-use-lazy"); /* lazy forced off, no error */
    ERR("--l1-use-hugepages: requires --shm-name \"\"", "--l1-use-hugepages");
    assert_non_null(strstr(err, "None"));
    ERR("got shm name 'pool'", "--l1-use-hugepages", "--shm-name", "pool");
    OK("--l1-devdax-path", "/dev/dax0.0", "--no-l1-use-lazy", "--shm-name", "");
    ERR("--l1-devdax-path: '/dev/dax0.0' requires --no-l1-use-lazy", "--l1-devdax-path",
        "/dev/dax0.0", "--shm-name", "");
    ERR("--l1-devdax-path: '/dev/dax0.0' requires --shm-name \"\"", "--l1-devdax-path",
        "/dev/dax0.0", "--no-l1-use-lazy");
}

/* One --l1-manager entry, with the global policy set unless told not to. */
static lmc_config_status l1(const char *entry, bool policy)
{
    return policy ? run(NULL, false, ARGS("--eviction-policy", "LRU", "--l1-manager", entry))
                  : run(NULL, false, ARGS("--l1-manager", entry));
}

static void test_l1_entry_valid(void **state)
{
    (void)state;
    expect_ok(l1("{\"type\":\"DRAM\",\"tag\":\"mem\",\"size_gb\":1.5,\"align_bytes\":8192,"
                 "\"read_ttl_seconds\":10,\"write_ttl_seconds\":20,\"use_lazy\":false,"
                 "\"init_size_gb\":1,\"shm_name\":\"pool\",\"use_hugepages\":false}",
                 true));
    expect_ok(l1("{\"type\":\"DEVDAX\",\"tag\":\"dax\",\"size_gb\":4,\"path\":\"/dev/dax0.0\"}",
                 true));
    expect_ok(l1("{\"type\":\"GDS\",\"tag\":\"g\",\"size_gb\":4,\"path\":\"/nvme\","
                 "\"backend\":\"cufile\",\"direct_io\":false}",
                 true));
    expect_ok(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":{\"eviction_policy\":\"ARC\","
                 "\"trigger_watermark\":0.5,\"eviction_ratio\":1}}",
                 false));
}

static void test_l1_entry_shape(void **state)
{
    (void)state;
    expect_err(l1("{\"type\":", true), "--l1-manager[0]: invalid JSON");
    expect_err(l1("[1,2]", true), "--l1-manager[0]: must be a JSON object, got '[1,2]'");
    expect_err(l1("{\"type\":\"HBM\",\"size_gb\":1}", true),
               "--l1-manager[0]: \"type\" must be DRAM, DEVDAX or GDS, got \"HBM\"");
    expect_err(l1("{\"size_gb\":1}", true), "\"type\" must be DRAM, DEVDAX or GDS, got null");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"colour\":1}", true),
               "--l1-manager[0]: unknown key 'colour' for a DRAM L1");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"path\":\"/x\"}", true),
               "unknown key 'path' for a DRAM L1");
    expect_err(l1("{\"type\":\"GDS\",\"tag\":\"g\",\"size_gb\":1,\"path\":\"/x\","
                  "\"use_lazy\":true}", true),
               "unknown key 'use_lazy' for a GDS L1");
}

static void test_l1_entry_tag(void **state)
{
    (void)state;
    expect_err(l1("{\"type\":\"DEVDAX\",\"size_gb\":1,\"path\":\"/d\"}", true),
               "--l1-manager[0]: \"tag\" must be a non-empty string, got null");
    expect_err(l1("{\"type\":\"DRAM\",\"tag\":\"\",\"size_gb\":1}", true),
               "\"tag\" must be a non-empty string, got \"\"");
    expect_err(l1("{\"type\":\"DRAM\",\"tag\":7,\"size_gb\":1}", true),
               "\"tag\" must be a non-empty string, got 7");
    expect_err(l1("{\"type\":\"GDS\",\"tag\":\"_default\",\"size_gb\":1,\"path\":\"/x\"}", true),
               "\"tag\" '_default' is reserved for DRAM, not GDS");
    expect_err(run(NULL, false,
                   ARGS("--eviction-policy", "LRU", "--l1-manager",
                        "{\"type\":\"DRAM\",\"tag\":\"a\",\"size_gb\":1}", "--l1-manager",
                        "{\"type\":\"DEVDAX\",\"tag\":\"a\",\"size_gb\":1,\"path\":\"/d\"}")),
               "--l1-manager[1]: duplicate \"tag\" 'a' (also entry 0)");
    /* Two untagged DRAM entries both default to _default. */
    expect_err(run(NULL, false,
                   ARGS("--eviction-policy", "LRU", "--l1-manager",
                        "{\"type\":\"DRAM\",\"size_gb\":1}", "--l1-manager",
                        "{\"type\":\"DRAM\",\"size_gb\":1}")),
               "duplicate \"tag\" '_default'");
}

static void test_l1_entry_sizes(void **state)
{
    (void)state;
    expect_err(l1("{\"type\":\"DRAM\"}", true), "--l1-manager[0]: \"size_gb\" is required");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":0}", true),
               "\"size_gb\" must be a finite number > 0, got 0");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":-2.5}", true), "got -2.5");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":\"1\"}", true), "\"size_gb\" must be");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"align_bytes\":3}", true),
               "\"align_bytes\" must be a power of two, got 3");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"align_bytes\":1.5}", true),
               "\"align_bytes\" must be an integer > 0, got 1.5");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1e-9,\"align_bytes\":4096}", true),
               "is smaller than \"align_bytes\" 4096");
    expect_err(l1("{\"type\":\"GDS\",\"tag\":\"g\",\"size_gb\":1,\"path\":\"/x\","
                  "\"align_bytes\":512}", true),
               "\"align_bytes\" must be >= 4096 for GDS");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"read_ttl_seconds\":0}", true),
               "\"read_ttl_seconds\" must be an integer > 0, got 0");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"init_size_gb\":-1}", true),
               "\"init_size_gb\" must be");
}

static void test_l1_entry_dram(void **state)
{
    (void)state;
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"shm_name\":\"pool\"}", true),
               "--l1-manager[0]: \"shm_name\" 'pool' cannot be used with \"use_lazy\"");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"shm_name\":\"p\",\"use_lazy\":true}", true),
               "\"shm_name\" 'p' cannot be used");
    expect_ok(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"shm_name\":\"\"}", true));
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"use_lazy\":1}", true),
               "\"use_lazy\" must be a boolean, got 1");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"shm_name\":5}", true),
               "\"shm_name\" must be a string, got 5");
    const char *p1 = "{\"type\":\"DRAM\",\"tag\":\"a\",\"size_gb\":1,\"use_lazy\":false,"
                     "\"shm_name\":\"pool\"}";
    const char *p2 = "{\"type\":\"DRAM\",\"tag\":\"b\",\"size_gb\":1,\"use_lazy\":false,"
                     "\"shm_name\":\"pool\"}";
    expect_err(run(NULL, false, ARGS("--eviction-policy", "LRU", "--l1-manager", p1,
                                     "--l1-manager", p2)),
               "--l1-manager[1]: duplicate DRAM \"shm_name\" 'pool'");
    /* Empty names mean "no SHM" and may repeat. */
    expect_ok(run(NULL, false,
                  ARGS("--eviction-policy", "LRU", "--l1-manager",
                       "{\"type\":\"DRAM\",\"tag\":\"a\",\"size_gb\":1}", "--l1-manager",
                       "{\"type\":\"DRAM\",\"tag\":\"b\",\"size_gb\":1}")));
}

static void test_l1_entry_paths(void **state)
{
    (void)state;
    expect_err(l1("{\"type\":\"DEVDAX\",\"tag\":\"d\",\"size_gb\":1}", true),
               "\"path\" must be a non-empty string for DEVDAX, got null");
    expect_err(l1("{\"type\":\"GDS\",\"tag\":\"g\",\"size_gb\":1,\"path\":\"\"}", true),
               "\"path\" must be a non-empty string for GDS");
    expect_err(l1("{\"type\":\"GDS\",\"tag\":\"g\",\"size_gb\":1,\"path\":\"/x\","
                  "\"direct_io\":\"yes\"}", true),
               "\"direct_io\" must be a boolean");
    const char *g1 = "{\"type\":\"GDS\",\"tag\":\"g1\",\"size_gb\":1,\"path\":\"/a\"}";
    const char *g2 = "{\"type\":\"GDS\",\"tag\":\"g2\",\"size_gb\":1,\"path\":\"/b\"}";
    expect_err(run(NULL, false, ARGS("--eviction-policy", "LRU", "--l1-manager", g1,
                                     "--l1-manager", g2)),
               "--l1-manager[1]: at most one GDS L1");
}

static void test_l1_entry_eviction(void **state)
{
    (void)state;
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1}", false),
               "--l1-manager[0]: no eviction policy");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":{\"trigger_watermark\":0.5}}",
                  false),
               "no eviction policy");
    expect_ok(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":{\"trigger_watermark\":0.5}}",
                 true));
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":{\"eviction_policy\":\"FIFO\"}}",
                  true),
               "\"eviction\".\"eviction_policy\" must be one of LRU, ARC, IsolatedLRU, noop, got "
               "\"FIFO\"");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":{\"eviction_ratio\":2}}", true),
               "\"eviction\".\"eviction_ratio\" must be in (0, 1], got 2");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":{\"trigger_watermark\":0}}",
                  true),
               "\"trigger_watermark\" must be in (0, 1], got 0");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":{\"policy\":\"LRU\"}}", true),
               "unknown key 'policy' in \"eviction\"");
    expect_err(l1("{\"type\":\"DRAM\",\"size_gb\":1,\"eviction\":\"LRU\"}", true),
               "\"eviction\" must be a JSON object, got \"LRU\"");
}

/* ------------------------------------------------------------- L2 */

static void test_l2_adapter_shape(void **state)
{
    (void)state;
    OK("--l2-adapter", "{\"type\":\"fs\",\"base_path\":\"/tmp/x\"}");
    ERR("--l2-adapter[0]: invalid JSON", "--l2-adapter", "{type:fs}");
    ERR("--l2-adapter[1]: must be a JSON object, got '[]'", "--l2-adapter", "{\"type\":\"fs\",\"base_path\":\"/tmp/x\"}",
        "--l2-adapter", "[]");
    ERR("--l2-adapter[0]: needs a non-empty string \"type\"", "--l2-adapter", "{\"path\":1}");
    ERR("needs a non-empty string \"type\"", "--l2-adapter", "{\"type\":3}");
    ERR("needs a non-empty string \"type\"", "--l2-adapter", "{\"type\":\"\"}");
}

static void test_l2_affinity(void **state)
{
    (void)state;
    const char *dram = "{\"type\":\"DRAM\",\"tag\":\"mem\",\"size_gb\":1}";
    const char *gds = "{\"type\":\"GDS\",\"tag\":\"g\",\"size_gb\":1,\"path\":\"/x\"}";
    OK("--l2-adapter", "{\"type\":\"fs\",\"base_path\":\"/x\",\"affinity_tag\":\"_default\"}");
    ERR("--l2-adapter[0]: \"affinity_tag\" 'mem' names no L1", "--l2-adapter",
        "{\"type\":\"fs\",\"base_path\":\"/x\",\"affinity_tag\":\"mem\"}");
    MGR_OK("--eviction-policy", "LRU", "--l1-manager", dram, "--l2-adapter",
           "{\"type\":\"fs\",\"base_path\":\"/x\",\"affinity_tag\":\"mem\"}");
    MGR_ERR("\"affinity_tag\" '_default' names no L1", "--eviction-policy", "LRU",
            "--l1-manager", dram, "--l2-adapter", "{\"type\":\"fs\",\"base_path\":\"/tmp/x\"}");
    MGR_ERR("\"affinity_tag\" 'g' is a GDS L1", "--eviction-policy", "LRU", "--l1-manager",
            dram, "--l1-manager", gds, "--l2-adapter", "{\"type\":\"fs\",\"base_path\":\"/x\",\"affinity_tag\":\"g\"}");
    ERR("\"affinity_tag\" must be a string", "--l2-adapter",
        "{\"type\":\"fs\",\"base_path\":\"/x\",\"affinity_tag\":1}");
}

/* Parses (upstream accepts it), then lmc_config_check_built refuses it with
 * the flag's name; the defaults pass. */
static void expect_unbuilt(char *const *envp, const char *const *args, const char *flag)
{
    const char *argv[32] = {"lmcached", "--l1-size-gb", "1", "--eviction-policy", "LRU"};
    int argc = 5;
    for (size_t i = 0; args && args[i]; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    lmc_config c;
    assert_int_equal(lmc_config_parse(&c, argc, (char *const *)argv, envp, NULL, err, sizeof err),
                     LMC_CONFIG_OK);
    char why[256] = "";
    int rc = lmc_config_check_built(&c, why, sizeof why);
    lmc_config_free(&c);
    if (!flag) {
        assert_int_equal(rc, 0);
        return;
    }
    assert_int_equal(rc, -1);
    if (strncmp(why, flag, strlen(flag)) != 0 || why[strlen(flag)] != ':')
        fail_msg("'%s' does not start with '%s:'", why, flag);
}

static void test_unbuilt_features_refused(void **state)
{
    (void)state;
    expect_unbuilt(NULL, NULL, NULL);
    /* CacheBlend is built (docs/cacheblend.md). */
    expect_unbuilt(NULL, ARGS("--engine-type", "blend"), NULL);
    expect_unbuilt(NULL, ARGS("--engine-type", "blend_legacy"), NULL);
    expect_unbuilt(NULL, ARGS("--engine-type", "blend", "--enable-segmented-prefix"), NULL);
    expect_unbuilt(NULL, ARGS("--script-allowed-imports", "math"), "--script-allowed-imports");
    expect_unbuilt(NULL, ARGS("--script-allowed-imports"), NULL);
    /* Coordinator registration is built (docs/fleet.md); it needs the HTTP
     * frontend, so with --no-http the URL is refused. */
    expect_unbuilt(NULL, ARGS("--coordinator-url", "http://c:8000"), NULL);
    char *env[] = {"LMCACHE_COORDINATOR_URL=http://c:8000", NULL};
    expect_unbuilt(env, NULL, NULL);
    expect_unbuilt(NULL, ARGS("--coordinator-url", "http://c:8000", "--no-http"),
                   "--coordinator-url");
    expect_unbuilt(env, ARGS("--no-http"), "--coordinator-url");
    expect_unbuilt(NULL, ARGS("--no-http"), NULL);
    /* P2P is built (docs/p2p.md, "Running the channel"). */
    expect_unbuilt(NULL, ARGS("--p2p-advertise-url", "10.0.0.1:9000", "--coordinator-url", "http://c"),
                   NULL);
    /* Both trace levels are built (docs/trace.md). */
    expect_unbuilt(NULL, ARGS("--trace-level", "storage"), NULL);
    expect_unbuilt(NULL, ARGS("--trace-level", "events"), NULL);
    expect_unbuilt(NULL, ARGS("--trace-output", "/tmp/t.bin"), NULL);
    expect_unbuilt(NULL, ARGS("--enable-extra-logging"), "--enable-extra-logging");
    /* Documented as having no effect, and accepted. */
    expect_unbuilt(NULL, ARGS("--enable-gc-monitor", "--periodic-notifier-interval-ms", "50"), NULL);
}

/* ------------------------------------------------------------- HTTP */

/* Writes `text` to a fresh temporary file; the caller unlinks *path. */
static void write_temp(char path[64], const char *text, size_t len)
{
    snprintf(path, 64, "/tmp/lmc-token-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
}

/* No message may show the token (docs/http.md, "Authentication"). */
static void expect_secret_err(lmc_config_status st, const char *needle, const char *secret)
{
    expect_err(st, needle);
    if (secret && *secret && strstr(err, secret))
        fail_msg("error '%s' shows the token", err);
}

static void test_http_auth_token(void **state)
{
    (void)state;
    OK("--http-auth-token", "abc");
    OK("--http-auth-token", "A-z0.9_~+/=");
    expect_secret_err(run(NULL, true, ARGS("--http-auth-token", "")),
                      "--http-auth-token (or LMCACHE_HTTP_AUTH_TOKEN): must not be empty", NULL);
    expect_secret_err(run(NULL, true, ARGS("--http-auth-token", "two words")),
                      "--http-auth-token", "two words");
    expect_secret_err(run(NULL, true, ARGS("--http-auth-token", "tab\there")),
                      "visible ASCII", "tab\there");
    /* The coordinator's token goes out in the same header (docs/fleet.md). */
    OK("--coordinator-auth-token", "c-tok_1");
    expect_secret_err(run(NULL, true, ARGS("--coordinator-auth-token", "")),
                      "--coordinator-auth-token (or LMCACHE_COORDINATOR_AUTH_TOKEN)", NULL);
    expect_secret_err(run(NULL, true, ARGS("--coordinator-auth-token", "x\r\nHost: y")),
                      "--coordinator-auth-token", "Host: y");
    char big[4098];
    memset(big, 'x', 4097);
    big[4097] = '\0';
    expect_secret_err(run(NULL, true, ARGS("--http-auth-token", big)), "at most 4096", big);
    big[4096] = '\0';
    OK("--http-auth-token", big);
    char *empty_env[] = {"LMCACHE_HTTP_AUTH_TOKEN=", NULL};
    expect_err(run(empty_env, true, ARGS("--port", "5555")), "--http-auth-token");
    char *env[] = {"LMCACHE_HTTP_AUTH_TOKEN=from-env", NULL};
    expect_ok(run(env, true, ARGS("--port", "5555")));
    ERR("--http-max-buffered-mb: must be >= 1", "--http-max-buffered-mb", "0");
}

static void test_http_auth_token_file(void **state)
{
    (void)state;
    char path[64];
    write_temp(path, "file-token\r\n", 12);
    lmc_config c;
    const char *argv[] = {"lmcached", "--l1-size-gb", "1", "--eviction-policy", "LRU",
                          "--http-auth-token-file", path, NULL};
    assert_int_equal(lmc_config_parse(&c, 7, (char *const *)argv, NULL, NULL, err, sizeof err),
                     LMC_CONFIG_OK);
    assert_string_equal(c.http.auth_token, "file-token");
    lmc_config_free(&c);
    expect_secret_err(run(NULL, true, ARGS("--http-auth-token-file", path, "--http-auth-token",
                                           "other")),
                      "--http-auth-token-file: cannot be combined with --http-auth-token",
                      "file-token");
    char *env[] = {"LMCACHE_HTTP_AUTH_TOKEN=from-env", NULL};
    expect_secret_err(run(env, true, ARGS("--http-auth-token-file", path)),
                      "cannot be combined", "from-env");
    unlink(path);
    ERR("--http-auth-token-file: cannot read '/nonexistent/token': No such file",
        "--http-auth-token-file", "/nonexistent/token");
    ERR("--http-auth-token-file: cannot read '/tmp': Is a directory", "--http-auth-token-file",
        "/tmp");
    write_temp(path, "\n", 1);
    ERR("is empty", "--http-auth-token-file", path);
    unlink(path);
    write_temp(path, "line-one\nline-two\n", 18);
    expect_secret_err(run(NULL, true, ARGS("--http-auth-token-file", path)), "one line",
                      "line-one");
    unlink(path);
    static char big[4200];
    memset(big, 'y', sizeof big - 1);
    write_temp(path, big, 4097);
    expect_secret_err(run(NULL, true, ARGS("--http-auth-token-file", path)), "at most 4096",
                      "yyyyyyyy");
    unlink(path);
    write_temp(path, big, 4096);
    OK("--http-auth-token-file", path);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reap_timeout),
        cmocka_unit_test(test_registration_grace),
        cmocka_unit_test(test_hash_builtin),
        cmocka_unit_test(test_engine_transfer_mode),
        cmocka_unit_test(test_ports),
        cmocka_unit_test(test_positive_ints),
        cmocka_unit_test(test_positive_floats),
        cmocka_unit_test(test_fractions),
        cmocka_unit_test(test_plugin_config),
        cmocka_unit_test(test_tracing),
        cmocka_unit_test(test_p2p_enable),
        cmocka_unit_test(test_p2p_single_region),
        cmocka_unit_test(test_verbs),
        cmocka_unit_test(test_legacy_mode),
        cmocka_unit_test(test_l1_manager_not_mixed),
        cmocka_unit_test(test_align_power_of_two),
        cmocka_unit_test(test_hugepages_and_devdax),
        cmocka_unit_test(test_l1_entry_valid),
        cmocka_unit_test(test_l1_entry_shape),
        cmocka_unit_test(test_l1_entry_tag),
        cmocka_unit_test(test_l1_entry_sizes),
        cmocka_unit_test(test_l1_entry_dram),
        cmocka_unit_test(test_l1_entry_paths),
        cmocka_unit_test(test_l1_entry_eviction),
        cmocka_unit_test(test_l2_adapter_shape),
        cmocka_unit_test(test_l2_affinity),
        cmocka_unit_test(test_unbuilt_features_refused),
        cmocka_unit_test(test_http_auth_token),
        cmocka_unit_test(test_http_auth_token_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
