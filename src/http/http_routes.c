/* The route table (docs/http.md, "Endpoints" and the sections after it),
 * its dispatch, and the frontend's own rows with their handlers. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/http_internal.h"
#include "http/http_json.h"
#include "obs/log.h"

/* Rows enough for every owner's; a full table fails the add, so start-up
 * says so instead of serving without a route. */
#define MAX_ROUTES 96

typedef struct {
    lmc_http_route row;
    void *ctx;
} table_row;

/* Append-only: `n` is stored with release after the rows it counts are
 * written, so a dispatch that loads it (acquire) sees them complete. */
struct lmc_http_routes {
    pthread_mutex_t add_lock;  /* one writer at a time */
    table_row rows[MAX_ROUTES];
    atomic_size_t n;
    atomic_bool sealed;
};

lmc_http_routes *lmc_http_routes_new(void)
{
    lmc_http_routes *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (pthread_mutex_init(&t->add_lock, NULL) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

void lmc_http_routes_free(lmc_http_routes *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->add_lock);
    free(t);
}

int lmc_http_routes_add(lmc_http_routes *t, const lmc_http_route *rows, size_t n, void *ctx)
{
    pthread_mutex_lock(&t->add_lock);
    size_t used = atomic_load_explicit(&t->n, memory_order_relaxed);
    bool fits = n <= MAX_ROUTES - used;
    for (size_t i = 0; fits && i < n; i++)
        t->rows[used + i] = (table_row){rows[i], ctx};
    if (fits)
        atomic_store_explicit(&t->n, used + n, memory_order_release);
    pthread_mutex_unlock(&t->add_lock);
    return fits ? 0 : -1;
}

void lmc_http_routes_seal(lmc_http_routes *t)
{
    atomic_store(&t->sealed, true);
}

static const lmc_http_backend *backend_of(const lmc_http_request *req)
{
    return &req->site->backend;
}

/* ---- endpoints ------------------------------------------------------- */

static void ep_root(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                    const char *arg)
{
    (void)ctx;
    (void)arg;
    const char *accept = lmc_http_header(req, MHD_HTTP_HEADER_ACCEPT);
    if (accept && strstr(accept, "text/html")) {
        lmc_http_reply_text(out, MHD_HTTP_OK, "text/html; charset=utf-8",
                            strdup(lmc_http_index_html));
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK,
                        json_pack("{s:s, s:s}", "status", "ok", "service", "LMCache HTTP API"));
}

static void ep_dashboard(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                         const char *arg)
{
    (void)ctx;
    (void)req;
    (void)arg;
    lmc_http_reply_text(out, MHD_HTTP_OK, "text/html; charset=utf-8",
                        strdup(lmc_http_dashboard_html));
}

static void ep_health(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                      const char *arg)
{
    (void)ctx;
    (void)arg;
    const lmc_http_backend *b = backend_of(req);
    json_t *verdict = b->health ? b->health(b->user) : NULL;
    if (verdict) { /* "degraded" still serves: a probe must not restart it */
        const char *status = json_string_value(json_object_get(verdict, "status"));
        bool serving = status && strcmp(status, "degraded") == 0;
        lmc_http_reply_json(out, serving ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, verdict);
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK, json_pack("{s:s}", "status", "healthy"));
}

/* /status's view of the frontend itself (docs/http.md, "Authentication"
 * and "Request bodies"): whether a token guards it, whether it listens
 * beyond loopback, and what its limits refused. */
static int add_frontend_status(const lmc_http_site *site, json_t *status)
{
    const lmc_http_stats *st = site->stats;
    json_t *auth = json_pack("{s:b, s:b, s:I}", "enabled", site->auth_enabled, "exposed",
                             site->exposed, "rejected",
                             (json_int_t)(st ? atomic_load(&st->auth_rejected) : 0));
    if (json_object_set_new(status, "http_auth", auth) != 0)
        return -1;
    if (!st)
        return 0;
    json_t *up = json_pack("{s:I, s:I, s:I, s:I}", "budget_bytes", (json_int_t)st->upload_budget,
                           "buffered_bytes", (json_int_t)atomic_load(&st->upload_held),
                           "refused_too_large", (json_int_t)atomic_load(&st->refused_too_large),
                           "refused_over_budget",
                           (json_int_t)atomic_load(&st->refused_over_budget));
    return json_object_set_new(status, "http_uploads", up);
}

static void ep_status(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                      const char *arg)
{
    (void)ctx;
    (void)arg;
    const lmc_http_backend *b = backend_of(req);
    json_t *status = b->status ? b->status(b->user) : NULL;
    if (!json_is_object(status) || add_frontend_status(req->site, status) != 0) {
        json_decref(status);
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR,
                            lmc_http_error("status unavailable"));
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK, status);
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void ep_pressure(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                        const char *arg)
{
    (void)ctx;
    (void)arg;
    const lmc_http_backend *b = backend_of(req);
    json_t *status = b->status ? b->status(b->user) : NULL;
    json_t *snap = status ? lmc_http_memory_pressure(status, wall_ms()) : NULL;
    json_decref(status);
    if (!snap) {
        lmc_http_reply_json(out, MHD_HTTP_SERVICE_UNAVAILABLE,
                            lmc_http_detail("memory pressure snapshot unavailable"));
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK, snap);
}

/* arg: "both" (/version), "version" (/lmc_version) or "commit" (/commit_id).
 * /lmc_version and /commit_id answer "" where /version says "NA". */
void lmc_http_ep_version(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                       const char *arg)
{
    (void)ctx;
    const char *v = req->site->version, *c = req->site->commit;
    char text[256];
    if (strcmp(arg, "both") == 0)
        snprintf(text, sizeof text, "%s-%s", v, c);
    else
        snprintf(text, sizeof text, "%s", strcmp(arg, "version") == 0 ? v : c);
    if (strcmp(arg, "both") != 0 && strcmp(text, "NA") == 0)
        text[0] = '\0';
    lmc_http_reply_json(out, MHD_HTTP_OK, json_string(text));
}

static void ep_config(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                      const char *arg)
{
    (void)ctx;
    (void)arg;
    const lmc_http_backend *b = backend_of(req);
    if (!b->config) {
        lmc_http_reply_json(out, MHD_HTTP_SERVICE_UNAVAILABLE,
                            lmc_http_error("configs not initialized"));
        return;
    }
    json_t *grouped = b->config(b->user);
    json_t *view = json_is_object(grouped) ? lmc_http_config_view(grouped) : NULL;
    json_decref(grouped);
    if (!view) {
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR,
                            lmc_http_error("configuration unavailable"));
        return;
    }
    lmc_http_reply_pretty_json(out, MHD_HTTP_OK, view);
}

