/* /quota routes (docs/coordinator.md, "Quotas"): L2 quotas per salt and
 * the default for salts without one, persisted on every write. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_internal.h"
#include "storage/object_key.h"

/* The tier of the request (query, else body, else "l2"); false with a 400
 * in out when it is not l2. */
static bool tier_ok(const lmc_http_request *rq, const json_t *body, lmc_http_reply *out)
{
    const char *tier = lmc_http_query(rq, "tier");
    json_t *bt = json_object_get(body, "tier");
    if (!tier && bt && !json_is_string(bt))
        return lmc_http_reply_json(out, 400, json_pack("{s:s}", "error", "tier must be a str")),
               false;
    if (!tier)
        tier = bt ? json_string_value(bt) : "l2";
    if (strcmp(tier, "l2") == 0)
        return true;
    char msg[256];
    if (!strcmp(tier, "all") || !strcmp(tier, "l1"))
        snprintf(msg, sizeof msg, "tier '%s' has no quota accounting; only 'l2'", tier);
    else
        snprintf(msg, sizeof msg, "unknown tier '%.64s'; only 'l2'", tier);
    lmc_http_reply_json(out, 400, json_pack("{s:s}", "error", msg));
    return false;
}

/* A limit in GB: a finite number >= 0 (null allowed when may_be_null). */
static bool limit_value(const json_t *v, bool may_be_null, double *out, bool *is_null)
{
    *is_null = may_be_null && json_is_null(v);
    if (*is_null)
        return true;
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
        return false;
    *out = json_number_value(v);
    return true;
}

static json_t *body_or_400(const lmc_http_request *rq, lmc_http_reply *out)
{
    json_t *b = rq->body ? json_loadb(rq->body, rq->body_len, 0, NULL) : NULL;
    if (json_is_object(b))
        return b;
    json_decref(b);
    lmc_http_reply_json(out, 400, json_pack("{s:s}", "error", "invalid quota limit: the body must "
                                                           "be a JSON object"));
    return NULL;
}

static json_t *default_json(const coordinator_state *s)
{
    return json_pack("{s:o, s:s}", "default_limit_gb",
                     s->has_default_quota ? json_real(s->default_quota_gb) : json_null(), "tier",
                     "l2");
}

void coordinator_ep_quota_config(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                                 const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    json_t *b = NULL;
    if (strcmp(rq->method, "PUT") == 0 && !(b = body_or_400(rq, out)))
        return;
    double limit = 0;
    bool is_null = false;
    if (!tier_ok(rq, b, out))
        goto done;
    if (b && !limit_value(json_object_get(b, "default_limit_gb"), true, &limit, &is_null)) {
        lmc_http_reply_json(out, 400, json_pack("{s:s}", "error", "invalid quota limit"));
        goto done;
    }
    pthread_mutex_lock(&co->mu);
    if (b) {
        co->st.has_default_quota = !is_null;
        co->st.default_quota_gb = is_null ? 0 : limit;
        coordinator_db_put_default(co->db, !is_null, limit);
    }
    lmc_http_reply_json(out, 200, default_json(&co->st));
    pthread_mutex_unlock(&co->mu);
done:
    json_decref(b);
}

/* Upstream's coordinator names (quota_limit_gb, quota_exists, usage_gb),
 * which its clients read, and beside them lmcached's own /quota names
 * (limit_gb, exists, current_usage_gb) with the same values, so that one
 * client reads either binary (docs/coordinator.md, "Quotas"). */
static json_t *salt_json(const coordinator_state *s, uint32_t salt, const char *name)
{
    const coordinator_salt *sa = salt < s->salt_cap ? &s->salt[salt] : NULL;
    bool has = sa && sa->has_quota;
    double limit = has ? sa->quota_gb : 0.0, usage = sa ? (double)sa->l2_bytes / COORD_GB : 0.0;
    return json_pack("{s:s, s:f, s:b, s:f, s:s, s:f, s:b, s:f}", "cache_salt", name,
                     "quota_limit_gb", limit, "quota_exists", has, "usage_gb", usage, "tier", "l2",
                     "limit_gb", limit, "exists", has, "current_usage_gb", usage);
}

