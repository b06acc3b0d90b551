/* The HTTP frontend, the standalone Prometheus exporter (--no-http) and
 * the metrics registry: the frontend's own rows reach the server through
 * the lmc_http_backend callbacks, the server's feature rows (objects,
 * prefetches, quotas, /api/kv) and every module's are added to the route
 * table by their owners (all run on HTTP threads); and the runtime plugins,
 * launched once the server is up and stopped first at shutdown. */
#include <stdlib.h>
#include <string.h>

#include "obs/event_logging.h"
#include "obs/event_metrics.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "fleet/fleet.h"
#include "modules/kv_events.h"
#include "server/server_internal.h"
#include "server/warm_prefetch.h"
#include "storage/l2/l2_service.h"
#include "storage/quota.h"
#include "storage/storage_manager.h"
#include "storage/storage_metrics.h"

extern char **environ;

#ifndef LMC_COMMIT_STRING
#define LMC_COMMIT_STRING "NA"
#endif
#ifndef LMC_VERSION_STRING
#define LMC_VERSION_STRING "0.0.0"
#endif

static bool http_ready(void *user)
{
    lmc_server *s = user;
    return atomic_load(&s->ready);
}

static json_t *http_status(void *user)
{
    return lmc_server_report_status(user);
}

/* One reason per unhealthy L2 adapter, appended to `reasons`. */
static void add_l2_reasons(json_t *reasons, json_t *bad)
{
    size_t i;
    json_t *ad;
    json_array_foreach(bad, i, ad) {
        char reason[768];
        snprintf(reason, sizeof reason, "L2 adapter %lld (%s) unhealthy: %s",
                 (long long)json_integer_value(json_object_get(ad, "index")),
                 json_string_value(json_object_get(ad, "type_name")),
                 json_string_value(json_object_get(ad, "reason")));
        json_array_append_new(reasons, json_string(reason));
    }
}

/* /healthcheck (docs/http.md, "Health"): "unhealthy" (503) with
 * --health-requires-l2 while an L2 adapter is down; "degraded" (200: it
 * serves, a probe must not restart it) while an L2 adapter is down without
 * that flag or /dev/shm backs less than the configured L1; NULL: healthy. */
static json_t *http_health(void *user)
{
    lmc_server *s = user;
    if (!s->ctx.storage)
        return NULL;
    json_t *bad = lmc_l2_unhealthy(s->ctx.storage), *reasons = json_array();
    if (!bad)
        bad = json_array();
    char l1_why[512];
    if (lmc_storage_manager_l1_short(s->ctx.storage, l1_why, sizeof l1_why)) {
        char reason[640];
        snprintf(reason, sizeof reason, "L1 smaller than configured: %s", l1_why);
        json_array_append_new(reasons, json_string(reason));
    }
    add_l2_reasons(reasons, bad);
    if (json_array_size(reasons) == 0) {
        json_decref(bad);
        json_decref(reasons);
        return NULL;
    }
    bool fail = s->cfg->storage.health_requires_l2 && json_array_size(bad) > 0;
    /* The headline is what decided the verdict: the first L2 reason on a 503. */
    size_t headline = fail ? json_array_size(reasons) - json_array_size(bad) : 0;
    const char *first = json_string_value(json_array_get(reasons, headline));
    return json_pack("{s:s, s:s, s:o, s:o}", "status", fail ? "unhealthy" : "degraded",
                     "reason", first ? first : "", "reasons", reasons, "l2_adapters", bad);
}

static json_t *http_config(void *user)
{
    lmc_server *s = user;
    char *text = lmc_config_to_json(s->cfg);
    json_t *cfg = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    return cfg;
}

/* /config/adapters: the L2 adapters in priority order (index 0 = primary). */
static json_t *http_adapters(void *user)
{
    lmc_server *s = user;
    size_t n = lmc_storage_manager_l2_counts(s->ctx.storage, NULL, 0);
    lmc_storage_l2_counts *c = calloc(n ? n : 1, sizeof *c);
    json_t *list = c ? json_array() : NULL; /* NULL: answered 500 */
    n = c ? lmc_storage_manager_l2_counts(s->ctx.storage, c, n) : 0;
    for (size_t i = 0; list && i < n; i++)
        json_array_append_new(list, json_pack("{s:I, s:s, s:s, s:b, s:b}", "index", (json_int_t)i,
                                              "type_name", c[i].type_name, "tier", "l2",
                                              "primary", i == 0, "reconfigurable", 0));
    free(c);
    return list;
}

