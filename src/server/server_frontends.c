/* The HTTP frontend, the standalone Prometheus exporter (--no-http) and
 * the metrics registry, wired to the server through the lmc_http_backend
 * callbacks (all run on HTTP threads); and the runtime plugins, launched
 * once the server is up and stopped first at shutdown. */
#include <stdlib.h>
#include <string.h>

#include "obs/log.h"
#include "server/server_internal.h"
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
    lmc_rpc_stats st = lmc_rpc_server_stats(s->rpc);
    return (lmc_metrics_rpc_counts){st.received, st.replied, st.dropped, st.error_frames};
}

static int start_http(lmc_server *s, char *err, size_t errlen)
{
    static const lmc_http_backend backend_template = {
        .ready = http_ready, .status = http_status, .config = http_config,
        .clear = http_clear, .metrics = http_metrics,
    };
    lmc_http_backend backend = backend_template;
    backend.user = s;
    lmc_http_options opts = {
        .host = s->cfg->http.http_host,
        .port = s->cfg->http.http_port,
        .version = LMC_VERSION_STRING,
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

int lmc_server_start_frontends(lmc_server *s, char *err, size_t errlen)
{
    s->metrics = lmc_metrics_new();
    if (!s->metrics || lmc_metrics_add_process_collector(s->metrics) != 0 ||
        lmc_metrics_add_rpc_source(s->metrics, rpc_counts, s) != 0 ||
        lmc_metrics_add_status_source(s->metrics, http_status, s) != 0) {
        snprintf(err, errlen, "cannot set up metrics");
        return -1;
    }
    if (s->cfg->http.enabled)
        return start_http(s, err, errlen);
    start_exporter(s);
    return 0;
}

void lmc_server_frontends_ready(lmc_server *s)
{
    if (s->ctx.events && !s->cfg->obs.disable_metrics)
        lmc_metrics_attach_event_bus(s->metrics, s->ctx.events);
    atomic_store(&s->ready, true);
    s->plugins = lmc_plugins_start(s->cfg, environ);
}

void lmc_server_stop_frontends(lmc_server *s)
{
    lmc_plugins_stop(s->plugins);
    s->plugins = NULL;
    lmc_http_server_stop(s->http);
    s->http = NULL;
    lmc_http_server_stop(s->exporter);
    s->exporter = NULL;
}

void lmc_server_free_metrics(lmc_server *s)
{
    lmc_metrics_free(s->metrics);
    s->metrics = NULL;
}
