/* Event-driven metrics: one subscriber per event type (event_metrics.h).
 * Every handler runs on the bus drain thread, the only user of `pairs`. */
#include "obs/event_metrics.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "obs/event_pairs.h"
#include "obs/events.h"

typedef struct {
    lmc_metric *requested, *hit, *hit_l1, *hit_l2, *lookups, *early_exit;
    lmc_metric *sub_stores, *fin_stores, *sub_retrieves, *fin_retrieves;
    lmc_metric *chunks_loaded, *load_requests, *load_bytes, *store_tput, *load_tput;
    lmc_metric *l1_read, *l1_write, *lifetime, *idle, *alloc_failure, *read_failure;
    lmc_metric *usage, *reuse_gap, *evict_reuse_gap;
    lmc_metric *sm_read[3], *sm_write[3];   /* requests, succeed keys, failed keys */
    lmc_metric *l2_store_sub, *l2_store_sub_obj, *l2_store_done_obj, *l2_store_tput,
        *l2_load_tput, *l2_pf_lookup, *l2_pf_lookup_obj, *l2_pf_load_sub, *l2_pf_load_sub_obj,
        *l2_pf_load_done, *l2_evicted, *l2_pf_failure;
    lmc_event_pairs pairs;
} event_metrics;

static const double gbs_bounds[] = {0.1, 0.5, 1, 2, 5, 10, 20, 50, 100};
static const double lifetime_bounds[] = {0.1, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 21600};
static const double ratio_bounds[] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1};
static const double evict_reuse_bounds[] = {0.1, 1, 5, 10, 30, 60, 120, 300};
#define N_BOUNDS(a) (sizeof(a) / sizeof((a)[0]))

/* ---- registration ------------------------------------------------------ */

static lmc_metric *counter(lmc_metrics *r, const char *name, const char *help,
                           const char *const *labels)
{
    return lmc_metrics_counter(r, name, help, labels);
}

static bool register_lookup(lmc_metrics *r, event_metrics *em)
{
    static const char *const ms[] = {"model_name", "cache_salt", NULL};
    static const char *const msr[] = {"model_name", "cache_salt", "reason", NULL};
    em->requested = counter(r, "lmcache_mp_lookup_requested_total",
                            "Chunk-aligned tokens submitted to lookup", ms);
    em->hit = counter(r, "lmcache_mp_lookup_hit_total",
                      "Tokens of the contiguous prefix found in L1+L2", ms);
    em->hit_l1 = counter(r, "lmcache_mp_lookup_hit_l1_total", "Lookup hit tokens found in L1", ms);
    em->hit_l2 = counter(r, "lmcache_mp_lookup_hit_l2_total", "Lookup hit tokens found in L2", ms);
    em->lookups = counter(r, "lmcache_mp_lookups_total", "Completed lookups", ms);
    em->early_exit = counter(r, "lmcache_mp_lookup_early_exit_total",
                             "Lookups that exited before probing", msr);
    return em->requested && em->hit && em->hit_l1 && em->hit_l2 && em->lookups &&
           em->early_exit;
}

static bool register_transfers(lmc_metrics *r, event_metrics *em)
{
    static const char *const dev[] = {"device", NULL};
    static const char *const wms[] = {"worker_id", "model_name", "cache_salt", NULL};
    static const char *const wmsd[] = {"worker_id", "model_name", "cache_salt", "device", NULL};
    static const char *const dem[] = {"device", "engine_id", "model_name", NULL};
    em->sub_stores = counter(r, "lmcache_mp_num_submitted_stores_total",
                             "GPU->CPU transfers enqueued", dev);
    em->fin_stores = counter(r, "lmcache_mp_num_finished_stores_total",
                             "GPU->CPU transfers that left the stream", dev);
    em->sub_retrieves = counter(r, "lmcache_mp_num_submitted_retrieves_total",
                                "CPU->GPU transfers enqueued", dev);
    em->fin_retrieves = counter(r, "lmcache_mp_num_finished_retrieves_total",
                                "CPU->GPU transfers that left the stream", dev);
    em->chunks_loaded = counter(r, "lmcache_mp_num_chunks_loaded_total",
                                "Chunks delivered to a worker by retrieve", wms);
    em->load_requests = counter(r, "lmcache_mp_l0_l1_load_requests_total",
                                "Retrieves that loaded at least one chunk", wmsd);
    em->load_bytes = counter(r, "lmcache_mp_l0_l1_load_bytes_total",
                             "Bytes copied L1 -> GPU", wmsd);
    em->store_tput = lmc_metrics_histogram(r, "lmcache_mp_l0_l1_store_throughput_gbs",
                                           "GPU->CPU store throughput per request (GB/s)", dem,
                                           gbs_bounds, N_BOUNDS(gbs_bounds));
    em->load_tput = lmc_metrics_histogram(r, "lmcache_mp_l0_l1_load_throughput_gbs",
                                          "CPU->GPU load throughput per request (GB/s)", dem,
                                          gbs_bounds, N_BOUNDS(gbs_bounds));
    return em->sub_stores && em->fin_stores && em->sub_retrieves && em->fin_retrieves &&
           em->chunks_loaded && em->load_requests && em->load_bytes && em->store_tput &&
           em->load_tput;
}

