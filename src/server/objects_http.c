/* GET and DELETE /cache/objects, POST /cache/prefetches and GET
 * /cache/prefetches/{request_id} (docs/http.md, "Cached objects" and
 * "Warm prefetch"): the server's rows, since the storage manager and the
 * warm prefetcher they reach are the server's.  Request parsing and
 * validation first, then the work. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_json.h"
#include "http/http_routes.h"
#include "server/server_internal.h"
#include "server/warm_prefetch.h"
#include "storage/l2/l2_service.h"
#include "storage/object_key_json.h"
#include "storage/storage_manager.h"

#define MAX_DELETE_KEYS 10000

/* ---- /cache/objects ------------------------------------------------------ */

/* The adapter's index, or -1 with 503 (no L2 at all) or 404 (no match). */
static int find_adapter(lmc_server *s, const char *adapter, unsigned *status, char *err,
                        size_t errlen)
{
    int a = lmc_l2_find_adapter(s->ctx.storage, adapter);
    if (a < 0) {
        bool none = lmc_l2_find_adapter(s->ctx.storage, NULL) < 0;
        *status = none ? 503 : 404;
        snprintf(err, errlen, none ? "no L2 adapters" : "no L2 adapter '%s'", adapter);
    }
    return a;
}

static json_t *objects_list(lmc_server *s, const char *adapter, const char *model,
                            size_t page_size, const char *page_token, unsigned *status, char *err,
                            size_t errlen)
{
    int a = find_adapter(s, adapter, status, err, errlen);
    if (a < 0)
        return NULL;
    json_t *page = lmc_l2_list(s->ctx.storage, a, model, page_size, page_token);
    if (!page) {
        *status = 503;
        snprintf(err, errlen, "the adapter cannot list its keys");
    }
    return page;
}

/* EncodedObjectKey {chunk_hash_hex, model_name, kv_rank, object_group_id=0,
 * cache_salt=""} -> key.  A delete only names keys, so nothing is interned
 * (issue 17): strings the server's interner holds are taken from it, and
 * *l1 tells whether both were there (else no L1 object has the key); the
 * others point into `o`, which outlives the L2 delete that reads them. */
static int decode_encoded_key(lmc_server *s, const json_t *o, lmc_object_key *k, bool *l1,
                              char *why, size_t whylen)
{
    lmc_object_key_json_fields f;
    *k = (lmc_object_key){0};
    switch (lmc_object_key_json_parse(o, &f)) {
    case LMC_OBJECT_KEY_JSON_OK:
        break;
    case LMC_OBJECT_KEY_JSON_NOT_OBJECT:
    case LMC_OBJECT_KEY_JSON_HASH_LENGTH:
        return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex of 1..32 bytes"), -1;
    case LMC_OBJECT_KEY_JSON_HASH_DIGIT:
        return snprintf(why, whylen, "chunk_hash_hex must be lower-case hex"), -1;
    case LMC_OBJECT_KEY_JSON_MODEL:
        return snprintf(why, whylen, "model_name must be a non-empty str of at most %d bytes "
                                     "without '@'", LMC_MODEL_NAME_MAX), -1;
    case LMC_OBJECT_KEY_JSON_SALT:
        return snprintf(why, whylen, "cache_salt is invalid"), -1;
    case LMC_OBJECT_KEY_JSON_RANK_OR_GROUP:
        return snprintf(why, whylen, "kv_rank and object_group_id must be u32 integers"), -1;
    }
    memcpy(k->chunk_hash, f.chunk_hash, f.chunk_hash_len);
    k->chunk_hash_len = f.chunk_hash_len;
    k->kv_rank = f.kv_rank;
    k->object_group_id = f.object_group_id;
    const char *model = f.model_name, *salt = f.cache_salt;
    /* Names never interned name no L1 object; the L2 part then reads the
     * body's own strings (the key is not `interned`, so holds nothing). */
    const char *m_in = lmc_intern_find(s->ctx.interner, model, strlen(model));
    const char *s_in = m_in ? lmc_intern_find(s->ctx.interner, salt, strlen(salt)) : NULL;
    *l1 = m_in && s_in;
    if (*l1) {
        lmc_object_key_set_strings(k, m_in, s_in); /* dropped after the request */
    } else {
        lmc_intern_release(m_in);
        k->model_name = model;
        k->cache_salt = salt;
    }
    return 0;
}

