/* HTTP frontend: upstream's operator API (docs/http.md) served by
 * libmicrohttpd.  The frontend knows nothing about the cache server: it
 * calls the backend table the server fills in.  docs/http.md lists every
 * endpoint.
 *
 * Threads: requests run on libmicrohttpd's worker threads, several at a
 * time, so every backend callback must be thread-safe.  Callbacks never
 * run after lmc_http_server_stop() returned. */
#ifndef LMC_HTTP_HTTP_SERVER_H
#define LMC_HTTP_HTTP_SERVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

/* What the server provides.  Every callback receives `user`.  JSON
 * callbacks return a NEW reference (the frontend decrefs it) or NULL on
 * failure (answered 500).  A NULL callback means "not provided". */
/* Requests and results of the /api/kv endpoints (the server implements them). */
typedef struct {
    const char *model;
    const char *salt;                  /* "" for none */
    const uint64_t *tokens;
    size_t n_tokens;
} lmc_kv_request;

typedef struct {
    size_t total_tokens, total_chunks;
    size_t done_tokens, done_chunks;   /* hit (lookup/retrieve) or stored */
} lmc_kv_counts;

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
    /* Quotas (/quota, /api/quota; docs/http.md, "Quotas").
     * NULL callbacks = 501.
     * set: 0 or -1; remove: true when the salt had a quota; snapshot: new
     * {"limits": {salt: bytes}, "usage": {salt: bytes}}. */
    int (*quota_set)(void *user, const char *salt, uint64_t limit_bytes);
    bool (*quota_remove)(void *user, const char *salt);
    json_t *(*quota_snapshot)(void *user);
    /* /cache/objects.  NULL callbacks = 501.  Each returns the reply body
     * (new reference) or NULL with *status (404, 503, ...) and err set.
     * list: one page of an L2 adapter's keys (adapter NULL = primary).
     * remove: `body` is {"keys":[EncodedObjectKey], "tier", "adapter",
     * "force"} with keys already checked to be an array of <= 10000. */
    json_t *(*objects_list)(void *user, const char *adapter, const char *model,
                            size_t page_size, const char *page_token, unsigned *status,
                            char *err, size_t errlen);
    json_t *(*objects_remove)(void *user, const json_t *body, unsigned *status, char *err,
                              size_t errlen);
    /* /cache/prefetches (warm L2 -> L1 prefetch).  NULL callbacks = 501.
     * submit: *status 202 with the body on success; query: 200. */
    json_t *(*prefetch_submit)(void *user, const json_t *body, unsigned *status, char *err,
                               size_t errlen);
    json_t *(*prefetch_query)(void *user, const char *request_id, unsigned *status, char *err,
                              size_t errlen);
    /* POST /cache/checksums (and legacy GET /kvcache/check): `body` is
     * {"block_ids", "chunk_size", "instance_id", "layerwise"}.  The reply
     * body, or NULL with *status and err.  NULL callback = 501. */
    json_t *(*checksums)(void *user, const json_t *body, unsigned *status, char *err,
                         size_t errlen);
    /* /api/kv/lookup, /store, /retrieve.  NULL callbacks = 501.  0, or -1
     * with *status and err.  retrieve: *data is malloc'd (NULL if no hit). */
    int (*kv_lookup)(void *user, const lmc_kv_request *rq, lmc_kv_counts *out,
                     unsigned *status, char *err, size_t errlen);
    int (*kv_store)(void *user, const lmc_kv_request *rq, const uint8_t *data, size_t len,
                    lmc_kv_counts *out, unsigned *status, char *err, size_t errlen);
    int (*kv_retrieve)(void *user, const lmc_kv_request *rq, uint8_t **data, size_t *len,
                       lmc_kv_counts *out, unsigned *status, char *err, size_t errlen);
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

/* Binds host:port and starts serving.  `backend` is copied; `opts`
 * strings are copied.  On failure (bad host, port in use) returns -1 and
 * writes one line to err. */
int lmc_http_server_start(const lmc_http_options *opts, const lmc_http_backend *backend,
                          lmc_http_server **out, char *err, size_t errlen);
/* The bound port (useful with port 0). */
int lmc_http_server_port(const lmc_http_server *s);
/* Stops accepting, waits for running requests, frees.  NULL is a no-op. */
void lmc_http_server_stop(lmc_http_server *s);

#endif