static bool register_l1(lmc_metrics *r, event_metrics *em)
{
    static const char *const dm[] = {"during", "model_name", NULL};
    static const char *const drm[] = {"during", "reason", "model_name", NULL};
    em->l1_read = counter(r, "lmcache_mp_l1_read_total", "Keys whose L1 read finished", NULL);
    em->l1_write = counter(r, "lmcache_mp_l1_write_total", "Keys written to L1", NULL);
    em->lifetime = lmc_metrics_histogram(
        r, "lmcache_mp_l1_chunk_lifetime_seconds", "Sampled L1 chunks: allocation -> eviction",
        NULL, lifetime_bounds, N_BOUNDS(lifetime_bounds));
    em->idle = lmc_metrics_histogram(r, "lmcache_mp_l1_chunk_idle_before_evict_seconds",
                                     "Sampled L1 chunks: last touch -> eviction", NULL,
                                     lifetime_bounds, N_BOUNDS(lifetime_bounds));
    em->alloc_failure = counter(r, "lmcache_mp_l1_allocation_failure_total",
                                "L1 out of memory during reserve-write, per key", dm);
    em->read_failure = counter(r, "lmcache_mp_l1_read_failure_total",
                               "Reserve-read failures after a successful lookup", drm);
    em->usage = lmc_metrics_histogram(r, "lmcache_mp_l1_usage_ratio",
                                      "L1 used / committed bytes, sampled every eviction cycle",
                                      NULL, ratio_bounds, N_BOUNDS(ratio_bounds));
    em->reuse_gap = lmc_metrics_histogram(
        r, "lmcache_mp_l1_chunk_reuse_gap_seconds",
        "Sampled L1 chunks: gap between consecutive reads or touches", NULL, lifetime_bounds,
        N_BOUNDS(lifetime_bounds));
    em->evict_reuse_gap = lmc_metrics_histogram(
        r, "lmcache_mp_l1_chunk_evict_reuse_gap_seconds",
        "Sampled L1 chunks: eviction -> next write of the same key (300 when it never came)",
        NULL, evict_reuse_bounds, N_BOUNDS(evict_reuse_bounds));
    return em->l1_read && em->l1_write && em->lifetime && em->idle && em->alloc_failure &&
           em->read_failure && em->usage && em->reuse_gap && em->evict_reuse_gap;
}

static bool register_sm(lmc_metrics *r, event_metrics *em)
{
    static const char *const salt[] = {"cache_salt", NULL};
    static const char *const names[2][3][2] = {
        {{"lmcache_mp_sm_read_requests_total", "Storage-manager prefix reads (per salt)"},
         {"lmcache_mp_sm_read_succeed_keys_total", "Keys the prefix reads locked"},
         {"lmcache_mp_sm_read_failed_keys_total", "Keys the prefix reads did not find"}},
        {{"lmcache_mp_sm_write_requests_total", "Storage-manager reserve-writes (per salt)"},
         {"lmcache_mp_sm_write_succeed_keys_total", "Keys whose write reservation succeeded"},
         {"lmcache_mp_sm_write_failed_keys_total", "Keys whose write reservation failed"}},
    };
    for (int i = 0; i < 3; i++) {
        em->sm_read[i] = counter(r, names[0][i][0], names[0][i][1], salt);
        em->sm_write[i] = counter(r, names[1][i][0], names[1][i][1], salt);
        if (!em->sm_read[i] || !em->sm_write[i])
            return false;
    }
    return true;
}

