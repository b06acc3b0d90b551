/* L1 eviction controller (docs/storage.md, "Eviction").
 *
 * Every period (1 s in production) it compares L1 usage (used / committed)
 * with the trigger watermark; at or above it, it asks the policy for
 * floor(tracked_keys x ratio) victims (at least 1), oldest first and only
 * among keys lmc_l1_manager_is_evictable() accepts, and deletes them with a
 * non-force delete, so locked and live staging objects are never evicted.
 *
 * The policy is fed by an L1 listener the controller registers at creation
 * (reserved/written -> added, touched -> accessed, deleted -> removed).
 *
 * Thread-safety: one controller thread (optional); run_once may also be
 * called from any thread (tests call it directly with period_ms = 0).
 * Counters are guarded by the controller's own mutex, which is never held
 * while calling the policy or the L1 manager. */
#ifndef LMC_STORAGE_L1_L1_EVICTION_H
#define LMC_STORAGE_L1_L1_EVICTION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/eviction_policy.h"
#include "storage/l1/l1_manager.h"

typedef struct lmc_l1_eviction_options {
    double trigger_watermark;    /* usage fraction that starts eviction */
    double eviction_ratio;       /* fraction of tracked keys per trigger */
    uint32_t period_ms;          /* 0: no thread, run_once only */
    /* Optional observers (metrics), called by whoever runs the cycle with
     * no lock held: every cycle's usage, and the keys a cycle evicted with
     * their ages (lmc_l1_manager_delete_aged). */
    void (*on_cycle)(void *user, double usage_ratio, bool triggered);
    void (*on_evicted)(void *user, const lmc_object_key *keys, const lmc_l1_object_age *ages,
                       size_t n);
    void *observer_user;
} lmc_l1_eviction_options;

typedef struct lmc_l1_eviction lmc_l1_eviction;

/* Takes ownership of `policy` (also on failure).  `l1` must outlive the
 * controller.  NULL on allocation failure. */
lmc_l1_eviction *lmc_l1_eviction_new(lmc_l1_manager *l1, lmc_eviction_policy *policy,
                                     const lmc_l1_eviction_options *opts);
/* Starts the controller thread (no-op when period_ms is 0).  0 or -1. */
int lmc_l1_eviction_start(lmc_l1_eviction *e);
/* Stops and joins the thread; idempotent. */
void lmc_l1_eviction_stop(lmc_l1_eviction *e);
/* One synchronous cycle; returns the number of keys evicted. */
size_t lmc_l1_eviction_run_once(lmc_l1_eviction *e);
/* {is_healthy, running, eviction_policy, trigger_watermark, eviction_ratio,
 *  num_tracked_keys, cycles, triggered_cycles, evicted_keys, last_usage_ratio} */
json_t *lmc_l1_eviction_report_status(lmc_l1_eviction *e);
/* The loop's counters, as report_status shows them (for the metrics). */
typedef struct {
    uint64_t cycles, triggered_cycles, evicted_keys;
} lmc_l1_eviction_counts;
lmc_l1_eviction_counts lmc_l1_eviction_get_counts(lmc_l1_eviction *e);
const char *lmc_l1_eviction_policy_name(const lmc_l1_eviction *e);
double lmc_l1_eviction_trigger_watermark(const lmc_l1_eviction *e);
/* The controller's rules as pure functions, for whoever replays an L1
 * without one (the trace what-if, docs/trace.md, "What-if"):
 *  - feed: what an L1 event tells the policy (added, accessed, removed);
 *  - triggered: whether a cycle at this usage evicts (used/total >= watermark);
 *  - plan: how many victims that cycle asks for, floor(tracked x ratio),
 *    at least 1, at most tracked; 0 when not triggered. */
void lmc_l1_eviction_feed(lmc_eviction_policy *policy, lmc_l1_event_kind kind,
                          const lmc_object_key *keys, size_t n);
bool lmc_l1_eviction_triggered(uint64_t used, uint64_t total, double trigger_watermark);
size_t lmc_l1_eviction_plan(uint64_t used, uint64_t total, size_t tracked,
                            double trigger_watermark, double ratio);
/* Stops the thread, unregisters the listener and frees the policy. */
void lmc_l1_eviction_free(lmc_l1_eviction *e);

#endif
