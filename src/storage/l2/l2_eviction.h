/* L2 eviction controller (docs/l2.md, "L2 eviction and quotas"): see
 * l2_eviction.c. */
#ifndef LMC_STORAGE_L2_EVICTION_H
#define LMC_STORAGE_L2_EVICTION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "storage/l2/l2_adapter.h"
#include "storage/quota.h"
#include "storage/storage_manager.h"

typedef struct lmc_l2_eviction lmc_l2_eviction;

/* eviction_configs[i] is adapter i's "eviction" object, or NULL when that
 * adapter is not evicted.  Installs observers on the tracked adapters (call
 * before any task runs) and starts one thread ticking every period_ms
 * (0 = 1000).  Evicted keys are published as L2_EVICTED through `events`
 * (NULL: not published).  NULL on allocation failure. */
lmc_l2_eviction *lmc_l2_eviction_new(lmc_l2_adapter *const *adapters,
                                     const json_t *const *eviction_configs, size_t n,
                                     lmc_quotas *quotas, lmc_storage_manager *events,
                                     unsigned period_ms);
/* One synchronous cycle (tests). */
void lmc_l2_eviction_run_once(lmc_l2_eviction *e);
void lmc_l2_eviction_stop(lmc_l2_eviction *e);   /* joins the thread */
void lmc_l2_eviction_free(lmc_l2_eviction *e);
json_t *lmc_l2_eviction_status(lmc_l2_eviction *e);
/* {cache_salt: bytes} summed over the IsolatedLRU targets (the only ones
 * that count per salt).  New reference. */
json_t *lmc_l2_eviction_usage_by_salt(lmc_l2_eviction *e);
/* True when some target runs IsolatedLRU, the one policy that enforces the
 * per-salt quotas. */
bool lmc_l2_eviction_enforces_quotas(const lmc_l2_eviction *e);

#endif