static bool register_l2(lmc_metrics *r, event_metrics *em)
{
    static const char *const salt[] = {"cache_salt", NULL};
    static const char *const name[] = {"l2_name", NULL};
    static const char *const rm[] = {"reason", "model_name", NULL};
    em->l2_store_sub = counter(r, "lmcache_mp_l2_store_submitted_total",
                               "L2 store requests submitted", NULL);
    em->l2_store_sub_obj = counter(r, "lmcache_mp_l2_store_submitted_objects_total",
                                   "Chunks submitted for L2 store", salt);
    em->l2_store_done_obj = counter(r, "lmcache_mp_l2_store_completed_objects_total",
                                    "Chunks stored to L2", salt);
    em->l2_store_tput = lmc_metrics_histogram(r, "lmcache_mp_l2_store_throughput_gbs",
                                              "L2 store task bytes / (completed - submitted)",
                                              name, gbs_bounds, N_BOUNDS(gbs_bounds));
    em->l2_load_tput = lmc_metrics_histogram(r, "lmcache_mp_l2_load_throughput_gbs",
                                             "L2 load task bytes / (completed - submitted)",
                                             name, gbs_bounds, N_BOUNDS(gbs_bounds));
    em->l2_pf_lookup = counter(r, "lmcache_mp_l2_prefetch_lookup_total", "L2 prefetch lookups",
                               NULL);
    em->l2_pf_lookup_obj = counter(r, "lmcache_mp_l2_prefetch_lookup_objects_total",
                                   "Chunks looked up in L2", salt);
    em->l2_pf_load_sub = counter(r, "lmcache_mp_l2_prefetch_load_submitted_total",
                                 "L2 load tasks submitted (one per adapter used)", NULL);
    em->l2_pf_load_sub_obj = counter(r, "lmcache_mp_l2_prefetch_load_submitted_objects_total",
                                     "Chunks submitted for loading from L2", salt);
    em->l2_pf_load_done = counter(r, "lmcache_mp_l2_prefetch_load_completed_total",
                                  "Chunks loaded from L2 into L1", salt);
    em->l2_evicted = counter(r, "lmcache_mp_l2_evicted_objects_total",
                             "Chunks evicted from L2", salt);
    em->l2_pf_failure = counter(r, "lmcache_mp_l2_prefetch_failure_total",
                                "Keys expected in L2 that did not land in L1", rm);
    return em->l2_store_sub && em->l2_store_sub_obj && em->l2_store_done_obj &&
           em->l2_store_tput && em->l2_load_tput && em->l2_pf_lookup && em->l2_pf_lookup_obj &&
           em->l2_pf_load_sub && em->l2_pf_load_sub_obj && em->l2_pf_load_done &&
           em->l2_evicted && em->l2_pf_failure;
}

/* ---- handlers ---------------------------------------------------------- */

static void on_lookup_end(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    const json_t *m = ev->metadata;
    const char *ms[] = {lmc_event_str(m, "model_name"), lmc_event_str(m, "cache_salt"), NULL};
    const char *reason = lmc_event_str(m, "early_exit");
    double hit = lmc_event_num(m, "hit_tokens"), l2 = lmc_event_num(m, "hit_tokens_l2");
    lmc_metric_add(em->lookups, ms, 1);
    lmc_metric_add(em->requested, ms, lmc_event_num(m, "requested_tokens"));
    lmc_metric_add(em->hit, ms, hit);
    lmc_metric_add(em->hit_l1, ms, hit > l2 ? hit - l2 : 0);
    lmc_metric_add(em->hit_l2, ms, l2);
    if (*reason) {
        ms[2] = reason;
        lmc_metric_add(em->early_exit, ms, 1);
    }
}

static void on_transfer_start(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    bool store = strcmp(ev->type, LMC_EVENT_STORE_START) == 0;
    char buf[32], key[LMC_EVENT_PAIRS_KEY];
    const char *dev[] = {lmc_event_label(ev->metadata, "device", buf, sizeof buf)};
    lmc_metric_add(store ? em->sub_stores : em->sub_retrieves, dev, 1);
    lmc_event_pairs_key(key, store ? "S" : "R", ev->session_id, dev[0]);
    lmc_event_pairs_put(&em->pairs, key, ev->timestamp);
}

/* Observes bytes / (END - START) when the START was seen. */
static void observe_throughput(event_metrics *em, const lmc_event *ev, bool store,
                               const char *device)
{
    char key[LMC_EVENT_PAIRS_KEY];
    double start, bytes = lmc_event_num(ev->metadata, "bytes");
    lmc_event_pairs_key(key, store ? "S" : "R", ev->session_id, device);
    if (!lmc_event_pairs_take(&em->pairs, key, &start) || bytes <= 0 || ev->timestamp <= start)
        return;
    const char *dem[] = {device, lmc_event_str(ev->metadata, "engine_id"),
                         lmc_event_str(ev->metadata, "model_name")};
    lmc_metric_observe(store ? em->store_tput : em->load_tput, dem,
                       bytes / 1e9 / (ev->timestamp - start));
}

