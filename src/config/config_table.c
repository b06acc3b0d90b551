/* The flag table: one descriptor per command-line flag.  Parsing, defaults,
 * environment fallbacks, simple range checks, --help and the JSON rendering
 * are all driven from here, so adding a flag means adding one entry (plus a
 * field in config.h, and a rule in config_validate.c if it needs more than a
 * range). */
#include "config/config_internal.h"

#include <stddef.h>
#include <string.h>

#define AT(member) .offset = offsetof(lmc_config, member)

/* Range shorthands. */
#define GE1 .range = LMC_RANGE_CHECK, .min = 1
#define GT0 .range = LMC_RANGE_CHECK | LMC_RANGE_MIN_OPEN, .min = 0
#define GT0_FINITE .range = LMC_RANGE_CHECK | LMC_RANGE_MIN_OPEN | LMC_RANGE_FINITE, .min = 0
#define PORT .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 1, .max = 65535
#define FRACTION                                                                   \
    .range = LMC_RANGE_CHECK | LMC_RANGE_MIN_OPEN | LMC_RANGE_HAS_MAX | LMC_RANGE_FINITE, \
    .min = 0, .max = 1

static const char *const hash_choices[] = {"builtin", "sha256_cbor", "blake3", NULL};
static const char *const engine_choices[] = {"default", "blend", "blend_legacy", NULL};
static const char *const cpu_layout_choices[] = {"hnd", "hint", NULL};
static const char *const mode_choices[] = {"lmcache_driven", "engine_driven", "auto", NULL};
static const char *const log_choices[] = {"DEBUG", "INFO", "WARNING", "ERROR", NULL};
static const char *const log_format_choices[] = {"text", "json", NULL};
static const char *const evict_choices[] = {"LRU", "ARC", "IsolatedLRU", "noop", NULL};
static const char *const store_choices[] = {"default", "skip_l1", NULL};
static const char *const prefetch_choices[] = {"default", "retain", NULL};
static const char *const trace_choices[] = {"storage", "events", NULL};

