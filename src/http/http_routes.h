/* The route table of the HTTP frontend (docs/http.md, "Endpoints"): the
 * owner of a feature adds the rows that serve it, each with a handler and
 * the handler's context, and the frontend routes, guards and bounds the
 * requests by those rows alone.  docs/architecture.md ("HTTP routes")
 * says who owns which rows.
 *
 * Threads: rows may be added while the frontend serves (the modules add
 * theirs once they exist); a row, once added, is never changed or removed
 * until the table is freed, after every frontend using it stopped.
 * Handlers run on the frontend's worker threads, several at a time. */
#ifndef LMC_HTTP_HTTP_ROUTES_H
#define LMC_HTTP_HTTP_ROUTES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct lmc_http_site lmc_http_site;
struct MHD_Connection;

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
    const lmc_http_site *site;  /* the frontend's own (http_internal.h) */
    const char *method;  /* as received; HEAD is routed like GET */
    const char *path;    /* without the query string */
    /* NUL-terminated, NULL when empty: the frontend's buffer for this
     * request, freed after the handler returns, so a handler may change
     * it in place (the coordinator's /events scanner unescapes strings
     * where they lie rather than copy a body of up to 16 MiB). */
    char *body;
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

/* How a route answers while the server is not ready (docs/http.md,
 * "Behaviour shared by every endpoint": Readiness). */
typedef enum {
    LMC_HTTP_READY_ANY = 0,  /* serves regardless */
    LMC_HTTP_READY_DETAIL,   /* 503 {"detail":"server not initialized"} */
    LMC_HTTP_READY_ENGINE,   /* 503 {"error":"engine not initialized"} */
    LMC_HTTP_READY_CONFIGS,  /* 503 {"error":"configs not initialized"} */
    LMC_HTTP_READY_HEALTH,   /* 503 {"status":"unhealthy","reason":"engine not initialized"} */
} lmc_http_readiness;

/* `ctx` is what the owner gave lmc_http_routes_add; `arg` the row's own. */
typedef void (*lmc_http_handler)(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                                 const char *arg);

typedef struct {
    const char *method;  /* "GET" also serves HEAD; "*" serves every method */
    const char *path;
    bool prefix;         /* path ends in '/' and the rest must be non-empty */
    lmc_http_access access;
    lmc_http_body body;
    lmc_http_readiness ready;
    lmc_http_handler fn;
    const char *arg;     /* static; e.g. the prefix, a 501 message */
} lmc_http_route;

typedef struct lmc_http_routes lmc_http_routes;

lmc_http_routes *lmc_http_routes_new(void);
/* Frees the table; every frontend serving it must have stopped.  NULL is
 * a no-op. */
void lmc_http_routes_free(lmc_http_routes *t);
/* Appends n rows (copied; their strings must outlive the table), each
 * handler called with `ctx`.  Earlier rows win when two match; rows of one
 * path list their methods in the Allow header of a 405 in this order.
 * 0, or -1 when the table is full. */
int lmc_http_routes_add(lmc_http_routes *t, const lmc_http_route *rows, size_t n, void *ctx);
/* Every owner has added its rows.  Until then a request that no row
 * serves is answered 503 {"detail":"server not initialized"}, as the rows
 * still to come would answer it, rather than 404. */
void lmc_http_routes_seal(lmc_http_routes *t);
/* The frontend's own rows: pages, probes, /status, /version, /metrics,
 * /config, /cache/clear, /threads and the routes answered 501 (http_routes.c).
 * They call the lmc_http_backend the frontend was started with. */
int lmc_http_routes_add_site(lmc_http_routes *t);
/* GET /version ("<version>-<commit>", a JSON string), /lmc_version and
 * /commit_id (arg "both", "version" or "commit"), from the version and
 * commit the server was started with (lmc_http_options): a row for other
 * route tables that answer them as the frontend does (docs/http.md). */
void lmc_http_ep_version(const lmc_http_request *req, lmc_http_reply *out, void *ctx,
                         const char *arg);

/* Query-string argument / request header, or NULL. */
const char *lmc_http_query(const lmc_http_request *req, const char *name);
const char *lmc_http_header(const lmc_http_request *req, const char *name);

/* Fill `out`; they take ownership of body / text. */
void lmc_http_reply_json(lmc_http_reply *out, unsigned status, json_t *body);
void lmc_http_reply_pretty_json(lmc_http_reply *out, unsigned status, json_t *body);
void lmc_http_reply_text(lmc_http_reply *out, unsigned status, const char *content_type,
                         char *text);

#endif
