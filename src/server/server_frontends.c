/* The HTTP frontend, the standalone Prometheus exporter (--no-http) and
 * the metrics registry, wired to the server through the lmc_http_backend
 * callbacks (all run on HTTP threads); and the runtime plugins, launched
 * once the server is up and stopped first at shutdown. */
#include <stdlib.h>
#include <string.h>

#include "obs/event_logging.h"
#include "obs/event_metrics.h"
#include "obs/log.h"
#include "rpc/wire.h"
#include "modules/transfer/server/checksums.h"
#include "fleet/fleet.h"
#include "server/server_internal.h"
#include "server/kv_http.h"
#include "server/warm_prefetch.h"
#include "storage/object_key_json.h"
#include "storage/storage_manager.h"

extern char **environ;

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

static json_t *http_config(void *user)
{
    lmc_server *s = user;
    char *text = lmc_config_to_json(s->cfg);
    json_t *cfg = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    return cfg;
}

/* Quotas live in the storage manager; the HTTP threads reach them through
 * these (docs/http.md, "Quotas").  The storage manager exists once HTTP answers
 * non-503, since quota routes wait for readiness. */
static int http_quota_set(void *user, const char *salt, uint64_t limit_bytes)
{
    lmc_server *s = user;
    return lmc_quotas_set(lmc_storage_manager_quotas(s->ctx.storage), salt, limit_bytes);
}

static bool http_quota_remove(void *user, const char *salt)
{
    lmc_server *s = user;
    return lmc_quotas_delete(lmc_storage_manager_quotas(s->ctx.storage), salt);
}

static json_t *http_quota_snapshot(void *user)
{
    lmc_server *s = user;
    json_t *cap = lmc_quotas_capture(lmc_storage_manager_quotas(s->ctx.storage));
    json_t *snap = json_pack("{s:O, s:o}", "limits", json_object_get(cap, "limits"), "usage",
                             lmc_storage_manager_l2_usage_by_salt(s->ctx.storage));
    json_decref(cap);
    return snap;
}

/* ---- /cache/objects ------------------------------------------------------ */

/* The adapter's index, or -1 with 503 (no L2 at all) or 404 (no match). */
static int find_adapter(lmc_server *s, const char *adapter, unsigned *status, char *err,
                        size_t errlen)
{
    int a = lmc_storage_manager_l2_find_adapter(s->ctx.storage, adapter);
    if (a < 0) {
        bool none = lmc_storage_manager_l2_find_adapter(s->ctx.storage, NULL) < 0;
        *status = none ? 503 : 404;
        snprintf(err, errlen, none ? "no L2 adapters" : "no L2 adapter '%s'", adapter);
    }
    return a;
}

static json_t *http_objects_list(void *user, const char *adapter, const char *model,
                                 size_t page_size, const char *page_token, unsigned *status,
                                 char *err, size_t errlen)
{
    lmc_server *s = user;
    int a = find_adapter(s, adapter, status, err, errlen);
    if (a < 0)
        return NULL;
    json_t *page = lmc_storage_manager_l2_list(s->ctx.storage, a, model, page_size, page_token);
    if (!page) {
        *status = 503;
        snprintf(err, errlen, "the adapter cannot list its keys");
    }
    return page;
}

/* EncodedObjectKey {chunk_hash_hex, model_name, kv_rank, object_group_id=0,
 * cache_salt=""} -> key.  A delete only names keys, so nothing is interned
 * (issue 17): strings the server's interner holds are taken from it, and
 * *l1 tells whether both were there (else no L1 object has the key); the
 * others point into `o`, which outlives the L2 delete that reads them. */
static int decode_encoded_key(lmc_server *s, const json_t *o, lmc_object_key *k, bool *l1,
                              char *why, size_t whylen)
{
    lmc_object_key_json_fields f;
    *k = (lmc_object_key){0};
    switch (lmc_object_key_json_parse(o, &f)) {
    case LMC_OBJECT_KEY_JSON_OK:
        break;
    case LMC_OBJECT_KEY_JSON_NOT_OBJECT:
    case LMC_OBJECT_KEY_JSON_HASH_LENGTH:
        return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex of 1..32 bytes"), -1;
    case LMC_OBJECT_KEY_JSON_HASH_DIGIT:
        return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex"), -1;
    case LMC_OBJECT_KEY_JSON_MODEL:
        return snprintf(why, whylen, "model_name must be a non-empty str of at most %d bytes "
                                     "without '@'", LMC_MODEL_NAME_MAX), -1;
    case LMC_OBJECT_KEY_JSON_SALT:
        return snprintf(why, whylen, "cache_salt is invalid"), -1;
    case LMC_OBJECT_KEY_JSON_RANK_OR_GROUP:
        return snprintf(why, whylen, "kv_rank and object_group_id must be u32 integers"), -1;
    }
    memcpy(k->chunk_hash, f.chunk_hash, f.chunk_hash_len);
    k->chunk_hash_len = f.chunk_hash_len;
    k->kv_rank = f.kv_rank;
    k->object_group_id = f.object_group_id;
    const char *model = f.model_name, *salt = f.cache_salt;
    /* Names never interned name no L1 object; the L2 part then reads the
     * body's own strings (the key is not `interned`, so holds nothing). */
    const char *m_in = lmc_intern_find(s->ctx.interner, model, strlen(model));
    const char *s_in = m_in ? lmc_intern_find(s->ctx.interner, salt, strlen(salt)) : NULL;
    *l1 = m_in && s_in;
    if (*l1) {
        lmc_object_key_set_strings(k, m_in, s_in); /* dropped after the request */
    } else {
        lmc_intern_release(m_in);
        k->model_name = model;
        k->cache_salt = salt;
    }
    return 0;
}