static json_t *objects_remove(lmc_server *s, const json_t *body, unsigned *status, char *err,
                              size_t errlen)
{
    const json_t *keys_j = json_object_get(body, "keys");
    const char *tier = json_string_value(json_object_get(body, "tier"));
    const char *adapter = json_string_value(json_object_get(body, "adapter"));
    bool force = json_is_true(json_object_get(body, "force"));
    bool l1 = tier && (!strcmp(tier, "l1") || !strcmp(tier, "all"));
    bool l2 = !tier || strcmp(tier, "l1") != 0;
    int a = l2 ? find_adapter(s, adapter, status, err, errlen) : -1;
    if (l2 && a < 0)
        return NULL;
    size_t n = json_array_size(keys_j), n_l1 = 0;
    /* keys[0..n) for L2; l1_keys[0..n_l1) the ones an L1 object may have */
    lmc_object_key *keys = malloc((n ? n : 1) * sizeof *keys);
    lmc_object_key *l1_keys = malloc((n ? n : 1) * sizeof *l1_keys);
    if (!keys || !l1_keys) {
        free(keys);
        free(l1_keys);
        return *status = 500, snprintf(err, errlen, "out of memory"), NULL;
    }
    for (size_t i = 0; i < n; i++) {
        char why[160];
        bool known;
        if (decode_encoded_key(s, json_array_get(keys_j, i), &keys[i], &known, why,
                               sizeof why) != 0) {
            lmc_keys_drop(keys, i);
            free(keys);
            free(l1_keys);
            *status = 400;
            snprintf(err, errlen, "keys[%zu]: %s", i, why);
            return NULL;
        }
        if (known)
            l1_keys[n_l1++] = keys[i];
    }
    size_t deleted = 0, skipped = 0;
    if (l1)
        lmc_storage_manager_delete(s->ctx.storage, l1_keys, n_l1, force, &deleted, &skipped);
    if (l2)
        deleted += lmc_l2_delete(s->ctx.storage, a, keys, n);
    lmc_keys_drop(keys, n); /* l1_keys borrowed these */
    free(keys);
    free(l1_keys);
    return json_pack("{s:I, s:I, s:b}", "deleted", (json_int_t)deleted, "skipped",
                     (json_int_t)skipped, "ok", 1);
}

/* ---- /cache/prefetches ------------------------------------------------------ */

static json_t *prefetch_submit(lmc_server *s, const json_t *body, unsigned *status, char *err,
                               size_t errlen)
{
    if (!s->warm)
        return *status = 503, snprintf(err, errlen, "prefetch service unavailable"), NULL;
    return lmc_warm_prefetch_submit(s->warm, body, status, err, errlen);
}

static json_t *prefetch_query(lmc_server *s, const char *id, unsigned *status, char *err,
                              size_t errlen)
{
    if (!s->warm)
        return *status = 503, snprintf(err, errlen, "prefetch service unavailable"), NULL;
    return lmc_warm_prefetch_query(s->warm, id, status, err, errlen);
}

static void reply_backend(lmc_http_reply *out, json_t *body, unsigned status, const char *err)
{
    if (body)
        lmc_http_reply_json(out, status == MHD_HTTP_ACCEPTED ? status : MHD_HTTP_OK, body);
    else
        lmc_http_reply_json(out, status ? status : MHD_HTTP_INTERNAL_SERVER_ERROR,
                            lmc_http_detail("%s", err));
}

static void ep_objects_list(const lmc_http_request *req, lmc_http_reply *out, void *server,
                            const char *arg)
{
    (void)arg;
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
    unsigned status = 0;
    char err[256] = "";
    json_t *page = objects_list(server, lmc_http_query(req, "adapter"),
                                   lmc_http_query(req, "model_name"), (size_t)page_size,
                                   lmc_http_query(req, "page_token"), &status, err, sizeof err);
    reply_backend(out, page, status, err);
}

static void ep_objects_remove(const lmc_http_request *req, lmc_http_reply *out, void *server,
                              const char *arg)
{
    (void)arg;
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
        unsigned status = 0;
        char err[256] = "";
        json_t *reply = objects_remove(server, body, &status, err, sizeof err);
        reply_backend(out, reply, status, err); /* status is set by the call above */
    }
    json_decref(body);
}

/* POST /cache/prefetches, GET /cache/prefetches/{request_id} */
static void ep_prefetch_submit(const lmc_http_request *req, lmc_http_reply *out, void *server,
                               const char *arg)
{
    (void)arg;
    json_t *body = req->body ? json_loadb(req->body, req->body_len, 0, NULL) : NULL;
    if (!json_is_object(body)) {
        lmc_http_reply_json(out, MHD_HTTP_UNPROCESSABLE_CONTENT,
                            lmc_http_detail("body must be a JSON object"));
    } else {
        unsigned status = 0;
        char err[256] = "";
        json_t *reply = prefetch_submit(server, body, &status, err, sizeof err);
        reply_backend(out, reply, status, err);
    }
    json_decref(body);
}

/* arg: the route prefix ("/cache/prefetches/"); the request id follows it. */
static void ep_prefetch_query(const lmc_http_request *req, lmc_http_reply *out, void *server,
                              const char *arg)
{
    unsigned status = 0;
    char err[256] = "";
    json_t *reply = prefetch_query(server, req->path + strlen(arg), &status, err, sizeof err);
    reply_backend(out, reply, status, err);
}

static const lmc_http_route object_routes[] = {
    {"GET", "/cache/objects", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE, LMC_HTTP_READY_DETAIL,
     ep_objects_list, NULL},
    {"DELETE", "/cache/objects", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_BULK,
     LMC_HTTP_READY_DETAIL, ep_objects_remove, NULL},
    {"POST", "/cache/prefetches", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_BULK,
     LMC_HTTP_READY_DETAIL, ep_prefetch_submit, NULL},
    {"GET", "/cache/prefetches/", true, LMC_HTTP_TOKEN, LMC_HTTP_BODY_NONE,
     LMC_HTTP_READY_DETAIL, ep_prefetch_query, "/cache/prefetches/"},
};

int lmc_server_add_object_routes(lmc_server *s, lmc_http_routes *routes)
{
    return lmc_http_routes_add(routes, object_routes,
                               sizeof object_routes / sizeof object_routes[0], s);
}
