/* Shared between metrics.c and metrics_sources.c only. */
#ifndef LMC_OBS_METRICS_INTERNAL_H
#define LMC_OBS_METRICS_INTERNAL_H

#include "obs/metrics.h"

/* Like lmc_metrics_add_collector(), but the registry owns `user` (a
 * malloc'd block, freed with the registry, or at once when this fails). */
int lmc_metrics_add_owned_collector(lmc_metrics *r, lmc_metrics_collect_fn fn, void *user);

#endif
