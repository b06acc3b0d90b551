/* Effective server configuration: every configuration group of the upstream
 * MP server, parsed from argv (+ environment fallbacks), validated, and
 * rendered as JSON.
 *
 * Ownership: every string and list inside lmc_config is heap-allocated and
 * owned by the config; lmc_config_free() releases it all.  A "nullable"
 * string is NULL when the flag was not given (upstream default None). */
#ifndef LMC_CONFIG_CONFIG_H
#define LMC_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    char **items;
    size_t count;
} lmc_strlist;

typedef struct {
    bool set;
    double value;
} lmc_opt_double;

/* --- MP server ("MP Server" group) -------------------------------------- */
typedef struct {
    char *instance_id;               /* --instance-id, default random UUIDv4 */
    char *host;                      /* --host "localhost" */
    int port;                        /* --port 5555 */
    int chunk_size;                  /* --chunk-size 256 */
    int max_workers;                 /* --max-workers 1 */
    int max_gpu_workers;             /* --max-gpu-workers (default max_workers) */
    int max_cpu_workers;             /* --max-cpu-workers (default max_workers) */
    char *hash_algorithm;            /* --hash-algorithm "blake3" */
    int hash_memo_mb;                /* --hash-memo-mb 16 (lmcached) */
    char *engine_type;               /* --engine-type default|blend|blend_legacy */
    char *supported_transfer_mode;   /* --supported-transfer-mode auto|lmcache_driven|engine_driven */
    bool separate_object_groups;     /* --[no-]separate-object-groups, true */
    char *cpu_kv_layout;             /* --cpu-kv-layout hnd|hint (lmcached) */
    int copy_split_bytes;            /* --copy-split-bytes, 1 MiB; 0 never splits */
    int layerwise_batch;             /* --layerwise-batch, env LMCACHE_MP_LAYERWISE_BATCH, 0 */
    bool enable_segmented_prefix;    /* --enable-segmented-prefix, false */
    bool enable_dedup_content;       /* --enable-dedup-content, false (blend) */
    int blend_max_chunks;            /* --blend-max-chunks, 2^20 (lmcached) */
    char *shm_name;                  /* --shm-name, nullable (NULL = auto) */
    lmc_strlist script_allowed_imports; /* --script-allowed-imports (nargs *) */
    double worker_reap_timeout_seconds;       /* 120.0 */
    double worker_registration_grace_seconds; /* 3600.0 */
    /* lmcached additions (documented in docs/configuration.md) */
    char *log_level;                 /* --log-level, env LMCACHE_LOG_LEVEL, "INFO" */
    char *log_format;                /* --log-format text|json, env LMCACHE_LOG_FORMAT */
    bool rpc_error_frames;           /* --[no-]rpc-error-frames, false */
    int max_interned_strings;        /* --max-interned-strings 65536 */
    int max_queued_requests;         /* --max-queued-requests 4096 */
    int kv_event_log_size;           /* --kv-event-log-size 32768 (0 = off) */
    char *kv_events_publish_endpoint; /* --kv-events-publish-endpoint, "" = off */
    char *kv_events_replay_endpoint; /* --kv-events-replay-endpoint, "" = none */
    char *kv_events_topic;           /* --kv-events-topic, "" */
    int kv_events_buffer_steps;      /* --kv-events-buffer-steps 10000 */
    int kv_events_block_size;        /* --kv-events-block-size 0 (0 = chunk hashes) */
    char *kv_events_hash_seed;       /* --kv-events-hash-seed, nullable (NULL = $PYTHONHASHSEED) */
} lmc_mp_config;

/* --- Runtime plugins ---------------------------------------------------- */
typedef struct {
    lmc_strlist locations;           /* --runtime-plugin-locations (nargs *) */
    char *extra_config_json;         /* --runtime-plugin-config, a JSON object, "{}" */
} lmc_runtime_plugin_config;