static void ep_adapters(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                        const char *arg)
{
    (void)ctx;
    (void)arg;
    const lmc_http_backend *b = backend_of(req);
    json_t *list = b->adapters ? b->adapters(b->user) : json_array();
    if (!json_is_array(list)) {
        json_decref(list);
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR,
                            lmc_http_detail("adapter list unavailable"));
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK, json_pack("{s:o}", "adapters", list));
}

/* Runs backend.clear; on failure writes the message to err. */
static bool do_clear(const lmc_http_request *req, bool force, char *err, size_t errlen)
{
    const lmc_http_backend *b = backend_of(req);
    snprintf(err, errlen, "clear failed");
    return b->clear(b->user, force, err, errlen) == 0;
}

static void ep_cache_clear(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                           const char *arg)
{
    (void)ctx;
    (void)arg;
    bool force;
    json_t *error = NULL;
    unsigned rc = lmc_http_parse_clear_body(req->body, req->body_len, &force, &error);
    if (rc != 0) {
        lmc_http_reply_json(out, rc, error);
        return;
    }
    if (!backend_of(req)->clear) {
        lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                            lmc_http_detail("cache clear is not available in this build"));
        return;
    }
    char err[256];
    /* Upstream accepts `force` but always clears locked objects too. */
    if (!do_clear(req, true, err, sizeof err)) {
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR, lmc_http_detail("%s", err));
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK,
                        json_pack("{s:s, s:{s:s}}", "status", "ok", "cleared", "tier", "l1"));
}

static void ep_clear_legacy(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                            const char *arg)
{
    (void)ctx;
    (void)arg;
    char err[256];
    if (!backend_of(req)->clear) {
        lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                            lmc_http_error("cache clear is not available in this build"));
        return;
    }
    if (!do_clear(req, true, err, sizeof err)) {
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR, lmc_http_error(err));
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
}

static bool parse_int(const char *text, long long *out)
{
    char *end;
    if (!text || !*text)
        return false;
    *out = strtoll(text, &end, 10);
    return *end == '\0';
}

static void ep_threads(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                       const char *arg)
{
    (void)ctx;
    (void)arg;
    const char *tid_text = lmc_http_query(req, "thread_id");
    long long tid = 0;
    if (tid_text && !parse_int(tid_text, &tid)) {
        lmc_http_reply_json(
            out, 422,
            lmc_http_validation_error("int_parsing", json_pack("[s,s]", "query", "thread_id"),
                                      "Input should be a valid integer, unable to parse "
                                      "string as an integer",
                                      json_string(tid_text)));
        return;
    }
    lmc_http_reply_json(out, MHD_HTTP_OK,
                        lmc_http_threads(lmc_http_query(req, "name"), tid_text != NULL, tid));
}

