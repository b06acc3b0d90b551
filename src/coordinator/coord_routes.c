/* The coordinator's route table (docs/coordinator.md, "HTTP API"), served
 * by src/http's server core (coord_http.c), with /events, /l2/events,
 * /healthcheck and the older /blend/... routes answered 501. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_events.h"
#include "coordinator/coord_internal.h"
#include "obs/log.h"

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

/* A path served under other methods only; arg: its Allow header. */
static void ep_not_allowed(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                           const char *arg)
{
    (void)rq;
    (void)ctx;
    coordinator_reply_not_allowed(out, arg);
}

typedef int (*parse_fn)(char *text, size_t len, coordinator_event_request *out, char *why,
                        size_t whylen);

/* Parses the body in place with parse and ingests it as one transaction;
 * false when the reply (422 or 503) is already written. */
static bool ingest_body(lmc_coord *co, const lmc_http_request *rq, lmc_http_reply *out,
                        parse_fn parse, coordinator_event_request *r, coordinator_ingest_result *res)
{
    if (!rq->body)
        return coordinator_reply_detail(out, 422, "a JSON object body is required"), false;
    char why[512];
    int parsed = parse(rq->body, rq->body_len, r, why, sizeof why);
    if (parsed != 0) /* out of memory is ours, not the body's: the sender tries again */
        return coordinator_reply_detail(out, parsed == -2 ? 503 : 422, "%s", why), false;
    pthread_mutex_lock(&co->mu);
    uint64_t refused = co->st.keys.refused;
    int rc = coordinator_events_ingest(&co->st, co->db, r, res, why, sizeof why);
    if (co->st.keys.refused != refused)
        coordinator_warn_keys_full(co);
    if (rc == -2)
        warn_not_saved(co);
    pthread_mutex_unlock(&co->mu);
    if (rc != 0)
        coordinator_reply_detail(out, 503, "%s", why);
    return rc == 0;
}

/* POST /events: the body is scanned in place (lmc_http_request.body). */
void coordinator_ep_events(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                           const char *arg)
{
    (void)arg;
    coordinator_event_request r;
    coordinator_ingest_result res;
    memset(&r, 0, sizeof r);
    if (ingest_body(ctx, rq, out, coordinator_events_parse_in_place, &r, &res)) {
        coordinator_blend_feed(ctx, &r);
        lmc_http_reply_json(out, 200, json_pack("{s:I, s:I, s:I}", "applied",
                                                (json_int_t)res.applied, "duplicates",
                                                (json_int_t)res.duplicates, "stale",
                                                (json_int_t)res.stale));
    }
    coordinator_events_request_free(&r);
}

/* POST /l2/events, the older L2 usage stream (docs/coordinator.md, "L2
 * usage events"): {"recorded": the events applied}. */
static void ep_l2_events(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                         const char *arg)
{
    (void)arg;
    coordinator_event_request r;
    coordinator_ingest_result res;
    memset(&r, 0, sizeof r);
    if (ingest_body(ctx, rq, out, coordinator_l2_usage_parse_in_place, &r, &res))
        lmc_http_reply_json(out, 200, json_pack("{s:I}", "recorded", (json_int_t)r.pool_n));
    coordinator_events_request_free(&r);
}

static void ep_healthcheck(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                           const char *arg)
{
    lmc_coord *co = ctx;
    (void)rq;
    (void)arg;
    pthread_mutex_lock(&co->mu);
    size_t n = co->n_members;
    pthread_mutex_unlock(&co->mu);
    lmc_http_reply_json(out, 200, json_pack("{s:s, s:I}", "status", "healthy", "instances",
                                            (json_int_t)n));
}

/* Access: reads (GET, and HEAD with it) are open, except those that name
 * tenants' salts or keys (the quotas, /directory/keys), which need the
 * token as every other method does when one is configured, as lmcached
 * guards its own GET /quota (docs/coordinator.md, "Authentication").  Bodies: the routes that carry
 * key or token lists (BULK) take COORD_MAX_BODY, the others
 * COORD_MAX_SMALL_BODY (docs/coordinator.md, "Bounds"). */
