#include "fleet/fleet.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fleet/fleet_internal.h"
#include "obs/log.h"

/* ---- helpers shared by the threads ------------------------------------- */

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double lmc_fleet_wall_now(void) { return clock_s(CLOCK_REALTIME); }
double lmc_fleet_mono_now(void) { return clock_s(CLOCK_MONOTONIC); }

bool lmc_fleet_sleep(lmc_fleet *c, double seconds)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = floor(seconds);
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((seconds - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    while (!atomic_load(&c->stop) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&c->wake, &c->mu, &deadline);
    pthread_mutex_unlock(&c->mu);
    return !atomic_load(&c->stop);
}

bool lmc_fleet_warn_due(warn_limiter *w)
{
    double now = lmc_fleet_mono_now();
    if (w->streak++ == 0 || now - w->last_warn >= COORD_WARN_EVERY_S) {
        w->last_warn = now;
        return true;
    }
    return false;
}

uint64_t lmc_fleet_warn_reset(warn_limiter *w)
{
    uint64_t streak = w->streak;
    w->streak = 0;
    return streak;
}

void lmc_fleet_describe_failure(const char *what, const lmc_fleet_reply *r, char *buf, size_t len)
{
    if (r->status == 0)
        snprintf(buf, len, "%s: %s", what, r->error[0] ? r->error : "no reply");
    else if (r->status == 401) /* the operator's fix, not only the code */
        snprintf(buf, len, "%s: HTTP 401: the coordinator wants its bearer token; give this "
                           "server the coordinator's LMCACHE_MP_COORDINATOR_AUTH_TOKEN with "
                           "--coordinator-auth-token (docs/fleet.md)", what);
    else
        snprintf(buf, len, "%s: HTTP %ld", what, r->status);
}

/* ---- start and stop ------------------------------------------------------ */

/* The URL without a trailing '/', and a copy without user:password. */
static void set_urls(lmc_fleet *c, const char *url)
{
    snprintf(c->url, sizeof c->url, "%s", url);
    size_t n = strlen(c->url);
    while (n > 0 && c->url[n - 1] == '/')
        c->url[--n] = '\0';
    snprintf(c->shown_url, sizeof c->shown_url, "%s", c->url);
    CURLU *u = curl_url();
    char *clean = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, c->url, CURLU_GUESS_SCHEME) == CURLUE_OK &&
        curl_url_set(u, CURLUPART_USER, NULL, 0) == CURLUE_OK &&
        curl_url_set(u, CURLUPART_PASSWORD, NULL, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_URL, &clean, 0) == CURLUE_OK) {
        snprintf(c->shown_url, sizeof c->shown_url, "%s", clean);
        n = strlen(c->shown_url);
        while (n > 0 && c->shown_url[n - 1] == '/')
            c->shown_url[--n] = '\0';
    }
    curl_free(clean);
    curl_url_cleanup(u);
}

static void pick_l1_backend(lmc_fleet *c)
{
    snprintf(c->l1_backend, sizeof c->l1_backend, "dram");
    if (!c->sm)
        return;
    json_t *st = lmc_storage_manager_report_status(c->sm);
    void *it = json_object_iter(json_object_get(st, "l1_capacity_bytes_by_backend"));
    if (it)
        snprintf(c->l1_backend, sizeof c->l1_backend, "%s", json_object_iter_key(it));
    json_decref(st);
}

