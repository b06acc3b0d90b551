/* Storage telemetry (internal to the storage manager): turns what L1 does
 * into event-bus events for the metrics (obs/events.h lists them).
 *
 * Nothing is published until lmc_storage_manager_set_event_bus() attached a
 * bus; before that every hook returns at once, so unit tests and
 * --disable-observability pay nothing.  Hooks run on the threads of the
 * calls that produced them (L1 listener, eviction cycle), never with an L1
 * lock held, except the sampler, which the L1 manager calls under its mutex
 * and which only reads the rate. */
#ifndef LMC_STORAGE_STORAGE_TELEMETRY_H
#define LMC_STORAGE_STORAGE_TELEMETRY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "obs/event_bus.h"
#include "storage/l1/l1_manager.h"
#include "storage/ttl_lock.h"

typedef struct lmc_storage_telemetry lmc_storage_telemetry;

lmc_storage_telemetry *lmc_storage_telemetry_new(lmc_l1_manager *l1, lmc_clock_ms_fn clock,
                                                 void *clock_user);
void lmc_storage_telemetry_free(lmc_storage_telemetry *t);

/* Once, before concurrent use of the events it enables. */
void lmc_storage_telemetry_attach(lmc_storage_telemetry *t, lmc_event_bus *bus,
                                  double sample_rate);
bool lmc_storage_telemetry_enabled(const lmc_storage_telemetry *t);
/* Steals `metadata`; dropped when no bus is attached. */
void lmc_storage_telemetry_publish(lmc_storage_telemetry *t, const char *type,
                                   json_t *metadata);

/* Hooks (signatures of lmc_l1_sampler_fn, the eviction observers and an L1
 * listener; `user` is the telemetry). */
bool lmc_storage_telemetry_sample(const lmc_object_key *key, void *user);
void lmc_storage_telemetry_on_cycle(void *user, double usage_ratio, bool triggered);
void lmc_storage_telemetry_on_evicted(void *user, const lmc_object_key *keys,
                                      const lmc_l1_object_age *ages, size_t n);
void lmc_storage_telemetry_on_l1_event(lmc_storage_telemetry *t, lmc_l1_event_kind kind,
                                       const lmc_object_key *keys, size_t n);

/* Reserve-write and prefix-lock outcomes (the sm_* and
 * l1_allocation_failure metrics).  `during` names the caller's phase. */
void lmc_storage_telemetry_write_outcome(lmc_storage_telemetry *t, const lmc_object_key *keys,
                                         size_t n, const lmc_l1_result *results,
                                         const char *during);
void lmc_storage_telemetry_read_outcome(lmc_storage_telemetry *t, const lmc_object_key *keys,
                                        size_t n, size_t hits);

#endif
