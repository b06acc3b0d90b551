/* The coordinator's HTTP server (docs/coordinator.md, "HTTP"): src/http's
 * server core serving the coordinator's route table (coord_routes.c) with
 * the coordinator's bounds, and the reply helpers its handlers share. */
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_internal.h"
#include "http/http_json.h"
#include "obs/log.h"

/* LMC_VERSION_STRING and LMC_COMMIT_STRING come from CMake (CMakeLists.txt). */

#define MAX_CONNECTIONS 512u
#define THREADS 2u

void coordinator_reply_detail(lmc_http_reply *out, unsigned status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lmc_http_reply_json(out, status, lmc_http_detail("%s", msg));
}

void coordinator_reply_not_allowed(lmc_http_reply *out, const char *allow)
{
    coordinator_reply_detail(out, MHD_HTTP_METHOD_NOT_ALLOWED, "Method Not Allowed");
    snprintf(out->allow, sizeof out->allow, "%s", allow);
}

json_t *coordinator_body_object(const lmc_http_request *rq, lmc_http_reply *out)
{
    json_error_t e;
    json_t *b = rq->body ? json_loadb(rq->body, rq->body_len, 0, &e) : NULL;
    if (json_is_object(b))
        return b;
    json_decref(b);
    if (!rq->body)
        coordinator_reply_detail(out, 422, "a JSON object body is required");
    else if (!b)
        coordinator_reply_detail(out, 422, "malformed JSON: %s (line %d, column %d)", e.text,
                                 e.line, e.column);
    else
        coordinator_reply_detail(out, 422, "the body must be a JSON object");
    return NULL;
}

/* Every write route is open without a token: said once, at start, where
 * others can reach the port (docs/coordinator.md, "Authentication"). */
static void warn_if_open(const lmc_coord *co)
{
    if (co->cfg.auth_token[0] || !lmc_http_server_exposed(co->http))
        return;
    LMC_WARN("coordinator: listening on %s, not a loopback address, without "
             "LMCACHE_MP_COORDINATOR_AUTH_TOKEN: anyone who can reach port %d can register and "
             "remove servers, post cache events that rewrite the key directory and L2 usage, "
             "set quotas that make the coordinator delete L2 objects through the servers, pin "
             "keys, and have it send prefetch requests to the servers. Set "
             "LMCACHE_MP_COORDINATOR_AUTH_TOKEN (docs/coordinator.md, \"Authentication\")",
             co->cfg.host, co->port);
}

/* The refusals of a body for MAX_BUFFERED_MB name the setting and its
 * size (docs/coordinator.md, "Bounds"): 503 while others hold the room,
 * 413 for a body larger than the whole budget. */
typedef struct {
    char over[200], whole[200];
} budget_texts;

static void word_budget(size_t budget, budget_texts *t)
{
    snprintf(t->over, sizeof t->over,
             "the request bodies being received fill the %zu bytes they may hold at once "
             "(LMCACHE_MP_COORDINATOR_MAX_BUFFERED_MB); send it again later", budget);
    snprintf(t->whole, sizeof t->whole,
             "request body exceeds the %zu bytes all request bodies may hold at once "
             "(LMCACHE_MP_COORDINATOR_MAX_BUFFERED_MB)", budget);
}

/* The coordinator's rows only: none of lmcached's own (no backend), and
 * sealed at once, so a path no row serves is a 404 from the start. */
static int new_routes(lmc_coord *co, char *err, size_t errlen)
{
    co->routes = lmc_http_routes_new();
    if (!co->routes || coordinator_routes_add(co->routes, co) != 0)
        return snprintf(err, errlen, "out of memory"), -1;
    lmc_http_routes_seal(co->routes);
    return 0;
}

int coordinator_http_start(lmc_coord *co, char *err, size_t errlen)
{
    unsigned timeout = (unsigned)(co->cfg.timeout_keep_alive_s + 0.999);
    size_t budget = (size_t)co->cfg.max_buffered_mb << 20;
    budget_texts texts;
    word_budget(budget, &texts);
    if (new_routes(co, err, errlen) != 0)
        return -1;
    lmc_http_options opts = {
        .host = co->cfg.host, .port = co->cfg.port,
        .max_body_bytes = COORD_MAX_SMALL_BODY, .max_bulk_body_bytes = COORD_MAX_BODY,
        .max_buffered_bytes = budget, .reserve_declared = true,
        .timeout_s = timeout ? timeout : 1u, .threads = THREADS,
        .max_connections = MAX_CONNECTIONS, .auth_token = co->cfg.auth_token,
        .host_setting = "LMCACHE_MP_COORDINATOR_HOST", .over_budget_detail = texts.over,
        .over_whole_budget_detail = texts.whole, .owner_announces = true,
        .version = LMC_VERSION_STRING, .commit = LMC_COMMIT_STRING,
    };
    lmc_http_backend none = {0};
    lmc_http_server *http;
    if (lmc_http_server_start(&opts, &none, co->routes, &http, err, errlen) != 0)
        return -1;
    pthread_mutex_lock(&co->mu);
    co->http = http;
    co->port = lmc_http_server_port(http);
    pthread_mutex_unlock(&co->mu);
    warn_if_open(co);
    return 0;
}

void coordinator_http_stop(lmc_coord *co)
{
    lmc_http_server_stop(co->http); /* no handler runs after this */
    co->http = NULL;
    lmc_http_routes_free(co->routes);
    co->routes = NULL;
}
