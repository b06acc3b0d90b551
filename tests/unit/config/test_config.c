/* Parsing: defaults, every flag, argparse syntax, environment fallbacks,
 * --help.  Validation rules live in test_config_validate.c, JSON and the
 * derived values in test_config_json.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"

static char err[512];

/* args: NULL-terminated; `legacy` prepends the flags a valid legacy-mode
 * config needs (upstream requires an L1 size and eviction policy). */
static lmc_config_status parse_list(lmc_config *cfg, char *const *envp, bool legacy,
                                    const char *const *args)
{
    const char *argv[256] = {"lmcached"};
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
    lmc_config_status st = lmc_config_parse(cfg, argc, (char *const *)argv, envp, NULL, err,
                                            sizeof err);
    if (st == LMC_CONFIG_ERROR)
        assert_null(strchr(err, '\n'));
    return st;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NOARGS ((const char *const[]){NULL})
#define PARSE_OK(cfg, ...) assert_int_equal(parse_list((cfg), NULL, true, ARGS(__VA_ARGS__)), LMC_CONFIG_OK)
#define ENV_OK(cfg, env, ...) assert_int_equal(parse_list((cfg), (env), true, ARGS(__VA_ARGS__)), LMC_CONFIG_OK)

/* Expects an error whose one-line message contains `needle`. */
#define PARSE_ERR(needle, ...)                                                       \
    do {                                                                             \
        lmc_config c_;                                                               \
        assert_int_equal(parse_list(&c_, NULL, true, ARGS(__VA_ARGS__)), LMC_CONFIG_ERROR); \
        if (!strstr(err, (needle)))                                                  \
            fail_msg("error '%s' lacks '%s'", err, (needle));                        \
        assert_null(c_.mp.instance_id);                                              \
    } while (0)

#define ENV_ERR(env, needle, ...)                                                    \
    do {                                                                             \
        lmc_config c_;                                                               \
        assert_int_equal(parse_list(&c_, (env), true, ARGS(__VA_ARGS__)), LMC_CONFIG_ERROR); \
        if (!strstr(err, (needle)))                                                  \
            fail_msg("error '%s' lacks '%s'", err, (needle));                        \
    } while (0)

/* ---------------------------------------------------------------- defaults */

static void assert_mp_defaults(const lmc_config *c)
{
    assert_non_null(c->mp.instance_id);
    assert_string_equal(c->mp.host, "localhost");
    assert_int_equal(c->mp.port, 5555);
    assert_int_equal(c->mp.chunk_size, 256);
    assert_int_equal(c->mp.max_workers, 1);
    assert_int_equal(c->mp.max_gpu_workers, 1);
    assert_int_equal(c->mp.max_cpu_workers, 1);
    assert_string_equal(c->mp.hash_algorithm, "blake3");
    assert_int_equal(c->mp.hash_memo_mb, 16);
    assert_string_equal(c->mp.engine_type, "default");
    assert_string_equal(c->mp.supported_transfer_mode, "auto");
    assert_true(c->mp.separate_object_groups);
    assert_string_equal(c->mp.cpu_kv_layout, "hnd");
    assert_int_equal(c->mp.layerwise_batch, 0);
    assert_int_equal(c->mp.copy_split_bytes, 1 << 20);
    assert_false(c->mp.enable_segmented_prefix);
    assert_null(c->mp.shm_name);
    assert_int_equal(c->mp.script_allowed_imports.count, 0);
    assert_true(c->mp.worker_reap_timeout_seconds == 120.0);
    assert_true(c->mp.worker_registration_grace_seconds == 3600.0);
    assert_string_equal(c->mp.log_level, "INFO");
    assert_string_equal(c->mp.log_format, "text");
    assert_false(c->mp.rpc_error_frames);
    assert_int_equal(c->mp.max_interned_strings, 65536);
    assert_int_equal(c->mp.max_queued_requests, 4096);
    assert_int_equal(c->mp.kv_event_log_size, 32768);
    assert_string_equal(c->mp.kv_events_publish_endpoint, "");
    assert_string_equal(c->mp.kv_events_replay_endpoint, "");
    assert_string_equal(c->mp.kv_events_topic, "");
    assert_int_equal(c->mp.kv_events_buffer_steps, 10000);
    assert_int_equal(c->mp.kv_events_block_size, 0);
    assert_null(c->mp.kv_events_hash_seed);
    assert_int_equal(c->plugins.locations.count, 0);
    assert_string_equal(c->plugins.extra_config_json, "{}");
}

static void assert_net_defaults(const lmc_config *c)
{
    assert_string_equal(c->p2p.advertise_url, "");
    assert_string_equal(c->p2p.listen_url, "");
    assert_true(c->p2p.lookup_timeout == 30.0);
    assert_true(c->p2p.load_timeout == 30.0);
    assert_string_equal(c->p2p.transfer_engine, "nixl");
    assert_string_equal(c->p2p.rdma_device, "");
    assert_int_equal(c->p2p.rdma_port, 1);
    assert_int_equal(c->p2p.rdma_gid_index, -1);
    assert_string_equal(c->p2p.rdma_gid_indices, "");
    assert_int_equal(c->p2p.rdma_queue_depth, 4096);
    assert_int_equal(c->p2p.rdma_handshake_timeout_ms, 10000);
    assert_string_equal(c->http.http_host, "0.0.0.0");
    assert_int_equal(c->http.http_port, 8080);
    assert_true(c->http.enabled);
    assert_null(c->http.auth_token);
    assert_null(c->http.auth_token_file);
    assert_int_equal(c->http.max_buffered_mb, 2048);
    assert_string_equal(c->coordinator.url, "");
    assert_string_equal(c->coordinator.advertise_ip, "");
    assert_true(c->coordinator.heartbeat_interval == 5.0);
    assert_false(c->coordinator.l2_event_reporting);
    assert_true(c->coordinator.l2_event_flush_interval == 1.0);
}

static void assert_storage_defaults(const lmc_storage_config *s)
{
    assert_int_equal(s->l1_manager_json.count, 0);
    assert_true(s->l1_use_lazy);
    assert_int_equal(s->l1_init_size_gb, 20);
    assert_int_equal(s->l1_shm_reserve_mb, -1);
    assert_int_equal(s->l1_align_bytes, 4096);
    assert_false(s->l1_use_hugepages);
    assert_null(s->l1_devdax_path);
    assert_null(s->gds_l1_path);
    assert_true(s->gds_l1_use_direct_io);
    assert_string_equal(s->gds_l1_backend, "auto");
    assert_int_equal(s->l1_write_ttl_seconds, 600);
    assert_int_equal(s->l1_read_ttl_seconds, 300);
    assert_true(s->eviction_trigger_watermark == 0.8);
    assert_true(s->eviction_ratio == 0.2);
    assert_string_equal(s->l2_store_policy, "default");
    assert_string_equal(s->l2_prefetch_policy, "default");
    assert_int_equal(s->l2_prefetch_max_in_flight, 8);
    assert_false(s->l2_prefetch_load_timeout.set);
    assert_int_equal(s->periodic_notifier_interval_ms, 5);
    assert_int_equal(s->l2_adapter_json.count, 0);
    assert_true(s->l2_health_interval_s == 10.0);
    assert_false(s->health_requires_l2);
}

static void assert_obs_defaults(const lmc_obs_config *o)
{
    assert_false(o->disable_observability);
    assert_false(o->disable_metrics);
    assert_false(o->disable_logging);
    assert_false(o->enable_tracing);
    assert_null(o->otlp_endpoint);
    assert_int_equal(o->event_bus_queue_size, 10000);
    assert_int_equal(o->prometheus_port, 9090);
    assert_true(o->metrics_sample_rate == 0.01);
    assert_string_equal(o->lookup_hash_log_dir, "");
    assert_true(o->lookup_hash_log_rotation_interval == 21600.0);
    assert_int_equal(o->lookup_hash_log_rotation_max_size, 104857600);
    assert_int_equal(o->lookup_hash_log_max_files, 100);
    assert_false(o->enable_gc_monitor);
    assert_true(o->gc_monitor_min_pause_ms == 1.0);
    assert_int_equal(o->gc_monitor_top_objects, 0);
    assert_false(o->enable_extra_logging);
    assert_true(o->extra_logging_interval == 10.0);
    assert_null(o->trace_level);
    assert_null(o->trace_output);
    assert_false(o->allow_trace_replay);
}

static void test_defaults_parse(void **state)
{
    (void)state;
    lmc_config c;
    assert_int_equal(parse_list(&c, NULL, true, NOARGS), LMC_CONFIG_OK);
    assert_mp_defaults(&c);
    assert_net_defaults(&c);
    assert_storage_defaults(&c.storage);
    assert_obs_defaults(&c.obs);
    assert_true(c.storage.l1_size_gb.set);
    assert_true(c.storage.l1_size_gb.value == 1.0);
    assert_string_equal(c.storage.eviction_policy, "LRU");
    lmc_config_free(&c);
}

static void test_defaults_init(void **state)
{
    (void)state;
    lmc_config c;
    assert_int_equal(lmc_config_init_defaults(&c), 0);
    assert_mp_defaults(&c);
    assert_net_defaults(&c);
    assert_storage_defaults(&c.storage);
    assert_obs_defaults(&c.obs);
    assert_false(c.storage.l1_size_gb.set);
    assert_null(c.storage.eviction_policy);
    lmc_config_free(&c);
    assert_null(c.mp.host);
    lmc_config_free(&c); /* idempotent on a freed config */
}

static void test_legacy_flags_required(void **state)
{
    (void)state;
    lmc_config c;
    assert_int_equal(parse_list(&c, NULL, false, NOARGS), LMC_CONFIG_ERROR);
    assert_non_null(strstr(err, "--l1-size-gb"));
}

/* ------------------------------------------------------- every flag, set */

static const char *const all_args[] = {
    "--instance-id", "abc", "--host", "127.0.0.2", "--port", "6000", "--chunk-size", "128",
    "--max-workers", "4", "--max-gpu-workers", "2", "--max-cpu-workers", "3",
    "--hash-algorithm", "sha256_cbor", "--hash-memo-mb", "3", "--engine-type", "blend", "--supported-transfer-mode",
    "lmcache_driven", "--no-separate-object-groups", "--cpu-kv-layout", "hint",
    "--layerwise-batch", "3", "--copy-split-bytes", "65536",
    "--enable-segmented-prefix", "--enable-dedup-content", "--blend-max-chunks", "4096",
    "--shm-name", "myshm", "--script-allowed-imports", "math", "json",
    "--worker-reap-timeout-seconds", "60", "--worker-registration-grace-seconds", "90.5",
    "--log-level", "debug", "--log-format", "json", "--rpc-error-frames", "--max-interned-strings", "1000",
    "--max-queued-requests", "7", "--kv-event-log-size", "9",
    "--kv-events-publish-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint",
    "tcp://*:5558", "--kv-events-topic", "kv-events", "--kv-events-buffer-steps", "12",
    "--kv-events-block-size", "16", "--kv-events-hash-seed", "7",
    "--runtime-plugin-locations", "/a", "/b",
    "--runtime-plugin-config", "{\"k\":1}", "--p2p-listen-url", "0.0.0.0:7000",
    "--p2p-lookup-timeout", "2.5", "--p2p-load-timeout", "3.5", "--p2p-transfer-engine",
    "nixl", "--p2p-rdma-device", "mlx5_0", "--p2p-rdma-port", "2", "--p2p-rdma-gid-index",
    "3", "--p2p-rdma-gid-indices", "3", "--p2p-rdma-queue-depth", "128",
    "--p2p-rdma-handshake-timeout-ms", "500", "--http-host", "127.0.0.1", "--http-port",
    "8081", "--no-http", "--http-auth-token", "tok", "--http-max-buffered-mb", "64", "--coordinator-url", "http://c:9000", "--coordinator-advertise-ip", "10.0.0.1",
    "--coordinator-heartbeat-interval", "2.5", "--coordinator-l2-event-reporting",
    "--coordinator-l2-event-flush-interval", "0.5", "--coordinator-event-reporting",
    "--coordinator-event-flush-interval", "0.25", "--coordinator-auth-token", "ctok",
    "--l1-size-gb", "2.5",
    "--no-l1-use-lazy", "--l1-init-size-gb", "4", "--l1-shm-reserve-mb", "128",
    "--l1-align-bytes", "8192",
    "--no-gds-l1-use-direct-io", "--gds-l1-backend", "cufile", "--l1-write-ttl-seconds",
    "60", "--l1-read-ttl-seconds", "30", "--eviction-policy", "ARC",
    "--eviction-trigger-watermark", "0.9", "--eviction-ratio", "0.1", "--l2-store-policy",
    "skip_l1", "--l2-prefetch-policy", "retain", "--l2-prefetch-max-in-flight", "16",
    "--l2-prefetch-load-timeout", "1.5", "--periodic-notifier-interval-ms", "10",
    "--l2-health-interval-s", "2.5", "--health-requires-l2",
    "--l2-adapter", "{\"type\":\"fs\",\"base_path\":\"/tmp/x\"}", "--l2-adapter", "{\"type\":\"resp\",\"host\":\"h\",\"port\":1}",
    "--disable-observability", "--disable-metrics", "--disable-logging", "--enable-tracing",
    "--otlp-endpoint", "http://otel:4317", "--event-bus-queue-size", "5", "--prometheus-port",
    "9191", "--metrics-sample-rate", "0.5", "--lookup-hash-log-dir", "/tmp/lh",
    "--lookup-hash-log-rotation-interval", "60", "--lookup-hash-log-rotation-max-size",
    "1000", "--lookup-hash-log-max-files", "3", "--enable-gc-monitor",
    "--gc-monitor-min-pause-ms", "2.5", "--gc-monitor-top-objects", "5",
    "--enable-extra-logging", "--extra-logging-interval", "2", "--trace-level", "events",
    "--trace-output", "/tmp/t.bin", "--allow-trace-replay", NULL};

static void assert_all_mp(const lmc_config *c)
{
    assert_string_equal(c->mp.instance_id, "abc");
    assert_string_equal(c->mp.host, "127.0.0.2");
    assert_int_equal(c->mp.port, 6000);
    assert_int_equal(c->mp.chunk_size, 128);
    assert_int_equal(c->mp.max_workers, 4);
    assert_int_equal(c->mp.max_gpu_workers, 2);
    assert_int_equal(c->mp.max_cpu_workers, 3);
    assert_string_equal(c->mp.hash_algorithm, "sha256_cbor");
    assert_int_equal(c->mp.hash_memo_mb, 3);
    assert_string_equal(c->mp.engine_type, "blend");
    assert_string_equal(c->mp.supported_transfer_mode, "lmcache_driven");
    assert_false(c->mp.separate_object_groups);
    assert_string_equal(c->mp.cpu_kv_layout, "hint");
    assert_int_equal(c->mp.layerwise_batch, 3);
    assert_int_equal(c->mp.copy_split_bytes, 65536);
    assert_true(c->mp.enable_segmented_prefix);
    assert_string_equal(c->mp.shm_name, "myshm");
    assert_int_equal(c->mp.script_allowed_imports.count, 2);
    assert_string_equal(c->mp.script_allowed_imports.items[1], "json");
    assert_true(c->mp.worker_reap_timeout_seconds == 60.0);
    assert_true(c->mp.worker_registration_grace_seconds == 90.5);
    assert_string_equal(c->mp.log_level, "DEBUG");
    assert_string_equal(c->mp.log_format, "json");
    assert_true(c->mp.rpc_error_frames);
    assert_int_equal(c->mp.max_interned_strings, 1000);
    assert_int_equal(c->mp.max_queued_requests, 7);
    assert_int_equal(c->mp.kv_event_log_size, 9);
    assert_string_equal(c->mp.kv_events_publish_endpoint, "tcp://*:5557");
    assert_string_equal(c->mp.kv_events_replay_endpoint, "tcp://*:5558");
    assert_string_equal(c->mp.kv_events_topic, "kv-events");
    assert_int_equal(c->mp.kv_events_buffer_steps, 12);
    assert_int_equal(c->mp.kv_events_block_size, 16);
    assert_string_equal(c->mp.kv_events_hash_seed, "7");
    assert_int_equal(c->plugins.locations.count, 2);
    assert_string_equal(c->plugins.locations.items[0], "/a");
    assert_string_equal(c->plugins.extra_config_json, "{\"k\":1}");
}

static void assert_all_net(const lmc_config *c)
{
    assert_string_equal(c->p2p.listen_url, "0.0.0.0:7000");
    assert_true(c->p2p.lookup_timeout == 2.5);
    assert_true(c->p2p.load_timeout == 3.5);
    assert_string_equal(c->p2p.rdma_device, "mlx5_0");
    assert_int_equal(c->p2p.rdma_port, 2);
    assert_int_equal(c->p2p.rdma_gid_index, 3);
    assert_string_equal(c->p2p.rdma_gid_indices, "3");
    assert_int_equal(c->p2p.rdma_queue_depth, 128);
    assert_int_equal(c->p2p.rdma_handshake_timeout_ms, 500);
    assert_string_equal(c->http.http_host, "127.0.0.1");
    assert_int_equal(c->http.http_port, 8081);
    assert_false(c->http.enabled);
    assert_string_equal(c->http.auth_token, "tok");
    assert_int_equal(c->http.max_buffered_mb, 64);
    assert_string_equal(c->coordinator.url, "http://c:9000");
    assert_string_equal(c->coordinator.advertise_ip, "10.0.0.1");
    assert_true(c->coordinator.heartbeat_interval == 2.5);
    assert_true(c->coordinator.l2_event_reporting);
    assert_true(c->coordinator.l2_event_flush_interval == 0.5);
    assert_true(c->coordinator.event_reporting);
    assert_true(c->coordinator.event_flush_interval == 0.25);
    assert_string_equal(c->coordinator.auth_token, "ctok");
}

static void assert_all_storage(const lmc_storage_config *s)
{
    assert_true(s->l1_size_gb.set && s->l1_size_gb.value == 2.5);
    assert_false(s->l1_use_lazy);
    assert_int_equal(s->l1_init_size_gb, 4);
    assert_int_equal(s->l1_shm_reserve_mb, 128);
    assert_int_equal(s->l1_align_bytes, 8192);
    assert_false(s->gds_l1_use_direct_io);
    assert_string_equal(s->gds_l1_backend, "cufile");
    assert_int_equal(s->l1_write_ttl_seconds, 60);
    assert_int_equal(s->l1_read_ttl_seconds, 30);
    assert_string_equal(s->eviction_policy, "ARC");
    assert_true(s->eviction_trigger_watermark == 0.9);
    assert_true(s->eviction_ratio == 0.1);
    assert_string_equal(s->l2_store_policy, "skip_l1");
    assert_string_equal(s->l2_prefetch_policy, "retain");
    assert_int_equal(s->l2_prefetch_max_in_flight, 16);
    assert_true(s->l2_prefetch_load_timeout.set && s->l2_prefetch_load_timeout.value == 1.5);
    assert_int_equal(s->periodic_notifier_interval_ms, 10);
    assert_int_equal(s->l2_adapter_json.count, 2);
    assert_true(s->l2_health_interval_s == 2.5);
    assert_true(s->health_requires_l2);
    assert_string_equal(s->l2_adapter_json.items[0], "{\"type\":\"fs\",\"base_path\":\"/tmp/x\"}");
    assert_string_equal(s->l2_adapter_json.items[1], "{\"type\":\"resp\",\"host\":\"h\",\"port\":1}");
}

static void assert_all_obs(const lmc_obs_config *o)
{
    assert_true(o->disable_observability && o->disable_metrics && o->disable_logging);
    assert_true(o->enable_tracing);
    assert_string_equal(o->otlp_endpoint, "http://otel:4317");
    assert_int_equal(o->event_bus_queue_size, 5);
    assert_int_equal(o->prometheus_port, 9191);
    assert_true(o->metrics_sample_rate == 0.5);
    assert_string_equal(o->lookup_hash_log_dir, "/tmp/lh");
    assert_true(o->lookup_hash_log_rotation_interval == 60.0);
    assert_int_equal(o->lookup_hash_log_rotation_max_size, 1000);
    assert_int_equal(o->lookup_hash_log_max_files, 3);
    assert_true(o->enable_gc_monitor);
    assert_true(o->gc_monitor_min_pause_ms == 2.5);
    assert_int_equal(o->gc_monitor_top_objects, 5);
    assert_true(o->enable_extra_logging);
    assert_true(o->extra_logging_interval == 2.0);
    assert_string_equal(o->trace_level, "events");
    assert_string_equal(o->trace_output, "/tmp/t.bin");
    assert_true(o->allow_trace_replay);
}

static void test_every_flag_parses(void **state)
{
    (void)state;
    lmc_config c;
    assert_int_equal(parse_list(&c, NULL, false, all_args), LMC_CONFIG_OK);
    assert_all_mp(&c);
    assert_all_net(&c);
    assert_all_storage(&c.storage);
    assert_all_obs(&c.obs);
    lmc_config_free(&c);
}

/* Keeps test_every_flag_parses honest: a new flag must be added there (or
 * to the short list of flags covered by dedicated tests). */
static void test_every_flag_is_covered(void **state)
{
    (void)state;
    static const char *const elsewhere[] = {"l1-manager", "l1-use-hugepages",
                                            "l1-devdax-path", "gds-l1-path",
                                            "p2p-advertise-url", "http-auth-token-file", NULL};
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    assert_true(n > 60);
    for (size_t i = 0; i < n; i++) {
        char want[128], want_no[128];
        snprintf(want, sizeof want, "--%s", flags[i].name);
        snprintf(want_no, sizeof want_no, "--no-%s", flags[i].name);
        bool found = false;
        for (size_t k = 0; all_args[k] && !found; k++)
            found = !strcmp(all_args[k], want) || !strcmp(all_args[k], want_no);
        for (size_t k = 0; elsewhere[k] && !found; k++)
            found = !strcmp(elsewhere[k], flags[i].name);
        if (!found)
            fail_msg("flag %s not covered", want);
    }
}

static void test_storage_paths_and_hugepages(void **state)
{
    (void)state;
    lmc_config c;
    PARSE_OK(&c, "--gds-l1-path", "/mnt/nvme");
    assert_string_equal(c.storage.gds_l1_path, "/mnt/nvme");
    lmc_config_free(&c);
    PARSE_OK(&c, "--l1-devdax-path", "/dev/dax0.0", "--no-l1-use-lazy", "--shm-name", "");
    assert_string_equal(c.storage.l1_devdax_path, "/dev/dax0.0");
    assert_string_equal(c.mp.shm_name, "");
    lmc_config_free(&c);
    PARSE_OK(&c, "--l1-use-hugepages", "--shm-name", "");
    assert_true(c.storage.l1_use_hugepages);
    assert_false(c.storage.l1_use_lazy); /* forced off, no error */
    lmc_config_free(&c);
}

/* ------------------------------------------------------------- syntax */

static void test_equals_form(void **state)
{
    (void)state;
    lmc_config c;
    PARSE_OK(&c, "--port=6001", "--coordinator-url=http://h/x?a=b", "--shm-name=",
             "--l2-adapter={\"type\":\"fs\",\"base_path\":\"a=b\"}", "--metrics-sample-rate=1");
    assert_int_equal(c.mp.port, 6001);
    assert_string_equal(c.coordinator.url, "http://h/x?a=b");
    assert_string_equal(c.mp.shm_name, "");
    assert_string_equal(c.storage.l2_adapter_json.items[0], "{\"type\":\"fs\",\"base_path\":\"a=b\"}");
    assert_true(c.obs.metrics_sample_rate == 1.0);
    lmc_config_free(&c);
}

static void test_no_forms(void **state)
{
    (void)state;
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) {
        if (flags[i].kind != LMC_FK_BOOL && flags[i].kind != LMC_FK_TRUE)
            continue;
        char on[128], off[128];
        snprintf(on, sizeof on, "--%s", flags[i].name);
        snprintf(off, sizeof off, "--no-%s", flags[i].name);
        lmc_config c;
        /* Flags that need another to be valid get it (the blend ones apply
         * to --engine-type blend only). */
        const char *extra = strcmp(flags[i].name, "enable-tracing") == 0
                                ? "--otlp-endpoint=http://o"
                            : strcmp(flags[i].name, "enable-segmented-prefix") == 0 ||
                                    strcmp(flags[i].name, "enable-dedup-content") == 0
                                ? "--engine-type=blend"
                                : "--shm-name=";
        PARSE_OK(&c, on, extra);
        assert_true(*(bool *)((char *)&c + flags[i].offset));
        lmc_config_free(&c);
        PARSE_OK(&c, on, off, extra); /* last one wins */
        assert_false(*(bool *)((char *)&c + flags[i].offset));
        lmc_config_free(&c);
    }
}