static void ep_metrics(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                       const char *arg)
{
    (void)ctx;
    (void)arg;
    const lmc_http_backend *b = backend_of(req);
    if (!b->metrics) {
        lmc_http_reply_json(out, MHD_HTTP_NOT_FOUND, lmc_http_detail("Not Found"));
        return;
    }
    char *text = b->metrics(b->user);
    if (!text) {
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR,
                            lmc_http_detail("metrics unavailable"));
        return;
    }
    lmc_http_reply_text(out, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text);
}

/* Upstream's push channel from the coordinator is a logged no-op. */
static void ep_coordinator(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                           const char *arg)
{
    (void)ctx;
    (void)arg;
    json_t *doc = req->body ? json_loadb(req->body, req->body_len, JSON_DECODE_ANY, NULL) : NULL;
    if (!doc) {
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST, lmc_http_error("invalid JSON body"));
        return;
    }
    if (!json_is_object(doc)) {
        json_decref(doc);
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST, lmc_http_error("body must be an object"));
        return;
    }
    const char *type = json_string_value(json_object_get(doc, "type"));
    LMC_INFO("coordinator command received (type %s); ignored", type ? type : "unknown");
    json_decref(doc);
    lmc_http_reply_json(out, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
}

static void ep_not_built(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                         const char *arg)
{
    (void)ctx;
    (void)req;
    lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                        lmc_http_detail("%s not available in this build", arg));
}

/* ---- the frontend's own rows, and dispatch -------------------------------- */

/* Access: OPEN only for what probes, scrapers and the dashboard read
 * (health, status, memory pressure, version, metrics, the pages); every
 * other route can change the cache, read or write KV data, or tell one
 * tenant's keys and salts to another, and needs the token when one is set
 * (docs/http.md, "Authentication", lists each route's class; the e2e test
 * test_http_auth.py checks that list against the rows of every owner). */
#define OPEN LMC_HTTP_OPEN
#define TOKEN LMC_HTTP_TOKEN
#define NOB LMC_HTTP_BODY_NONE
#define JSON LMC_HTTP_BODY_JSON
#define ANY LMC_HTTP_READY_ANY
#define DETAIL LMC_HTTP_READY_DETAIL
#define ENGINE LMC_HTTP_READY_ENGINE
#define CONFIGS LMC_HTTP_READY_CONFIGS
#define HEALTH LMC_HTTP_READY_HEALTH

static const lmc_http_route site_routes[] = {
    {"GET", "/", false, OPEN, NOB, ANY, ep_root, NULL},
    {"GET", "/dashboard", false, OPEN, NOB, ANY, ep_dashboard, NULL},
    {"GET", "/healthcheck", false, OPEN, NOB, HEALTH, ep_health, NULL},
    {"GET", "/api/healthcheck", false, OPEN, NOB, HEALTH, ep_health, NULL},
    {"GET", "/status", false, OPEN, NOB, ENGINE, ep_status, NULL},
    {"GET", "/api/status", false, OPEN, NOB, ENGINE, ep_status, NULL},
    {"GET", "/status/memory-pressure", false, OPEN, NOB, DETAIL, ep_pressure, NULL},
    {"GET", "/version", false, OPEN, NOB, ANY, lmc_http_ep_version, "both"},
    {"GET", "/lmc_version", false, OPEN, NOB, ANY, lmc_http_ep_version, "version"},
    {"GET", "/commit_id", false, OPEN, NOB, ANY, lmc_http_ep_version, "commit"},
    {"GET", "/metrics", false, OPEN, NOB, ANY, ep_metrics, NULL},
    {"GET", "/config", false, TOKEN, NOB, CONFIGS, ep_config, NULL},
    {"GET", "/conf", false, TOKEN, NOB, CONFIGS, ep_config, NULL},
    {"GET", "/config/adapters", false, TOKEN, NOB, DETAIL, ep_adapters, NULL},
    {"POST", "/cache/clear", false, TOKEN, JSON, DETAIL, ep_cache_clear, NULL},
    {"POST", "/clear-cache", false, TOKEN, JSON, ENGINE, ep_clear_legacy, NULL},
    {"GET", "/threads", false, TOKEN, NOB, ANY, ep_threads, NULL},
    {"POST", "/coordinator/command", false, TOKEN, JSON, ANY, ep_coordinator, NULL},
    {"GET", "/config/policies", false, TOKEN, NOB, ANY, ep_not_built, "runtime policies are"},
    {"PATCH", "/config/policies", false, TOKEN, JSON, ANY, ep_not_built,
     "runtime policies are"},
    {"POST", "/config/policies/validate", false, TOKEN, JSON, ANY, ep_not_built,
     "runtime policies are"},
    {"GET", "/reconfigure/", true, TOKEN, NOB, ANY, ep_not_built, "reconfiguration is"},
    {"POST", "/reconfigure/", true, TOKEN, JSON, ANY, ep_not_built, "reconfiguration is"},
};

