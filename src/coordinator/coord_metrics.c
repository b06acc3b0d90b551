/* GET /metrics (docs/coordinator.md, "Metrics"): the coordinator's families
 * in an obs/metrics registry, refreshed from its state and counters at
 * scrape time, rendered as lmcached renders its own; 404 when
 * LMCACHE_MP_COORDINATOR_METRICS_ENABLED is false. */
#include <stddef.h>
#include <stdlib.h>

#include "coordinator/coord_blend.h"
#include "coordinator/coord_internal.h"

/* One family: where its value comes from, read at scrape time. */
typedef enum { FROM_STATE, FROM_COUNTER, FROM_MEMBERS, FROM_HTTP, FROM_BUFFERED, FROM_BLEND } source;
typedef struct {
    const char *name, *help;
    lmc_metric_type type;
    source from;
    size_t offset;  /* into coordinator_state (a uint32_t/uint64_t), coordinator_counters
                     * or lmc_http_figures (a uint64_t) */
    bool wide;      /* the state field is a uint64_t */
} family;

#define STATE32(f) FROM_STATE, offsetof(coordinator_state, f), false
#define STATE64(f) FROM_STATE, offsetof(coordinator_state, f), true
#define COUNTER(f) FROM_COUNTER, offsetof(coordinator_counters, f), true
/* The blend index's own figures (0 when it is off). */
#define BLEND(f) FROM_BLEND, offsetof(coordinator_blend_stats, f), true
/* The HTTP server core counts its answers and refusals itself. */
#define HTTP(f) FROM_HTTP, offsetof(lmc_http_figures, f), true
static const family FAMILIES[] = {
    {"lmcache_mp_coordinator_instances", "registered instances", LMC_METRIC_GAUGE, FROM_MEMBERS, 0, false},
    {"lmcache_mp_coordinator_keys_tracked", "keys the coordinator holds facts about", LMC_METRIC_GAUGE, STATE32(keys.n_live)},
    {"lmcache_mp_coordinator_keys_max", "the key directory's bound (MAX_KEYS)", LMC_METRIC_GAUGE, STATE32(keys.max_live)},
    {"lmcache_mp_coordinator_keys_refused_total", "new keys not recorded: the directory was full", LMC_METRIC_COUNTER, STATE64(keys.refused)},
    {"lmcache_mp_coordinator_blend_chunks", "chunks in the blend index (ENABLE_BLEND_LOOKUP)", LMC_METRIC_GAUGE, BLEND(chunks)},
    {"lmcache_mp_coordinator_blend_refused_total", "stored chunks not indexed: the blend index was full (MAX_BLEND_CHUNKS)", LMC_METRIC_COUNTER, BLEND(refused)},
    {"lmcache_mp_coordinator_events_applied_total", "event batches applied", LMC_METRIC_COUNTER, STATE64(ingest.applied)},
    {"lmcache_mp_coordinator_events_duplicates_total", "event batches dropped as duplicates", LMC_METRIC_COUNTER, STATE64(ingest.duplicates)},
    {"lmcache_mp_coordinator_events_stale_total", "event batches of an older incarnation", LMC_METRIC_COUNTER, STATE64(ingest.stale)},
    {"lmcache_mp_coordinator_events_gaps_total", "batches that followed missing ones", LMC_METRIC_COUNTER, STATE64(ingest.gaps)},
    {"lmcache_mp_coordinator_event_entries_applied_total", "entries of applied batches", LMC_METRIC_COUNTER, STATE64(ingest.entries_applied)},
    {"lmcache_mp_coordinator_l2_usage_posts_total", "POST /l2/events requests applied (the older L2 usage stream)", LMC_METRIC_COUNTER, STATE64(ingest.l2_usage_posts)},
    {"lmcache_mp_coordinator_l2_usage_events_total", "store and lookup events of the L2 usage stream applied", LMC_METRIC_COUNTER, STATE64(ingest.l2_usage_events)},
    {"lmcache_mp_coordinator_fences_total", "instance streams fenced (restart, expiry, removal)", LMC_METRIC_COUNTER, STATE64(ingest.fenced)},
    {"lmcache_mp_coordinator_health_sweeps_total", "stale-instance sweeps", LMC_METRIC_COUNTER, COUNTER(sweeps)},
    {"lmcache_mp_coordinator_instances_expired_total", "instances removed for lack of heartbeats", LMC_METRIC_COUNTER, COUNTER(instances_expired)},
    {"lmcache_mp_coordinator_eviction_passes_total", "fleet eviction passes", LMC_METRIC_COUNTER, COUNTER(eviction_passes)},
    {"lmcache_mp_coordinator_eviction_keys_requested_total", "keys sent for deletion", LMC_METRIC_COUNTER, COUNTER(eviction_keys_requested)},
    {"lmcache_mp_coordinator_eviction_requests_total", "DELETE /cache/objects calls", LMC_METRIC_COUNTER, COUNTER(eviction_requests)},
    {"lmcache_mp_coordinator_eviction_request_failures_total", "of which failed", LMC_METRIC_COUNTER, COUNTER(eviction_request_failures)},
    {"lmcache_mp_coordinator_resync_keys_total", "L2 keys backfilled by the startup resync", LMC_METRIC_COUNTER, COUNTER(resync_keys)},
    {"lmcache_mp_coordinator_http_rejected_total", "requests answered 4xx", LMC_METRIC_COUNTER, HTTP(answered_4xx)},
    {"lmcache_mp_coordinator_http_auth_rejected_total", "requests without the bearer token", LMC_METRIC_COUNTER, HTTP(auth_rejected)},
    {"lmcache_mp_coordinator_http_too_large_total", "request bodies refused 413: over the route's limit or the whole budget", LMC_METRIC_COUNTER, HTTP(refused_too_large)},
    {"lmcache_mp_coordinator_http_busy_total", "request bodies refused 503: the bodies held at once filled MAX_BUFFERED_MB", LMC_METRIC_COUNTER, HTTP(refused_over_budget)},
    {"lmcache_mp_coordinator_http_buffered_bytes", "bytes of request bodies held now, all connections", LMC_METRIC_GAUGE, FROM_BUFFERED, 0, false},
};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

