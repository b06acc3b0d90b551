/* Span recorder (--enable-tracing): turns LOOKUP/STORE/RETRIEVE _START and
 * _END events into OTLP spans "mp.lookup_prefetch", "mp.store" and
 * "mp.retrieve" (docs/observability.md, "OTLP export").  A span opens on
 * *_START and closes on
 * the *_END with the same session id; an END without its START becomes a
 * zero-length span with attribute lmc.unpaired="true".  Attributes: every
 * END metadata entry as a string, plus session_id.  All spans of one
 * session id share a trace id.
 *
 * Finished spans wait (at most max_pending; more are dropped and counted)
 * until the OTLP exporter takes them.  Thread-safe. */
#ifndef LMC_OBS_SPANS_H
#define LMC_OBS_SPANS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "obs/event_bus.h"

typedef struct lmc_span_recorder lmc_span_recorder;

lmc_span_recorder *lmc_span_recorder_new(size_t max_pending);
/* Subscribes to the six events; free the bus before the recorder. */
int lmc_span_recorder_attach(lmc_span_recorder *r, lmc_event_bus *bus);
/* What the subscriber does with one event (exposed for tests). */
void lmc_span_recorder_record(lmc_span_recorder *r, const lmc_event *ev);
/* The finished spans as an array of OTLP JSON span objects (new
 * reference, possibly empty); the recorder forgets them. */
json_t *lmc_span_recorder_take(lmc_span_recorder *r);
uint64_t lmc_span_recorder_dropped(lmc_span_recorder *r);
void lmc_span_recorder_free(lmc_span_recorder *r);

#endif