static void on_transfer_end(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    const json_t *m = ev->metadata;
    bool store = strcmp(ev->type, LMC_EVENT_STORE_END) == 0;
    char dbuf[32], wbuf[32];
    const char *device = lmc_event_label(m, "device", dbuf, sizeof dbuf);
    lmc_metric_add(store ? em->fin_stores : em->fin_retrieves, (const char *const[]){device}, 1);
    observe_throughput(em, ev, store, device);
    if (store)
        return;
    double chunks = lmc_event_num(m, "num_chunks");
    const char *w[] = {lmc_event_label(m, "worker_id", wbuf, sizeof wbuf),
                       lmc_event_str(m, "model_name"), lmc_event_str(m, "cache_salt"), device};
    lmc_metric_add(em->chunks_loaded, w, chunks);
    if (chunks >= 1) {
        lmc_metric_add(em->load_requests, w, 1);
        lmc_metric_add(em->load_bytes, w, lmc_event_num(m, "bytes"));
    }
}

static void on_l1_count(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    bool read = strcmp(ev->type, LMC_EVENT_L1_READ) == 0;
    lmc_metric_add(read ? em->l1_read : em->l1_write, NULL,
                   lmc_event_num(ev->metadata, "num_keys"));
}

static void on_l1_evicted(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    size_t i;
    const json_t *k;
    json_array_foreach(json_object_get(ev->metadata, "keys"), i, k) {
        if (json_is_number(json_object_get(k, "lifetime_s")))
            lmc_metric_observe(em->lifetime, NULL, lmc_event_num(k, "lifetime_s"));
        if (json_is_number(json_object_get(k, "idle_s")))
            lmc_metric_observe(em->idle, NULL, lmc_event_num(k, "idle_s"));
    }
}

static void on_l1_failure(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    const json_t *m = ev->metadata;
    double n = json_is_number(json_object_get(m, "num_keys")) ? lmc_event_num(m, "num_keys") : 1;
    const char *during = lmc_event_str(m, "during"), *model = lmc_event_str(m, "model_name");
    if (strcmp(ev->type, LMC_EVENT_L1_ALLOCATION_FAILURE) == 0)
        lmc_metric_add(em->alloc_failure, (const char *const[]){during, model}, n);
    else
        lmc_metric_add(em->read_failure,
                       (const char *const[]){during, lmc_event_str(m, "reason"), model}, n);
}

static void observe_all(lmc_metric *h, const json_t *values)
{
    size_t i;
    const json_t *v;
    json_array_foreach(values, i, v) {
        if (json_is_number(v))
            lmc_metric_observe(h, NULL, json_number_value(v));
    }
}

static void on_l1_cycle(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    if (strcmp(ev->type, LMC_EVENT_L1_USAGE) == 0) {
        lmc_metric_observe(em->usage, NULL, lmc_event_num(ev->metadata, "usage_ratio"));
        return;
    }
    observe_all(em->reuse_gap, json_object_get(ev->metadata, "reuse_gaps_s"));
    observe_all(em->evict_reuse_gap, json_object_get(ev->metadata, "evict_reuse_gaps_s"));
}

static void on_sm(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    lmc_metric **m = strcmp(ev->type, LMC_EVENT_SM_READ) == 0 ? em->sm_read : em->sm_write;
    const char *salt;
    const json_t *counts;
    json_object_foreach(json_object_get(ev->metadata, "by_salt"), salt, counts) {
        const char *labels[] = {salt};
        lmc_metric_add(m[0], labels, 1);
        lmc_metric_add(m[1], labels, lmc_event_num(counts, "ok"));
        lmc_metric_add(m[2], labels, lmc_event_num(counts, "failed"));
    }
}

/* Adds each {salt: n} of the event's by_salt to `m`; returns the total. */
static double add_by_salt(lmc_metric *m, const lmc_event *ev)
{
    const char *salt;
    const json_t *n;
    double total = 0;
    json_object_foreach(json_object_get(ev->metadata, "by_salt"), salt, n) {
        if (!json_is_number(n))
            continue;
        lmc_metric_add(m, (const char *const[]){salt}, json_number_value(n));
        total += json_number_value(n);
    }
    return total;
}

static void on_l2_store(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    if (strcmp(ev->type, LMC_EVENT_L2_STORE_SUBMITTED) == 0) {
        lmc_metric_add(em->l2_store_sub, NULL, 1);
        add_by_salt(em->l2_store_sub_obj, ev);
    } else {
        add_by_salt(em->l2_store_done_obj, ev);
    }
}

