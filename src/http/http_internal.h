/* Shared by the files of src/http/ only: the request and reply of one
 * HTTP exchange, and the route table's entry point. */
#ifndef LMC_HTTP_HTTP_INTERNAL_H
#define LMC_HTTP_HTTP_INTERNAL_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>

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
} lmc_http_stats;

/* What the routes need to know about the server. */
typedef struct {
    lmc_http_backend backend;
    char *version;  /* "NA" when not given */
    char *commit;
    bool metrics_only;  /* lmc_http_options.metrics_only */
    bool auth_enabled;  /* a bearer token guards the LMC_HTTP_TOKEN routes */
    bool exposed;       /* listening on an address other than loopback */
    lmc_http_stats *stats;  /* NULL when dispatch is called without a server */
} lmc_http_site;

/* Who may call a route (docs/http.md, "Authentication").  TOKEN is 0 so
 * that a route entry that forgets to say is guarded. */
typedef enum {
    LMC_HTTP_TOKEN = 0,  /* needs the bearer token when one is configured */
    LMC_HTTP_OPEN,       /* probes and scrapers: never needs it */
} lmc_http_access;

/* What body a route reads, which picks its size limit (docs/http.md,
 * "Request bodies"). */
typedef enum {
    LMC_HTTP_BODY_NONE = 0,  /* ignored: a few bytes at most */
    LMC_HTTP_BODY_JSON,      /* a JSON document: lmc_http_options.max_body_bytes */
    LMC_HTTP_BODY_KV,        /* a KV tensor: lmc_http_options.max_kv_body_bytes */
    LMC_HTTP_BODY_BULK,      /* JSON with a token or key list: 16 x max_body_bytes */
} lmc_http_body;

typedef struct {
    lmc_http_access access;
    lmc_http_body body;
} lmc_http_policy;

typedef struct {
    const lmc_http_site *site;
    const char *method;  /* as received; HEAD is routed like GET */
    const char *path;    /* without the query string */
    const char *body;    /* NUL-terminated copy; NULL when empty */
    size_t body_len;
    struct MHD_Connection *conn;  /* NULL in tests that call dispatch directly */
} lmc_http_request;

typedef struct {
    unsigned status;
    char *body;                /* malloc'd; may be NULL (empty body) */
    size_t len;
    const char *content_type;  /* static string */
    char allow[64];            /* Allow header of a 405, else "" */
    int n_extra;               /* more headers (static names), e.g. X-LMCache-Hit-Tokens */
    const char *extra_names[4];
    char extra_values[4][24];
} lmc_http_reply;

/* Query-string argument / request header, or NULL. */
const char *lmc_http_query(const lmc_http_request *req, const char *name);
const char *lmc_http_header(const lmc_http_request *req, const char *name);

/* Fill `out`; they take ownership of body / text. */
void lmc_http_reply_json(lmc_http_reply *out, unsigned status, json_t *body);
void lmc_http_reply_pretty_json(lmc_http_reply *out, unsigned status, json_t *body);
void lmc_http_reply_text(lmc_http_reply *out, unsigned status, const char *content_type,
                         char *text);

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
