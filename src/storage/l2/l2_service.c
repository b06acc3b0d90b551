/* Builds the L2 tier from the configuration, attaches it to the storage
 * manager (storage_tier.h) and answers the L2 calls of l2_service.h.
 *
 * Close order matters: stop the controllers' threads (prefetch answers
 * its pending requests with 0 hits), close the adapters (their workers are
 * joined, so nothing writes into L1 any more), then let the controllers
 * give back the L1 read locks and staging buffers they still hold. */
#include "storage/l2/l2_service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "obs/log.h"
#include "storage/l2/l2_eviction.h"
#include "storage/l2/l2_health.h"
#include "storage/l2/l2_internal.h"
#include "storage/storage_events.h"
#include "storage/storage_tier.h"

/* Per adapter: what its placement reports name (storage_events.h). */
typedef struct adapter_reporter {
    lmc_storage_manager *sm;
    const char *backend;           /* the adapter's type name */
    bool shared;
} adapter_reporter;

typedef struct l2_service {
    lmc_storage_manager *sm;
    lmc_l2_adapter **ad;
    bool *shared;                  /* per adapter: its JSON's "shared" (docs/l2.md) */
    adapter_reporter *reporters;   /* per adapter */
    size_t na;
    lmc_l2_store_ctl *store;
    lmc_l2_prefetch_ctl *prefetch;
    lmc_l2_eviction *eviction;
    lmc_l2_health *health;
    lmc_l2_backend *p2p_peers;     /* the last adapter's backend with P2P on, else NULL */
} l2_service;

static json_t *svc_status(void *impl)
{
    l2_service *s = impl;
    json_t *list = json_array();
    bool healthy = true;
    for (size_t a = 0; list && a < s->na; a++) {
        json_t *st = lmc_l2_adapter_status(s->ad[a]);
        if (st) {
            lmc_l2_health_annotate(s->health, a, st);
            json_object_set_new(st, "shared", json_boolean(s->shared[a]));
        }
        healthy = healthy && !json_is_false(json_object_get(st, "is_healthy"));
        json_array_append_new(list, st ? st : json_null());
    }
    return json_pack("{s:b, s:I, s:o, s:o, s:o, s:o}", "is_healthy", healthy,
                     "num_l2_adapters", (json_int_t)s->na, "l2_adapters",
                     list ? list : json_array(), "store_controller",
                     lmc_l2_store_ctl_status(s->store), "prefetch_controller",
                     lmc_l2_prefetch_ctl_status(s->prefetch), "l2_eviction_controller",
                     lmc_l2_eviction_status(s->eviction));
}

static void svc_close(void *impl)
{
    l2_service *s = impl;
    lmc_l2_health_free(s->health); /* its probes use the adapters */
    if (s->prefetch)
        lmc_l2_prefetch_ctl_stop(s->prefetch);
    if (s->store)
        lmc_l2_store_ctl_stop(s->store);
    lmc_l2_eviction_stop(s->eviction);
    for (size_t a = 0; a < s->na; a++)
        lmc_l2_adapter_close(s->ad[a]);
    lmc_l2_prefetch_ctl_free(s->prefetch);
    lmc_l2_store_ctl_free(s->store);
    lmc_l2_eviction_free(s->eviction);
    free(s->ad);
    free(s->shared);
    free(s->reporters);
    free(s);
}

static size_t svc_adapter_counts(void *impl, lmc_storage_l2_counts *out, size_t max)
{
    l2_service *s = impl;
    for (size_t a = 0; a < s->na && a < max; a++) {
        lmc_l2_adapter_counts(s->ad[a], &out[a]);
        lmc_l2_health_state h;
        lmc_l2_health_get(s->health, a, &h);
        out[a].healthy = h.healthy;
    }
    return s->na;
}

static const lmc_storage_tier_ops svc_ops = {
    .adapter_counts = svc_adapter_counts,
    .report_status = svc_status,
    .close = svc_close,
};

/* The tier attached to `sm` by lmc_l2_attach(), or NULL. */
static l2_service *service_of(const lmc_storage_manager *sm)
{
    return lmc_storage_manager_tier(sm, &svc_ops);
}