struct coordinator_metrics {
    lmc_metrics *registry;
    lmc_metric *placements, *placement_bytes, *l2_usage;  /* labelled */
    lmc_metric *plain[N_FAMILIES];
};

static double read_value(const lmc_coord *co, const lmc_http_figures *http,
                         const coordinator_blend_stats *blend, const family *f)
{
    switch (f->from) {
    case FROM_BLEND:
        return (double)*(const uint64_t *)((const char *)blend + f->offset);
    case FROM_MEMBERS:
        return (double)co->n_members;
    case FROM_BUFFERED:
        return (double)http->buffered_bytes;
    case FROM_HTTP:
        return (double)*(const uint64_t *)((const char *)http + f->offset);
    case FROM_COUNTER:
        return (double)atomic_load((const atomic_ullong *)((const char *)&co->ctr + f->offset));
    case FROM_STATE:
        break;
    }
    const char *at = (const char *)&co->st + f->offset;
    return f->wide ? (double)*(const uint64_t *)at : (double)*(const uint32_t *)at;
}

/* Runs at every render, before the registry writes the text. */
static void collect(lmc_metrics *r, void *user)
{
    (void)r;
    lmc_coord *co = user;
    coordinator_metrics *m = co->metrics;
    const coordinator_state *s = &co->st;
    pthread_mutex_lock(&co->mu);
    lmc_http_figures http = {0};
    if (co->http)
        lmc_http_server_figures(co->http, &http);
    coordinator_blend_stats blend = {0};
    if (co->blend) /* its lock after mu, the feed's order */
        blend = coordinator_blend_get_stats(co->blend);
    lmc_metric_set(m->placements, (const char *const[]){"l1"}, (double)s->l1_entries);
    lmc_metric_set(m->placements, (const char *const[]){"l2"}, (double)s->l2_entries);
    lmc_metric_set(m->placement_bytes, (const char *const[]){"l1"}, (double)s->l1_bytes);
    lmc_metric_set(m->placement_bytes, (const char *const[]){"l2"}, (double)s->l2_bytes);
    lmc_metric_clear(m->l2_usage);  /* salts without keys or a quota are left out */
    for (uint32_t i = 0; i < s->salts.n && i < s->salt_cap; i++) {
        if (s->salt[i].l2_count || s->salt[i].has_quota)
            lmc_metric_set(m->l2_usage, (const char *const[]){coordinator_names_str(&s->salts, i)},
                           (double)s->salt[i].l2_bytes);
    }
    for (size_t i = 0; i < N_FAMILIES; i++)
        lmc_metric_set(m->plain[i], NULL, read_value(co, &http, &blend, &FAMILIES[i]));
    pthread_mutex_unlock(&co->mu);
}

static lmc_metric *add_family(lmc_metrics *r, lmc_metric_type type, const char *name,
                              const char *help, const char *const *labels)
{
    return type == LMC_METRIC_COUNTER ? lmc_metrics_counter(r, name, help, labels)
                                      : lmc_metrics_gauge(r, name, help, labels);
}

int coordinator_metrics_new(lmc_coord *co)
{
    coordinator_metrics *m = calloc(1, sizeof *m);
    if (!m || !(m->registry = lmc_metrics_new()))
        goto fail;
    co->metrics = m;
    lmc_metrics *r = m->registry;
    m->placements = lmc_metrics_gauge(r, "lmcache_mp_key_directory_placement_count",
                                      "placements in the key directory", (const char *const[]){"tier", NULL});
    m->placement_bytes = lmc_metrics_gauge(r, "lmcache_mp_key_directory_placement_size_bytes",
                                           "bytes of the placements", (const char *const[]){"tier", NULL});
    m->l2_usage = lmc_metrics_gauge(r, "lmcache_mp_coordinator_l2_usage_bytes", "L2 bytes per cache salt",
                                    (const char *const[]){"cache_salt", NULL});
    bool ok = m->placements && m->placement_bytes && m->l2_usage;
    for (size_t i = 0; i < N_FAMILIES && ok; i++)
        ok = (m->plain[i] = add_family(r, FAMILIES[i].type, FAMILIES[i].name, FAMILIES[i].help, NULL));
    /* process_* as lmcached exports them (docs/metrics.md) */
    if (ok && lmc_metrics_add_collector(r, collect, co) == 0 &&
        lmc_metrics_add_process_collector(r) == 0)
        return 0;
fail:
    coordinator_metrics_free(m);
    co->metrics = NULL;
    return -1;
}

void coordinator_metrics_free(coordinator_metrics *m)
{
    if (!m)
        return;
    lmc_metrics_free(m->registry);
    free(m);
}

void coordinator_ep_metrics(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                            const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    (void)rq;
    if (!co->cfg.metrics_enabled || !co->metrics)
        return coordinator_reply_detail(out, 404, "Not Found");
    char *text = lmc_metrics_render(co->metrics->registry);
    if (!text)
        return coordinator_reply_detail(out, 500, "out of memory");
    lmc_http_reply_text(out, 200, LMC_METRICS_CONTENT_TYPE, text);
}
