/* GET /metrics: Prometheus text (docs/coordinator.md, "Metrics"), 404
 * when LMCACHE_MP_COORDINATOR_METRICS_ENABLED is false. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_internal.h"
#include "core/grow.h"

typedef struct {
    char *buf;
    size_t len, cap;
    bool failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->buf && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        if (lmc_grow_array(&t->buf, &t->cap, t->len + (size_t)n + 1, 1, 4096) != 0) {
            t->failed = true;
            return;
        }
    }
}

static void family(text *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP lmcache_mp_%s %s\n# TYPE lmcache_mp_%s %s\n", name, help, name, type);
}

static void counter(text *t, const char *name, const char *help, unsigned long long v)
{
    family(t, name, "counter", help);
    put(t, "lmcache_mp_%s %llu\n", name, v);
}

/* Prometheus label values escape \ " and newline. */
static void label_value(text *t, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            put(t, "\\%c", *s);
        else if (*s == '\n')
            put(t, "\\n");
        else
            put(t, "%c", *s);
    }
}

static void state_metrics(text *t, const lmc_coord *co)
{
    const coordinator_state *s = &co->st;
    family(t, "key_directory_placement_count", "gauge", "placements in the key directory");
    put(t, "lmcache_mp_key_directory_placement_count{tier=\"l1\"} %llu\n"
           "lmcache_mp_key_directory_placement_count{tier=\"l2\"} %llu\n",
        (unsigned long long)s->l1_entries, (unsigned long long)s->l2_entries);
    family(t, "key_directory_placement_size_bytes", "gauge", "bytes of the placements");
    put(t, "lmcache_mp_key_directory_placement_size_bytes{tier=\"l1\"} %llu\n"
           "lmcache_mp_key_directory_placement_size_bytes{tier=\"l2\"} %llu\n",
        (unsigned long long)s->l1_bytes, (unsigned long long)s->l2_bytes);
    family(t, "coordinator_l2_usage_bytes", "gauge", "L2 bytes per cache salt");
    for (uint32_t i = 0; i < s->salts.n && i < s->salt_cap; i++) {
        if (!s->salt[i].l2_count && !s->salt[i].has_quota)
            continue;
        put(t, "lmcache_mp_coordinator_l2_usage_bytes{cache_salt=\"");
        label_value(t, coordinator_names_str(&s->salts, i));
        put(t, "\"} %llu\n", (unsigned long long)s->salt[i].l2_bytes);
    }
    family(t, "coordinator_instances", "gauge", "registered instances");
    put(t, "lmcache_mp_coordinator_instances %zu\n", co->n_members);
    family(t, "coordinator_keys_tracked", "gauge", "keys the coordinator holds facts about");
    put(t, "lmcache_mp_coordinator_keys_tracked %u\n", s->keys.n_live);
    family(t, "coordinator_keys_max", "gauge", "the key directory's bound (MAX_KEYS)");
    put(t, "lmcache_mp_coordinator_keys_max %u\n", s->keys.max_live);
    counter(t, "coordinator_keys_refused_total", "new keys not recorded: the directory was full",
            s->keys.refused);
    counter(t, "coordinator_events_applied_total", "event batches applied", s->ingest.applied);
    counter(t, "coordinator_events_duplicates_total", "event batches dropped as duplicates",
            s->ingest.duplicates);
    counter(t, "coordinator_events_stale_total", "event batches of an older incarnation",
            s->ingest.stale);
    counter(t, "coordinator_events_gaps_total", "batches that followed missing ones",
            s->ingest.gaps);
    counter(t, "coordinator_event_entries_applied_total", "entries of applied batches",
            s->ingest.entries_applied);
    counter(t, "coordinator_fences_total", "instance streams fenced (restart, expiry, removal)",
            s->ingest.fenced);
}

static void http_metrics(text *t, lmc_coord *co)
{
    const coordinator_counters *c = &co->ctr;
    counter(t, "coordinator_http_rejected_total", "requests answered 4xx", c->requests_rejected);
    counter(t, "coordinator_http_auth_rejected_total", "requests without the bearer token",
            c->auth_rejected);
    counter(t, "coordinator_http_too_large_total",
            "request bodies refused 413: over the route's limit or the whole budget",
            c->bodies_too_large);
    counter(t, "coordinator_http_busy_total",
            "request bodies refused 503: the bodies held at once filled MAX_BUFFERED_MB",
            c->bodies_over_budget);
    family(t, "coordinator_http_buffered_bytes", "gauge",
           "bytes of request bodies held now, all connections");
    put(t, "lmcache_mp_coordinator_http_buffered_bytes %zu\n", atomic_load(&co->buffered));
}

static void loop_metrics(text *t, const coordinator_counters *c)
{
    counter(t, "coordinator_health_sweeps_total", "stale-instance sweeps", c->sweeps);
    counter(t, "coordinator_instances_expired_total", "instances removed for lack of heartbeats",
            c->instances_expired);
    counter(t, "coordinator_eviction_passes_total", "fleet eviction passes", c->eviction_passes);
    counter(t, "coordinator_eviction_keys_requested_total", "keys sent for deletion",
            c->eviction_keys_requested);
    counter(t, "coordinator_eviction_requests_total", "DELETE /cache/objects calls",
            c->eviction_requests);
    counter(t, "coordinator_eviction_request_failures_total", "of which failed",
            c->eviction_request_failures);
    counter(t, "coordinator_resync_keys_total", "L2 keys backfilled by the startup resync",
            c->resync_keys);
}

void coordinator_ep_metrics(lmc_coord *co, const coordinator_request *rq, coordinator_reply *out)
{
    (void)rq;
    if (!co->cfg.metrics_enabled)
        return coordinator_reply_detail(out, 404, "Not Found");
    text t = {0};
    pthread_mutex_lock(&co->mu);
    state_metrics(&t, co);
    pthread_mutex_unlock(&co->mu);
    loop_metrics(&t, &co->ctr);
    http_metrics(&t, co);
    if (t.failed) {
        free(t.buf);
        return coordinator_reply_detail(out, 500, "out of memory");
    }
    out->status = 200;
    out->text = t.buf;
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