/* A p2p adapter proves the fleet's coordinator token to its peer's
 * channel (docs/p2p.md, "Trust model"): the service sets it on the parsed
 * copy, so that it never appears in the configuration's text. */
static void give_p2p_token(json_t *o, const char *token)
{
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!type || strcmp(type, "p2p") != 0)
        return;
    json_object_del(o, "auth_token");
    if (token && token[0])
        json_object_set_new(o, "auth_token", json_string(token));
}

static lmc_l2_adapter *adapter_from_text(const char *text, size_t i, uint8_t *base,
                                         const char *p2p_token, bool *shared, char *err,
                                         size_t errlen)
{
    json_error_t jerr;
    char why[512];
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (o)
        give_p2p_token(o, p2p_token);
    size_t workers = 1;
    lmc_l2_backend *be = o ? lmc_l2_backend_from_json(o, &workers, why, sizeof why) : NULL;
    *shared = json_is_true(json_object_get(o, "shared"));
    if (!o && json_error_code(&jerr) == json_error_out_of_memory)
        snprintf(why, sizeof why, "out of memory reading its JSON");
    else if (!o)
        snprintf(why, sizeof why, "invalid JSON (%s)", jerr.text);
    json_decref(o);
    lmc_l2_adapter *a = be ? lmc_l2_adapter_new(be, base, workers) : NULL;
    if (be && !a)
        snprintf(why, sizeof why, "cannot start its workers");
    if (!a)
        snprintf(err, errlen, "--l2-adapter[%zu]: %s", i, why);
    return a;
}

/* Adapters whose JSON has an "eviction" object get an eviction target. */
static int start_eviction(l2_service *s, const lmc_strlist *l)
{
    json_t **docs = calloc(s->na ? s->na : 1, sizeof *docs);
    const json_t **ev = calloc(s->na ? s->na : 1, sizeof *ev);
    int rc = docs && ev ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < l->count; i++) {  /* the p2p peers: no eviction */
        /* The text was validated at start: NULL here is memory, and an
         * adapter must not start without the eviction its JSON asked for. */
        docs[i] = json_loads(l->items[i], 0, NULL);
        ev[i] = json_object_get(docs[i], "eviction");
        rc = docs[i] ? 0 : -1;
    }
    if (rc == 0) {
        s->eviction = lmc_l2_eviction_new(s->ad, ev, s->na, lmc_storage_manager_quotas(s->sm),
                                          s->sm, 0);
        rc = s->eviction ? 0 : -1;
    }
    for (size_t i = 0; docs && i < l->count; i++)
        json_decref(docs[i]);
    free(docs);
    free(ev);
    return rc;
}

static void report_stored(void *user, const lmc_object_key *keys, const uint64_t *sizes,
                          size_t n)
{
    adapter_reporter *r = user;
    lmc_storage_manager_report_l2_placement(r->sm, LMC_PLACEMENT_STORED, r->backend, r->shared,
                                            keys, sizes, n);
}

/* A load that landed in L1 is the adapter's "access" of those keys. */
static void report_loaded(void *user, const lmc_object_key *keys, const uint8_t *ok, size_t n)
{
    adapter_reporter *r = user;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && ok[j])
            j++;
        lmc_storage_manager_report_l2_placement(r->sm, LMC_PLACEMENT_ACCESSED, r->backend,
                                                r->shared, keys + i, NULL, j - i);
        i = j + 1;
    }
}

static void report_deleted(void *user, const lmc_object_key *keys, size_t n)
{
    adapter_reporter *r = user;
    lmc_storage_manager_report_l2_placement(r->sm, LMC_PLACEMENT_DELETED, r->backend, r->shared,
                                            keys, NULL, n);
}

static void attach_reporters(l2_service *s)
{
    for (size_t a = 0; a < s->na; a++) {
        /* A peer's L1 is no L2 of ours: its 0-byte stores hold nothing
         * (docs/p2p.md, "Requesting side"), so nothing is placed there. */
        if (strcmp(lmc_l2_adapter_type(s->ad[a]), "p2p") == 0)
            continue;
        s->reporters[a] = (adapter_reporter){s->sm, lmc_l2_adapter_type(s->ad[a]), s->shared[a]};
        lmc_l2_observer obs = {.user = &s->reporters[a], .on_stored = report_stored,
                               .on_loaded = report_loaded, .on_deleted = report_deleted};
        lmc_l2_adapter_set_reporter(s->ad[a], &obs);
    }
}