static void test_no_forms_explicit(void **state)
{
    (void)state;
    lmc_config c;
    PARSE_OK(&c, "--no-separate-object-groups", "--no-l1-use-lazy", "--no-rpc-error-frames",
             "--no-enable-segmented-prefix", "--no-disable-metrics");
    assert_false(c.mp.separate_object_groups);
    assert_false(c.storage.l1_use_lazy);
    assert_false(c.mp.rpc_error_frames);
    assert_false(c.obs.disable_metrics);
    lmc_config_free(&c);
    PARSE_OK(&c, "--no-separate-object-groups", "--separate-object-groups");
    assert_true(c.mp.separate_object_groups);
    lmc_config_free(&c);
    PARSE_ERR("--no-port", "--no-port");
    PARSE_ERR("--rpc-error-frames: ignored explicit argument 'yes'", "--rpc-error-frames=yes");
}

static void test_nargs(void **state)
{
    (void)state;
    lmc_config c;
    PARSE_OK(&c, "--script-allowed-imports", "math", "json", "-x", "--port", "7000");
    assert_int_equal(c.mp.script_allowed_imports.count, 3);
    assert_string_equal(c.mp.script_allowed_imports.items[0], "math");
    assert_string_equal(c.mp.script_allowed_imports.items[2], "-x");
    assert_int_equal(c.mp.port, 7000);
    lmc_config_free(&c);
    PARSE_OK(&c, "--runtime-plugin-locations", "--port", "7001");
    assert_int_equal(c.plugins.locations.count, 0);
    assert_int_equal(c.mp.port, 7001);
    lmc_config_free(&c);
    PARSE_OK(&c, "--runtime-plugin-locations", "/a", "/b", "--runtime-plugin-locations", "/c");
    assert_int_equal(c.plugins.locations.count, 1); /* argparse: last occurrence wins */
    assert_string_equal(c.plugins.locations.items[0], "/c");
    lmc_config_free(&c);
    PARSE_OK(&c, "--runtime-plugin-locations=/x");
    assert_int_equal(c.plugins.locations.count, 1);
    assert_string_equal(c.plugins.locations.items[0], "/x");
    lmc_config_free(&c);
    PARSE_OK(&c, "--script-allowed-imports", "os"); /* runs to the end of argv */
    assert_int_equal(c.mp.script_allowed_imports.count, 1);
    lmc_config_free(&c);
}

