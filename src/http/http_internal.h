/* Shared by the files of src/http/ only: what the routes know about the
 * server, and the route table's entry points. */
#ifndef LMC_HTTP_HTTP_INTERNAL_H
#define LMC_HTTP_HTTP_INTERNAL_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>

#include "http/http_routes.h"
#include "http/http_server.h"

struct MHD_Connection;

/* Request-body bounds and access checks, counted for /status
 * (docs/http.md, "Authentication" and "Request bodies"). */
typedef struct {
    size_t upload_budget;               /* bytes all request bodies may hold at once */
    atomic_size_t upload_held;          /* bytes they hold now */
    atomic_ullong refused_too_large;    /* 413 */
    atomic_ullong refused_over_budget;  /* 503 */
    atomic_ullong auth_rejected;        /* 401 */
    atomic_ullong answered_4xx;         /* routed requests answered 4xx */
} lmc_http_stats;

/* What the routes need to know about the server. */
struct lmc_http_site {
    lmc_http_backend backend;
    const lmc_http_routes *routes;  /* borrowed from the starter */
    char *version;  /* "NA" when not given */
    char *commit;
    bool metrics_only;  /* lmc_http_options.metrics_only */
    bool auth_enabled;  /* a bearer token guards the LMC_HTTP_TOKEN routes */
    bool exposed;       /* listening on an address other than loopback */
    lmc_http_stats *stats;  /* NULL when dispatch is called without a server */
};

/* Routes the request (http_routes.c). */
void lmc_http_dispatch(const lmc_http_request *req, lmc_http_reply *out);
/* The policy of the route that dispatch would run for (method, path); a
 * path or method no route serves (404/405) is {OPEN, BODY_NONE}. */
lmc_http_policy lmc_http_route_policy(const lmc_http_site *site, const char *method,
                                      const char *path);

/* Static pages (http_pages.c). */
extern const char lmc_http_index_html[];
extern const char lmc_http_dashboard_html[];

#endif