static bool p2p_on(const lmc_config *cfg)
{
    return cfg->p2p.advertise_url && cfg->p2p.advertise_url[0];
}

/* With P2P on, the discovered peers are one more adapter, the last
 * (docs/p2p.md, "Requesting side"): lowest priority, after every L2 the
 * operator configured. */
static int add_p2p_peers(l2_service *s, const lmc_config *cfg, uint8_t *base, char *err,
                         size_t errlen)
{
    /* Every node of a fleet runs one engine: the peers serve ours
     * (docs/p2p.md, "Running the channel"). */
    bool ucx = strcmp(cfg->p2p.transfer_engine, "tcp") != 0;
    s->p2p_peers = lmc_l2_p2p_peers_new(cfg->p2p.lookup_timeout, cfg->p2p.load_timeout, ucx,
                                        cfg->coordinator.auth_token);
    lmc_l2_backend *be = s->p2p_peers;
    if (be && (s->ad[s->na] = lmc_l2_adapter_new(be, base, 2))) {
        s->na++;
        return 0;
    }
    s->p2p_peers = NULL;   /* lmc_l2_adapter_new destroyed it */
    return snprintf(err, errlen, "out of memory"), -1;
}

static int build(l2_service *s, const lmc_config *cfg, char *err, size_t errlen)
{
    const lmc_strlist *l = &cfg->storage.l2_adapter_json;
    uint8_t *base = lmc_storage_manager_l1_arena(s->sm)->base;
    size_t total = l->count + p2p_on(cfg);
    s->ad = calloc(total, sizeof *s->ad);
    s->shared = calloc(total, sizeof *s->shared);
    s->reporters = calloc(total ? total : 1, sizeof *s->reporters);
    if (!s->ad || !s->shared || !s->reporters)
        return snprintf(err, errlen, "out of memory"), -1;
    for (; s->na < l->count; s->na++)
        if (!(s->ad[s->na] = adapter_from_text(l->items[s->na], s->na, base,
                                               cfg->coordinator.auth_token,
                                               &s->shared[s->na], err, errlen)))
            return -1;
    if (p2p_on(cfg) && add_p2p_peers(s, cfg, base, err, errlen) != 0)
        return -1;
    attach_reporters(s);
    const lmc_storage_config *sc = &cfg->storage;
    if (!(s->health = lmc_l2_health_new(s->ad, s->na, sc->l2_health_interval_s)))
        return snprintf(err, errlen, "cannot start the L2 health probes"), -1;
    lmc_l2_prefetch_options po = {
        .retain = sc->l2_prefetch_policy && strcmp(sc->l2_prefetch_policy, "retain") == 0,
        .max_in_flight = (size_t)sc->l2_prefetch_max_in_flight,
        .load_timeout_s = sc->l2_prefetch_load_timeout.set ? sc->l2_prefetch_load_timeout.value
                                                           : 0,
    };
    if (start_eviction(s, l) != 0)
        return snprintf(err, errlen, "cannot start the L2 eviction controller"), -1;
    bool skip_l1 = sc->l2_store_policy && strcmp(sc->l2_store_policy, "skip_l1") == 0;
    s->store = lmc_l2_store_ctl_new(s->sm, s->ad, s->na, skip_l1);
    s->prefetch = lmc_l2_prefetch_ctl_new(s->sm, s->ad, s->na, &po);
    if (!s->store || !s->prefetch)
        return snprintf(err, errlen, "cannot start the L2 controllers"), -1;
    return 0;
}

int lmc_l2_attach(lmc_storage_manager *sm, const lmc_config *cfg, char *err, size_t errlen)
{
    if (cfg->storage.l2_adapter_json.count == 0 && !p2p_on(cfg))
        return 0;
    l2_service *s = calloc(1, sizeof *s);
    if (!s)
        return snprintf(err, errlen, "out of memory"), -1;
    s->sm = sm;
    if (build(s, cfg, err, errlen) != 0) {
        svc_close(s);
        return -1;
    }
    lmc_storage_manager_attach_tier(sm, &svc_ops, s);
    LMC_INFO("L2: %zu adapter(s)", s->na);
    return 0;
}