/* A mistyped flag names the one the operator most likely meant (issue 31);
 * one that is like none gets the plain refusal. */
static void test_unknown_flags_suggest_the_nearest(void **state)
{
    (void)state;
    PARSE_ERR("unrecognized argument: --l1-size (did you mean --l1-size-gb?)", "--l1-size", "4");
    PARSE_ERR("unrecognized argument: --l1_size_gb (did you mean --l1-size-gb?)", "--l1_size_gb",
              "4");
    PARSE_ERR("unrecognized argument: --evicton-policy (did you mean --eviction-policy?)",
              "--evicton-policy", "LRU");
    PARSE_ERR("unrecognized argument: --chunksize=256 (did you mean --chunk-size?)",
              "--chunksize=256");
    lmc_config c;
    assert_int_equal(parse_list(&c, NULL, true, ARGS("--zzzzzzzzzzzz")), LMC_CONFIG_ERROR);
    assert_string_equal(err, "unrecognized argument: --zzzzzzzzzzzz");
}

static void test_repeatable(void **state)
{
    (void)state;
    lmc_config c;
    PARSE_OK(&c, "--l2-adapter", "{\"type\":\"mock\",\"num_workers\":1}", "--port", "1234", "--l2-adapter",
             "{\"type\":\"mock\",\"num_workers\":2}", "--l2-adapter={\"type\":\"mock\",\"num_workers\":3}");
    assert_int_equal(c.storage.l2_adapter_json.count, 3);
    assert_string_equal(c.storage.l2_adapter_json.items[0], "{\"type\":\"mock\",\"num_workers\":1}");
    assert_string_equal(c.storage.l2_adapter_json.items[2], "{\"type\":\"mock\",\"num_workers\":3}");
    lmc_config_free(&c);
    assert_int_equal(parse_list(&c, NULL, false,
                                ARGS("--eviction-policy", "LRU", "--l1-manager",
                                     "{\"type\":\"DRAM\",\"tag\":\"a\",\"size_gb\":1}",
                                     "--l1-manager",
                                     "{\"type\":\"DRAM\",\"tag\":\"b\",\"size_gb\":2}")),
                     LMC_CONFIG_OK);
    assert_int_equal(c.storage.l1_manager_json.count, 2);
    assert_non_null(strstr(c.storage.l1_manager_json.items[1], "\"b\""));
    lmc_config_free(&c);
}

