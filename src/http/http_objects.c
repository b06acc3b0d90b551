/* GET and DELETE /cache/objects (docs/http.md, "Cached objects"):
 * request parsing and validation here, the work in the backend. */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_internal.h"
#include "http/http_json.h"
#include "http/http_objects.h"

#define MAX_DELETE_KEYS 10000

static bool available(const lmc_http_request *req, lmc_http_reply *out, bool list)
{
    const lmc_http_backend *b = &req->site->backend;
    if (list ? b->objects_list != NULL : b->objects_remove != NULL)
        return true;
    lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                        lmc_http_detail("%s is not available in this build",
                                        list ? "L2 object listing" : "object deletion"));
    return false;
}

static void reply_backend(lmc_http_reply *out, json_t *body, unsigned status, const char *err)
{
    if (body)
        lmc_http_reply_json(out, status == MHD_HTTP_ACCEPTED ? status : MHD_HTTP_OK, body);
    else
        lmc_http_reply_json(out, status ? status : MHD_HTTP_INTERNAL_SERVER_ERROR,
                            lmc_http_detail("%s", err));
}

void lmc_http_objects_list(const lmc_http_request *req, lmc_http_reply *out, const char *arg)
{
    (void)arg;
    if (!available(req, out, true))
        return;
    const char *tier = lmc_http_query(req, "tier");
    if (tier && strcmp(tier, "l2") != 0) {
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST,
                            lmc_http_detail("tier '%s' not supported; only 'l2'", tier));
        return;
    }
    const char *ps = lmc_http_query(req, "page_size");
    char *end = NULL;
    long page_size = ps ? strtol(ps, &end, 10) : 500;
    if (ps && (!*ps || *end || page_size < 1 || page_size > 5000)) {
        lmc_http_reply_json(out, MHD_HTTP_UNPROCESSABLE_CONTENT,
                            lmc_http_detail("page_size must be an integer in 1..5000"));
        return;
    }
    const lmc_http_backend *b = &req->site->backend;
    unsigned status = 0;
    char err[256] = "";
    json_t *page = b->objects_list(b->user, lmc_http_query(req, "adapter"),
                                   lmc_http_query(req, "model_name"), (size_t)page_size,
                                   lmc_http_query(req, "page_token"), &status, err, sizeof err);
    reply_backend(out, page, status, err);
}

void lmc_http_objects_remove(const lmc_http_request *req, lmc_http_reply *out, const char *arg)
{
    (void)arg;
    if (!available(req, out, false))
        return;
    json_t *body = req->body ? json_loadb(req->body, req->body_len, 0, NULL) : NULL;
    json_t *keys = json_object_get(body, "keys");
    json_t *tier = json_object_get(body, "tier"), *force = json_object_get(body, "force");
    const char *t = tier ? json_string_value(tier) : "l2";
    if (!json_is_object(body) || !json_is_array(keys) || !t ||
        (strcmp(t, "l2") && strcmp(t, "l1") && strcmp(t, "all")) ||
        (force && !json_is_boolean(force))) {
        lmc_http_reply_json(out, MHD_HTTP_UNPROCESSABLE_CONTENT,
                            lmc_http_detail("body must be {\"keys\": [EncodedObjectKey], "
                                            "\"tier\": \"l2\"|\"l1\"|\"all\", \"adapter\": str|null, "
                                            "\"force\": bool}"));
    } else if (json_array_size(keys) > MAX_DELETE_KEYS) {
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST,
                            lmc_http_detail("at most %d keys per request", MAX_DELETE_KEYS));
    } else {
        const lmc_http_backend *b = &req->site->backend;
        unsigned status = 0;
        char err[256] = "";
        json_t *reply = b->objects_remove(b->user, body, &status, err, sizeof err);
        reply_backend(out, reply, status, err); /* status is set by the call above */
    }
    json_decref(body);
}

/* POST /cache/prefetches, GET /cache/prefetches/{request_id} */
void lmc_http_prefetch_submit(const lmc_http_request *req, lmc_http_reply *out, const char *arg)
{
    (void)arg;
    const lmc_http_backend *b = &req->site->backend;
    if (!b->prefetch_submit) {
        lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                            lmc_http_detail("L2 prefetch is not available in this build"));
        return;
    }
    json_t *body = req->body ? json_loadb(req->body, req->body_len, 0, NULL) : NULL;
    if (!json_is_object(body)) {
        lmc_http_reply_json(out, MHD_HTTP_UNPROCESSABLE_CONTENT,
                            lmc_http_detail("body must be a JSON object"));
    } else {
        unsigned status = 0;
        char err[256] = "";
        json_t *reply = b->prefetch_submit(b->user, body, &status, err, sizeof err);
        reply_backend(out, reply, status, err);
    }
    json_decref(body);
}

void lmc_http_prefetch_query(const lmc_http_request *req, lmc_http_reply *out, const char *arg)
{
    const lmc_http_backend *b = &req->site->backend;
    if (!b->prefetch_query) {
        lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                            lmc_http_detail("L2 prefetch is not available in this build"));
        return;
    }
    unsigned status = 0;
    char err[256] = "";
    json_t *reply = b->prefetch_query(b->user, req->path + strlen(arg), &status, err, sizeof err);
    reply_backend(out, reply, status, err);
}
