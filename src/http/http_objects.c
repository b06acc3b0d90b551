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

/* ---- /cache/checksums ----------------------------------------------------- */

static void checksums_reply(const lmc_http_request *req, lmc_http_reply *out, json_t *body)
{
    const lmc_http_backend *b = &req->site->backend;
    unsigned status = 0;
    char err[256] = "";
    json_t *reply = b->checksums(b->user, body, &status, err, sizeof err);
    reply_backend(out, reply, status, err);
}

void lmc_http_checksums(const lmc_http_request *req, lmc_http_reply *out, const char *arg)
{
    (void)arg;
    const lmc_http_backend *b = &req->site->backend;
    if (!b->checksums) {
        lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                            lmc_http_detail("KV checksums are not available"));
        return;
    }
    json_t *body = req->body ? json_loadb(req->body, req->body_len, 0, NULL) : NULL;
    if (!json_is_object(body))
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST,
                            lmc_http_detail("body must be a JSON object"));
    else
        checksums_reply(req, out, body);
    json_decref(body);
}

/* One item of the legacy "mixed" id list, "7" or "[2,5]" (inclusive);
 * *end after it, or NULL when malformed or wider than max. */
static bool mixed_item(const char *s, long long *a, long long *b, const char **end, size_t max)
{
    char *e;
    if (*s != '[') {
        *a = *b = strtoll(s, &e, 10);
        *end = e;
        return e != s;
    }
    *a = strtoll(s + 1, &e, 10);
    if (e == s + 1 || *e != ',')
        return false;
    const char *second = e + 1;
    *b = strtoll(second, &e, 10);
    *end = e + 1;
    return e != second && *e == ']' && *b >= *a && (unsigned long long)(*b - *a) < max;
}

/* "0,[2,5],8" is 0, 2, 3, 4, 5, 8.  NULL when malformed or past max ids. */
static json_t *parse_mixed_ids(const char *s, size_t max)
{
    json_t *ids = json_array();
    while (ids) {
        long long a, b;
        const char *end;
        if (!mixed_item(s, &a, &b, &end, max))
            break;
        for (long long v = a; v <= b; v++)
            if (json_array_size(ids) >= max || json_array_append_new(ids, json_integer(v)) != 0)
                goto fail;
        if (*end == '\0')
            return ids;
        if (*end != ',')
            break;
        s = end + 1;
    }
fail:
    json_decref(ids);
    return NULL;
}

void lmc_http_checksums_legacy(const lmc_http_request *req, lmc_http_reply *out,
                               const char *arg)
{
    (void)arg;
    const lmc_http_backend *b = &req->site->backend;
    if (!b->checksums) {
        lmc_http_reply_json(out, MHD_HTTP_NOT_IMPLEMENTED,
                            json_pack("{s:s}", "error", "KV checksums are not available"));
        return;
    }
    const char *ids_s = lmc_http_query(req, "block_ids"), *cs = lmc_http_query(req, "chunk_size");
    const char *inst = lmc_http_query(req, "instance_id"), *lw = lmc_http_query(req, "layerwise");
    json_t *ids = ids_s ? parse_mixed_ids(ids_s, 1u << 20) : NULL;
    char *end = NULL;
    long long chunk = cs ? strtoll(cs, &end, 10) : 0, id = 0;
    if (!ids || !cs || *end || (inst && (id = strtoll(inst, &end, 10), *end))) {
        json_decref(ids);
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST,
                            json_pack("{s:s}", "error", "block_ids (like 0,[2,5],8), chunk_size "
                                                        "and instance_id must be integers"));
        return;
    }
    bool layerwise = lw && (!strcmp(lw, "true") || !strcmp(lw, "1") || !strcmp(lw, "True"));
    json_t *body = json_pack("{s:o, s:I, s:I, s:b}", "block_ids", ids, "chunk_size",
                             (json_int_t)chunk, "instance_id", (json_int_t)id, "layerwise",
                             layerwise);
    unsigned status = 0;
    char err[256] = "";
    json_t *reply = body ? b->checksums(b->user, body, &status, err, sizeof err) : NULL;
    if (reply)
        lmc_http_reply_json(out, MHD_HTTP_OK, reply);
    else
        lmc_http_reply_json(out, status ? status : MHD_HTTP_INTERNAL_SERVER_ERROR,
                            json_pack("{s:s}", "error", err[0] ? err : "out of memory"));
    json_decref(body);
}