static void test_bad_syntax(void **state)
{
    (void)state;
    PARSE_ERR("--bogus", "--bogus", "1");
    PARSE_ERR("stray", "stray");
    PARSE_ERR("-p", "-p", "1");
    PARSE_ERR("--port: expected one argument", "--port");
    PARSE_ERR("--port: expected one argument", "--port", "--host", "x");
    PARSE_ERR("--host: expected one argument", "--host");
    PARSE_ERR("--port: invalid int value '12abc'", "--port", "12abc");
    PARSE_ERR("--port: invalid int value ''", "--port", "");
    PARSE_ERR("--port: invalid int value '1.5'", "--port", "1.5");
    PARSE_ERR("--port", "--port", "99999999999");
    PARSE_ERR("--p2p-rdma-queue-depth: invalid int value 'x'", "--p2p-rdma-queue-depth", "x");
    PARSE_ERR("--eviction-ratio: invalid float value '0.5x'", "--eviction-ratio", "0.5x");
    PARSE_ERR("--l1-size-gb: invalid float value ' 1'", "--l1-size-gb", " 1");
    PARSE_ERR("--extra-logging-interval: invalid float value '0x10'", "--extra-logging-interval",
              "0x10");
}

/* Every value-taking flag reports a missing value by name. */
static void test_every_flag_missing_value(void **state)
{
    (void)state;
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) {
        lmc_flag_kind k = flags[i].kind;
        if (k == LMC_FK_BOOL || k == LMC_FK_TRUE || k == LMC_FK_NARGS)
            continue;
        char name[128];
        snprintf(name, sizeof name, "--%s", flags[i].name);
        lmc_config c;
        assert_int_equal(parse_list(&c, NULL, true, ARGS(name)), LMC_CONFIG_ERROR);
        assert_non_null(strstr(err, name));
        assert_non_null(strstr(err, "expected one argument"));
    }
}