/* --- P2P ---------------------------------------------------------------- */
typedef struct {
    char *advertise_url;             /* --p2p-advertise-url "" (non-empty enables P2P) */
    char *listen_url;                /* --p2p-listen-url "" */
    double lookup_timeout;           /* --p2p-lookup-timeout 30.0 */
    double load_timeout;             /* --p2p-load-timeout 30.0 */
    char *transfer_engine;           /* --p2p-transfer-engine "nixl" */
    char *rdma_device;               /* --p2p-rdma-device "" */
    int rdma_port;                   /* --p2p-rdma-port 1 */
    int rdma_gid_index;              /* --p2p-rdma-gid-index -1 */
    char *rdma_gid_indices;          /* --p2p-rdma-gid-indices "" */
    int64_t rdma_queue_depth;        /* --p2p-rdma-queue-depth 4096 */
    int64_t rdma_handshake_timeout_ms; /* --p2p-rdma-handshake-timeout-ms 10000 */
} lmc_p2p_config;

/* --- HTTP frontend ------------------------------------------------------ */
typedef struct {
    char *http_host;                 /* --http-host "0.0.0.0" */
    int http_port;                   /* --http-port 8080 */
    bool enabled;                    /* --[no-]http, true (lmcached: ZMQ only when off) */
    /* lmcached additions (docs/http.md, "Authentication" and "Request bodies") */
    char *auth_token;                /* --http-auth-token / LMCACHE_HTTP_AUTH_TOKEN, or
                                      * read from --http-auth-token-file; NULL = none */
    char *auth_token_file;           /* --http-auth-token-file, nullable */
    unsigned auth_token_file_mode;   /* its permission bits, read with the token */
    int max_buffered_mb;             /* --http-max-buffered-mb 2048 */
} lmc_http_config;

/* --- Coordinator (flags fall back to LMCACHE_COORDINATOR_*) -------------- */
typedef struct {
    char *url;                       /* --coordinator-url / LMCACHE_COORDINATOR_URL, "" */
    char *advertise_ip;              /* --coordinator-advertise-ip / ..._ADVERTISE_IP, "" */
    double heartbeat_interval;       /* --coordinator-heartbeat-interval, 5.0 */
    bool l2_event_reporting;         /* --coordinator-l2-event-reporting, false */
    double l2_event_flush_interval;  /* --coordinator-l2-event-flush-interval, 1.0 */
    bool event_reporting;            /* --coordinator-event-reporting, false */
    double event_flush_interval;     /* --coordinator-event-flush-interval, 1.0 */
    char *auth_token;                /* --coordinator-auth-token / ..._AUTH_TOKEN; NULL = none */
} lmc_coordinator_config;

/* --- Storage manager (docs/configuration.md, "Storage Manager (L1)" and
 *     "Storage Manager (L2)") --------------------------------------------- */
typedef struct {
    lmc_strlist l1_manager_json;     /* --l1-manager (repeatable JSON object) */
    lmc_opt_double l1_size_gb;       /* --l1-size-gb (float, None) */
    bool l1_use_lazy;                /* --[no-]l1-use-lazy, true */
    int l1_init_size_gb;             /* --l1-init-size-gb 20 */
    int l1_shm_reserve_mb;           /* --l1-shm-reserve-mb, -1 = automatic (lmcached) */
    int64_t l1_align_bytes;          /* --l1-align-bytes 4096 */
    bool l1_use_hugepages;           /* --[no-]l1-use-hugepages, false */
    char *l1_devdax_path;            /* --l1-devdax-path, nullable */
    char *gds_l1_path;               /* --gds-l1-path, nullable */
    bool gds_l1_use_direct_io;       /* --[no-]gds-l1-use-direct-io, true */
    char *gds_l1_backend;            /* --gds-l1-backend "auto" */
    int l1_write_ttl_seconds;        /* --l1-write-ttl-seconds 600 */
    int l1_read_ttl_seconds;         /* --l1-read-ttl-seconds 300 */
    char *eviction_policy;           /* --eviction-policy LRU|ARC|IsolatedLRU|noop, nullable */
    double eviction_trigger_watermark; /* --eviction-trigger-watermark 0.8 */
    double eviction_ratio;           /* --eviction-ratio 0.2 */
    char *l2_store_policy;           /* --l2-store-policy "default" */
    char *l2_prefetch_policy;        /* --l2-prefetch-policy "default" */
    int l2_prefetch_max_in_flight;   /* --l2-prefetch-max-in-flight 8 */
    lmc_opt_double l2_prefetch_load_timeout; /* --l2-prefetch-load-timeout (None) */
    int periodic_notifier_interval_ms; /* --periodic-notifier-interval-ms 5 */
    lmc_strlist l2_adapter_json;     /* --l2-adapter (repeatable JSON object) */
    double l2_health_interval_s;     /* --l2-health-interval-s 10 */
    bool health_requires_l2;         /* --health-requires-l2 */
} lmc_storage_config;