int lmc_l2_p2p_peer_set(lmc_storage_manager *sm, const char *id, const char *mq_url,
                        const char *chan_url, char *err, size_t errlen)
{
    l2_service *s = service_of(sm);
    if (!s || !s->p2p_peers)
        return snprintf(err, errlen, "P2P is off"), -1;
    return lmc_l2_p2p_peers_set(s->p2p_peers, id, mq_url, chan_url, err, errlen);
}

void lmc_l2_p2p_peer_drop(lmc_storage_manager *sm, const char *id)
{
    l2_service *s = service_of(sm);
    if (s && s->p2p_peers)
        lmc_l2_p2p_peers_drop(s->p2p_peers, id);
}

size_t lmc_l2_p2p_active_lookups(const lmc_storage_manager *sm)
{
    l2_service *s = service_of(sm);
    return s && s->p2p_peers ? lmc_l2_p2p_peers_active_lookups(s->p2p_peers) : 0;
}

/* ---- per-peer metrics (docs/metrics.md, "P2P requesting side") -------- */

enum { PM_LOOKUPS, PM_HITS, PM_BYTES, PM_LOOKUP_FAILURES, PM_TIMEOUTS, PM_LOAD_FAILURES,
       PM_SKIPPED, N_PM };

static const struct {
    const char *name, *help;
} peer_metric_specs[N_PM] = {
    [PM_LOOKUPS] = {"lmcache_mp_p2p_peer_lookups_total", "Lookups this server asked the peer"},
    [PM_HITS] = {"lmcache_mp_p2p_peer_hits_total", "Objects the peer leased to this server"},
    [PM_BYTES] = {"lmcache_mp_p2p_peer_read_bytes_total",
                  "Bytes read from the peer's L1 over the transfer channel"},
    [PM_LOOKUP_FAILURES] = {"lmcache_mp_p2p_peer_lookup_failures_total",
                            "Lookups of the peer that failed (no answer, a bad one, late)"},
    [PM_TIMEOUTS] = {"lmcache_mp_p2p_peer_lookup_timeouts_total",
                     "Lookups of the peer that got no answer in time"},
    [PM_LOAD_FAILURES] = {"lmcache_mp_p2p_peer_load_failures_total",
                          "Objects whose read from the peer failed"},
    [PM_SKIPPED] = {"lmcache_mp_p2p_peer_lookups_skipped_total",
                    "Lookups not sent: the peer was in its backoff after a silence"},
};

typedef struct peer_metrics {
    l2_service *s;
    lmc_metric *family[N_PM];
    lmc_metric *count;
} peer_metrics;

static void collect_peers(lmc_metrics *r, void *user)
{
    (void)r;
    peer_metrics *pm = user;
    lmc_l2_p2p_peer_stats *st = calloc(256, sizeof *st);
    size_t n = st ? lmc_l2_p2p_peers_stats(pm->s->p2p_peers, st, 256) : 0;
    for (size_t k = 0; k < N_PM; k++)
        lmc_metric_clear(pm->family[k]);   /* a dropped peer's series go */
    for (size_t i = 0; i < n; i++) {
        const lmc_l2_p2p_stats *c = &st[i].st;
        const double v[N_PM] = {
            [PM_LOOKUPS] = (double)c->lookups, [PM_HITS] = (double)c->hits,
            [PM_BYTES] = (double)c->loaded_bytes,
            [PM_LOOKUP_FAILURES] = (double)c->lookup_failures,
            [PM_TIMEOUTS] = (double)c->lookup_timeouts,
            [PM_LOAD_FAILURES] = (double)c->load_failures,
            [PM_SKIPPED] = (double)c->lookups_skipped,
        };
        const char *labels[] = {st[i].id};
        for (size_t k = 0; k < N_PM; k++)
            lmc_metric_set(pm->family[k], labels, v[k]);
    }
    lmc_metric_set(pm->count, NULL, (double)n);
    free(st);
}