static void test_negative_values(void **state)
{
    (void)state;
    lmc_config c;
    PARSE_OK(&c, "--p2p-rdma-gid-index", "-1", "--gc-monitor-top-objects", "-3");
    assert_int_equal(c.p2p.rdma_gid_index, -1);
    assert_int_equal(c.obs.gc_monitor_top_objects, -3);
    lmc_config_free(&c);
}

static void test_choices(void **state)
{
    (void)state;
    PARSE_ERR("--eviction-policy: invalid choice 'lru' (choose from LRU, ARC, IsolatedLRU, noop)",
              "--eviction-policy", "lru");
    PARSE_ERR("--engine-type: invalid choice 'x' (choose from default, blend, blend_legacy)",
              "--engine-type", "x");
    PARSE_ERR("(choose from lmcache_driven, engine_driven, auto)", "--supported-transfer-mode",
              "both");
    PARSE_ERR("--hash-algorithm: invalid choice 'md5' (choose from builtin, sha256_cbor, blake3)",
              "--hash-algorithm", "md5");
    PARSE_ERR("--l2-store-policy: invalid choice 'x' (choose from default, skip_l1)",
              "--l2-store-policy", "x");
    PARSE_ERR("--l2-prefetch-policy: invalid choice 'x' (choose from default, retain)",
              "--l2-prefetch-policy", "x");
    PARSE_ERR("--trace-level: invalid choice 'all' (choose from storage, events)",
              "--trace-level", "all");
    PARSE_ERR("--log-level: invalid choice 'loud'", "--log-level", "loud");
    lmc_config c;
    PARSE_OK(&c, "--eviction-policy", "IsolatedLRU", "--engine-type", "blend_legacy",
             "--trace-level", "storage", "--log-level", "Warn");
    assert_string_equal(c.storage.eviction_policy, "IsolatedLRU");
    assert_string_equal(c.mp.engine_type, "blend_legacy");
    assert_string_equal(c.obs.trace_level, "storage");
    assert_string_equal(c.mp.log_level, "WARNING");
    lmc_config_free(&c);
    PARSE_OK(&c, "--eviction-policy", "noop", "--log-level", "error");
    assert_string_equal(c.storage.eviction_policy, "noop");
    assert_string_equal(c.mp.log_level, "ERROR");
    lmc_config_free(&c);
}