/* --- Observability (docs/observability.md, "Flags") --------------------- */
typedef struct {
    bool disable_observability;      /* --disable-observability */
    bool disable_metrics;            /* --disable-metrics */
    bool disable_logging;            /* --disable-logging */
    bool enable_tracing;             /* --enable-tracing (needs --otlp-endpoint) */
    char *otlp_endpoint;             /* --otlp-endpoint, nullable */
    int event_bus_queue_size;        /* --event-bus-queue-size 10000 */
    int prometheus_port;             /* --prometheus-port 9090 */
    double metrics_sample_rate;      /* --metrics-sample-rate 0.01, in (0,1] */
    char *lookup_hash_log_dir;       /* --lookup-hash-log-dir "" */
    double lookup_hash_log_rotation_interval;   /* 21600 */
    int64_t lookup_hash_log_rotation_max_size;  /* 104857600 */
    int lookup_hash_log_max_files;   /* 100 */
    bool enable_gc_monitor;          /* accepted for compatibility; no effect in C */
    double gc_monitor_min_pause_ms;  /* 1.0 */
    int gc_monitor_top_objects;      /* 0 */
    bool enable_extra_logging;       /* --enable-extra-logging */
    double extra_logging_interval;   /* --extra-logging-interval 10.0, > 0 */
    char *trace_level;               /* --trace-level storage|events, nullable */
    char *trace_output;              /* --trace-output, nullable */
    bool allow_trace_replay;         /* --allow-trace-replay: POST /api/trace/replay */
} lmc_obs_config;

typedef struct lmc_config {
    lmc_mp_config mp;
    lmc_runtime_plugin_config plugins;
    lmc_p2p_config p2p;
    lmc_http_config http;
    lmc_coordinator_config coordinator;
    lmc_storage_config storage;
    lmc_obs_config obs;
} lmc_config;

typedef enum {
    LMC_CONFIG_OK = 0,       /* cfg is filled and valid */
    LMC_CONFIG_EXIT_OK = 1,  /* --help/--version printed; caller exits 0 */
    LMC_CONFIG_ERROR = 2,    /* err holds a one-line message; caller exits 2 */
} lmc_config_status;

/* Fills *cfg from argv (argv[0] is the program name) and the environment
 * envp (NULL-terminated "KEY=VALUE" array, like environ; NULL = empty).
 * `help_out` receives --help text.  On error, `err` gets one line naming the
 * flag and the bad value, and *cfg holds nothing that needs freeing. */
lmc_config_status lmc_config_parse(lmc_config *cfg, int argc, char *const argv[],
                                   char *const envp[], FILE *help_out,
                                   char *err, size_t errlen);

/* Defaults only (what parse() gives for an empty argv and environment, with
 * a fresh random instance id).  Returns 0, or -1 on allocation failure. */
int lmc_config_init_defaults(lmc_config *cfg);

void lmc_config_free(lmc_config *cfg);

/* The whole effective configuration as a JSON object, grouped as
 * {"mp_config":{...}, "storage_manager_config":{...}, "obs_config":{...},
 *  "http_config":{...}, "coordinator_config":{...}, "p2p_config":{...},
 *  "runtime_plugin_config":{...}} with upstream's field names.
 * Returns a malloc'd NUL-terminated string, or NULL on allocation failure. */
