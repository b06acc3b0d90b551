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
} lmc_http_options;

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
/* Stops accepting, waits for running requests, frees.  NULL is a no-op. */
void lmc_http_server_stop(lmc_http_server *s);

#endif