int lmc_l2_p2p_register_metrics(lmc_storage_manager *sm, lmc_metrics *r)
{
    static const char *const labels[] = {"peer", NULL};
    l2_service *s = service_of(sm);
    if (!s || !s->p2p_peers)
        return 0;
    peer_metrics *pm = calloc(1, sizeof *pm);
    if (!pm)
        return -1;
    pm->s = s;
    for (size_t k = 0; k < N_PM; k++)
        if (!(pm->family[k] = lmc_metrics_counter(r, peer_metric_specs[k].name,
                                                  peer_metric_specs[k].help, labels)))
            goto fail;
    pm->count = lmc_metrics_gauge(r, "lmcache_mp_p2p_peers", "Peers discovered and asked now",
                                  NULL);
    if (!pm->count)
        goto fail;
    return lmc_metrics_add_owned_collector(r, collect_peers, pm);
fail:
    free(pm);
    return -1;
}

bool lmc_l2_attached(const lmc_storage_manager *sm)
{
    return service_of(sm) != NULL;
}

int lmc_l2_prefetch(lmc_storage_manager *sm, const lmc_l2_prefetch_request *req)
{
    l2_service *s = service_of(sm);
    return s ? lmc_l2_prefetch_ctl_submit(s->prefetch, req) : -1;
}

void lmc_l2_stop_prefetch(lmc_storage_manager *sm)
{
    l2_service *s = service_of(sm);
    if (s)
        lmc_l2_prefetch_ctl_stop(s->prefetch);
}

lmc_quotas *lmc_l2_quotas(lmc_storage_manager *sm)
{
    return lmc_storage_manager_quotas(sm);
}

json_t *lmc_l2_usage_by_salt(lmc_storage_manager *sm)
{
    l2_service *s = service_of(sm);
    return s ? lmc_l2_eviction_usage_by_salt(s->eviction) : json_object();
}

bool lmc_l2_enforces_quotas(lmc_storage_manager *sm)
{
    l2_service *s = service_of(sm);
    return s && lmc_l2_eviction_enforces_quotas(s->eviction);
}

json_t *lmc_l2_unhealthy(lmc_storage_manager *sm)
{
    l2_service *s = service_of(sm);
    json_t *list = json_array();
    for (size_t a = 0; list && s && a < s->na; a++) {
        lmc_l2_health_state h;
        lmc_l2_health_get(s->health, a, &h);
        if (!h.healthy)
            json_array_append_new(list, json_pack("{s:I, s:s, s:s, s:I}", "index", (json_int_t)a,
                                                  "type_name", lmc_l2_adapter_type(s->ad[a]),
                                                  "reason", h.reason, "since_ms",
                                                  (json_int_t)h.since_ms));
    }
    return list;
}

int lmc_l2_find_adapter(lmc_storage_manager *sm, const char *type)
{
    l2_service *s = service_of(sm);
    if (!s)
        return -1;
    if (!type || !*type)
        return s->na ? 0 : -1;
    for (size_t a = 0; a < s->na; a++) {
        if (strcasecmp(lmc_l2_adapter_type(s->ad[a]), type) == 0)
            return (int)a;
    }
    return -1;
}

json_t *lmc_l2_list(lmc_storage_manager *sm, int adapter, const char *model, size_t page_size,
                    const char *page_token)
{
    l2_service *s = service_of(sm);
    if (!s || adapter < 0 || (size_t)adapter >= s->na)
        return NULL;
    json_t *page = lmc_l2_adapter_list_keys(s->ad[adapter], model, page_size, page_token);
    if (page) {
        json_object_set_new(page, "adapter", json_string(lmc_l2_adapter_type(s->ad[adapter])));
        json_object_set_new(page, "shared", json_boolean(s->shared[adapter]));
    }
    return page;
}

size_t lmc_l2_delete(lmc_storage_manager *sm, int adapter, const lmc_object_key *keys, size_t n)
{
    l2_service *s = service_of(sm);
    if (!s || adapter < 0 || (size_t)adapter >= s->na)
        return 0;
    /* One key at a time: a locked key must not hide the others' deletion,
     * and the eviction tracker follows each removal. */
    size_t done = 0;
    for (size_t i = 0; i < n; i++)
        done += lmc_l2_adapter_delete(s->ad[adapter], &keys[i], 1);
    return done;
}
