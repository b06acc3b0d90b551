/* Worker liveness registry: when each engine worker (instance id) was last
 * heard from and whether it has proven itself with a PING.  PING feeds it;
 * the transfer modules' reaper reads it (docs/architecture.md, "Reaper"). */
#ifndef LMC_MODULES_LIVENESS_H
#define LMC_MODULES_LIVENESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/ttl_lock.h" /* lmc_monotonic_ms */

typedef struct lmc_liveness lmc_liveness;

typedef struct {
    int64_t instance_id;
    int64_t last_seen_ms;    /* lmc_monotonic_ms() */
    bool pinged;
} lmc_liveness_entry;

lmc_liveness *lmc_liveness_new(void);
void lmc_liveness_free(lmc_liveness *lv);
/* Records a signal from `instance_id` at now_ms; `ping` marks it ping-proven. */
int lmc_liveness_touch(lmc_liveness *lv, int64_t instance_id, int64_t now_ms, bool ping);
bool lmc_liveness_get(lmc_liveness *lv, int64_t instance_id, lmc_liveness_entry *out);
void lmc_liveness_forget(lmc_liveness *lv, int64_t instance_id);
size_t lmc_liveness_count(lmc_liveness *lv);

#endif