static void quota_put(lmc_coord *co, const lmc_http_request *rq, lmc_http_reply *out, const char *salt)
{
    json_t *b = body_or_400(rq, out);
    double limit;
    bool is_null;
    if (!b || !tier_ok(rq, b, out))
        goto done;
    if (!limit_value(json_object_get(b, "limit_gb"), false, &limit, &is_null)) {
        lmc_http_reply_json(out, 400, json_pack("{s:s}", "error", "invalid quota limit"));
        goto done;
    }
    pthread_mutex_lock(&co->mu);
    uint32_t id = coordinator_names_intern(&co->st.salts, salt);
    coordinator_salt *sa = id == COORD_NONE ? NULL : coordinator_salt_at(&co->st, id);
    if (sa) {
        sa->has_quota = true;
        sa->quota_gb = limit;
        coordinator_db_put_quota(co->db, salt, limit);
    }
    pthread_mutex_unlock(&co->mu);
    if (!sa)
        coordinator_reply_detail(out, 503, "too many salts (at most %d)", COORD_MAX_NAMES);
    else
        lmc_http_reply_json(out, 200, json_pack("{s:s, s:f, s:s, s:s, s:b}", "cache_salt", salt,
                                                "limit_gb", limit, "status", "ok", "tier", "l2",
                                                "enforced", co->cfg.eviction_check_interval_s > 0));
done:
    json_decref(b);
}

static void quota_delete(lmc_coord *co, lmc_http_reply *out, const char *salt)
{
    pthread_mutex_lock(&co->mu);
    uint32_t id = coordinator_names_find(&co->st.salts, salt);
    bool had = id != COORD_NONE && id < co->st.salt_cap && co->st.salt[id].has_quota;
    if (had) {
        co->st.salt[id].has_quota = false;
        co->st.salt[id].quota_gb = 0;
        coordinator_db_put_quota(co->db, salt, -1);
    }
    pthread_mutex_unlock(&co->mu);
    lmc_http_reply_json(out, 200, json_pack("{s:s, s:f, s:s, s:s}", "cache_salt", salt, "limit_gb",
                                         0.0, "status", had ? "removed" : "not_found", "tier",
                                         "l2"));
}

/* GET, PUT and DELETE /quota/{salt}; arg: the prefix "/quota/". */
void coordinator_ep_quota_salt(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                               const char *arg)
{
    lmc_coord *co = ctx;
    const char *path_salt = rq->path + strlen(arg);
    const char *salt = strcmp(path_salt, "_default") == 0 ? "" : path_salt;
    if (!lmc_cache_salt_valid(salt, strlen(salt)))
        return lmc_http_reply_json(out, 400, json_pack("{s:s}", "error", "invalid cache_salt: at "
                                                     "most 128 bytes, no '@', '/' or '\\'"));
    if (strcmp(rq->method, "PUT") == 0)
        return quota_put(co, rq, out, salt);
    if (!tier_ok(rq, NULL, out))
        return;
    if (strcmp(rq->method, "DELETE") == 0)
        return quota_delete(co, out, salt);
    pthread_mutex_lock(&co->mu);
    lmc_http_reply_json(out, 200, salt_json(&co->st, coordinator_names_find(&co->st.salts, salt), salt));
    pthread_mutex_unlock(&co->mu);
}

static int by_name(const void *a, const void *b)
{
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "cache_salt"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "cache_salt"));
    return strcmp(x, y);
}

void coordinator_ep_quota_all(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                              const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    if (!tier_ok(rq, NULL, out))
        return;
    pthread_mutex_lock(&co->mu);
    const coordinator_state *s = &co->st;
    size_t n = 0;
    json_t **rows = calloc(s->salts.n + 1, sizeof *rows);
    for (uint32_t id = 0; rows && id < s->salts.n && id < s->salt_cap; id++) {
        const coordinator_salt *sa = &s->salt[id];
        if (sa->has_quota || sa->l2_count)
            rows[n++] = salt_json(s, id, coordinator_names_str(&s->salts, id));
    }
    double total = (double)s->l2_bytes / COORD_GB;
    pthread_mutex_unlock(&co->mu);
    if (!rows)
        return coordinator_reply_detail(out, 500, "out of memory");
    qsort(rows, n, sizeof *rows, by_name);
    json_t *list = json_array(), *users = json_object();
    for (size_t i = 0; i < n; i++) {
        json_object_set_new(users, json_string_value(json_object_get(rows[i], "cache_salt")),
                            json_pack("{s:O, s:O}", "limit_gb", json_object_get(rows[i], "limit_gb"),
                                      "current_usage_gb",
                                      json_object_get(rows[i], "current_usage_gb")));
        json_array_append_new(list, rows[i]);
    }
    free(rows);
    /* "users" is lmcached's shape of the same list (salt_json) */
    lmc_http_reply_json(out, 200, json_pack("{s:f, s:s, s:o, s:o}", "total_gb", total, "tier", "l2",
                                            "by_cache_salt", list, "users", users));
}