char *lmc_config_to_json(const lmc_config *cfg);

/* Refuses a value whose feature this build does not have (a non-default
 * --engine-type, --coordinator-url, --p2p-advertise-url, ...): returns -1
 * with one line naming the flag in `err`, else 0.  Separate from parsing,
 * which accepts whatever upstream accepts (docs/configuration.md, "Flags
 * refused by this version"). */
int lmc_config_check_built(const lmc_config *cfg, char *err, size_t errlen);

/* L1 size in bytes from the legacy flag or the first --l1-manager entry
 * (0 if neither is set). */
uint64_t lmc_config_l1_size_bytes(const lmc_config *cfg);

/* --- Flag table (read-only; drives parsing, --help, JSON and the docs) --- */

/* Help sections, in --help order. */
typedef enum {
    LMC_FG_MP,
    LMC_FG_PLUGINS,
    LMC_FG_P2P,
    LMC_FG_HTTP,
    LMC_FG_COORD,
    LMC_FG_L1,
    LMC_FG_L2,
    LMC_FG_OBS,
    LMC_FG_COUNT
} lmc_flag_group;

typedef enum {
    LMC_FK_STR,      /* char *, never NULL after defaults */
    LMC_FK_NSTR,     /* char *, NULL = None */
    LMC_FK_INT,      /* int */
    LMC_FK_I64,      /* int64_t */
    LMC_FK_DBL,      /* double */
    LMC_FK_OPT_DBL,  /* lmc_opt_double */
    LMC_FK_BOOL,     /* bool, argparse BooleanOptionalAction (--x / --no-x) */
    LMC_FK_TRUE,     /* bool, store_true (lmcached also accepts --no-x) */
    LMC_FK_APPEND,   /* lmc_strlist, one value per occurrence */
    LMC_FK_NARGS,    /* lmc_strlist, nargs='*' (last occurrence wins) */
} lmc_flag_kind;

/* lmc_config_flag.range: checked after parsing when LMC_RANGE_CHECK is set. */
enum {
    LMC_RANGE_CHECK = 1u << 0,
    LMC_RANGE_MIN_OPEN = 1u << 1,  /* value > min (else >= min) */
    LMC_RANGE_HAS_MAX = 1u << 2,
    LMC_RANGE_FINITE = 1u << 3,    /* doubles: reject inf/nan */
};

enum {
    LMC_FF_ADDITION = 1u << 0,     /* lmcached addition, not an upstream flag */
    LMC_FF_JSON = 1u << 1,         /* value(s) are JSON text, rendered parsed */
    LMC_FF_DERIVED = 1u << 2,      /* default computed from another flag */
    LMC_FF_LOG_LEVEL = 1u << 3,    /* lmc_log_level_parse(); stored canonical */
    LMC_FF_SECRET = 1u << 4,       /* never rendered: "***" when set, null when not */
};

typedef struct {
    const char *name;              /* without the leading "--" */
    lmc_flag_group group;
    lmc_flag_kind kind;
    size_t offset;                 /* into lmc_config */
    const char *def;               /* default as argv text; NULL = None */
    const char *def_doc;           /* default as shown in --help, when not def */
    const char *env;               /* environment fallback, or NULL */
    const char *const *choices;    /* NULL-terminated, or NULL */
    const char *json_name;         /* field name in lmc_config_to_json() */
    unsigned flags;                /* LMC_FF_* */
    unsigned range;                /* LMC_RANGE_* */
    double min, max;
    const char *help;              /* one line */
} lmc_config_flag;

/* The flag table and its length. */
const lmc_config_flag *lmc_config_flags(size_t *count);

/* "MP Server", "P2P", ... as printed by --help. */
const char *lmc_config_group_title(lmc_flag_group group);

/* JSON object name of a group ("mp_config", "storage_manager_config", ...). */
const char *lmc_config_group_json(lmc_flag_group group);

/* Writes the --help text. */
void lmc_config_print_help(FILE *out, const char *prog);

#endif
