/* POST /cache/checksums and the legacy GET /kvcache/check (docs/http.md,
 * "KV checksums"): the server-driven transfer module's own rows, which
 * parse the request and hand it to lmc_server_driven_checksums().  With
 * the module left out (--supported-transfer-mode engine_driven) the rows
 * are still there and answer 501, as docs/http.md says. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_json.h"
#include "http/http_routes.h"
#include "modules/transfer/server/checksums.h"

/* The reply body, or NULL with *status and err.  `module_state` is NULL
 * when the module is not loaded. */
static json_t *checksums_of(void *module_state, const json_t *body, unsigned *status, char *err,
                            size_t errlen)
{
    if (module_state)
        return lmc_server_driven_checksums(module_state, body, status, err, errlen);
    *status = MHD_HTTP_NOT_IMPLEMENTED;
    snprintf(err, errlen, "the server-driven transfer module is not loaded "
                          "(--supported-transfer-mode engine_driven)");
    return NULL;
}

static void checksums(const lmc_http_request *req, lmc_http_reply *out, void *module_state,
                      const char *arg)
{
    (void)arg;
    json_t *body = req->body ? json_loadb(req->body, req->body_len, 0, NULL) : NULL;
    if (!json_is_object(body)) {
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST,
                            lmc_http_detail("body must be a JSON object"));
    } else {
        unsigned status = 0;
        char err[256] = "";
        json_t *reply = checksums_of(module_state, body, &status, err, sizeof err);
        if (reply)
            lmc_http_reply_json(out, MHD_HTTP_OK, reply);
        else
            lmc_http_reply_json(out, status ? status : MHD_HTTP_INTERNAL_SERVER_ERROR,
                                lmc_http_detail("%s", err));
    }
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

static void checksums_legacy(const lmc_http_request *req, lmc_http_reply *out,
                             void *module_state, const char *arg)
{
    (void)arg;
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
    json_t *reply = body ? checksums_of(module_state, body, &status, err, sizeof err) : NULL;
    if (reply)
        lmc_http_reply_json(out, MHD_HTTP_OK, reply);
    else
        lmc_http_reply_json(out, status ? status : MHD_HTTP_INTERNAL_SERVER_ERROR,
                            json_pack("{s:s}", "error", err[0] ? err : "out of memory"));
    json_decref(body);
}

static const lmc_http_route checksum_routes[] = {
    {"POST", "/cache/checksums", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_BULK,
     LMC_HTTP_READY_DETAIL, checksums, NULL},
    {"GET", "/kvcache/check", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     checksums_legacy, NULL},
};

int lmc_server_driven_register_http(void *module_state, lmc_http_routes *routes)
{
    return lmc_http_routes_add(routes, checksum_routes,
                               sizeof checksum_routes / sizeof checksum_routes[0], module_state);
}