static void test_derived_workers(void **state)
{
    (void)state;
    lmc_config c;
    PARSE_OK(&c, "--max-workers", "4");
    assert_int_equal(c.mp.max_gpu_workers, 4);
    assert_int_equal(c.mp.max_cpu_workers, 4);
    lmc_config_free(&c);
    PARSE_OK(&c, "--max-gpu-workers", "2", "--max-workers", "6");
    assert_int_equal(c.mp.max_gpu_workers, 2);
    assert_int_equal(c.mp.max_cpu_workers, 6);
    lmc_config_free(&c);
}

/* ---------------------------------------------------------------- env */

static void test_env_fallbacks(void **state)
{
    (void)state;
    char *env[] = {"PATH=/bin", "LMCACHE_COORDINATOR_URLX=http://wrong",
                   "LMCACHE_COORDINATOR_URL=http://coord:8000",
                   "LMCACHE_COORDINATOR_ADVERTISE_IP=10.1.2.3",
                   "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL=2.5",
                   "LMCACHE_COORDINATOR_L2_EVENT_REPORTING=Yes",
                   "LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL=0.25",
                   "LMCACHE_COORDINATOR_EVENT_REPORTING=true",
                   "LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL=0.75",
                   "LMCACHE_COORDINATOR_AUTH_TOKEN=env-token",
                   "LMCACHE_LOG_LEVEL=debug", NULL};
    lmc_config c;
    ENV_OK(&c, env, "--port", "5555");
    assert_true(c.coordinator.event_reporting);
    assert_true(c.coordinator.event_flush_interval == 0.75);
    assert_string_equal(c.coordinator.auth_token, "env-token");
    assert_string_equal(c.coordinator.url, "http://coord:8000");
    assert_string_equal(c.coordinator.advertise_ip, "10.1.2.3");
    assert_true(c.coordinator.heartbeat_interval == 2.5);
    assert_true(c.coordinator.l2_event_reporting);
    assert_true(c.coordinator.l2_event_flush_interval == 0.25);
    assert_string_equal(c.mp.log_level, "DEBUG");
    lmc_config_free(&c);
}

