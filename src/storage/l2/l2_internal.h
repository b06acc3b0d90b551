/* Private to src/storage/l2: the two controllers the L2 service runs. */
#ifndef LMC_STORAGE_L2_INTERNAL_H
#define LMC_STORAGE_L2_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "storage/l2/l2_adapter.h"
#include "storage/l2/l2_service.h"
#include "storage/storage_manager.h"
#include "storage/storage_events.h"

#define LMC_L2_PREFETCH_TAG LMC_STORAGE_L2_PREFETCH_TAG

/* Write-behind (docs/l2.md, "Store controller (write-behind)"): one
 * thread.  Lifecycle: new ->
 * (running) -> stop (joins the thread, unregisters the listener) -> the
 * owner closes the adapters -> free (releases the read locks of stores that
 * never completed). */
typedef struct lmc_l2_store_ctl lmc_l2_store_ctl;
lmc_l2_store_ctl *lmc_l2_store_ctl_new(lmc_storage_manager *sm, lmc_l2_adapter *const *ad,
                                       size_t n_adapters, bool skip_l1);
void lmc_l2_store_ctl_stop(lmc_l2_store_ctl *c);
void lmc_l2_store_ctl_free(lmc_l2_store_ctl *c);
json_t *lmc_l2_store_ctl_status(lmc_l2_store_ctl *c);

/* Prefetch (docs/l2.md, "Prefetch (LOOKUP)"): one thread.  Lifecycle:
 * new -> submit* ->
 * stop (joins the thread; every undelivered request gets on_done(0)) ->
 * the owner closes the adapters -> free (drops leftover L1 staging). */
typedef struct lmc_l2_prefetch_ctl lmc_l2_prefetch_ctl;
typedef struct {
    bool retain;                 /* --l2-prefetch-policy retain */
    size_t max_in_flight;
    double load_timeout_s;       /* <= 0: none */
} lmc_l2_prefetch_options;
lmc_l2_prefetch_ctl *lmc_l2_prefetch_ctl_new(lmc_storage_manager *sm, lmc_l2_adapter *const *ad,
                                             size_t n_adapters,
                                             const lmc_l2_prefetch_options *o);
int lmc_l2_prefetch_ctl_submit(lmc_l2_prefetch_ctl *c, const lmc_l2_prefetch_request *req);
void lmc_l2_prefetch_ctl_stop(lmc_l2_prefetch_ctl *c);
void lmc_l2_prefetch_ctl_free(lmc_l2_prefetch_ctl *c);
json_t *lmc_l2_prefetch_ctl_status(lmc_l2_prefetch_ctl *c);

int64_t lmc_l2_now_ms(void);
double lmc_l2_now_s(void);   /* CLOCK_MONOTONIC, for task durations */

/* L2 events for the metrics (obs/events.h; no-ops without an event bus):
 * {by_salt} over keys[0..n), and one adapter task's {l2_name, bytes,
 * seconds}. */
void lmc_l2_publish_by_salt(lmc_storage_manager *sm, const char *type,
                            const lmc_object_key *keys, size_t n);
void lmc_l2_publish_task(lmc_storage_manager *sm, const char *type, const lmc_l2_adapter *a,
                         uint64_t bytes, double seconds);
void lmc_l2_publish_prefetch_failure(lmc_storage_manager *sm, const char *reason,
                                     const lmc_object_key *key, size_t n);

#endif
