/* The storage manager's hook for its L2 tier (docs/l2.md): private to
 * src/storage/l2 (docs/storage.md, "L2 hooks").  The storage manager does
 * not know adapters: the tier (library lmc_storage_l2, which depends on
 * this one and not the other way round) attaches itself here, and every
 * caller reaches it through storage/l2/l2_service.h.  The storage manager
 * needs only what its own contract promises about the tier: its part of
 * the status, and that close() closes it first, while L1 is still alive. */
#ifndef LMC_STORAGE_STORAGE_TIER_H
#define LMC_STORAGE_STORAGE_TIER_H

#include <jansson.h>

#include "storage/quota.h"
#include "storage/storage_manager.h"
#include "storage/storage_metrics.h"

typedef struct lmc_storage_tier_ops {
    /* New reference: an object whose fields are merged into the status. */
    json_t *(*report_status)(void *impl);
    /* Fills out[0..min(n, max)) with the adapters' figures, in priority
     * order; returns n, the number of adapters (storage_metrics.h). */
    size_t (*adapter_counts)(void *impl, lmc_storage_l2_counts *out, size_t max);
    /* Stops the tier's threads and frees it; runs while L1 is still alive. */
    void (*close)(void *impl);
} lmc_storage_tier_ops;

/* The storage manager owns `impl` from here on (close() closes it first).
 * Call once, before concurrent use. */
void lmc_storage_manager_attach_tier(lmc_storage_manager *sm, const lmc_storage_tier_ops *ops,
                                     void *impl);
/* The `impl` attached with exactly these `ops`, or NULL: a tier finds
 * itself again without the storage manager knowing its type. */
void *lmc_storage_manager_tier(const lmc_storage_manager *sm, const lmc_storage_tier_ops *ops);
/* The per-salt L2 quota registry: owned by the storage manager, so that
 * quotas set over HTTP exist with or without a tier (docs/l2.md). */
lmc_quotas *lmc_storage_manager_quotas(lmc_storage_manager *sm);

#endif