static void test_env_flag_wins(void **state)
{
    (void)state;
    char *env[] = {"LMCACHE_COORDINATOR_URL=http://env", "LMCACHE_COORDINATOR_ADVERTISE_IP=1.1.1.1",
                   "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL=abc",
                   "LMCACHE_COORDINATOR_L2_EVENT_REPORTING=1",
                   "LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL=9", "LMCACHE_LOG_LEVEL=bogus",
                   NULL};
    lmc_config c;
    ENV_OK(&c, env, "--coordinator-url", "http://flag", "--coordinator-advertise-ip", "2.2.2.2",
           "--coordinator-heartbeat-interval", "3", "--no-coordinator-l2-event-reporting",
           "--coordinator-l2-event-flush-interval", "4", "--log-level", "ERROR");
    assert_string_equal(c.coordinator.url, "http://flag");
    assert_string_equal(c.coordinator.advertise_ip, "2.2.2.2");
    assert_true(c.coordinator.heartbeat_interval == 3.0);
    assert_false(c.coordinator.l2_event_reporting);
    assert_true(c.coordinator.l2_event_flush_interval == 4.0);
    assert_string_equal(c.mp.log_level, "ERROR");
    lmc_config_free(&c);
}

static void test_env_bool_values(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        bool want;
    } cases[] = {{"1", true}, {"true", true}, {"TRUE", true}, {"yes", true},
                 {"0", false}, {"no", false}, {"on", false}, {"", false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char var[128];
        snprintf(var, sizeof var, "LMCACHE_COORDINATOR_L2_EVENT_REPORTING=%s", cases[i].text);
        char *env[] = {var, NULL};
        lmc_config c;
        ENV_OK(&c, env, "--port", "5555");
        assert_int_equal(c.coordinator.l2_event_reporting, cases[i].want);
        lmc_config_free(&c);
        ENV_OK(&c, env, "--coordinator-l2-event-reporting"); /* explicit flag wins */
        assert_true(c.coordinator.l2_event_reporting);
        lmc_config_free(&c);
    }
}