static int http_clear(void *user, bool force, char *err, size_t errlen)
{
    lmc_server *s = user;
    if (!s->ctx.storage) {
        snprintf(err, errlen, "storage is not available");
        return -1;
    }
    lmc_storage_manager_clear(s->ctx.storage, force);
    LMC_INFO("cache cleared over HTTP (force=%s)", force ? "true" : "false");
    return 0;
}

static char *http_metrics(void *user)
{
    lmc_server *s = user;
    return lmc_metrics_render(s->metrics);
}

static lmc_metrics_rpc_counts rpc_counts(void *user)
{
    lmc_server *s = user;
    if (!atomic_load(&s->ready))
        return (lmc_metrics_rpc_counts){0, 0, 0, 0, 0, 0};
    lmc_rpc_stats st = lmc_rpc_server_stats(s->rpc);
    return (lmc_metrics_rpc_counts){st.received,     st.replied, st.dropped,
                                    st.error_frames, st.inlined, st.overloaded};
}

/* lmcache_mp_rpc_requests_total{op, result}: per frozen op, requests
 * answered ("ok") and dropped ("failed", including ops without a handler). */
static void collect_rpc_ops(lmc_metrics *r, void *user)
{
    lmc_server *s = user;
    static const char *const labels[] = {"op", "result", NULL};
    lmc_metric *m = lmc_metrics_counter(r, "lmcache_mp_rpc_requests_total",
                                        "RPC requests by op and result", labels);
    if (!m || !atomic_load(&s->ready))
        return;
    for (int op = 1; op <= LMC_OP_FROZEN_MAX; op++) {
        uint64_t ok, failed;
        if (!lmc_rpc_server_op_counts(s->rpc, op, &ok, &failed) || (ok == 0 && failed == 0))
            continue;
        const char *ok_v[] = {lmc_op_name(op), "ok"}, *failed_v[] = {lmc_op_name(op), "failed"};
        lmc_metric_set(m, ok_v, (double)ok);
        lmc_metric_set(m, failed_v, (double)failed);
    }
}

/* The rows the server owns (docs/architecture.md, "HTTP routes"): the
 * frontend's own, then the server's features.  The modules add theirs
 * once they exist (lmc_server_frontends_ready). */
static int add_server_routes(lmc_server *s)
{
    s->routes = lmc_http_routes_new();
    return s->routes && lmc_http_routes_add_site(s->routes) == 0 &&
                   lmc_server_add_object_routes(s, s->routes) == 0 &&
                   lmc_server_add_quota_routes(s, s->routes) == 0 &&
                   lmc_server_add_kv_routes(s, s->routes) == 0 &&
                   lmc_server_add_trace_replay_routes(s, s->routes) == 0
               ? 0
               : -1;
}

/* ---- metrics of the server and its owners ---------------------------------- */

typedef struct {
    lmc_server *s;
    lmc_metric *healthy, *target_info;
} server_metrics;

/* lmcache_mp_healthy is /status's verdict over every module and the
 * storage (lmc_server_report_status); target_info names --instance-id. */
static void collect_server(lmc_metrics *r, void *user)
{
    (void)r;
    server_metrics *sm = user;
    json_t *status = lmc_server_report_status(sm->s);
    lmc_metric_set(sm->healthy, NULL, json_is_true(json_object_get(status, "is_healthy")));
    json_decref(status);
    const char *values[] = {sm->s->cfg->mp.instance_id};
    lmc_metric_set(sm->target_info, values, 1);
}

/* The families /metrics lists after the RPC ones, each registered by its
 * owner (docs/metrics.md): the server's health, the storage's, every
 * module's (a module left out registers its families alone), then
 * target_info.  Runs once the modules exist, before the event families. */