static json_t *http_objects_remove(void *user, const json_t *body, unsigned *status, char *err,
                                   size_t errlen)
{
    lmc_server *s = user;
    const json_t *keys_j = json_object_get(body, "keys");
    const char *tier = json_string_value(json_object_get(body, "tier"));
    const char *adapter = json_string_value(json_object_get(body, "adapter"));
    bool force = json_is_true(json_object_get(body, "force"));
    bool l1 = tier && (!strcmp(tier, "l1") || !strcmp(tier, "all"));
    bool l2 = !tier || strcmp(tier, "l1") != 0;
    int a = l2 ? find_adapter(s, adapter, status, err, errlen) : -1;
    if (l2 && a < 0)
        return NULL;
    size_t n = json_array_size(keys_j), n_l1 = 0;
    /* keys[0..n) for L2; l1_keys[0..n_l1) the ones an L1 object may have */
    lmc_object_key *keys = malloc((n ? n : 1) * sizeof *keys);
    lmc_object_key *l1_keys = malloc((n ? n : 1) * sizeof *l1_keys);
    if (!keys || !l1_keys) {
        free(keys);
        free(l1_keys);
        return *status = 500, snprintf(err, errlen, "out of memory"), NULL;
    }
    for (size_t i = 0; i < n; i++) {
        char why[160];
        bool known;
        if (decode_encoded_key(s, json_array_get(keys_j, i), &keys[i], &known, why,
                               sizeof why) != 0) {
            lmc_keys_drop(keys, i);
            free(keys);
            free(l1_keys);
            *status = 400;
            snprintf(err, errlen, "keys[%zu]: %s", i, why);
            return NULL;
        }
        if (known)
            l1_keys[n_l1++] = keys[i];
    }
    size_t deleted = 0, skipped = 0;
    if (l1)
        lmc_storage_manager_delete(s->ctx.storage, l1_keys, n_l1, force, &deleted, &skipped);
    if (l2)
        deleted += lmc_storage_manager_l2_delete(s->ctx.storage, a, keys, n);
    lmc_keys_drop(keys, n); /* l1_keys borrowed these */
    free(keys);
    free(l1_keys);
    return json_pack("{s:I, s:I, s:b}", "deleted", (json_int_t)deleted, "skipped",
                     (json_int_t)skipped, "ok", 1);
}

/* ---- /cache/prefetches ------------------------------------------------------ */

static json_t *http_prefetch_submit(void *user, const json_t *body, unsigned *status, char *err,
                                    size_t errlen)
{
    lmc_server *s = user;
    if (!s->warm)
        return *status = 503, snprintf(err, errlen, "prefetch service unavailable"), NULL;
    return lmc_warm_prefetch_submit(s->warm, body, status, err, errlen);
}

static json_t *http_prefetch_query(void *user, const char *id, unsigned *status, char *err,
                                   size_t errlen)
{
    lmc_server *s = user;
    if (!s->warm)
        return *status = 503, snprintf(err, errlen, "prefetch service unavailable"), NULL;
    return lmc_warm_prefetch_query(s->warm, id, status, err, errlen);
}

/* ---- /cache/checksums --------------------------------------------------------- */

static json_t *http_checksums(void *user, const json_t *body, unsigned *status, char *err,
                              size_t errlen)
{
    lmc_server *s = user;
    for (size_t i = 0; i < s->n_modules; i++)
        if (s->modules[i].def == &lmc_server_driven_module)
            return lmc_server_driven_checksums(s->modules[i].state, body, status, err, errlen);
    *status = 501;
    snprintf(err, errlen, "the server-driven transfer module is not loaded "
                          "(--supported-transfer-mode engine_driven)");
    return NULL;
}

/* ---- /api/kv ------------------------------------------------------------------ */

