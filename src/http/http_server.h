/* HTTP frontend: upstream's operator API (docs/http.md) served by
 * libmicrohttpd.  The frontend knows nothing about the cache server: it
 * serves the rows of a route table (http_routes.h) that each feature's
 * owner fills in, and asks the server, through a few backend callbacks,
 * only what its own rows (pages, probes, /status, /config, /metrics,
 * /cache/clear) answer.  docs/http.md lists every endpoint.
 *
 * Threads: requests run on libmicrohttpd's worker threads, several at a
 * time, so every backend callback and route handler must be thread-safe.
 * None runs after lmc_http_server_stop() returned. */
#ifndef LMC_HTTP_HTTP_SERVER_H
#define LMC_HTTP_HTTP_SERVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "http/http_routes.h"

/* What the server provides to the frontend's own rows
 * (lmc_http_routes_add_site).  Every callback receives `user`.  JSON
 * callbacks return a NEW reference (the frontend decrefs it) or NULL on
 * failure (answered 500).  A NULL callback means "not provided". */
typedef struct {
    void *user;
    /* false until the engine is up: engine-backed endpoints answer 503.
     * NULL = always ready. */
    bool (*ready)(void *user);
    /* /healthcheck once ready: NULL while the server counts as healthy
     * (200 {"status":"healthy"}); a body with "status":"degraded" is
     * answered 200 (serving, with reasons); any other body is a 503's, e.g.
     * {"status":"unhealthy","reason":...} (docs/http.md, "Endpoints").
     * NULL callback = always healthy. */
    json_t *(*health)(void *user);
    /* /status: the aggregated status object (lmc_server_report_status). */
    json_t *(*status)(void *user);
    /* /config: the grouped configuration as lmc_config_to_json() renders
     * it ({"mp_config":{...}, ...}); the frontend renames the groups to
     * upstream's keys.  NULL callback = 503 "configs not initialized". */
    json_t *(*config)(void *user);
    /* /config/adapters: a JSON array of adapter descriptions.  NULL = []. */
    json_t *(*adapters)(void *user);
    /* POST /cache/clear: clears all of L1 (locked objects too).  Returns 0,
     * or -1 with one line in err.  NULL = 501. */
    int (*clear)(void *user, bool force, char *err, size_t errlen);
    /* /metrics: Prometheus text (lmc_metrics_render); malloc'd, the
     * frontend frees it.  NULL callback = 404. */
    char *(*metrics)(void *user);
} lmc_http_backend;

typedef struct {
    const char *host;          /* "0.0.0.0", "127.0.0.1", "::", a host name */
    int port;                  /* 0 = any free port (see lmc_http_server_port) */
    const char *version;       /* for /version; NULL or "" = "NA" */
    const char *commit;        /* for /version; NULL or "" = "NA" */
    size_t max_body_bytes;     /* larger JSON request bodies get 413; 0 = 1 MiB */
    unsigned timeout_s;        /* idle connection timeout; 0 = 30 s */
    unsigned threads;          /* worker threads; 0 = 2 */
    size_t max_kv_body_bytes;  /* POST /api/kv/store bodies; 0 = 1 GiB */
    bool metrics_only;         /* serve GET/HEAD /metrics only (the standalone
                                * Prometheus exporter); every other path 404 */
    const char *auth_token;    /* bearer token the guarded routes require
                                * (docs/http.md, "Authentication"); NULL or "" =
                                * none.  Not kept: only its digest is. */
    size_t max_buffered_bytes; /* request bodies held at once over all
                                * connections; 0 = 2 GiB */
    /* What a server other than lmcached sets (docs/architecture.md, "HTTP
     * routes"; the coordinator's in docs/coordinator.md, "Bounds"). */
    size_t max_bulk_body_bytes; /* LMC_HTTP_BODY_BULK bodies; 0 = 16 x max_body_bytes */
    unsigned max_connections;   /* connections at once; 0 = 256 */
    bool reserve_declared;      /* a declared Content-Length holds its bytes of
                                 * the budget from the headers on, so a body
                                 * under way keeps its room; false = bytes are
                                 * held as they arrive */
    const char *host_setting;   /* named when host does not resolve; NULL =
                                 * "--http-host" */
    const char *over_budget_detail; /* the detail of a 503 for the budget;
                                     * NULL = "the server holds too many request
                                     * bodies (--http-max-buffered-mb); retry later" */
    const char *over_whole_budget_detail; /* the detail of a 413 for a body larger
                                           * than the whole budget; NULL = "request
                                           * body exceeds <budget> bytes" */
    bool owner_announces;       /* the owner logs where it listens and warns
                                 * about a missing token itself */
} lmc_http_options;

/* What the frontend counted since it started, for the owner's metrics
 * (a snapshot; each figure is read on its own). */
typedef struct {
    uint64_t answered_4xx;         /* routed requests answered 4xx (404, 405, a
                                    * handler's 4xx); not the refusals below */
    uint64_t auth_rejected;        /* 401 */
    uint64_t refused_too_large;    /* 413 */
    uint64_t refused_over_budget;  /* 503 */
    size_t buffered_bytes;         /* of the budget, held now */
} lmc_http_figures;

typedef struct lmc_http_server lmc_http_server;

/* Binds host:port and starts serving the rows of `routes` (borrowed: it
 * must outlive the server; rows may still be added).  `backend` is copied;
 * `opts` strings are copied.  On failure (bad host, port in use) returns
 * -1 and writes one line to err. */
int lmc_http_server_start(const lmc_http_options *opts, const lmc_http_backend *backend,
                          const lmc_http_routes *routes, lmc_http_server **out, char *err,
                          size_t errlen);
/* The bound port (useful with port 0). */
int lmc_http_server_port(const lmc_http_server *s);
/* Whether it listens on an address other than loopback. */
bool lmc_http_server_exposed(const lmc_http_server *s);
void lmc_http_server_figures(const lmc_http_server *s, lmc_http_figures *out);
/* Stops accepting, waits for running requests, frees.  NULL is a no-op. */
void lmc_http_server_stop(lmc_http_server *s);

#endif
