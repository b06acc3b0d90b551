/* The storage manager's relays to observers outside the storage contract
 * (docs/storage.md, "StorageManager facade"): the event bus its L1 and its
 * L2 tier publish on (docs/metrics.md), and the stream of L2 placements the
 * fleet reporter forwards to the coordinator (docs/fleet.md). */
#ifndef LMC_STORAGE_STORAGE_EVENTS_H
#define LMC_STORAGE_STORAGE_EVENTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obs/event_bus.h"
#include "storage/object_key.h"
#include "storage/storage_manager.h"

/* ---- events (metrics) --------------------------------------------------
 * Attaches the event bus the storage manager and its L2 tier publish on
 * (obs/events.h: L1_*, SM_*, L2_*); `sample_rate` is --metrics-sample-rate
 * for the L1 lifecycle histograms.  Call once, before concurrent use;
 * without it nothing is published.  The bus must outlive the manager's
 * threads (close the storage manager first). */
void lmc_storage_manager_set_event_bus(lmc_storage_manager *sm, lmc_event_bus *bus,
                                       double sample_rate);
bool lmc_storage_manager_events_enabled(const lmc_storage_manager *sm);

/* ---- the trace recorder (docs/trace.md) --------------------------------
 * Every reserve/finish/abort of a write is recorded into `trace` from here
 * on.  Call once, before concurrent use; close the trace after the
 * storage manager. */
struct lmc_storage_trace;
void lmc_storage_manager_set_trace(lmc_storage_manager *sm, struct lmc_storage_trace *trace);
/* Publishes (steals `metadata`); a no-op without a bus.  For the modules
 * and the L2 tier, whose events belong to the storage's metrics. */
void lmc_storage_manager_publish(lmc_storage_manager *sm, const char *type, json_t *metadata);
/* L1_READ_FAILURE: n keys a caller expected to read (after a lookup, or
 * for the L2 write-behind) were not readable.  `key` names the model. */
void lmc_storage_manager_report_read_failure(lmc_storage_manager *sm, const char *during,
                                             const char *reason, const lmc_object_key *key,
                                             size_t n);
/* {cache_salt: number of keys} (new reference; NULL on allocation failure). */
json_t *lmc_storage_keys_by_salt(const lmc_object_key *keys, size_t n);

/* ---- L2 placements (the coordinator's cache-event stream, docs/fleet.md)
 * What each L2 adapter stored (with sizes), deleted (sizes NULL) and loaded
 * back into L1 (an access; sizes NULL), named by the adapter's type and its
 * "shared" flag.  Reported on adapter worker threads or the deleting
 * thread, never with a lock held; the sink must be quick and must not
 * block.  Without a sink a report costs one atomic load per slot. */
typedef enum lmc_placement_kind {
    LMC_PLACEMENT_STORED,
    LMC_PLACEMENT_DELETED,
    LMC_PLACEMENT_ACCESSED,
} lmc_placement_kind;
typedef struct lmc_l2_placement_sink {
    void (*fn)(void *user, lmc_placement_kind kind, const char *backend, bool shared,
               const lmc_object_key *keys, const uint64_t *sizes, size_t n);
    void *user;
} lmc_l2_placement_sink;
/* Up to LMC_STORAGE_MAX_PLACEMENT_SINKS sinks (the fleet reporter, the KV
 * event log) hear every report; 0, or -1 when every slot is taken.  A sink
 * must outlive the storage manager's L2 threads, or be removed before it
 * goes away. */
#define LMC_STORAGE_MAX_PLACEMENT_SINKS 4
int lmc_storage_manager_add_l2_placement_sink(lmc_storage_manager *sm,
                                              const lmc_l2_placement_sink *sink);
void lmc_storage_manager_remove_l2_placement_sink(lmc_storage_manager *sm,
                                                  const lmc_l2_placement_sink *sink);
void lmc_storage_manager_report_l2_placement(lmc_storage_manager *sm, lmc_placement_kind kind,
                                             const char *backend, bool shared,
                                             const lmc_object_key *keys, const uint64_t *sizes,
                                             size_t n);
/* sizes[i]: raw bytes of keys[i]'s resident L1 copy, 0 when not resident
 * (takes the L1 lock once; for reporters, off the request path). */
void lmc_storage_manager_resident_sizes(lmc_storage_manager *sm, const lmc_object_key *keys,
                                        size_t n, uint64_t *sizes);

#endif