static int register_owner_metrics(lmc_server *s)
{
    static const char *const info_labels[] = {"service_instance_id", NULL};
    server_metrics *sm = calloc(1, sizeof *sm);
    if (!sm)
        return -1;
    sm->s = s;
    sm->healthy = lmc_metrics_gauge(s->metrics, "lmcache_mp_healthy",
                                    "1 when every module and the storage report healthy", NULL);
    if (!sm->healthy || lmc_storage_manager_register_metrics(s->ctx.storage, s->metrics) != 0 ||
        lmc_l2_p2p_register_metrics(s->ctx.storage, s->metrics) != 0 ||
        lmc_server_add_module_metrics(s) != 0 || lmc_server_register_trace_metrics(s) != 0)
        goto fail;
    sm->target_info = lmc_metrics_gauge(s->metrics, "target_info",
                                        "Target metadata: the server's --instance-id",
                                        info_labels);
    if (!sm->target_info)
        goto fail;
    return lmc_metrics_add_owned_collector(s->metrics, collect_server, sm);
fail:
    free(sm);
    return -1;
}

static int start_http(lmc_server *s, char *err, size_t errlen)
{
    static const lmc_http_backend backend_template = {
        .ready = http_ready, .health = http_health, .status = http_status,
        .config = http_config, .adapters = http_adapters, .clear = http_clear,
        .metrics = http_metrics,
    };
    lmc_http_backend backend = backend_template;
    backend.user = s;
    lmc_http_options opts = {
        .host = s->cfg->http.http_host,
        .port = s->cfg->http.http_port,
        .version = LMC_VERSION_STRING,
        .commit = LMC_COMMIT_STRING,
        .auth_token = s->cfg->http.auth_token,
        .max_buffered_bytes = (size_t)s->cfg->http.max_buffered_mb << 20,
    };
    /* lmc_http_server_start() logs where it listens, once. */
    return lmc_http_server_start(&opts, &backend, s->routes, &s->http, err, errlen);
}

/* ZMQ-only mode (--no-http): the standalone Prometheus exporter serves
 * /metrics alone on --prometheus-port, bound like the HTTP frontend would
 * be (--http-host).  A busy port is a warning, not a start-up failure:
 * the cache keeps working without its exporter. */
static void start_exporter(lmc_server *s)
{
    const lmc_obs_config *obs = &s->cfg->obs;
    if (obs->disable_observability || obs->disable_metrics)
        return;
    lmc_http_backend backend = {.user = s, .metrics = http_metrics};
    lmc_http_options opts = {
        .host = s->cfg->http.http_host,
        .port = obs->prometheus_port,
        .version = LMC_VERSION_STRING,
        .commit = LMC_COMMIT_STRING,
        .threads = 1,
        .metrics_only = true,
    };
    char err[256];
    if (lmc_http_server_start(&opts, &backend, s->routes, &s->exporter, err, sizeof err) != 0) {
        LMC_WARN("Prometheus exporter not started: %s", err);
        s->exporter = NULL;
        return;
    }
    LMC_INFO("Prometheus exporter on http://%s:%d/metrics", opts.host,
             lmc_http_server_port(s->exporter));
}

/* With --disable-metrics the registry keeps the process collector alone,
 * so /metrics still answers (process_* families only). */
int lmc_server_start_frontends(lmc_server *s, char *err, size_t errlen)
{
    bool full = !s->cfg->obs.disable_metrics;
    s->metrics = lmc_metrics_new();
    if (!s->metrics || lmc_metrics_add_process_collector(s->metrics) != 0 ||
        (full && lmc_metrics_add_rpc_source(s->metrics, rpc_counts, s) != 0) ||
        (full && lmc_metrics_add_collector(s->metrics, collect_rpc_ops, s) != 0)) {
        snprintf(err, errlen, "cannot set up metrics");
        return -1;
    }
    if (add_server_routes(s) != 0) {
        snprintf(err, errlen, "cannot set up the HTTP routes");
        return -1;
    }
    if (s->cfg->http.enabled)
        return start_http(s, err, errlen);
    start_exporter(s);
    return 0;
}

