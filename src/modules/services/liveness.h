/* Worker liveness registry: when each engine worker (instance id) was last
 * heard from and whether it has proven itself with a PING.  Registrations
 * and PING feed it; the transfer modules' reaper reads it
 * (docs/architecture.md, "Reaper").  Every client can name any id, so it
 * holds the registered instances plus at most LMC_LIVENESS_MAX_UNREGISTERED
 * ids that only PINGed, and finds an id in O(1). */
#ifndef LMC_MODULES_SERVICES_LIVENESS_H
#define LMC_MODULES_SERVICES_LIVENESS_H

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

#define LMC_LIVENESS_MAX_UNREGISTERED 1024

lmc_liveness *lmc_liveness_new(void);
void lmc_liveness_free(lmc_liveness *lv);
/* A registration of `instance_id` (kept until forgotten). */
int lmc_liveness_register(lmc_liveness *lv, int64_t instance_id, int64_t now_ms);
/* Records a signal from `instance_id` at now_ms; `ping` marks it
 * ping-proven.  An op of an id that is not there records nothing; a PING
 * of one is remembered among the last LMC_LIVENESS_MAX_UNREGISTERED such
 * ids (a worker may ping before it registers). */
int lmc_liveness_touch(lmc_liveness *lv, int64_t instance_id, int64_t now_ms, bool ping);
bool lmc_liveness_get(lmc_liveness *lv, int64_t instance_id, lmc_liveness_entry *out);
void lmc_liveness_forget(lmc_liveness *lv, int64_t instance_id);
size_t lmc_liveness_count(lmc_liveness *lv);

#endif
