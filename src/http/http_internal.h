/* Shared by the files of src/http/ only: the request and reply of one
 * HTTP exchange, and the route table's entry point. */
#ifndef LMC_HTTP_HTTP_INTERNAL_H
#define LMC_HTTP_HTTP_INTERNAL_H

#include <jansson.h>
#include <stddef.h>

#include "http/http_server.h"

struct MHD_Connection;

/* What the routes need to know about the server. */
typedef struct {
    lmc_http_backend backend;
    char *version;  /* "NA" when not given */
    char *commit;
    bool metrics_only;  /* lmc_http_options.metrics_only */
} lmc_http_site;

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

/* Static pages (http_pages.c). */
extern const char lmc_http_index_html[];
extern const char lmc_http_dashboard_html[];

#endif