static void attach_hash_log(lmc_server *s)
{
    const lmc_obs_config *obs = &s->cfg->obs;
    lmc_lookup_hash_log_options o = {
        .dir = obs->lookup_hash_log_dir,
        .rotation_interval = obs->lookup_hash_log_rotation_interval,
        .max_size = obs->lookup_hash_log_rotation_max_size,
        .max_files = obs->lookup_hash_log_max_files,
    };
    char err[256];
    s->hash_log = lmc_lookup_hash_log_open(&o, err, sizeof err);
    if (!s->hash_log || lmc_lookup_hash_log_attach(s->hash_log, s->ctx.events) != 0)
        LMC_WARN("lookup hash log disabled: %s", s->hash_log ? "too many subscribers" : err);
    else
        LMC_INFO("lookup hash log in %s", o.dir);
}

/* Every subscriber needs the bus: with --disable-observability none runs. */
static void attach_subscribers(lmc_server *s)
{
    const lmc_obs_config *obs = &s->cfg->obs;
    lmc_event_bus *bus = s->ctx.events;
    bool hash_log = obs->lookup_hash_log_dir && *obs->lookup_hash_log_dir;
    if (!bus) {
        if (hash_log || obs->enable_tracing)
            LMC_WARN("--disable-observability: no lookup hash log and no tracing");
        return;
    }
    if (!obs->disable_metrics &&
        (lmc_metrics_attach_event_bus(s->metrics, bus) != 0 ||
         lmc_metrics_attach_event_metrics(s->metrics, bus) != 0))
        LMC_WARN("event metrics are incomplete: cannot subscribe");
    if (!obs->disable_logging && lmc_event_logging_attach(bus) != 0)
        LMC_WARN("event logging disabled: cannot subscribe");
    if (hash_log)
        attach_hash_log(s);
    if (obs->enable_tracing) {
        s->spans = lmc_span_recorder_new(65536);
        if (!s->spans || lmc_span_recorder_attach(s->spans, bus) != 0)
            LMC_WARN("tracing disabled: cannot subscribe");
    }
}

/* OTEL_METRIC_EXPORT_INTERVAL (ms, the OpenTelemetry SDK variable)
 * overrides the 10 s period. */
static double export_interval(void)
{
    const char *env = getenv("OTEL_METRIC_EXPORT_INTERVAL");
    double ms = env ? strtod(env, NULL) : 0;
    return ms > 0 ? ms / 1000.0 : 10.0;
}

static void start_otlp(lmc_server *s)
{
    const lmc_obs_config *obs = &s->cfg->obs;
    const char *ep = obs->otlp_endpoint && *obs->otlp_endpoint
                         ? obs->otlp_endpoint : getenv("OTEL_EXPORTER_OTLP_ENDPOINT");
    if (!ep || !*ep || (obs->disable_metrics && !s->spans))
        return;
    lmc_otlp_options o = {
        .endpoint = ep, .instance_id = s->cfg->mp.instance_id,
        .version = LMC_VERSION_STRING, .interval_s = export_interval(),
        .metrics = obs->disable_metrics ? NULL : s->metrics, .spans = s->spans,
    };
    char err[256];
    s->otlp = lmc_otlp_start(&o, err, sizeof err);
    if (!s->otlp)
        LMC_WARN("OTLP export disabled: %s", err);
    else
        LMC_INFO("OTLP/HTTP export to %s every %.3g s%s", ep, o.interval_s,
                 s->spans ? " (metrics and traces)" : "");
}

/* Discovery's peers become the p2p L2 adapter's (docs/p2p.md,
 * "Requesting side"). */