static void test_env_bad_values(void **state)
{
    (void)state;
    char *e1[] = {"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL=abc", NULL};
    ENV_ERR(e1, "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL: invalid float value 'abc'", "--port", "1");
    char *e2[] = {"LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL=1s", NULL};
    ENV_ERR(e2, "LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL", "--port", "1");
    char *e3[] = {"LMCACHE_LOG_LEVEL=chatty", NULL};
    ENV_ERR(e3, "LMCACHE_LOG_LEVEL: invalid choice 'chatty'", "--port", "1");
    /* A numeric but invalid env value fails validation, naming the flag. */
    char *e4[] = {"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL=0", NULL};
    ENV_ERR(e4, "--coordinator-heartbeat-interval", "--port", "1");
}

static void test_env_empty_and_null(void **state)
{
    (void)state;
    char *env[] = {NULL};
    lmc_config c;
    ENV_OK(&c, env, "--port", "5555");
    assert_string_equal(c.coordinator.url, "");
    lmc_config_free(&c);
    char *e2[] = {"LMCACHE_COORDINATOR_URL=", NULL};
    ENV_OK(&c, e2, "--port", "5555");
    assert_string_equal(c.coordinator.url, "");
    lmc_config_free(&c);
}

/* ---------------------------------------------------------------- help */

static char *help_text(const char *flag, lmc_config_status *st)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    const char *argv[] = {"/usr/bin/lmcached", "--port", "1", flag, "--bogus", NULL};
    lmc_config c;
    *st = lmc_config_parse(&c, 5, (char *const *)argv, NULL, out, err, sizeof err);
    fclose(out);
    assert_null(c.mp.instance_id); /* nothing left to free */
    return buf;
}

static void test_help(void **state)
{
    (void)state;
    lmc_config_status st;
    char *text = help_text("--help", &st);
    assert_int_equal(st, LMC_CONFIG_EXIT_OK);
    assert_non_null(strstr(text, "usage: lmcached"));
    static const char *const headings[] = {"\nMP Server:\n", "\nP2P:\n", "\nHTTP Frontend:\n",
                                           "\nCoordinator:\n", "\nStorage Manager (L1):\n",
                                           "\nStorage Manager (L2):\n", "\nObservability:\n",
                                           "\nRuntime Plugins:\n"};
    for (size_t i = 0; i < sizeof headings / sizeof headings[0]; i++)
        assert_non_null(strstr(text, headings[i]));
    assert_true(strstr(text, "MP Server:") < strstr(text, "Observability:"));
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) {
        char want[128];
        snprintf(want, sizeof want, "  --%s", flags[i].name);
        if (!strstr(text, want))
            fail_msg("help lacks %s", want);
        if (flags[i].env && !strstr(text, flags[i].env))
            fail_msg("help lacks %s", flags[i].env);
    }
    assert_non_null(strstr(text, "--no-separate-object-groups"));
    assert_non_null(strstr(text, "--no-enable-tracing"));
    assert_non_null(strstr(text, "(int, default: 5555) "));
    assert_non_null(strstr(text, "--hash-algorithm {builtin,sha256_cbor,blake3}"));
    assert_non_null(strstr(text, "default: random UUIDv4"));
    assert_non_null(strstr(text, "lmcached)"));
    free(text);
}

static void test_help_short_and_version(void **state)
{
    (void)state;
    lmc_config_status st;
    char *text = help_text("-h", &st);
    assert_int_equal(st, LMC_CONFIG_EXIT_OK);
    assert_non_null(strstr(text, "Observability:"));
    free(text);
    text = help_text("--version", &st);
    assert_int_equal(st, LMC_CONFIG_EXIT_OK);
    assert_non_null(strstr(text, "lmcached "));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_parse),
        cmocka_unit_test(test_defaults_init),
        cmocka_unit_test(test_legacy_flags_required),
        cmocka_unit_test(test_every_flag_parses),
        cmocka_unit_test(test_every_flag_is_covered),
        cmocka_unit_test(test_storage_paths_and_hugepages),
        cmocka_unit_test(test_equals_form),
        cmocka_unit_test(test_no_forms),
        cmocka_unit_test(test_no_forms_explicit),
        cmocka_unit_test(test_nargs),
        cmocka_unit_test(test_repeatable),
        cmocka_unit_test(test_unknown_flags_suggest_the_nearest),
        cmocka_unit_test(test_bad_syntax),
        cmocka_unit_test(test_every_flag_missing_value),
        cmocka_unit_test(test_negative_values),
        cmocka_unit_test(test_choices),
        cmocka_unit_test(test_derived_workers),
        cmocka_unit_test(test_env_fallbacks),
        cmocka_unit_test(test_env_flag_wins),
        cmocka_unit_test(test_env_bool_values),
        cmocka_unit_test(test_env_bad_values),
        cmocka_unit_test(test_env_empty_and_null),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_help_short_and_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