static lmc_fleet *fleet_new(const lmc_config *cfg, int http_port, lmc_storage_manager *sm,
                            const lmc_fleet_tap *tap)
{
    const lmc_coordinator_config *cc = &cfg->coordinator;
    lmc_fleet *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->posting = cc->url && cc->url[0];
    if (tap)
        c->tap = *tap;
    if (c->posting)
        set_urls(c, cc->url);
    snprintf(c->configured_id, sizeof c->configured_id, "%s", cfg->mp.instance_id);
    snprintf(c->advertise_ip_opt, sizeof c->advertise_ip_opt, "%s",
             cc->advertise_ip ? cc->advertise_ip : "");
    c->http_port = http_port;
    c->heartbeat_interval = cc->heartbeat_interval;
    c->event_interval = cc->event_flush_interval;
    c->l2_interval = cc->l2_event_flush_interval;
    c->incarnation = (int64_t)time(NULL);
    c->sm = sm;
    c->l2_usage_on = c->posting && cc->l2_event_reporting && sm;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->l2_mu, NULL);
    pthread_mutex_init(&c->p2p_mu, NULL);
    if (c->posting && cfg->p2p.advertise_url && cfg->p2p.advertise_url[0]) {
        snprintf(c->p2p_url, sizeof c->p2p_url, "%s", cfg->p2p.advertise_url);
        c->mq_port = cfg->mp.port;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->wake, &ca);
    pthread_condattr_destroy(&ca);
    pick_l1_backend(c);
    bool ok = !cc->auth_token || (c->auth_token = strdup(cc->auth_token));
    if (ok && ((c->posting && cc->event_reporting) || c->tap.fn) && sm)
        ok = (c->events = lmc_fleet_event_batcher_new(c->configured_id, c->incarnation,
                                              COORD_EVENT_RING)) != NULL;
    if (ok && c->p2p_url[0])
        ok = (c->peers = calloc(COORD_P2P_PEERS_MAX, sizeof *c->peers)) != NULL;
    if (ok && c->l2_usage_on)
        ok = (c->l2_buf = malloc(COORD_L2_USAGE_MAX * sizeof *c->l2_buf)) != NULL;
    if (!ok) {
        lmc_fleet_free(c);
        return NULL;
    }
    return c;
}

/* The events trace's lifecycle marks (docs/trace.md, "The events level"). */
static void tap_lifecycle(lmc_fleet *c, bool start)
{
    if (!c->tap.fn)
        return;
    json_t *args = start ? json_pack("{s:s, s:s, s:I, s:s, s:i, s:i}", "phase", "start",
                                     "instance_id", c->configured_id, "incarnation",
                                     (json_int_t)c->incarnation, "ip", c->advertise_ip_opt,
                                     "http_port", c->http_port, "mq_port", c->mq_port)
                         : json_pack("{s:s, s:s}", "phase", "stop", "instance_id",
                                     c->configured_id);
    if (args)
        c->tap.fn(c->tap.user, LMC_FLEET_TAP_LIFECYCLE, args);
    json_decref(args);
}

lmc_fleet *lmc_fleet_start(const lmc_config *cfg, int http_port, lmc_storage_manager *sm,
                           const lmc_fleet_tap *tap)
{
    bool url = cfg->coordinator.url && cfg->coordinator.url[0];
    if (!url && !(tap && tap->fn && sm))
        return NULL;
    lmc_fleet *c = fleet_new(cfg, http_port, sm, tap);
    if (!c) {
        LMC_ERROR("coordinator: out of memory; this server does not register");
        return NULL;
    }
    tap_lifecycle(c, true);
    lmc_fleet_declare_capacity(c);
    if (lmc_fleet_attach_sources(c) != 0)
        LMC_WARN("coordinator: too many storage listeners; L1 events are not reported");
    if (c->events && !c->posting)
        c->reporter_running = pthread_create(&c->reporter, NULL, lmc_fleet_reporter_main, c) == 0;
    if (!c->posting) {
        LMC_INFO("cache events: recorded into the events trace, not posted (no coordinator)");
        return c;
    }
    c->registrar_running = pthread_create(&c->registrar, NULL, lmc_fleet_registrar_main, c) == 0;
    if (c->events || c->l2_usage_on)
        c->reporter_running = pthread_create(&c->reporter, NULL, lmc_fleet_reporter_main, c) == 0;
    if (c->p2p_url[0])
        c->discovery_running =
            pthread_create(&c->discovery, NULL, lmc_fleet_discovery_main, c) == 0;
    if (!c->registrar_running || (c->p2p_url[0] && !c->discovery_running))
        LMC_ERROR("coordinator: cannot start the registrar or P2P discovery thread");
    LMC_INFO("coordinator %s: registering every %.3g s%s%s", c->shown_url,
             c->heartbeat_interval, c->events ? ", cache events on" : "",
             c->l2_usage_on ? ", L2 usage events on" : "");
    return c;
}