static void on_p2p_peer(void *user, const char *id, const char *ip, int mq_port,
                        const char *url, bool present)
{
    lmc_server *s = user;
    if (!present) {
        lmc_l2_p2p_peer_drop(s->ctx.storage, id);
        return;
    }
    char mq[300], err[256];
    snprintf(mq, sizeof mq, strchr(ip, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", ip, mq_port);
    if (lmc_l2_p2p_peer_set(s->ctx.storage, id, mq, url, err, sizeof err) != 0)
        LMC_WARN("P2P peer %s is not read from: %s", id, err);
}

/* lmc_fleet_event_tokens_fn over the KV event log's bindings: the tokens
 * the store path hashed, so the fleet's fragment index learns what each
 * stored chunk holds (docs/fleet.md, "Cache-event stream"). */
static size_t stored_chunk_tokens(void *user, const lmc_object_key *key, uint32_t *tokens,
                                  size_t cap, uint64_t *position)
{
    return lmc_kv_events_tokens_of(user, key->chunk_hash, key->chunk_hash_len, tokens, cap,
                                   position);
}

/* With the HTTP frontend only: the coordinator calls us back on it. */
static void start_coordinator(lmc_server *s)
{
    const lmc_coordinator_config *cc = &s->cfg->coordinator;
    if (!cc->url[0] && (cc->event_reporting || cc->l2_event_reporting))
        LMC_WARN("--coordinator-event-reporting / --coordinator-l2-event-reporting: no "
                 "--coordinator-url, so no events are reported (docs/fleet.md)");
    lmc_fleet_tap tap;
    bool tapped = lmc_server_trace_fleet_tap(s, &tap);
    if (!s->http && !tapped)
        return;
    s->fleet = lmc_fleet_start(s->cfg, s->http ? lmc_http_server_port(s->http) : 0,
                               s->ctx.storage, tapped ? &tap : NULL);
    lmc_fleet_set_peer_listener(s->fleet, on_p2p_peer, s);
    if (s->ctx.kv_events)
        lmc_fleet_set_token_source(s->fleet, stored_chunk_tokens, s->ctx.kv_events,
                                   (size_t)s->cfg->mp.chunk_size);
    if (s->fleet && !s->cfg->obs.disable_metrics &&
        lmc_metrics_add_collector(s->metrics, lmc_fleet_collect_metrics, s->fleet) != 0)
        LMC_WARN("coordinator metrics are not exported: cannot register the collector");
}

void lmc_server_frontends_ready(lmc_server *s)
{
    lmc_server_add_module_routes(s);
    lmc_http_routes_seal(s->routes); /* every owner's rows are in */
    if (!s->cfg->obs.disable_metrics && register_owner_metrics(s) != 0)
        LMC_WARN("the storage and module metrics are incomplete: cannot register them");
    attach_subscribers(s);
    start_otlp(s);
    s->warm = lmc_warm_prefetch_new(&s->ctx); /* NULL: /cache/prefetches answers 503 */
    atomic_store(&s->ready, true);
    /* After ready: the coordinator calls back (a resync) as soon as this
     * server registers, and must not be answered 503. */
    start_coordinator(s);
    s->plugins = lmc_plugins_start(s->cfg, environ);
}

void lmc_server_stop_frontends(lmc_server *s)
{
    /* First, while the HTTP frontend still answers: the last events, then
     * the deregistration, each bounded by a short timeout. */
    lmc_fleet_stop(s->fleet);
    lmc_plugins_stop(s->plugins);
    s->plugins = NULL;
    lmc_http_server_stop(s->http);
    s->http = NULL;
    lmc_http_server_stop(s->exporter);
    s->exporter = NULL;
    lmc_http_routes_free(s->routes); /* no frontend serves it any more */
    s->routes = NULL;
    lmc_warm_prefetch_free(s->warm); /* after HTTP: no request can reach it */
    s->warm = NULL;
    if (s->otlp) {
        /* The last export sees every event published so far. */
        if (s->ctx.events)
            lmc_event_bus_drain(s->ctx.events, 1.0);
        lmc_otlp_stop(s->otlp);
        s->otlp = NULL;
    }
}

void lmc_server_free_metrics(lmc_server *s)
{
    lmc_span_recorder_free(s->spans);
    s->spans = NULL;
    lmc_lookup_hash_log_close(s->hash_log);
    s->hash_log = NULL;
    lmc_metrics_free(s->metrics);
    s->metrics = NULL;
}
