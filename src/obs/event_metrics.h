/* Event-driven metrics (docs/metrics.md, "Event-driven families"):
 * subscribes a registry to the
 * events of events.h and turns them into counters and histograms.  Every
 * counter counts every event; the L1 lifecycle histograms observe what the
 * events carry, which the producer has sampled already (events.h).
 * docs/metrics.md lists the families. */
#ifndef LMC_OBS_EVENT_METRICS_H
#define LMC_OBS_EVENT_METRICS_H

#include "obs/event_bus.h"
#include "obs/metrics.h"

/* The registry owns the subscriber state: free the bus before it. */
int lmc_metrics_attach_event_metrics(lmc_metrics *r, lmc_event_bus *bus);

#endif