static const lmc_config_flag flags[] = {
    /* --- MP Server -------------------------------------------------------- */
    {.name = "instance-id", .group = LMC_FG_MP, .kind = LMC_FK_STR, AT(mp.instance_id),
     .def_doc = "random UUIDv4", .json_name = "instance_id",
     .help = "Unique id of this server (coordinator membership key, service.instance.id)."},
    {.name = "host", .group = LMC_FG_MP, .kind = LMC_FK_STR, AT(mp.host), .def = "localhost",
     .json_name = "host", .help = "Host/interface the ZMQ message-queue server binds."},
    {.name = "port", .group = LMC_FG_MP, .kind = LMC_FK_INT, AT(mp.port), .def = "5555",
     .json_name = "port", PORT, .help = "TCP port of the ZMQ message-queue server."},
    {.name = "chunk-size", .group = LMC_FG_MP, .kind = LMC_FK_INT, AT(mp.chunk_size),
     .def = "256", .json_name = "chunk_size", GE1,
     .help = "Tokens per KV chunk (one stored object per chunk)."},
    {.name = "max-workers", .group = LMC_FG_MP, .kind = LMC_FK_INT, AT(mp.max_workers),
     .def = "1", .json_name = "max_workers", GE1,
     .help = "Default size of the GPU and CPU worker pools."},
    {.name = "max-gpu-workers", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.max_gpu_workers), .def_doc = "--max-workers", .json_name = "max_gpu_workers",
     .flags = LMC_FF_DERIVED, GE1,
     .help = "Workers in the GPU (affinity) pool that runs STORE/RETRIEVE."},
    {.name = "max-cpu-workers", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.max_cpu_workers), .def_doc = "--max-workers", .json_name = "max_cpu_workers",
     .flags = LMC_FF_DERIVED, GE1,
     .help = "Workers in the CPU (normal) pool that runs LOOKUP, END_SESSION, ..."},
    {.name = "hash-algorithm", .group = LMC_FG_MP, .kind = LMC_FK_STR,
     AT(mp.hash_algorithm), .def = "blake3", .choices = hash_choices,
     .json_name = "hash_algorithm",
     .help = "Token-chunk hash; 'builtin' is refused (CPython hash() only)."},
    {.name = "hash-memo-mb", .group = LMC_FG_MP, .kind = LMC_FK_INT, AT(mp.hash_memo_mb),
     .def = "16", .json_name = "hash_memo_mb", .flags = LMC_FF_ADDITION,
     .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 0, .max = 65536,
     .help = "MiB for the memo of chunk hashes shared by all requests (0 = off)."},
    {.name = "engine-type", .group = LMC_FG_MP, .kind = LMC_FK_STR, AT(mp.engine_type),
     .def = "default", .choices = engine_choices, .json_name = "engine_type",
     .help = "Cache engine type: 'blend' serves CacheBlend (docs/cacheblend.md); "
             "'blend_legacy' serves as 'default' (its ops have no wire ids)."},
    {.name = "supported-transfer-mode", .group = LMC_FG_MP, .kind = LMC_FK_STR,
     AT(mp.supported_transfer_mode), .def = "auto", .choices = mode_choices,
     .json_name = "supported_transfer_mode",
     .help = "KV transfer mode(s) offered to engines."},
    {.name = "separate-object-groups", .group = LMC_FG_MP, .kind = LMC_FK_BOOL,
     AT(mp.separate_object_groups), .def = "true", .json_name = "separate_object_groups",
     .help = "Keep one object group per sliding-window size."},
    /* At most 4096: LMC_KV_MAX_LAYERS, the most layers a registration has. */
    {.name = "layerwise-batch", .group = LMC_FG_MP, .kind = LMC_FK_INT, AT(mp.layerwise_batch),
     .def = "0", .env = "LMCACHE_MP_LAYERWISE_BATCH", .json_name = "layerwise_batch",
     .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 0, .max = 4096,
     .help = "Layers per streamed reply of RETRIEVE_LAYERWISE; 0 turns layerwise retrieve off."},
    {.name = "copy-split-bytes", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.copy_split_bytes), .def = "1048576",
     .json_name = "copy_split_bytes", .flags = LMC_FF_ADDITION,
     .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 0, .max = 1073741824,
     .help = "Server-driven CPU copies of at least twice this many bytes are cut into "
             "pieces of at least this size that idle --max-gpu-workers threads take; "
             "0 never splits."},
    {.name = "cpu-kv-layout", .group = LMC_FG_MP, .kind = LMC_FK_STR, AT(mp.cpu_kv_layout),
     .def = "hnd", .choices = cpu_layout_choices, .json_name = "cpu_kv_layout",
     .flags = LMC_FF_ADDITION,
     .help = "vLLM CPU shared tensors: 'hnd' as vLLM's CPU attention stores them, "
             "'hint' as the registration's kv_layout says."},
    {.name = "enable-segmented-prefix", .group = LMC_FG_MP, .kind = LMC_FK_TRUE,
     AT(mp.enable_segmented_prefix), .def = "false", .json_name = "enable_segmented_prefix",
     .help = "CacheBlend (--engine-type blend only): prefix chunks after a gap come "
             "back as segmented_prefix_segments."},
    {.name = "enable-dedup-content", .group = LMC_FG_MP, .kind = LMC_FK_TRUE,
     AT(mp.enable_dedup_content), .def = "false", .json_name = "enable_dedup_content",
     .help = "CacheBlend: register the same chunk text stored after different prefixes "
             "once (the first copy wins)."},
    {.name = "blend-max-chunks", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.blend_max_chunks), .def = "1048576", .json_name = "blend_max_chunks",
     .flags = LMC_FF_ADDITION,
     .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 1, .max = 1048576,
     .help = "CacheBlend: chunks the fingerprint matcher holds at most (72 bytes each, "
             "docs/cacheblend.md); registrations past it are refused and counted."},
    {.name = "shm-name", .group = LMC_FG_MP, .kind = LMC_FK_NSTR, AT(mp.shm_name),
     .def_doc = "None (lmcache_l1_pool_<pid>)", .json_name = "shm_name",
     .help = "POSIX SHM name of the L1 pool; \"\" disables SHM."},
    {.name = "script-allowed-imports", .group = LMC_FG_MP, .kind = LMC_FK_NARGS,
     AT(mp.script_allowed_imports), .def_doc = "[]", .json_name = "script_allowed_imports",
     .help = "Modules a /run_script script may import."},
    {.name = "worker-reap-timeout-seconds", .group = LMC_FG_MP, .kind = LMC_FK_DBL,
     AT(mp.worker_reap_timeout_seconds), .def = "120.0",
     .json_name = "worker_reap_timeout_seconds",
     .help = "Reap a pinging worker silent this long; 0 disables, else >= 30."},
    {.name = "worker-registration-grace-seconds", .group = LMC_FG_MP, .kind = LMC_FK_DBL,
     AT(mp.worker_registration_grace_seconds), .def = "3600.0",
     .json_name = "worker_registration_grace_seconds",
     .help = "Reap a never-pinged worker after this long; >= reap timeout."},
    {.name = "log-level", .group = LMC_FG_MP, .kind = LMC_FK_STR, AT(mp.log_level),
     .def = "INFO", .env = "LMCACHE_LOG_LEVEL", .choices = log_choices,
     .json_name = "log_level", .flags = LMC_FF_ADDITION | LMC_FF_LOG_LEVEL,
     .help = "Log threshold (case-insensitive; WARN and OFF also accepted)."},
    {.name = "log-format", .group = LMC_FG_MP, .kind = LMC_FK_STR, AT(mp.log_format),
     .def = "text", .env = "LMCACHE_LOG_FORMAT", .choices = log_format_choices,
     .json_name = "log_format", .flags = LMC_FF_ADDITION,
     .help = "Log lines as text, or as JSON objects one per line (docs/observability.md)."},
    {.name = "rpc-error-frames", .group = LMC_FG_MP, .kind = LMC_FK_BOOL,
     AT(mp.rpc_error_frames), .def = "false", .json_name = "rpc_error_frames",
     .flags = LMC_FF_ADDITION,
     .help = "Answer bad requests with LMCACHE_RPC_ERROR_V1 frames instead of dropping them."},
    {.name = "max-interned-strings", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.max_interned_strings), .def = "65536", .json_name = "max_interned_strings",
     .flags = LMC_FF_ADDITION, .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 16,
     .max = 16777216,
     .help = "Distinct model names and cache salts the server keeps; past this, names no "
             "object uses any more are evicted, and a store naming a new one is refused only "
             "while every one is in use."},
    {.name = "max-queued-requests", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.max_queued_requests), .def = "4096", .json_name = "max_queued_requests",
     .flags = LMC_FF_ADDITION, .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 1,
     .max = 1048576,
     .help = "Requests waiting per worker queue; past it a request gets its op's "
             "overload answer at once."},
    {.name = "kv-event-log-size", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.kv_event_log_size), .def = "32768", .json_name = "kv_event_log_size",
     .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 0, .max = 16777216,
     .help = "Records the KV event log keeps for POLL_KV_EVENTS (docs/kv_events.md); "
             "0 disables it."},
    {.name = "kv-events-publish-endpoint", .group = LMC_FG_MP, .kind = LMC_FK_STR,
     AT(mp.kv_events_publish_endpoint), .def = "",
     .env = "LMCACHE_KV_EVENTS_PUBLISH_ENDPOINT", .json_name = "kv_events_publish_endpoint",
     .flags = LMC_FF_ADDITION,
     .help = "ZMQ PUB endpoint bound to publish the KV event log in vLLM's format "
             "(docs/kv_events.md); \"\" = off."},
    {.name = "kv-events-replay-endpoint", .group = LMC_FG_MP, .kind = LMC_FK_STR,
     AT(mp.kv_events_replay_endpoint), .def = "",
     .env = "LMCACHE_KV_EVENTS_REPLAY_ENDPOINT", .json_name = "kv_events_replay_endpoint",
     .flags = LMC_FF_ADDITION,
     .help = "ZMQ ROUTER endpoint bound to replay published batches; \"\" = none."},
    {.name = "kv-events-topic", .group = LMC_FG_MP, .kind = LMC_FK_STR,
     AT(mp.kv_events_topic), .def = "", .env = "LMCACHE_KV_EVENTS_TOPIC",
     .json_name = "kv_events_topic", .flags = LMC_FF_ADDITION,
     .help = "Topic frame of every published KV event batch."},
    {.name = "kv-events-buffer-steps", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.kv_events_buffer_steps), .def = "10000", .env = "LMCACHE_KV_EVENTS_BUFFER_STEPS",
     .json_name = "kv_events_buffer_steps", .flags = LMC_FF_ADDITION,
     .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 1, .max = 1000000,
     .help = "Published batches kept for the replay socket."},
    {.name = "kv-events-block-size", .group = LMC_FG_MP, .kind = LMC_FK_INT,
     AT(mp.kv_events_block_size), .def = "0", .env = "LMCACHE_KV_EVENTS_BLOCK_SIZE",
     .json_name = "kv_events_block_size", .flags = LMC_FF_ADDITION,
     .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = 0, .max = 1048576,
     .help = "vLLM's --block-size: publish vLLM's sha256_cbor block hashes over blocks of "
             "this many tokens (a divisor of --chunk-size); 0 = LMCache chunk hashes."},
    {.name = "kv-events-hash-seed", .group = LMC_FG_MP, .kind = LMC_FK_NSTR,
     AT(mp.kv_events_hash_seed), .def_doc = "None ($PYTHONHASHSEED)",
     .env = "LMCACHE_KV_EVENTS_HASH_SEED", .json_name = "kv_events_hash_seed",
     .flags = LMC_FF_ADDITION,
     .help = "vLLM's PYTHONHASHSEED for --kv-events-block-size; unset = $PYTHONHASHSEED, "
             "one of the two is required."},

    /* --- Runtime plugins -------------------------------------------------- */
    {.name = "runtime-plugin-locations", .group = LMC_FG_PLUGINS, .kind = LMC_FK_NARGS,
     AT(plugins.locations), .def_doc = "[]", .json_name = "runtime_plugin_locations",
     .help = "Plugin files or directories (scanned for *.py and *.sh)."},
    {.name = "runtime-plugin-config", .group = LMC_FG_PLUGINS, .kind = LMC_FK_STR,
     AT(plugins.extra_config_json), .def = "{}", .json_name = "runtime_plugin_extra_config",
     .flags = LMC_FF_JSON, .help = "JSON object of extra key/values handed to plugins."},

    /* --- P2P ---------------------------------------------------------------- */
    {.name = "p2p-advertise-url", .group = LMC_FG_P2P, .kind = LMC_FK_STR,
     AT(p2p.advertise_url), .def = "", .json_name = "p2p_advertise_url",
     .help = "host:port peers use for transfers; non-empty enables P2P."},
    {.name = "p2p-listen-url", .group = LMC_FG_P2P, .kind = LMC_FK_STR, AT(p2p.listen_url),
     .def = "", .json_name = "p2p_listen_url",
     .help = "Bind address of the transfer channel (\"\" = advertise URL)."},
    {.name = "p2p-lookup-timeout", .group = LMC_FG_P2P, .kind = LMC_FK_DBL,
     AT(p2p.lookup_timeout), .def = "30.0", .json_name = "p2p_lookup_timeout", GT0_FINITE,
     .help = "Seconds to wait for a peer's lookup result."},
    {.name = "p2p-load-timeout", .group = LMC_FG_P2P, .kind = LMC_FK_DBL,
     AT(p2p.load_timeout), .def = "30.0", .json_name = "p2p_load_timeout", GT0_FINITE,
     .help = "Seconds to wait for a peer transfer to finish."},
    {.name = "p2p-transfer-engine", .group = LMC_FG_P2P, .kind = LMC_FK_STR,
     AT(p2p.transfer_engine), .def = "nixl", .json_name = "p2p_transfer_engine",
     .help = "Transfer channel engine: tcp, ucx (nixl and verbs: served by ucx)."},
    {.name = "p2p-rdma-device", .group = LMC_FG_P2P, .kind = LMC_FK_STR,
     AT(p2p.rdma_device), .def = "", .json_name = "p2p_rdma_device",
     .help = "verbs: comma list of unique HCA names (required for verbs)."},
    {.name = "p2p-rdma-port", .group = LMC_FG_P2P, .kind = LMC_FK_INT, AT(p2p.rdma_port),
     .def = "1", .json_name = "p2p_rdma_port", .help = "verbs: HCA port, 1..255."},
    {.name = "p2p-rdma-gid-index", .group = LMC_FG_P2P, .kind = LMC_FK_INT,
     AT(p2p.rdma_gid_index), .def = "-1", .json_name = "p2p_rdma_gid_index",
     .help = "verbs: GID index, -1..255 (-1 = pick by advertised IPv4)."},
    {.name = "p2p-rdma-gid-indices", .group = LMC_FG_P2P, .kind = LMC_FK_STR,
     AT(p2p.rdma_gid_indices), .def = "", .json_name = "p2p_rdma_gid_indices",
     .help = "verbs: comma list of GID indices, one per device."},
    {.name = "p2p-rdma-queue-depth", .group = LMC_FG_P2P, .kind = LMC_FK_I64,
     AT(p2p.rdma_queue_depth), .def = "4096", .json_name = "p2p_rdma_queue_depth",
     .help = "verbs: queue depth, 1..2^32-1."},
    {.name = "p2p-rdma-handshake-timeout-ms", .group = LMC_FG_P2P, .kind = LMC_FK_I64,
     AT(p2p.rdma_handshake_timeout_ms), .def = "10000",
     .json_name = "p2p_rdma_handshake_timeout_ms",
     .help = "verbs: connection handshake timeout in ms, >= 1."},

    /* --- HTTP frontend ---------------------------------------------------- */
    {.name = "http-host", .group = LMC_FG_HTTP, .kind = LMC_FK_STR, AT(http.http_host),
     .def = "0.0.0.0", .json_name = "http_host", .help = "Host the HTTP frontend binds."},
    {.name = "http-port", .group = LMC_FG_HTTP, .kind = LMC_FK_INT, AT(http.http_port),
     .def = "8080", .json_name = "http_port", PORT, .help = "Port of the HTTP frontend."},
    {.name = "http", .group = LMC_FG_HTTP, .kind = LMC_FK_BOOL, AT(http.enabled),
     .def = "true", .json_name = "enabled",
     .help = "Serve the HTTP frontend (lmcached; --no-http runs ZMQ only)."},
    {.name = "http-auth-token", .group = LMC_FG_HTTP, .kind = LMC_FK_NSTR,
     AT(http.auth_token), .env = "LMCACHE_HTTP_AUTH_TOKEN", .json_name = "http_auth_token",
     .flags = LMC_FF_ADDITION | LMC_FF_SECRET,
     .help = "Bearer token the admin and KV routes require (docs/http.md); unset = none."},
    {.name = "http-auth-token-file", .group = LMC_FG_HTTP, .kind = LMC_FK_NSTR,
     AT(http.auth_token_file), .json_name = "http_auth_token_file", .flags = LMC_FF_ADDITION,
     .help = "Read --http-auth-token from this file (one line, trailing newline dropped)."},
    {.name = "http-max-buffered-mb", .group = LMC_FG_HTTP, .kind = LMC_FK_INT,
     AT(http.max_buffered_mb), .def = "2048", .json_name = "http_max_buffered_mb",
     .flags = LMC_FF_ADDITION, GE1,
     .help = "MiB of request bodies held at once over all connections; past it, 503."},

    /* --- Coordinator ------------------------------------------------------- */
    {.name = "coordinator-url", .group = LMC_FG_COORD, .kind = LMC_FK_STR,
     AT(coordinator.url), .def = "", .env = "LMCACHE_COORDINATOR_URL",
     .json_name = "coordinator_url", .help = "Coordinator base URL; \"\" = no registration."},
    {.name = "coordinator-advertise-ip", .group = LMC_FG_COORD, .kind = LMC_FK_STR,
     AT(coordinator.advertise_ip), .def = "", .env = "LMCACHE_COORDINATOR_ADVERTISE_IP",
     .json_name = "coordinator_advertise_ip",
     .help = "Address the coordinator and peers call (\"\" = outbound IP)."},
    {.name = "coordinator-heartbeat-interval", .group = LMC_FG_COORD, .kind = LMC_FK_DBL,
     AT(coordinator.heartbeat_interval), .def = "5.0",
     .env = "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL",
     .json_name = "coordinator_heartbeat_interval", GT0_FINITE,
     .help = "Seconds between coordinator heartbeats."},
    {.name = "coordinator-l2-event-reporting", .group = LMC_FG_COORD, .kind = LMC_FK_TRUE,
     AT(coordinator.l2_event_reporting), .def = "false",
     .env = "LMCACHE_COORDINATOR_L2_EVENT_REPORTING",
     .json_name = "coordinator_l2_event_reporting",
     .help = "Report L2 usage events to the coordinator."},
    {.name = "coordinator-l2-event-flush-interval", .group = LMC_FG_COORD,
     .kind = LMC_FK_DBL, AT(coordinator.l2_event_flush_interval), .def = "1.0",
     .env = "LMCACHE_COORDINATOR_L2_EVENT_FLUSH_INTERVAL",
     .json_name = "coordinator_l2_event_flush_interval", GT0_FINITE,
     .help = "Seconds between L2 event batches."},
    {.name = "coordinator-event-reporting", .group = LMC_FG_COORD, .kind = LMC_FK_TRUE,
     AT(coordinator.event_reporting), .def = "false",
     .env = "LMCACHE_COORDINATOR_EVENT_REPORTING", .json_name = "coordinator_event_reporting",
     .flags = LMC_FF_ADDITION,
     .help = "Stream cache events (store/delete/access) to the coordinator (docs/fleet.md)."},
    {.name = "coordinator-event-flush-interval", .group = LMC_FG_COORD, .kind = LMC_FK_DBL,
     AT(coordinator.event_flush_interval), .def = "1.0",
     .env = "LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL",
     .json_name = "coordinator_event_flush_interval", .flags = LMC_FF_ADDITION, GT0_FINITE,
     .help = "Seconds between cache-event posts."},
    {.name = "coordinator-auth-token", .group = LMC_FG_COORD, .kind = LMC_FK_NSTR,
     AT(coordinator.auth_token), .env = "LMCACHE_COORDINATOR_AUTH_TOKEN",
     .json_name = "coordinator_auth_token", .flags = LMC_FF_ADDITION | LMC_FF_SECRET,
     .help = "Bearer token sent to the coordinator; unset = none."},

    /* --- Storage manager: L1 ----------------------------------------------- */
    {.name = "l1-manager", .group = LMC_FG_L1, .kind = LMC_FK_APPEND,
     AT(storage.l1_manager_json), .def_doc = "[]", .json_name = "l1_manager",
     .flags = LMC_FF_JSON, .help = "Tagged L1 definition as a JSON object (repeatable)."},
    {.name = "l1-size-gb", .group = LMC_FG_L1, .kind = LMC_FK_OPT_DBL,
     AT(storage.l1_size_gb), .json_name = "l1_size_gb", GT0_FINITE,
     .help = "Legacy single-L1 size in GiB (needs --eviction-policy)."},
    {.name = "l1-use-lazy", .group = LMC_FG_L1, .kind = LMC_FK_BOOL, AT(storage.l1_use_lazy),
     .def = "true", .json_name = "l1_use_lazy",
     .help = "Pin L1 lazily: --l1-init-size-gb first, then grow."},
    {.name = "l1-init-size-gb", .group = LMC_FG_L1, .kind = LMC_FK_INT,
     AT(storage.l1_init_size_gb), .def = "20", .json_name = "l1_init_size_gb", GT0,
     .help = "Initially pinned GiB when lazy (clamped to the size)."},
    {.name = "l1-shm-reserve-mb", .group = LMC_FG_L1, .kind = LMC_FK_INT,
     AT(storage.l1_shm_reserve_mb), .def = "-1",
     .def_doc = "-1: an eighth of /dev/shm, at most 1024", .json_name = "l1_shm_reserve_mb",
     .flags = LMC_FF_ADDITION, .range = LMC_RANGE_CHECK | LMC_RANGE_HAS_MAX, .min = -1,
     .max = 1048576,
     .help = "MiB of /dev/shm the L1 never takes, left to the engine's processes beside it."},
    {.name = "l1-align-bytes", .group = LMC_FG_L1, .kind = LMC_FK_I64,
     AT(storage.l1_align_bytes), .def = "4096", .json_name = "l1_align_bytes",
     .help = "Allocation alignment, a power of two."},
    {.name = "l1-use-hugepages", .group = LMC_FG_L1, .kind = LMC_FK_BOOL,
     AT(storage.l1_use_hugepages), .def = "false", .json_name = "l1_use_hugepages",
     .help = "Back L1 with 2 MiB hugepages (forces lazy off; needs --shm-name \"\")."},
    {.name = "l1-devdax-path", .group = LMC_FG_L1, .kind = LMC_FK_NSTR,
     AT(storage.l1_devdax_path), .json_name = "l1_devdax_path",
     .help = "Device-DAX device (or mmap-able file) used as the L1 arena."},
    {.name = "gds-l1-path", .group = LMC_FG_L1, .kind = LMC_FK_NSTR,
     AT(storage.gds_l1_path), .json_name = "gds_l1_path",
     .help = "GDS L1 tier: NVMe slab directory or /dev/ugds_drvX device."},
    {.name = "gds-l1-use-direct-io", .group = LMC_FG_L1, .kind = LMC_FK_BOOL,
     AT(storage.gds_l1_use_direct_io), .def = "true", .json_name = "gds_l1_use_direct_io",
     .help = "Open the GDS slab file with O_DIRECT."},
    {.name = "gds-l1-backend", .group = LMC_FG_L1, .kind = LMC_FK_STR,
     AT(storage.gds_l1_backend), .def = "auto", .json_name = "gds_l1_backend",
     .help = "GDS backend (auto or an available backend)."},
    {.name = "l1-write-ttl-seconds", .group = LMC_FG_L1, .kind = LMC_FK_INT,
     AT(storage.l1_write_ttl_seconds), .def = "600", .json_name = "l1_write_ttl_seconds",
     GT0, .help = "TTL of an object's write lock."},
    {.name = "l1-read-ttl-seconds", .group = LMC_FG_L1, .kind = LMC_FK_INT,
     AT(storage.l1_read_ttl_seconds), .def = "300", .json_name = "l1_read_ttl_seconds",
     GT0, .help = "TTL of an object's read lock."},
    {.name = "eviction-policy", .group = LMC_FG_L1, .kind = LMC_FK_NSTR,
     AT(storage.eviction_policy), .choices = evict_choices, .json_name = "eviction_policy",
     .help = "L1 eviction policy (required in legacy mode)."},
    {.name = "eviction-trigger-watermark", .group = LMC_FG_L1, .kind = LMC_FK_DBL,
     AT(storage.eviction_trigger_watermark), .def = "0.8",
     .json_name = "eviction_trigger_watermark", FRACTION,
     .help = "L1 usage fraction at which eviction starts."},
    {.name = "eviction-ratio", .group = LMC_FG_L1, .kind = LMC_FK_DBL,
     AT(storage.eviction_ratio), .def = "0.2", .json_name = "eviction_ratio", FRACTION,
     .help = "Fraction of tracked keys evicted per trigger."},

    /* --- Storage manager: L2 ----------------------------------------------- */
    {.name = "l2-adapter", .group = LMC_FG_L2, .kind = LMC_FK_APPEND,
     AT(storage.l2_adapter_json), .def_doc = "[]", .json_name = "l2_adapter",
     .flags = LMC_FF_JSON,
     .help = "L2 adapter as a JSON object with a \"type\" (repeatable; order = priority)."},
    {.name = "l2-store-policy", .group = LMC_FG_L2, .kind = LMC_FK_STR,
     AT(storage.l2_store_policy), .def = "default", .choices = store_choices,
     .json_name = "l2_store_policy", .help = "What happens in L1 after an L2 store."},
    {.name = "l2-prefetch-policy", .group = LMC_FG_L2, .kind = LMC_FK_STR,
     AT(storage.l2_prefetch_policy), .def = "default", .choices = prefetch_choices,
     .json_name = "l2_prefetch_policy",
     .help = "Whether L2-prefetched objects stay in L1 (retain) or are temporary."},
    {.name = "l2-prefetch-max-in-flight", .group = LMC_FG_L2, .kind = LMC_FK_INT,
     AT(storage.l2_prefetch_max_in_flight), .def = "8",
     .json_name = "l2_prefetch_max_in_flight", GT0,
     .help = "Concurrent L2 prefetch requests; the rest queue FIFO."},
    {.name = "l2-prefetch-load-timeout", .group = LMC_FG_L2, .kind = LMC_FK_OPT_DBL,
     AT(storage.l2_prefetch_load_timeout), .json_name = "l2_prefetch_load_timeout",
     GT0_FINITE, .help = "Deadline in seconds for a read-locked L2 prefetch."},
    {.name = "periodic-notifier-interval-ms", .group = LMC_FG_L2, .kind = LMC_FK_INT,
     AT(storage.periodic_notifier_interval_ms), .def = "5",
     .json_name = "periodic_notifier_interval_ms", GT0,
     .help = "Accepted for compatibility; no effect (lmcached's L2 controllers wake when work arrives)."},
    {.name = "l2-health-interval-s", .group = LMC_FG_L2, .kind = LMC_FK_DBL,
     AT(storage.l2_health_interval_s), .def = "10", .json_name = "l2_health_interval_s",
     .flags = LMC_FF_ADDITION, GT0_FINITE,
     .help = "Seconds between probes of each L2 adapter's backend (docs/l2.md, \"Health\")."},
    {.name = "health-requires-l2", .group = LMC_FG_L2, .kind = LMC_FK_TRUE,
     AT(storage.health_requires_l2), .def = "false", .json_name = "health_requires_l2",
     .flags = LMC_FF_ADDITION,
     .help = "GET /healthcheck answers 503 while an L2 adapter is unhealthy."},

    /* --- Observability ----------------------------------------------------- */
    {.name = "disable-observability", .group = LMC_FG_OBS, .kind = LMC_FK_TRUE,
     AT(obs.disable_observability), .def = "false", .json_name = "disable_observability",
     .help = "No event bus at all."},
    {.name = "disable-metrics", .group = LMC_FG_OBS, .kind = LMC_FK_TRUE,
     AT(obs.disable_metrics), .def = "false", .json_name = "disable_metrics",
     .help = "Register no metric subscribers."},
    {.name = "disable-logging", .group = LMC_FG_OBS, .kind = LMC_FK_TRUE,
     AT(obs.disable_logging), .def = "false", .json_name = "disable_logging",
     .help = "Register no event-logging subscribers."},
    {.name = "enable-tracing", .group = LMC_FG_OBS, .kind = LMC_FK_TRUE,
     AT(obs.enable_tracing), .def = "false", .json_name = "enable_tracing",
     .help = "Export spans over OTLP (needs --otlp-endpoint)."},
    {.name = "otlp-endpoint", .group = LMC_FG_OBS, .kind = LMC_FK_NSTR,
     AT(obs.otlp_endpoint), .json_name = "otlp_endpoint",
     .help = "OTLP collector URL; unset = Prometheus pull."},
    {.name = "event-bus-queue-size", .group = LMC_FG_OBS, .kind = LMC_FK_INT,
     AT(obs.event_bus_queue_size), .def = "10000", .json_name = "event_bus_queue_size",
     GT0, .help = "Event bus queue bound; overflow is dropped and counted."},
    {.name = "prometheus-port", .group = LMC_FG_OBS, .kind = LMC_FK_INT,
     AT(obs.prometheus_port), .def = "9090", .json_name = "prometheus_port", PORT,
     .help = "Port of the standalone Prometheus exporter."},
    {.name = "metrics-sample-rate", .group = LMC_FG_OBS, .kind = LMC_FK_DBL,
     AT(obs.metrics_sample_rate), .def = "0.01", .json_name = "metrics_sample_rate",
     FRACTION, .help = "Fraction of chunks tracked by lifecycle histograms."},
    {.name = "lookup-hash-log-dir", .group = LMC_FG_OBS, .kind = LMC_FK_STR,
     AT(obs.lookup_hash_log_dir), .def = "", .json_name = "lookup_hash_log_dir",
     .help = "Directory for JSONL lookup-hash logs (\"\" = off)."},
    {.name = "lookup-hash-log-rotation-interval", .group = LMC_FG_OBS, .kind = LMC_FK_DBL,
     AT(obs.lookup_hash_log_rotation_interval), .def = "21600",
     .json_name = "lookup_hash_log_rotation_interval", GT0_FINITE,
     .help = "Rotate the lookup-hash log after this many seconds."},
    {.name = "lookup-hash-log-rotation-max-size", .group = LMC_FG_OBS, .kind = LMC_FK_I64,
     AT(obs.lookup_hash_log_rotation_max_size), .def = "104857600",
     .json_name = "lookup_hash_log_rotation_max_size", GT0,
     .help = "Rotate the lookup-hash log past this many bytes."},
    {.name = "lookup-hash-log-max-files", .group = LMC_FG_OBS, .kind = LMC_FK_INT,
     AT(obs.lookup_hash_log_max_files), .def = "100",
     .json_name = "lookup_hash_log_max_files", GE1,
     .help = "Keep at most this many lookup-hash log files."},
    {.name = "enable-gc-monitor", .group = LMC_FG_OBS, .kind = LMC_FK_TRUE,
     AT(obs.enable_gc_monitor), .def = "false", .json_name = "enable_gc_monitor",
     .help = "Accepted for compatibility; no effect (no CPython GC)."},
    {.name = "gc-monitor-min-pause-ms", .group = LMC_FG_OBS, .kind = LMC_FK_DBL,
     AT(obs.gc_monitor_min_pause_ms), .def = "1.0", .json_name = "gc_monitor_min_pause_ms",
     .help = "Accepted for compatibility; no effect."},
    {.name = "gc-monitor-top-objects", .group = LMC_FG_OBS, .kind = LMC_FK_INT,
     AT(obs.gc_monitor_top_objects), .def = "0", .json_name = "gc_monitor_top_objects",
     .help = "Accepted for compatibility; no effect."},
    {.name = "enable-extra-logging", .group = LMC_FG_OBS, .kind = LMC_FK_TRUE,
     AT(obs.enable_extra_logging), .def = "false", .json_name = "enable_extra_logging",
     .help = "Periodic INFO log of throughput and L1 usage."},
    {.name = "extra-logging-interval", .group = LMC_FG_OBS, .kind = LMC_FK_DBL,
     AT(obs.extra_logging_interval), .def = "10.0", .json_name = "extra_logging_interval",
     GT0_FINITE, .help = "Seconds between extra-logging lines."},
    {.name = "trace-level", .group = LMC_FG_OBS, .kind = LMC_FK_NSTR, AT(obs.trace_level),
     .choices = trace_choices, .json_name = "trace_level",
     .help = "Record a replayable binary trace at this level: 'storage' the storage "
             "manager's calls, 'events' the cache-event stream (docs/trace.md)."},
    {.name = "trace-output", .group = LMC_FG_OBS, .kind = LMC_FK_NSTR,
     AT(obs.trace_output), .json_name = "trace_output",
     .help = "Trace file path (unset = timestamped file under $TMPDIR)."},
    {.name = "allow-trace-replay", .group = LMC_FG_OBS, .kind = LMC_FK_TRUE,
     AT(obs.allow_trace_replay), .def = "false", .json_name = "allow_trace_replay",
     .help = "Serve POST /api/trace/replay, which writes a trace's objects into this cache."},
};

