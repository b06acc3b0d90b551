/* Quota endpoints (docs/http.md, "Quotas"): /quota[/{salt}] and the legacy
 * /api/quota[/{salt}], the server's rows over the storage manager's
 * quotas.  GB = 2^30 bytes; the path segment "_default" names the empty
 * salt.  Errors use FastAPI's {"detail": ...} shape.  The storage manager
 * exists once these answer non-503, since they wait for readiness. */
#include <math.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_json.h"
#include "http/http_routes.h"
#include "obs/log.h"
#include "server/server_internal.h"
#include "storage/l2/l2_service.h"
#include "storage/quota.h"
#include "storage/storage_manager.h"

#define GB ((double)(1ull << 30))
/* Limits are kept in bytes as signed 64-bit JSON integers: 2^33 GB is
 * 2^63 bytes, the first value that no longer fits. */
#define MAX_LIMIT_GB 8589934592.0

static const char *salt_of(const lmc_http_request *req, const char *prefix)
{
    const char *salt = req->path + strlen(prefix);
    return strcmp(salt, "_default") == 0 ? "" : salt;
}

static lmc_quotas *quotas_of(lmc_server *s)
{
    return lmc_l2_quotas(s->ctx.storage);
}

/* {"limits": {salt: bytes}, "usage": {salt: bytes}} (new reference). */
static json_t *quota_snapshot(lmc_server *s)
{
    json_t *cap = lmc_quotas_capture(quotas_of(s));
    json_t *snap = json_pack("{s:O, s:o}", "limits", json_object_get(cap, "limits"), "usage",
                             lmc_l2_usage_by_salt(s->ctx.storage));
    json_decref(cap);
    return snap;
}

static double gb_of(const json_t *obj, const char *salt)
{
    return (double)json_integer_value(json_object_get(obj, salt)) / GB;
}

/* PUT {"limit_gb": number}, finite, >= 0 and below MAX_LIMIT_GB */
static void ep_quota_put(const lmc_http_request *req, lmc_http_reply *out, void *server,
                         const char *prefix)
{
    const char *salt = salt_of(req, prefix);
    json_t *body = req->body ? json_loadb(req->body, req->body_len, 0, NULL) : NULL;
    json_t *v = json_object_get(body, "limit_gb");
    double gb = json_number_value(v);
    if (!body || !json_is_object(body)) {
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST, lmc_http_detail("body must be a JSON object"));
    } else if (!json_is_number(v) || !isfinite(gb) || !(gb >= 0 && gb < MAX_LIMIT_GB)) {
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST,
                            lmc_http_detail("\"limit_gb\" must be a finite number >= 0 and "
                                            "below 8589934592 (2^63 bytes)"));
    } else if (lmc_quotas_set(quotas_of(server), salt, (uint64_t)llround(gb * GB)) != 0) {
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR, lmc_http_detail("out of memory"));
    } else {
        /* Accepted either way (upstream does), but an operator must learn
         * when nothing will hold the tenant to it. */
        bool enforced = lmc_l2_enforces_quotas(((lmc_server *)server)->ctx.storage);
        if (enforced)
            LMC_INFO("quota: cache_salt '%s' limited to %g GB in L2", salt, gb);
        else
            LMC_WARN_LIMITED("quota: cache_salt '%s' limited to %g GB, but no L2 adapter runs "
                             "IsolatedLRU eviction, which is what enforces quotas: the limit "
                             "is kept and not enforced (docs/http.md, \"Quotas\")", salt, gb);
        lmc_http_reply_json(out, MHD_HTTP_OK,
                            json_pack("{s:s, s:f, s:s, s:b}", "cache_salt", salt, "limit_gb", gb,
                                      "status", "ok", "enforced", enforced));
    }
    json_decref(body);
}

static void ep_quota_get(const lmc_http_request *req, lmc_http_reply *out, void *server,
                         const char *prefix)
{
    const char *salt = salt_of(req, prefix);
    json_t *snap = quota_snapshot(server);
    json_t *limits = json_object_get(snap, "limits"), *usage = json_object_get(snap, "usage");
    lmc_http_reply_json(out, MHD_HTTP_OK,
                        json_pack("{s:s, s:f, s:f, s:b}", "cache_salt", salt, "limit_gb",
                                  gb_of(limits, salt), "current_usage_gb", gb_of(usage, salt),
                                  "exists", json_object_get(limits, salt) != NULL));
    json_decref(snap);
}

static void ep_quota_delete(const lmc_http_request *req, lmc_http_reply *out, void *server,
                            const char *prefix)
{
    const char *salt = salt_of(req, prefix);
    bool removed = lmc_quotas_delete(quotas_of(server), salt);
    lmc_http_reply_json(out, MHD_HTTP_OK, json_pack("{s:s, s:s}", "cache_salt", salt, "status",
                                                    removed ? "removed" : "not_found"));
}

/* {"users": {salt: {limit_gb, current_usage_gb}}} over salts with a quota
 * or with bytes in L2. */
static void ep_quota_list(const lmc_http_request *req, lmc_http_reply *out, void *server,
                          const char *prefix)
{
    (void)req;
    (void)prefix;
    json_t *snap = quota_snapshot(server);
    json_t *limits = json_object_get(snap, "limits"), *usage = json_object_get(snap, "usage");
    json_t *users = json_object();
    const char *salt;
    json_t *v;
    for (int pass = 0; pass < 2; pass++) {
        json_object_foreach(pass ? usage : limits, salt, v) {
            json_object_set_new(users, salt,
                                json_pack("{s:f, s:f}", "limit_gb", gb_of(limits, salt),
                                          "current_usage_gb", gb_of(usage, salt)));
        }
    }
    lmc_http_reply_json(out, MHD_HTTP_OK, json_pack("{s:o}", "users", users));
    json_decref(snap);
}

static const lmc_http_route quota_routes[] = {
    {"GET", "/quota", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     ep_quota_list, "/quota/"},
    {"GET", "/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     ep_quota_get, "/quota/"},
    {"PUT", "/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_JSON, LMC_HTTP_READY_DETAIL,
     ep_quota_put, "/quota/"},
    {"DELETE", "/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     ep_quota_delete, "/quota/"},
    {"GET", "/api/quota", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     ep_quota_list, "/api/quota/"},
    {"GET", "/api/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     ep_quota_get, "/api/quota/"},
    {"PUT", "/api/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_JSON, LMC_HTTP_READY_DETAIL,
     ep_quota_put, "/api/quota/"},
    {"DELETE", "/api/quota/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     ep_quota_delete, "/api/quota/"},
};

int lmc_server_add_quota_routes(lmc_server *s, lmc_http_routes *routes)
{
    return lmc_http_routes_add(routes, quota_routes, sizeof quota_routes / sizeof quota_routes[0],
                               s);
}
