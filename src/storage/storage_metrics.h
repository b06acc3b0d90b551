/* The storage's metrics and the typed figures they read (docs/metrics.md:
 * lmcache_mp_l1_*, lmcache_mp_l1_eviction_* and lmcache_mp_l2_*), beside
 * the storage contract (docs/storage.md, "StorageManager facade"): the
 * storage owns its families, so a field renamed in /status cannot change
 * a metric. */
#ifndef LMC_STORAGE_STORAGE_METRICS_H
#define LMC_STORAGE_STORAGE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/storage_manager.h"

struct lmc_metrics;
struct lmc_l1_stats;

/* One L2 adapter's figures (the lmcache_mp_l2_* families, /config/adapters). */
typedef struct {
    const char *type_name;      /* static for the tier's lifetime */
    uint64_t stores_completed;  /* ok + failed */
    uint64_t loads;
    uint64_t used_bytes, capacity_bytes;
    bool healthy;               /* its backend's last probe (docs/l2.md, "Health") */
} lmc_storage_l2_counts;

/* The storage's metric families and a collector that reads the L1,
 * eviction and L2 counters at scrape time.  The collector runs until the
 * registry is freed: scrapes must end before the manager is freed.  0 or
 * -1 (storage_metrics.c). */
int lmc_storage_manager_register_metrics(lmc_storage_manager *sm, struct lmc_metrics *r);
void lmc_storage_manager_l1_stats(lmc_storage_manager *sm, struct lmc_l1_stats *out);
void lmc_storage_manager_eviction_counts(lmc_storage_manager *sm, uint64_t *cycles,
                                         uint64_t *triggered_cycles, uint64_t *evicted_keys);
/* The L2 adapters' figures in priority order: fills out[0..min(n, max));
 * returns n (0 without an L2 tier). */
size_t lmc_storage_manager_l2_counts(lmc_storage_manager *sm, lmc_storage_l2_counts *out,
                                     size_t max);

#endif
