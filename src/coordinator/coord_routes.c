/* The route table of the coordinator (docs/coordinator.md, "HTTP API"),
 * /events, /healthcheck and the CacheBlend routes answered 501. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "coordinator/coord_internal.h"
#include "obs/log.h"

static bool is_get(const char *method)
{
    return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
}

/* Reads are open, as are /healthcheck and /metrics (both GET); every
 * other method needs the token when one is configured. */
bool coordinator_route_guarded(const char *method, const char *path)
{
    (void)path;
    return !is_get(method);
}

static const char *after(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(path, prefix, n) == 0 && path[n] ? path + n : NULL;
}

void coordinator_warn_keys_full(lmc_coord *co)
{
    double now = coordinator_now_mono();
    if (co->keys_full_warned && now - co->keys_full_warned < 60)
        return;
    co->keys_full_warned = now;
    LMC_WARN("coordinator: the key directory is full (%u keys, LMCACHE_MP_COORDINATOR_MAX_KEYS): "
             "new keys are not recorded until deletes make room; %llu refused so far "
             "(lmcache_mp_coordinator_keys_refused_total)", co->st.keys.n_live,
             (unsigned long long)co->st.keys.refused);
}

/* Requests answered 503 for the database, logged at most once a minute
 * with the count since (mu held): a failing disk and senders retrying
 * every second must not flood the log. */
static void warn_not_saved(lmc_coord *co)
{
    double now = coordinator_now_mono();
    co->not_saved++;
    if (co->not_saved_warned && now - co->not_saved_warned < 60)
        return;
    co->not_saved_warned = now;
    LMC_ERROR("coordinator: the events of a request could not be saved (the database is "
              "locked by another process, the disk is full, a file-size limit, an I/O error): "
              "answered 503 for the sender to send them again; %llu such request(s) so far",
              (unsigned long long)co->not_saved);
}

static void blend_501(coordinator_reply *out)
{
    coordinator_reply_detail(out, 501, "CacheBlend (the fleet fragment index) is not implemented in "
                                 "this coordinator (docs/coordinator.md)");
}

void coordinator_ep_events(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out)
{
    if (!rq->body)
        return coordinator_reply_detail(out, 422, "a JSON object body is required");
    coordinator_event_request r;
    char why[512];
    int parsed = coordinator_events_parse_in_place(rq->body, rq->body_len, &r, why, sizeof why);
    if (parsed != 0) /* out of memory is ours, not the body's: the sender tries again */
        return coordinator_reply_detail(out, parsed == -2 ? 503 : 422, "%s", why);
    coordinator_ingest_result res;
    pthread_mutex_lock(&co->mu);
    uint64_t refused = co->st.keys.refused;
    int rc = coordinator_events_ingest(&co->st, co->db, &r, &res, why, sizeof why);
    if (co->st.keys.refused != refused)
        coordinator_warn_keys_full(co);
    if (rc == -2)
        warn_not_saved(co);
    pthread_mutex_unlock(&co->mu);
    coordinator_events_request_free(&r);
    if (rc != 0)
        return coordinator_reply_detail(out, 503, "%s", why);
    coordinator_reply_json(out, 200, json_pack("{s:I, s:I, s:I}", "applied", (json_int_t)res.applied,
                                         "duplicates", (json_int_t)res.duplicates, "stale",
                                         (json_int_t)res.stale));
}

static void healthcheck(lmc_coord *co, coordinator_reply *out)
{
    pthread_mutex_lock(&co->mu);
    size_t n = co->n_members;
    pthread_mutex_unlock(&co->mu);
    coordinator_reply_json(out, 200, json_pack("{s:s, s:I}", "status", "healthy", "instances",
                                         (json_int_t)n));
}

/* Routes under /instances/. */
static bool instance_routes(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out,
                            const char *rest)
{
    const char *hb = "/heartbeat";
    size_t n = strlen(rest), hn = strlen(hb);
    if (n > hn && strcmp(rest + n - hn, hb) == 0) {
        char id[COORD_INSTANCE_ID_MAX + 1];
        if (n - hn > COORD_INSTANCE_ID_MAX)
            return coordinator_reply_json(out, 404, json_pack("{s:s}", "error", "unknown instance; "
                                                        "re-register")), true;
        memcpy(id, rest, n - hn);
        id[n - hn] = '\0';
        if (strcmp(rq->method, "PUT") != 0)
            return false;
        coordinator_ep_heartbeat(co, rq, out, id);
        return true;
    }
    if (strcmp(rq->method, "DELETE") != 0)
        return false;
    coordinator_ep_deregister(co, rq, out, rest);
    return true;
}

/* true when a route ran; false: the path is known but not the method. */
static bool route(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out, bool *known)
{
    const char *m = rq->method, *p = rq->path, *rest;
    bool get = is_get(m), post = !strcmp(m, "POST"), put = !strcmp(m, "PUT");
    bool del = !strcmp(m, "DELETE");
    *known = true;
    if (!strcmp(p, "/healthcheck"))
        return get ? healthcheck(co, out), true : false;
    if (!strcmp(p, "/metrics"))
        return get ? coordinator_ep_metrics(co, rq, out), true : false;
    if (!strcmp(p, "/instances")) {
        if (post)
            return coordinator_ep_register(co, rq, out), true;
        return get ? coordinator_ep_instances(co, rq, out), true : false;
    }
    if ((rest = after(p, "/instances/")))
        return instance_routes(co, rq, out, rest);
    if (!strcmp(p, "/events"))
        return post ? coordinator_ep_events(co, rq, out), true : false;
    if (!strcmp(p, "/quota/config"))
        return get || put ? coordinator_ep_quota_config(co, rq, out), true : false;
    if (!strcmp(p, "/quota"))
        return get ? coordinator_ep_quota_all(co, rq, out), true : false;
    if ((rest = after(p, "/quota/")))
        return get || put || del ? coordinator_ep_quota_salt(co, rq, out, rest), true : false;
    if (!strcmp(p, "/cache/pins"))
        return post || del ? coordinator_ep_pins(co, rq, out), true : false;
    if (!strcmp(p, "/cache/prefetches"))
        return post ? coordinator_ep_prefetch(co, rq, out), true : false;
    if ((rest = after(p, "/cache/prefetches/")))
        return get ? coordinator_ep_prefetch_status(co, rq, out, rest), true : false;
    if (!strcmp(p, "/directory/lookup"))
        return post ? coordinator_ep_dir_lookup(co, rq, out), true : false;
    if (!strcmp(p, "/directory/keys"))
        return get ? coordinator_ep_dir_keys(co, rq, out), true : false;
    if (!strcmp(p, "/directory/stats"))
        return get ? coordinator_ep_dir_stats(co, rq, out), true : false;
    if (!strcmp(p, "/directory/blend-lookup") || after(p, "/blend/"))
        return blend_501(out), true;
    *known = false;
    return false;
}

void coordinator_dispatch(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out)
{
    bool known;
    if (route(co, rq, out, &known))
        return;
    if (known)
        coordinator_reply_detail(out, 405, "Method Not Allowed");
    else
        coordinator_reply_detail(out, 404, "Not Found");
}
