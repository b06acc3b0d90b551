/* The storage's metrics (docs/metrics.md, "Exported now"): L1 usage
 * gauges, L1 book and lease counters, the eviction loop's counters and,
 * per L2 adapter type, the store/load counters and usage gauges.  The
 * storage owns them: the collector reads its typed counters, so a status
 * field renamed for /status cannot change a metric. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/metrics.h"
#include "storage/l1/l1_manager.h"
#include "storage/storage_manager.h"
#include "storage/storage_metrics.h"

/* The unlabelled families, in the order /metrics lists them. */
enum {
    L1_USED, L1_COMMITTED, L1_CAPACITY, L1_RATIO, L1_OBJECTS, L1_LOCKED, L1_STAGING,
    L1_RETIRED, L1_VIOLATIONS, L1_EVENTS_LOST, LEASE_TWICE, LEASE_STALE, LEASE_EXPIRED,
    SIZE_MISMATCHES, EVICTION_TICKS, EVICTION_TRIGGERED, EVICTED, L1_PREFAULTED,
    L1_PREFAULTING, N_FAMILIES
};

/* The labelled L2 families (l2_name = the adapter's type, as upstream). */
enum { L2_STORES, L2_LOADS, L2_USED, L2_CAPACITY, N_L2_FAMILIES };

typedef struct {
    lmc_metric_type type;
    const char *name, *help;
} family_spec;

static const family_spec families[N_FAMILIES] = {
    [L1_USED] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_used_bytes",
                 "L1 bytes allocated to objects and staging"},
    [L1_COMMITTED] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_committed_bytes",
                      "L1 bytes committed to the allocator so far"},
    [L1_CAPACITY] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_capacity_bytes",
                     "Configured L1 size in bytes"},
    [L1_RATIO] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_memory_usage_ratio",
                  "L1 used bytes / committed bytes"},
    [L1_OBJECTS] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_objects", "Objects stored in L1"},
    [L1_LOCKED] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_locked_objects",
                   "L1 objects currently read-locked"},
    [L1_STAGING] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_staging_objects",
                    "L1 objects reserved for writing and not yet committed"},
    [L1_RETIRED] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_retired_bytes",
                    "L1 bytes of deleted objects kept until the copies in flight end"},
    [L1_VIOLATIONS] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_invariant_violations_total",
                       "Broken rules found in the L1 manager's books (docs/storage.md, "
                       "Invariants)"},
    [L1_EVENTS_LOST] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_events_lost_total",
                        "L1 listener events a give-back could not allocate"},
    [LEASE_TWICE] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_lease_returned_twice_total",
                     "L1 leases given back a second time (no-op)"},
    [LEASE_STALE] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_lease_returned_stale_total",
                     "L1 leases given back after their buffer was gone (forced clear, lapse; "
                     "no-op)"},
    [LEASE_EXPIRED] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_lease_returned_expired_total",
                       "L1 leases given back after their lock lapsed"},
    [SIZE_MISMATCHES] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_object_size_mismatches_total",
                         "L1 reads refused because the object is not of the size its reader's "
                         "layout expects"},
    [EVICTION_TICKS] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_eviction_loop_ticks_total",
                        "L1 eviction loop iterations"},
    [EVICTION_TRIGGERED] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_eviction_loop_triggered_total",
                            "L1 eviction loop iterations that ran the eviction policy"},
    [EVICTED] = {LMC_METRIC_COUNTER, "lmcache_mp_l1_evicted_total", "Keys evicted from L1"},
    [L1_PREFAULTED] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_prefaulted_bytes",
                       "L1 bytes committed and faulted into the server's mapping"},
    [L1_PREFAULTING] = {LMC_METRIC_GAUGE, "lmcache_mp_l1_prefault_running",
                        "1 while the L1 pre-fault after start runs, else 0"},
};

static const family_spec l2_families[N_L2_FAMILIES] = {
    [L2_STORES] = {LMC_METRIC_COUNTER, "lmcache_mp_l2_store_completed_total",
                   "L2 store requests completed"},
    [L2_LOADS] = {LMC_METRIC_COUNTER, "lmcache_mp_l2_load_completed_total",
                  "L2 load tasks completed"},
    [L2_USED] = {LMC_METRIC_GAUGE, "lmcache_mp_l2_used_bytes", "Bytes held by an L2 adapter"},
    [L2_CAPACITY] = {LMC_METRIC_GAUGE, "lmcache_mp_l2_capacity_bytes",
                     "Capacity of an L2 adapter (0 = unknown)"},
};

typedef struct {
    lmc_storage_manager *sm;
    lmc_metric *m[N_FAMILIES];
} storage_metrics;

static lmc_metric *family(lmc_metrics *r, const family_spec *f, const char *const *labels)
{
    return f->type == LMC_METRIC_COUNTER ? lmc_metrics_counter(r, f->name, f->help, labels)
                                         : lmc_metrics_gauge(r, f->name, f->help, labels);
}

