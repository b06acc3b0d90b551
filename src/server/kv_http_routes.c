/* /api/kv/store, /api/kv/retrieve, /api/kv/lookup (docs/http.md, "KV transfer
 * over HTTP"): the server's rows.  Request parsing and the binary replies
 * here; kv_http.c does the work. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_json.h"
#include "http/http_routes.h"
#include "server/kv_http.h"
#include "server/server_internal.h"

#define KV_MEDIA_TYPE "application/x-lmcache-kv; v=1"

/* "1,2,3" -> tokens (malloc'd); false when empty or malformed. */
static bool parse_token_header(const char *text, uint64_t **tokens, size_t *n)
{
    size_t cap = 1;
    for (const char *p = text; *p; p++)
        cap += *p == ',';
    *tokens = malloc(cap * sizeof **tokens);
    *n = 0;
    const char *p = text;
    while (*tokens && *p) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v > UINT32_MAX || (*end && *end != ','))
            return false;
        (*tokens)[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    return *tokens && *n > 0;
}

static void reply_error(lmc_http_reply *out, unsigned status, const char *err)
{
    lmc_http_reply_json(out, status ? status : MHD_HTTP_INTERNAL_SERVER_ERROR,
                        lmc_http_detail("%s", err));
}

static void ep_kv_store(const lmc_http_request *req, lmc_http_reply *out, void *server,
                        const char *arg)
{
    (void)arg;
    lmc_server *s = server;
    const char *model = lmc_http_header(req, "X-LMCache-Model-Name");
    const char *toks = lmc_http_header(req, "X-LMCache-Tokens");
    const char *salt = lmc_http_header(req, "X-LMCache-Cache-Salt");
    const char *type = lmc_http_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
    lmc_kv_request rq = {.model = model, .salt = salt ? salt : ""};
    uint64_t *tokens = NULL;
    if (!model || !*model) {
        reply_error(out, MHD_HTTP_BAD_REQUEST, "missing X-LMCache-Model-Name header");
    } else if (!toks || !parse_token_header(toks, &tokens, &rq.n_tokens)) {
        reply_error(out, MHD_HTTP_BAD_REQUEST,
                    "X-LMCache-Tokens must be comma-separated ints (at least one)");
    } else if (type && strncmp(type, "application/x-lmcache-kv", 24) != 0) {
        reply_error(out, MHD_HTTP_BAD_REQUEST, "Content-Type must be " KV_MEDIA_TYPE);
    } else {
        rq.tokens = tokens;
        lmc_kv_counts c;
        unsigned status = 0;
        char err[256] = "";
        if (lmc_kv_http_store(&s->ctx, &rq, (const uint8_t *)req->body, req->body_len, &c, &status,
                        err, sizeof err) != 0)
            reply_error(out, status, err);
        else
            lmc_http_reply_json(out, MHD_HTTP_OK,
                                json_pack("{s:s, s:I, s:I, s:I, s:I}", "status", "ok",
                                          "total_tokens", (json_int_t)c.total_tokens,
                                          "total_chunks", (json_int_t)c.total_chunks,
                                          "stored_tokens", (json_int_t)c.done_tokens,
                                          "stored_chunks", (json_int_t)c.done_chunks));
    }
    free(tokens);
}

/* {"model_name": str, "tokens": [int], "cache_salt": str}; the caller frees
 * *tokens and decrefs *doc (rq strings point into it). */
static bool parse_json_request(const lmc_http_request *req, lmc_kv_request *rq,
                               uint64_t **tokens, json_t **doc)
{
    *tokens = NULL;
    *doc = req->body ? json_loadb(req->body, req->body_len, 0, NULL) : NULL;
    json_t *arr = json_object_get(*doc, "tokens"), *salt = json_object_get(*doc, "cache_salt");
    *rq = (lmc_kv_request){.model = json_string_value(json_object_get(*doc, "model_name")),
                           .salt = salt ? json_string_value(salt) : ""};
    if (!rq->model || !rq->salt || !json_is_array(arr))
        return false;
    rq->n_tokens = json_array_size(arr);
    *tokens = malloc((rq->n_tokens ? rq->n_tokens : 1) * sizeof **tokens);
    for (size_t i = 0; *tokens && i < rq->n_tokens; i++) {
        json_t *t = json_array_get(arr, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) > (json_int_t)UINT32_MAX)
            return false;
        (*tokens)[i] = (uint64_t)json_integer_value(t);
    }
    rq->tokens = *tokens;
    return *tokens != NULL;
}

