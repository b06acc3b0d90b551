/* Event bus: producers publish (type, timestamp, session id, metadata) into
 * a bounded queue; one drain thread hands each event to every subscriber of
 * its type.  Publishing never blocks: when the queue is full the event is
 * dropped and counted (docs/observability.md, "Event bus"). */
#ifndef LMC_OBS_EVENT_BUS_H
#define LMC_OBS_EVENT_BUS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lmc_event {
    const char *type;         /* static string, e.g. "REPORT_BLOCK_ALLOCATION" */
    double timestamp;         /* wall clock, seconds */
    char session_id[64];
    json_t *metadata;         /* owned by the event; may be NULL */
} lmc_event;

/* `type` NULL subscribes to every event.  Runs on the drain thread. */
typedef void (*lmc_event_fn)(const lmc_event *event, void *user);

typedef struct lmc_event_bus lmc_event_bus;

typedef struct {
    uint64_t published, delivered, dropped;
    size_t queued;
    double oldest_timestamp;  /* of the oldest queued event; 0 when empty */
} lmc_event_bus_stats;

lmc_event_bus *lmc_event_bus_new(size_t capacity);
int lmc_event_bus_subscribe(lmc_event_bus *bus, const char *type, lmc_event_fn fn, void *user);
/* Steals `metadata`.  Safe from any thread; never blocks on subscribers. */
void lmc_event_bus_publish(lmc_event_bus *bus, const char *type, const char *session_id,
                           json_t *metadata);
/* Builds an event's metadata from `arg` and consumes `arg` (frees it). */
typedef json_t *(*lmc_event_build_fn)(void *arg);
/* Like publish, but the metadata is built by `build(arg)` on the drain
 * thread just before delivery, so a request thread only pays for copying
 * its facts, not for formatting JSON.  A dropped event is built and freed
 * at once.  `build` must not touch what the publisher may change later. */
void lmc_event_bus_publish_deferred(lmc_event_bus *bus, const char *type, const char *session_id,
                                    lmc_event_build_fn build, void *arg);
lmc_event_bus_stats lmc_event_bus_get_stats(lmc_event_bus *bus);
/* Waits until every event published before the call has been handed to
 * the subscribers, or `timeout_s` passed.  0 when drained, -1 on timeout.
 * Not from a subscriber (it would wait for itself). */
int lmc_event_bus_drain(lmc_event_bus *bus, double timeout_s);
/* Delivers what is queued, stops the drain thread, frees everything. */
void lmc_event_bus_free(lmc_event_bus *bus);

#endif