const lmc_config_flag *lmc_config_flags(size_t *count)
{
    *count = sizeof flags / sizeof flags[0];
    return flags;
}

const lmc_config_flag *lmc_cfg_find(const char *name)
{
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (strcmp(flags[i].name, name) == 0)
            return &flags[i];
    return NULL;
}

size_t lmc_cfg_index(const lmc_config_flag *f)
{
    return (size_t)(f - flags);
}

void *lmc_cfg_field(lmc_config *cfg, const lmc_config_flag *f)
{
    return (char *)cfg + f->offset;
}

const void *lmc_cfg_cfield(const lmc_config *cfg, const lmc_config_flag *f)
{
    return (const char *)cfg + f->offset;
}

static const struct {
    const char *title;
    const char *json;
} groups[LMC_FG_COUNT] = {
    [LMC_FG_MP] = {"MP Server", "mp_config"},
    [LMC_FG_PLUGINS] = {"Runtime Plugins", "runtime_plugin_config"},
    [LMC_FG_P2P] = {"P2P", "p2p_config"},
    [LMC_FG_HTTP] = {"HTTP Frontend", "http_config"},
    [LMC_FG_COORD] = {"Coordinator", "coordinator_config"},
    [LMC_FG_L1] = {"Storage Manager (L1)", "storage_manager_config"},
    [LMC_FG_L2] = {"Storage Manager (L2)", "storage_manager_config"},
    [LMC_FG_OBS] = {"Observability", "obs_config"},
};

const char *lmc_config_group_title(lmc_flag_group group)
{
    return group < LMC_FG_COUNT ? groups[group].title : "";
}

const char *lmc_config_group_json(lmc_flag_group group)
{
    return group < LMC_FG_COUNT ? groups[group].json : "";
}