void lmc_fleet_stop(lmc_fleet *c)
{
    if (!c || c->stopped)
        return;
    pthread_mutex_lock(&c->mu);
    atomic_store(&c->stop, true);
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->mu);
    /* The reporter's last flush and the registrar's DELETE run at once. */
    if (c->registrar_running)
        pthread_join(c->registrar, NULL);
    lmc_fleet_deregister(c);
    if (c->reporter_running)
        pthread_join(c->reporter, NULL);
    if (c->discovery_running)
        pthread_join(c->discovery, NULL);
    c->registrar_running = c->reporter_running = c->discovery_running = false;
    c->stopped = true;
    tap_lifecycle(c, false);   /* after the reporter's last flush: no batch follows */
    /* Nothing reports any more.  A listener call already under way may
     * still land in the buffer: `c` lives until lmc_fleet_free, after the
     * storage manager is closed. */
    lmc_fleet_detach_sources(c);
}

void lmc_fleet_free(lmc_fleet *c)
{
    if (!c)
        return;
    lmc_fleet_stop(c);   /* a no-op after the server's stop: never touches a closed storage */
    lmc_fleet_event_batcher_free(c->events);
    if (c->l2_buf)
        fleet_drop_l2_events(c->l2_buf, c->l2_n);
    free(c->l2_buf);
    free(c->peers);
    if (c->auth_token) {
        memset(c->auth_token, 0, strlen(c->auth_token));
        free(c->auth_token);
    }
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->l2_mu);
    pthread_mutex_destroy(&c->p2p_mu);
    free(c);
}

/* ---- status and metrics ------------------------------------------------- */

static json_t *events_status(lmc_fleet *c)
{
    if (!c->events)
        return json_pack("{s:b}", "enabled", false);
    lmc_fleet_event_stats st = lmc_fleet_event_batcher_stats(c->events);
    return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:I, s:I, "
                     "s:b}", "enabled", true, "seq", (json_int_t)st.seq, "batches_sent",
                     (json_int_t)st.batches_sent, "batches_dropped",
                     (json_int_t)st.batches_dropped, "entries_sent", (json_int_t)st.entries_sent,
                     "entries_dropped", (json_int_t)st.entries_dropped, "entries_overflowed",
                     (json_int_t)st.entries_overflowed, "entries_unencodable",
                     (json_int_t)st.entries_unencodable, "posts_ok", (json_int_t)st.posts_ok,
                     "posts_failed", (json_int_t)st.posts_failed, "posts_retried",
                     (json_int_t)st.posts_retried, "retry_pending", st.retry_pending, "queued",
                     (json_int_t)st.queued, "capacity_revision",
                     (json_int_t)st.capacity_revision, "capacity_pending", st.capacity_pending);
}

static json_t *l2_usage_status(lmc_fleet *c)
{
    pthread_mutex_lock(&c->l2_mu);
    json_t *o = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I}", "enabled", c->l2_usage_on, "seq",
                          (json_int_t)c->l2_seq, "batches_sent", (json_int_t)c->l2_batches_sent,
                          "batches_dropped", (json_int_t)c->l2_batches_dropped,
                          "events_dropped", (json_int_t)c->l2_events_dropped, "queued",
                          (json_int_t)c->l2_n);
    pthread_mutex_unlock(&c->l2_mu);
    return o;
}

json_t *lmc_fleet_status(lmc_fleet *c)
{
    json_t *events = events_status(c);
    lmc_fleet_event_stats st = c->events ? lmc_fleet_event_batcher_stats(c->events) : (lmc_fleet_event_stats){0};
    pthread_mutex_lock(&c->mu);
    json_t *o = json_pack(
        "{s:s, s:b, s:s?, s:s, s:I, s:s, s:i, s:f, s:o, s:s?, s:I, s:I, s:I, s:I, s:I, s:I, "
        "s:I, s:I}",
        "url", c->shown_url, "registered", c->held_id[0] != '\0', "instance_id",
        c->held_id[0] ? c->held_id : NULL, "configured_instance_id", c->configured_id,
        "incarnation", (json_int_t)c->incarnation, "advertise_ip", c->advertise_ip, "http_port",
        c->http_port, "heartbeat_interval", c->heartbeat_interval, "last_heartbeat",
        c->last_heartbeat > 0 ? json_real(c->last_heartbeat) : json_null(), "last_error",
        c->last_error[0] ? c->last_error : NULL, "registrations",
        (json_int_t)c->registrations, "heartbeats", (json_int_t)c->heartbeats_ok,
        "request_failures", (json_int_t)c->request_failures, "seq", (json_int_t)st.seq,
        "batches_sent", (json_int_t)st.batches_sent, "batches_dropped",
        (json_int_t)st.batches_dropped, "entries_dropped", (json_int_t)st.entries_dropped,
        "deregistrations", (json_int_t)c->deregistrations);
    pthread_mutex_unlock(&c->mu);
    if (o) {
        json_object_set_new(o, "events", events ? events : json_null());
        json_object_set_new(o, "l2_usage_events", l2_usage_status(c));
    } else {
        json_decref(events);
    }
    return o;
}

