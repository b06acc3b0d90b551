/* Worker reaper (docs/architecture.md, "Reaper"): a thread that wakes
 * every period (timeout/4 by default) and reaps the registered instances
 * that have been silent too long: longer than `timeout_ms` once
 * ping-proven, longer than `grace_ms` if never pinged.  Last-seen and
 * ping-proven come from the shared liveness registry (PING and every
 * transfer op write it).
 *
 * The owner supplies the instance list and the reap action, so one reaper
 * can serve any transfer module.  Clock and period are injectable so unit
 * tests reap without sleeping (no thread; call run_once). */
#ifndef LMC_MODULES_SERVICES_REAPER_H
#define LMC_MODULES_SERVICES_REAPER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/services/liveness.h"

typedef struct {
    int64_t timeout_ms;       /* 0: reaping disabled (no thread) */
    int64_t grace_ms;         /* never-pinged instances */
    int64_t period_ms;        /* 0: timeout_ms / 4 */
    lmc_liveness *liveness;
    /* Snapshot of the tracked instance ids: writes at most cap, returns the
     * total (call again with a larger buffer when it exceeds cap). */
    size_t (*list)(void *user, int64_t *ids, size_t cap);
    void (*reap)(void *user, int64_t instance_id);
    void *user;
    lmc_clock_ms_fn clock;    /* NULL: CLOCK_MONOTONIC */
    void *clock_user;
    bool start_thread;
} lmc_reaper_options;

typedef struct lmc_reaper lmc_reaper;

/* Sets timeout_ms and grace_ms from the flags' seconds
 * (--worker-reap-timeout-seconds, --worker-registration-grace-seconds).
 * LMCACHED_TEST_REAP_SCALE (test-only, undocumented for users) divides
 * both, so e2e tests see a reap within a second while the flags keep their
 * >= 30 s validation. */
void lmc_reaper_set_timeouts(lmc_reaper_options *o, double timeout_s, double grace_s);

/* NULL on allocation/thread failure. */
lmc_reaper *lmc_reaper_new(const lmc_reaper_options *o);
/* Stops and joins the thread. */
void lmc_reaper_free(lmc_reaper *r);
/* One pass: reaps what is overdue now; returns how many. */
size_t lmc_reaper_run_once(lmc_reaper *r);
bool lmc_reaper_due(const lmc_reaper_options *o, const lmc_liveness_entry *e, bool known,
                    int64_t now_ms);

#endif
