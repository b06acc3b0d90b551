#include "obs/event_logging.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/json_dump.h"
#include "obs/log.h"

void lmc_event_logging_format(const lmc_event *ev, char *buf, size_t len)
{
    char *meta = ev->metadata ? lmc_json_dumps(ev->metadata, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    const char *shown = meta ? meta : "{}";
    bool cut = strlen(shown) > LMC_EVENT_LOG_MAX_META;
    snprintf(buf, len, "event %s session=%s t=%.6f %.*s%s", ev->type, ev->session_id,
             ev->timestamp, LMC_EVENT_LOG_MAX_META, shown, cut ? "..." : "");
    free(meta);
}

static void on_event(const lmc_event *ev, void *user)
{
    (void)user;
    if (!lmc_log_enabled(LMC_LOG_DEBUG))
        return; /* skip the JSON dump when nobody reads it */
    char line[LMC_EVENT_LOG_MAX_META + 256];
    lmc_event_logging_format(ev, line, sizeof line);
    LMC_DEBUG("%s", line);
}

int lmc_event_logging_attach(lmc_event_bus *bus)
{
    return lmc_event_bus_subscribe(bus, NULL, on_event, NULL);
}