static void ep_kv_lookup(const lmc_http_request *req, lmc_http_reply *out, void *server,
                         const char *arg)
{
    (void)arg;
    lmc_server *s = server;
    lmc_kv_request rq;
    uint64_t *tokens;
    json_t *doc;
    lmc_kv_counts c;
    unsigned status = 0;
    char err[256] = "";
    if (!parse_json_request(req, &rq, &tokens, &doc))
        reply_error(out, MHD_HTTP_UNPROCESSABLE_CONTENT,
                    "body must be {\"model_name\": str, \"tokens\": [int], \"cache_salt\": str}");
    else if (lmc_kv_http_lookup(&s->ctx, &rq, &c, &status, err, sizeof err) != 0)
        reply_error(out, status, err);
    else
        lmc_http_reply_json(out, MHD_HTTP_OK,
                            json_pack("{s:I, s:I, s:I, s:I}", "total_tokens",
                                      (json_int_t)c.total_tokens, "total_chunks",
                                      (json_int_t)c.total_chunks, "hit_tokens",
                                      (json_int_t)c.done_tokens, "hit_chunks",
                                      (json_int_t)c.done_chunks));
    free(tokens);
    json_decref(doc);
}

static void add_count_headers(lmc_http_reply *out, const lmc_kv_counts *c)
{
    static const char *const names[4] = {"X-LMCache-Hit-Tokens", "X-LMCache-Hit-Chunks",
                                         "X-LMCache-Total-Tokens", "X-LMCache-Total-Chunks"};
    const size_t values[4] = {c->done_tokens, c->done_chunks, c->total_tokens, c->total_chunks};
    for (int i = 0; i < 4; i++) {
        out->extra_names[i] = names[i];
        snprintf(out->extra_values[i], sizeof out->extra_values[i], "%zu", values[i]);
    }
    out->n_extra = 4;
}

static void ep_kv_retrieve(const lmc_http_request *req, lmc_http_reply *out, void *server,
                           const char *arg)
{
    (void)arg;
    lmc_server *s = server;
    lmc_kv_request rq;
    uint64_t *tokens;
    json_t *doc;
    lmc_kv_counts c;
    unsigned status = 0;
    char err[256] = "";
    uint8_t *data = NULL;
    size_t len = 0;
    if (!parse_json_request(req, &rq, &tokens, &doc)) {
        reply_error(out, MHD_HTTP_UNPROCESSABLE_CONTENT,
                    "body must be {\"model_name\": str, \"tokens\": [int], \"cache_salt\": str}");
    } else if (lmc_kv_http_retrieve(&s->ctx, &rq, &data, &len, &c, &status, err, sizeof err) != 0) {
        reply_error(out, status, err);
    } else {
        /* No hit: 404 with an empty body and the same count headers. */
        free(out->body);
        *out = (lmc_http_reply){.status = c.done_chunks ? MHD_HTTP_OK : MHD_HTTP_NOT_FOUND,
                                .content_type = KV_MEDIA_TYPE, .body = (char *)data,
                                .len = len};
        add_count_headers(out, &c);
        data = NULL;
    }
    free(data);
    free(tokens);
    json_decref(doc);
}

static const lmc_http_route kv_routes[] = {
    {"POST", "/api/kv/store", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_KV, LMC_HTTP_READY_DETAIL,
     ep_kv_store, NULL},
    {"POST", "/api/kv/retrieve", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_BULK,
     LMC_HTTP_READY_DETAIL, ep_kv_retrieve, NULL},
    {"POST", "/api/kv/lookup", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_BULK, LMC_HTTP_READY_DETAIL,
     ep_kv_lookup, NULL},
};

int lmc_server_add_kv_routes(lmc_server *s, lmc_http_routes *routes)
{
    return lmc_http_routes_add(routes, kv_routes, sizeof kv_routes / sizeof kv_routes[0], s);
}
