/* Event-driven metrics: one subscriber per event type (event_metrics.h).
 * Every handler runs on the bus drain thread, the only user of `pairs`. */
#include "obs/event_metrics.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "obs/event_pairs.h"
#include "obs/events.h"
#include "obs/metrics_internal.h"

typedef struct {
    double sample_rate;
    lmc_metric *requested, *hit, *hit_l1, *hit_l2, *lookups, *early_exit;
    lmc_metric *sub_stores, *fin_stores, *sub_retrieves, *fin_retrieves;
    lmc_metric *chunks_loaded, *load_requests, *load_bytes, *store_tput, *load_tput;
    lmc_metric *l1_read, *l1_write, *lifetime, *idle, *alloc_failure, *read_failure;
    lmc_event_pairs pairs;
} event_metrics;

static const double gbs_bounds[] = {0.1, 0.5, 1, 2, 5, 10, 20, 50, 100};
static const double lifetime_bounds[] = {0.1, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 21600};
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
    return em->l1_read && em->l1_write && em->lifetime && em->idle && em->alloc_failure &&
           em->read_failure;
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
        if (!lmc_obs_sampled(lmc_event_str(k, "hash"), em->sample_rate))
            continue;
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

/* ---- attach ------------------------------------------------------------ */

static void collect_nothing(lmc_metrics *r, void *user)
{
    (void)r;
    (void)user;
}

int lmc_metrics_attach_event_metrics(lmc_metrics *r, lmc_event_bus *bus, double sample_rate)
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
    };
    event_metrics *em = calloc(1, sizeof *em);
    if (!r || !bus || !em) {
        free(em);
        return -1;
    }
    em->sample_rate = sample_rate;
    if (!register_lookup(r, em) || !register_transfers(r, em) || !register_l1(r, em)) {
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