int lmc_http_routes_add_site(lmc_http_routes *t)
{
    return lmc_http_routes_add(t, site_routes, sizeof site_routes / sizeof site_routes[0],
                               NULL);
}

static bool path_matches(const lmc_http_route *r, const char *path)
{
    if (!r->prefix)
        return strcmp(r->path, path) == 0;
    size_t n = strlen(r->path);
    return strncmp(r->path, path, n) == 0 && path[n] != '\0';
}

static bool answer_not_ready(const lmc_http_request *req, const lmc_http_route *r,
                             lmc_http_reply *out)
{
    const lmc_http_backend *b = backend_of(req);
    if (r->ready == ANY || !b->ready || b->ready(b->user))
        return false;
    json_t *body = r->ready == DETAIL    ? lmc_http_detail("server not initialized")
                   : r->ready == ENGINE  ? lmc_http_error("engine not initialized")
                   : r->ready == CONFIGS ? lmc_http_error("configs not initialized")
                                         : json_pack("{s:s, s:s}", "status", "unhealthy",
                                                     "reason", "engine not initialized");
    lmc_http_reply_json(out, MHD_HTTP_SERVICE_UNAVAILABLE, body);
    return true;
}

static void add_allowed(char *allow, size_t len, const char *method)
{
    if (strstr(allow, method))
        return;
    size_t used = strlen(allow);
    snprintf(allow + used, len - used, "%s%s", used ? ", " : "", method);
}

/* A "*" row serves every method. */
static bool method_matches(const lmc_http_route *r, const char *method)
{
    return strcmp(r->method, method) == 0 || strcmp(r->method, "*") == 0;
}

static bool serves(const lmc_http_site *site, const lmc_http_route *r, const char *path)
{
    return path_matches(r, path) && !(site->metrics_only && r->fn != ep_metrics);
}

/* HEAD is routed like GET. */
static const char *routed_method(const char *method)
{
    return strcmp(method, "HEAD") == 0 ? "GET" : method;
}

/* The rows added so far (see struct lmc_http_routes). */
static size_t rows_of(const lmc_http_site *site, const table_row **rows)
{
    if (!site->routes) {
        *rows = NULL;
        return 0;
    }
    *rows = site->routes->rows;
    return atomic_load_explicit(&site->routes->n, memory_order_acquire);
}

lmc_http_policy lmc_http_route_policy(const lmc_http_site *site, const char *method,
                                      const char *path)
{
    const table_row *rows;
    size_t n = rows_of(site, &rows);
    method = routed_method(method);
    for (size_t i = 0; i < n; i++)
        if (serves(site, &rows[i].row, path) && method_matches(&rows[i].row, method))
            return (lmc_http_policy){rows[i].row.access, rows[i].row.body};
    return (lmc_http_policy){LMC_HTTP_OPEN, LMC_HTTP_BODY_NONE};
}

/* No row serves the request: 405 when another method would be served,
 * 503 while owners may still add the row (the exporter serves /metrics
 * alone, whatever they add), else 404. */
static void answer_unrouted(const lmc_http_site *site, lmc_http_reply *out)
{
    if (out->allow[0])
        lmc_http_reply_json(out, MHD_HTTP_METHOD_NOT_ALLOWED,
                            lmc_http_detail("Method Not Allowed"));
    else if (!site->metrics_only && site->routes && !atomic_load(&site->routes->sealed))
        lmc_http_reply_json(out, MHD_HTTP_SERVICE_UNAVAILABLE,
                            lmc_http_detail("server not initialized"));
    else
        lmc_http_reply_json(out, MHD_HTTP_NOT_FOUND, lmc_http_detail("Not Found"));
}

void lmc_http_dispatch(const lmc_http_request *req, lmc_http_reply *out)
{
    const table_row *rows;
    size_t n = rows_of(req->site, &rows);
    const char *method = routed_method(req->method);
    out->allow[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const lmc_http_route *r = &rows[i].row;
        if (!serves(req->site, r, req->path))
            continue;
        if (method_matches(r, method)) {
            out->allow[0] = '\0'; /* Allow goes with a 405 only */
            if (!answer_not_ready(req, r, out))
                r->fn(req, out, rows[i].ctx, r->arg);
            return;
        }
        add_allowed(out->allow, sizeof out->allow, r->method);
    }
    answer_unrouted(req->site, out);
}