static int http_kv_lookup(void *user, const lmc_kv_request *rq, lmc_kv_counts *out,
                          unsigned *status, char *err, size_t errlen)
{
    lmc_server *s = user;
    return lmc_kv_http_lookup(&s->ctx, rq, out, status, err, errlen);
}

static int http_kv_store(void *user, const lmc_kv_request *rq, const uint8_t *data, size_t len,
                         lmc_kv_counts *out, unsigned *status, char *err, size_t errlen)
{
    lmc_server *s = user;
    return lmc_kv_http_store(&s->ctx, rq, data, len, out, status, err, errlen);
}

static int http_kv_retrieve(void *user, const lmc_kv_request *rq, uint8_t **data, size_t *len,
                            lmc_kv_counts *out, unsigned *status, char *err, size_t errlen)
{
    lmc_server *s = user;
    return lmc_kv_http_retrieve(&s->ctx, rq, data, len, out, status, err, errlen);
}

/* /config/adapters: the L2 adapters in priority order (index 0 = primary). */
static json_t *http_adapters(void *user)
{
    lmc_server *s = user;
    json_t *status = lmc_storage_manager_report_status(s->ctx.storage);
    json_t *list = json_array();
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(status, "l2_adapters"), i, a) {
        json_array_append_new(list, json_pack("{s:I, s:s, s:s, s:b, s:b}", "index", (json_int_t)i,
                                              "type_name",
                                              json_string_value(json_object_get(a, "type_name")),
                                              "tier", "l2", "primary", i == 0,
                                              "reconfigurable", 0));
    }
    json_decref(status);
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

/* The collectors read what lmc_server_new() builds after the HTTP frontend
 * is already serving: the acquire load of `ready` orders those reads after
 * the construction (a /metrics scrape during start-up sees process
 * metrics only). */
static json_t *status_when_ready(void *user)
{
    lmc_server *s = user;
    return atomic_load(&s->ready) ? lmc_server_report_status(s) : NULL;
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

static int start_http(lmc_server *s, char *err, size_t errlen)
{
    static const lmc_http_backend backend_template = {
        .quota_set = http_quota_set, .quota_remove = http_quota_remove,
        .quota_snapshot = http_quota_snapshot, .adapters = http_adapters,
        .objects_list = http_objects_list, .objects_remove = http_objects_remove,
        .prefetch_submit = http_prefetch_submit, .prefetch_query = http_prefetch_query,
        .checksums = http_checksums,
        .kv_lookup = http_kv_lookup, .kv_store = http_kv_store, .kv_retrieve = http_kv_retrieve,
        .ready = http_ready, .status = http_status, .config = http_config,
        .clear = http_clear, .metrics = http_metrics,
    };
    lmc_http_backend backend = backend_template;
    backend.user = s;
    lmc_http_options opts = {
        .host = s->cfg->http.http_host,
        .port = s->cfg->http.http_port,
        .version = LMC_VERSION_STRING,
        .auth_token = s->cfg->http.auth_token,
        .max_buffered_bytes = (size_t)s->cfg->http.max_buffered_mb << 20,
    };
    if (lmc_http_server_start(&opts, &backend, &s->http, err, errlen) != 0)
        return -1;
    LMC_INFO("HTTP frontend on http://%s:%d", opts.host, lmc_http_server_port(s->http));
    return 0;
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
        .threads = 1,
        .metrics_only = true,
    };
    char err[256];
    if (lmc_http_server_start(&opts, &backend, &s->exporter, err, sizeof err) != 0) {
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
        (full && lmc_metrics_add_collector(s->metrics, collect_rpc_ops, s) != 0) ||
        (full && lmc_metrics_add_status_source(s->metrics, status_when_ready, s) != 0)) {
        snprintf(err, errlen, "cannot set up metrics");
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

/* With the HTTP frontend only: the coordinator calls us back on it. */
static void start_coordinator(lmc_server *s)
{
    const lmc_coordinator_config *cc = &s->cfg->coordinator;
    if (!cc->url[0] && (cc->event_reporting || cc->l2_event_reporting))
        LMC_WARN("--coordinator-event-reporting / --coordinator-l2-event-reporting: no "
                 "--coordinator-url, so no events are reported (docs/fleet.md)");
    if (!s->http)
        return;
    s->fleet = lmc_fleet_start(s->cfg, lmc_http_server_port(s->http), s->ctx.storage);
    if (s->fleet && !s->cfg->obs.disable_metrics &&
        lmc_metrics_add_collector(s->metrics, lmc_fleet_collect_metrics, s->fleet) != 0)
        LMC_WARN("coordinator metrics are not exported: cannot register the collector");
}

void lmc_server_frontends_ready(lmc_server *s)
{
    attach_subscribers(s);
    start_otlp(s);
    start_coordinator(s);
    s->warm = lmc_warm_prefetch_new(&s->ctx); /* NULL: /cache/prefetches answers 503 */
    atomic_store(&s->ready, true);
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