static void on_l2_task(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    double bytes = lmc_event_num(ev->metadata, "bytes");
    double seconds = lmc_event_num(ev->metadata, "seconds");
    if (bytes <= 0 || seconds <= 0)
        return;
    bool store = strcmp(ev->type, LMC_EVENT_L2_STORE_TASK) == 0;
    const char *name[] = {lmc_event_str(ev->metadata, "l2_name")};
    lmc_metric_observe(store ? em->l2_store_tput : em->l2_load_tput, name,
                       bytes / 1e9 / seconds);
}

static void on_l2_prefetch(const lmc_event *ev, void *user)
{
    event_metrics *em = user;
    const char *t = ev->type;
    if (strcmp(t, LMC_EVENT_L2_PREFETCH_LOOKUP) == 0) {
        lmc_metric_add(em->l2_pf_lookup, NULL, 1);
        add_by_salt(em->l2_pf_lookup_obj, ev);
    } else if (strcmp(t, LMC_EVENT_L2_PREFETCH_LOAD_SUBMITTED) == 0) {
        lmc_metric_add(em->l2_pf_load_sub, NULL, lmc_event_num(ev->metadata, "adapters"));
        add_by_salt(em->l2_pf_load_sub_obj, ev);
    } else if (strcmp(t, LMC_EVENT_L2_PREFETCH_LOAD_COMPLETED) == 0) {
        add_by_salt(em->l2_pf_load_done, ev);
    } else if (strcmp(t, LMC_EVENT_L2_EVICTED) == 0) {
        add_by_salt(em->l2_evicted, ev);
    } else {
        const json_t *m = ev->metadata;
        lmc_metric_add(em->l2_pf_failure,
                       (const char *const[]){lmc_event_str(m, "reason"),
                                             lmc_event_str(m, "model_name")},
                       lmc_event_num(m, "num_keys"));
    }
}

/* ---- attach ------------------------------------------------------------ */

static void collect_nothing(lmc_metrics *r, void *user)
{
    (void)r;
    (void)user;
}

int lmc_metrics_attach_event_metrics(lmc_metrics *r, lmc_event_bus *bus)
{
    static const struct {
        const char *type;
        lmc_event_fn fn;
    } subs[] = {
        {LMC_EVENT_LOOKUP_END, on_lookup_end},
        {LMC_EVENT_STORE_START, on_transfer_start},
        {LMC_EVENT_STORE_END, on_transfer_end},
        {LMC_EVENT_RETRIEVE_START, on_transfer_start},
        {LMC_EVENT_RETRIEVE_END, on_transfer_end},
        {LMC_EVENT_L1_READ, on_l1_count},
        {LMC_EVENT_L1_WRITE, on_l1_count},
        {LMC_EVENT_L1_KEYS_EVICTED, on_l1_evicted},
        {LMC_EVENT_L1_ALLOCATION_FAILURE, on_l1_failure},
        {LMC_EVENT_L1_READ_FAILURE, on_l1_failure},
        {LMC_EVENT_L1_USAGE, on_l1_cycle},
        {LMC_EVENT_L1_REUSE_GAPS, on_l1_cycle},
        {LMC_EVENT_SM_READ, on_sm},
        {LMC_EVENT_SM_WRITE, on_sm},
        {LMC_EVENT_L2_STORE_SUBMITTED, on_l2_store},
        {LMC_EVENT_L2_STORE_COMPLETED, on_l2_store},
        {LMC_EVENT_L2_STORE_TASK, on_l2_task},
        {LMC_EVENT_L2_LOAD_TASK, on_l2_task},
        {LMC_EVENT_L2_PREFETCH_LOOKUP, on_l2_prefetch},
        {LMC_EVENT_L2_PREFETCH_LOAD_SUBMITTED, on_l2_prefetch},
        {LMC_EVENT_L2_PREFETCH_LOAD_COMPLETED, on_l2_prefetch},
        {LMC_EVENT_L2_PREFETCH_FAILURE, on_l2_prefetch},
        {LMC_EVENT_L2_EVICTED, on_l2_prefetch},
    };
    event_metrics *em = calloc(1, sizeof *em);
    if (!r || !bus || !em) {
        free(em);
        return -1;
    }
    if (!register_lookup(r, em) || !register_transfers(r, em) || !register_l1(r, em) ||
        !register_sm(r, em) || !register_l2(r, em)) {
        free(em);
        return -1;
    }
    /* The registry owns em (a no-op collector carries it), so the
     * subscriptions stay valid until the registry is freed. */
    if (lmc_metrics_add_owned_collector(r, collect_nothing, em) != 0)
        return -1;
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        if (lmc_event_bus_subscribe(bus, subs[i].type, subs[i].fn, em) != 0)
            return -1;
    }
    return 0;
}