typedef struct {
    const char *key;             /* in the status object; "events.x" one level down */
    bool counter;
    const char *name, *help;
} fleet_metric;

static const fleet_metric fleet_metrics[] = {
    {"registered", false, "lmcache_mp_coordinator_registered",
     "1 while the coordinator holds this server's registration"},
    {"registrations", true, "lmcache_mp_coordinator_registrations_total",
     "Successful POST /instances"},
    {"heartbeats", true, "lmcache_mp_coordinator_heartbeats_total", "Heartbeats answered 2xx"},
    {"request_failures", true, "lmcache_mp_coordinator_request_failures_total",
     "Registrations and heartbeats that failed (network, non-2xx except 404, bad reply)"},
    {"seq", false, "lmcache_mp_coordinator_event_seq", "Last cache-event batch seq handed out"},
    {"batches_sent", true, "lmcache_mp_coordinator_event_batches_sent_total",
     "Cache-event batches the coordinator accepted"},
    {"batches_dropped", true, "lmcache_mp_coordinator_event_batches_dropped_total",
     "Cache-event placement batches dropped: refused (4xx) or failing past the retry window (seq gaps)"},
    {"entries_dropped", true, "lmcache_mp_coordinator_event_entries_dropped_total",
     "Cache-event entries lost: failed posts and a full buffer"},
    {"events.entries_overflowed", true, "lmcache_mp_coordinator_event_entries_overflowed_total",
     "Cache-event entries pushed out of the full buffer (the coordinator was slow)"},
    {"events.entries_unencodable", true,
     "lmcache_mp_coordinator_event_entries_unencodable_total",
     "Cache-event entries left out of their post: not encodable as JSON (a name not UTF-8)"},
    {"events.posts_retried", true, "lmcache_mp_coordinator_event_posts_retried_total",
     "Failed POST /events sent again unchanged (no answer or a 5xx such as 503)"},
    {"events.retry_pending", false, "lmcache_mp_coordinator_event_retry_pending",
     "1 while a failed POST /events is held to be sent again"},
    {"l2_usage_events.batches_sent", true, "lmcache_mp_coordinator_l2_event_batches_sent_total",
     "L2 usage batches the coordinator accepted (POST /l2/events)"},
    {"l2_usage_events.events_dropped", true, "lmcache_mp_coordinator_l2_events_dropped_total",
     "L2 usage events lost: failed posts and a full buffer"},
};

void lmc_fleet_collect_metrics(lmc_metrics *r, void *user)
{
    json_t *st = lmc_fleet_status(user);
    for (size_t i = 0; i < sizeof fleet_metrics / sizeof fleet_metrics[0]; i++) {
        const fleet_metric *m = &fleet_metrics[i];
        lmc_metric *family = m->counter ? lmc_metrics_counter(r, m->name, m->help, NULL)
                                        : lmc_metrics_gauge(r, m->name, m->help, NULL);
        const char *dot = strchr(m->key, '.');
        const json_t *v = st;
        if (dot) {
            char outer[32];
            snprintf(outer, sizeof outer, "%.*s", (int)(dot - m->key), m->key);
            v = json_object_get(json_object_get(st, outer), dot + 1);
        } else {
            v = json_object_get(st, m->key);
        }
        if (family && (json_is_number(v) || json_is_boolean(v)))
            lmc_metric_set(family, NULL, json_is_boolean(v) ? json_is_true(v) : json_number_value(v));
    }
    json_decref(st);
}