static void collect_l1(storage_metrics *sm_m)
{
    lmc_l1_stats s;
    uint64_t cycles, triggered, evicted;
    lmc_storage_manager_l1_stats(sm_m->sm, &s);
    lmc_storage_manager_eviction_counts(sm_m->sm, &cycles, &triggered, &evicted);
    uint64_t prefaulted;
    bool prefaulting = lmc_storage_manager_prefault_progress(sm_m->sm, &prefaulted);
    const double values[N_FAMILIES] = {
        [L1_USED] = (double)s.used_bytes,
        [L1_COMMITTED] = (double)s.committed_bytes,
        [L1_CAPACITY] = (double)s.configured_bytes,
        [L1_RATIO] = s.committed_bytes ? (double)s.used_bytes / (double)s.committed_bytes : 0.0,
        [L1_OBJECTS] = (double)s.num_objects,
        [L1_LOCKED] = (double)s.num_locked,
        [L1_STAGING] = (double)s.num_staging,
        [L1_RETIRED] = (double)s.retired_bytes,
        [L1_VIOLATIONS] = (double)s.invariant_violations,
        [L1_EVENTS_LOST] = (double)s.events_lost,
        [LEASE_TWICE] = (double)s.leases.returned_twice,
        [LEASE_STALE] = (double)s.leases.returned_stale,
        [LEASE_EXPIRED] = (double)s.leases.returned_expired,
        [SIZE_MISMATCHES] = (double)s.leases.size_mismatches,
        [EVICTION_TICKS] = (double)cycles,
        [EVICTION_TRIGGERED] = (double)triggered,
        [EVICTED] = (double)evicted,
        [L1_PREFAULTED] = (double)prefaulted,
        [L1_PREFAULTING] = prefaulting ? 1.0 : 0.0,
    };
    for (size_t i = 0; i < N_FAMILIES; i++)
        lmc_metric_set(sm_m->m[i], NULL, values[i]);
}

/* lmcache_mp_l2_adapter_healthy{adapter, l2_name}: one series per adapter,
 * as adapters of one type may differ (docs/metrics.md). */
static void collect_l2_health(lmc_metrics *r, const lmc_storage_l2_counts *c, size_t n)
{
    static const char *const labels[] = {"adapter", "l2_name", NULL};
    static const family_spec spec = {
        LMC_METRIC_GAUGE, "lmcache_mp_l2_adapter_healthy",
        "1 when the L2 adapter's last backend probe succeeded (docs/l2.md, Health)"};
    lmc_metric *m = family(r, &spec, labels);
    for (size_t i = 0; m && i < n; i++) {
        char index[24];
        snprintf(index, sizeof index, "%zu", i);
        const char *values[] = {index, c[i].type_name};
        lmc_metric_set(m, values, c[i].healthy ? 1 : 0);
    }
}

/* Several adapters of one type share the label: their figures are summed
 * per type, the series in the order the types first appear.  The families
 * are registered at the first scrape (found again at the next ones), so
 * that /metrics lists them after the event families, where it always has. */
static void collect_l2(lmc_metrics *r, storage_metrics *sm_m)
{
    static const char *const l2_labels[] = {"l2_name", NULL};
    lmc_metric *l2[N_L2_FAMILIES];
    for (size_t k = 0; k < N_L2_FAMILIES; k++)
        if (!(l2[k] = family(r, &l2_families[k], l2_labels)))
            return;
    size_t n = lmc_storage_manager_l2_counts(sm_m->sm, NULL, 0);
    lmc_storage_l2_counts *c = n ? calloc(n, sizeof *c) : NULL;
    if (!c)
        return;
    n = lmc_storage_manager_l2_counts(sm_m->sm, c, n);
    for (size_t i = 0; i < n; i++) {
        double sum[N_L2_FAMILIES] = {0};
        bool seen = false;
        for (size_t j = 0; j < n && !seen; j++) {
            if (strcmp(c[j].type_name, c[i].type_name) != 0)
                continue;
            seen = j < i; /* an earlier adapter of this type set the sums */
            sum[L2_STORES] += (double)c[j].stores_completed;
            sum[L2_LOADS] += (double)c[j].loads;
            sum[L2_USED] += (double)c[j].used_bytes;
            sum[L2_CAPACITY] += (double)c[j].capacity_bytes;
        }
        const char *values[] = {c[i].type_name};
        for (size_t k = 0; !seen && k < N_L2_FAMILIES; k++)
            lmc_metric_set(l2[k], values, sum[k]);
    }
    collect_l2_health(r, c, n);
    free(c);
}

static void collect_storage(lmc_metrics *r, void *user)
{
    collect_l1(user);
    collect_l2(r, user);
}

int lmc_storage_manager_register_metrics(lmc_storage_manager *sm, lmc_metrics *r)
{
    storage_metrics *sm_m = calloc(1, sizeof *sm_m);
    if (!sm_m)
        return -1;
    sm_m->sm = sm;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        if (!(sm_m->m[i] = family(r, &families[i], NULL))) {
            free(sm_m);
            return -1;
        }
    }
    return lmc_metrics_add_owned_collector(r, collect_storage, sm_m);
}
