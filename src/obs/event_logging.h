/* The logging subscriber (--disable-logging turns it off): every event is
 * logged at DEBUG through LMC_DEBUG as
 *     event TYPE session=ID t=TIMESTAMP METADATA-JSON
 * with the metadata cut at LMC_EVENT_LOG_MAX_META bytes.  Stateless: the
 * subscription holds no pointer, so it needs no cleanup. */
#ifndef LMC_OBS_EVENT_LOGGING_H
#define LMC_OBS_EVENT_LOGGING_H

#include <stddef.h>

#include "obs/event_bus.h"

#define LMC_EVENT_LOG_MAX_META 1024

int lmc_event_logging_attach(lmc_event_bus *bus);
/* The line the subscriber logs, into buf (exposed for tests). */
void lmc_event_logging_format(const lmc_event *ev, char *buf, size_t len);

#endif
