/* Private to src/storage/l2: the health monitor of the L2 service
 * (docs/l2.md, "Health").  Lifecycle: new (probes every adapter once,
 * then every period on its own thread) -> get/annotate from any thread ->
 * free (joins the thread; before the adapters close). */
#ifndef LMC_STORAGE_L2_HEALTH_H
#define LMC_STORAGE_L2_HEALTH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/l2/l2_adapter.h"

typedef struct lmc_l2_health_state {
    bool healthy;
    char reason[512];        /* "" when healthy; printable ASCII */
    int64_t since_ms;        /* Unix ms of the last change of healthy; 0 = never probed */
} lmc_l2_health_state;

typedef enum {
    LMC_L2_HEALTH_SAME,      /* nothing to log (also: healthy at the first probe) */
    LMC_L2_HEALTH_FAILED,    /* unhealthy now, or unhealthy for another reason */
    LMC_L2_HEALTH_RECOVERED, /* healthy again */
} lmc_l2_health_change;

/* Records one probe's verdict in st (pure: the caller locks). */
lmc_l2_health_change lmc_l2_health_record(lmc_l2_health_state *st, bool healthy,
                                          const char *reason, int64_t now_ms);

typedef struct lmc_l2_health lmc_l2_health;
/* ad[0..n) is borrowed and must outlive the monitor.  period_s <= 0: the
 * probe at start only.  NULL when out of memory or no thread. */
lmc_l2_health *lmc_l2_health_new(lmc_l2_adapter *const *ad, size_t n, double period_s);
void lmc_l2_health_free(lmc_l2_health *h);
/* Adapter i's last verdict (healthy when h is NULL or i out of range). */
void lmc_l2_health_get(lmc_l2_health *h, size_t i, lmc_l2_health_state *out);
/* Sets is_healthy, health_reason (null when healthy) and health_since_ms
 * in adapter i's status object.  0 or -1. */
int lmc_l2_health_annotate(lmc_l2_health *h, size_t i, json_t *adapter_status);

#endif
