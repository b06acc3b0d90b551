/* Internal to src/server/: the server object shared by the compositor
 * (server.c) and the HTTP/metrics frontends (server_frontends.c). */
#ifndef LMC_SERVER_SERVER_INTERNAL_H
#define LMC_SERVER_SERVER_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>

#include "http/http_server.h"
#include "modules/module.h"
#include "obs/lookup_hash_log.h"
#include "obs/metrics.h"
#include "obs/otlp.h"
#include "obs/spans.h"
#include "plugins/plugins.h"
#include "rpc/rpc.h"
#include "server/server.h"

#define LMC_SERVER_MAX_MODULES 16

typedef struct {
    const lmc_module_def *def;
    void *state;
} module_instance;

struct lmc_server {
    const lmc_config *cfg;
    lmc_module_ctx ctx;
    lmc_rpc_server *rpc;
    module_instance modules[LMC_SERVER_MAX_MODULES];
    size_t n_modules;
    lmc_metrics *metrics;
    lmc_http_routes *routes;     /* served by http or exporter; freed after both stop */
    lmc_http_server *http;       /* NULL with --no-http */
    lmc_http_server *exporter;   /* --no-http: /metrics alone on --prometheus-port */
    lmc_plugins *plugins;        /* runtime plugins; NULL when none run */
    lmc_otlp *otlp;              /* --otlp-endpoint; NULL when unset */
    lmc_span_recorder *spans;    /* --enable-tracing; freed after the bus */
    lmc_lookup_hash_log *hash_log; /* --lookup-hash-log-dir; freed after the bus */
    atomic_bool ready;           /* HTTP answers 503 until modules are up */
    struct lmc_warm_prefetch *warm; /* HTTP warm prefetch (/cache/prefetches) */
    /* --coordinator-url (docs/fleet.md); NULL when unset.  Set after the
     * server is ready (the coordinator calls back at once), while HTTP
     * threads may read it: atomic. */
    struct lmc_fleet *_Atomic fleet;
    struct lmc_p2p_chan_server *p2p_tcp; /* --p2p-advertise-url, tcp engine; else NULL */
    struct lmc_p2p_ucx_server *p2p_ucx;  /* --p2p-advertise-url, ucx engine; else NULL */
    struct lmc_storage_trace *trace;     /* --trace-level (docs/trace.md); else NULL */
    struct lmc_trace_replay *replay;     /* --allow-trace-replay; else NULL */
};

/* --trace-level: opens the trace file and attaches the recorder to the
 * storage manager (server_trace.c); 0 without the flag. */
int lmc_server_start_trace(lmc_server *s, char *err, size_t errlen);
/* /status "trace": {level, output, records_written, records_dropped,
 * bytes_written}, nulls and zeros without a recorder. */
json_t *lmc_server_trace_status(lmc_server *s);
/* --trace-level events: the tap that records the cache-event stream into
 * the trace (false at any other level). */
struct lmc_fleet_tap;
bool lmc_server_trace_fleet_tap(lmc_server *s, struct lmc_fleet_tap *out);
int lmc_server_register_trace_metrics(lmc_server *s);

/* --allow-trace-replay (server_trace_replay.c, docs/trace.md): the state
 * of POST /api/trace/replay, whose row is always there and answers 403
 * without the flag.  Stop gives back every lease a replay still holds:
 * after the frontends stopped, before the storage manager closes. */
typedef struct lmc_trace_replay lmc_trace_replay;
int lmc_server_start_trace_replay(lmc_server *s, char *err, size_t errlen);
void lmc_server_stop_trace_replay(lmc_server *s);
int lmc_server_add_trace_replay_routes(lmc_server *s, lmc_http_routes *routes);

/* Metrics registry and HTTP listener; before storage so that a busy HTTP
 * port fails before memory is committed. */
int lmc_server_start_frontends(lmc_server *s, char *err, size_t errlen);
/* After the modules exist: the event subscribers (metrics, logging, lookup
 * hash log, spans) and the OTLP exporter, ready = true, then the runtime
 * plugins are launched. */
void lmc_server_frontends_ready(lmc_server *s);
/* Every module the server knows adds its HTTP rows to s->routes: a module
 * the configuration left out with state NULL (modules/module.h). */
void lmc_server_add_module_routes(lmc_server *s);
/* Every module the server knows registers its metrics (modules/module.h).
 * 0 or -1. */
int lmc_server_add_module_metrics(lmc_server *s);
/* The server's own feature rows (objects_http.c, quota_http.c,
 * kv_http_routes.c), handler ctx = s.  0, or -1 when the table is full. */
int lmc_server_add_object_routes(lmc_server *s, lmc_http_routes *routes);
int lmc_server_add_quota_routes(lmc_server *s, lmc_http_routes *routes);
int lmc_server_add_kv_routes(lmc_server *s, lmc_http_routes *routes);
/* Stops the runtime plugins, the OTLP exporter (after a last export) and
 * the HTTP listeners (no callback runs after it returns). */
void lmc_server_stop_frontends(lmc_server *s);
/* The state of def's instance, or NULL when the configuration left it out. */
void *lmc_server_module_state(const lmc_server *s, const lmc_module_def *def);
/* P2P (server_p2p.c, docs/p2p.md "Running the channel").  check: before
 * any thread starts, refuses an engine or --p2p-rdma-* value that cannot be
 * honoured.  start: after the modules, the channel server over the L1
 * arena.  stop: before the modules and the storage go.  0 or -1. */
int lmc_server_check_p2p(const lmc_config *cfg, char *err, size_t errlen);
int lmc_server_start_p2p(lmc_server *s, char *err, size_t errlen);
void lmc_server_stop_p2p(lmc_server *s);
/* After the event bus is freed: the subscribers' state and the registry. */
void lmc_server_free_metrics(lmc_server *s);

#endif