#define OPEN LMC_HTTP_OPEN
#define TOKEN LMC_HTTP_TOKEN
#define SMALL LMC_HTTP_BODY_JSON
#define BULK LMC_HTTP_BODY_BULK
#define ANY LMC_HTTP_READY_ANY

static const lmc_http_route coordinator_rows[] = {
    {"GET", "/healthcheck", false, OPEN, SMALL, ANY, ep_healthcheck, NULL},
    {"GET", "/metrics", false, OPEN, SMALL, ANY, coordinator_ep_metrics, NULL},
    /* as lmcached answers them (docs/http.md) */
    {"GET", "/version", false, OPEN, SMALL, ANY, lmc_http_ep_version, "both"},
    {"GET", "/lmc_version", false, OPEN, SMALL, ANY, lmc_http_ep_version, "version"},
    {"GET", "/commit_id", false, OPEN, SMALL, ANY, lmc_http_ep_version, "commit"},
    {"POST", "/instances", false, TOKEN, SMALL, ANY, coordinator_ep_register, NULL},
    {"GET", "/instances", false, OPEN, SMALL, ANY, coordinator_ep_instances, NULL},
    {"PUT", "/instances/", true, TOKEN, SMALL, ANY, coordinator_ep_heartbeat, "/instances/"},
    {"DELETE", "/instances/", true, TOKEN, SMALL, ANY, coordinator_ep_deregister,
     "/instances/"},
    {"POST", "/events", false, TOKEN, BULK, ANY, coordinator_ep_events, NULL},
    {"POST", "/l2/events", false, TOKEN, BULK, ANY, ep_l2_events, NULL},
    {"GET", "/quota/config", false, TOKEN, SMALL, ANY, coordinator_ep_quota_config, NULL},
    {"PUT", "/quota/config", false, TOKEN, SMALL, ANY, coordinator_ep_quota_config, NULL},
    /* not the quota of a salt named "config" */
    {"DELETE", "/quota/config", false, TOKEN, SMALL, ANY, ep_not_allowed, "GET, PUT"},
    {"GET", "/quota", false, TOKEN, SMALL, ANY, coordinator_ep_quota_all, NULL},
    {"GET", "/quota/", true, TOKEN, SMALL, ANY, coordinator_ep_quota_salt, "/quota/"},
    {"PUT", "/quota/", true, TOKEN, SMALL, ANY, coordinator_ep_quota_salt, "/quota/"},
    {"DELETE", "/quota/", true, TOKEN, SMALL, ANY, coordinator_ep_quota_salt, "/quota/"},
    {"POST", "/cache/pins", false, TOKEN, BULK, ANY, coordinator_ep_pins, NULL},
    {"DELETE", "/cache/pins", false, TOKEN, BULK, ANY, coordinator_ep_pins, NULL},
    {"POST", "/cache/prefetches", false, TOKEN, BULK, ANY, coordinator_ep_prefetch, NULL},
    {"GET", "/cache/prefetches/", true, OPEN, SMALL, ANY, coordinator_ep_prefetch_status,
     "/cache/prefetches/"},
    {"POST", "/directory/lookup", false, TOKEN, BULK, ANY, coordinator_ep_dir_lookup, NULL},
    {"GET", "/directory/keys", false, TOKEN, SMALL, ANY, coordinator_ep_dir_keys, NULL},
    {"GET", "/directory/stats", false, OPEN, SMALL, ANY, coordinator_ep_dir_stats, NULL},
    /* CacheBlend: the fleet fragment index; the older /blend/... directory 501 */
    {"POST", "/directory/blend-lookup", false, TOKEN, BULK, ANY, coordinator_ep_blend_lookup,
     NULL},
    {"*", "/directory/blend-lookup", false, TOKEN, SMALL, ANY, ep_not_allowed, "POST"},
    {"GET", "/blend/", true, OPEN, SMALL, ANY, coordinator_ep_blend_legacy, NULL},
    {"*", "/blend/", true, TOKEN, SMALL, ANY, coordinator_ep_blend_legacy, NULL},
};

int coordinator_routes_add(lmc_http_routes *t, lmc_coord *co)
{
    return lmc_http_routes_add(t, coordinator_rows,
                               sizeof coordinator_rows / sizeof coordinator_rows[0], co);
}
