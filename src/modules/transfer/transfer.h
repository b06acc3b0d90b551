/* What both transfer modes (engine-driven and server-driven) do alike with
 * storage and events: reserving L1 room for their writes and publishing
 * their transfer events.  The instance registry (instance_registry.h) and
 * the request resolution (resolve.h) are the other shared steps. */
#ifndef LMC_MODULES_TRANSFER_TRANSFER_H
#define LMC_MODULES_TRANSFER_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "modules/services/ipc_key.h"
#include "obs/event_bus.h"
#include "storage/lease.h"
#include "storage/object_key.h"

typedef struct lmc_storage_manager lmc_storage_manager;

/* WRITE leases for the keys that are missing, with one eviction pass and a
 * retry when L1 is full.  Fills leases[i] and res[i] for keys[i].  A call that fails whole leaves
 * every key OUT_OF_MEMORY and no lease granted. */
void lmc_transfer_reserve_writes(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n,
                        uint64_t object_size, const char *tag, lmc_lease *leases,
                        lmc_l1_result *res);

/* STORE_* / RETRIEVE_* (obs/events.h) of one transfer of `chunks` chunks
 * and `bytes` bytes for key `k` of engine `instance`, on `device` ("cpu",
 * "cuda").  Nothing without a bus. */
void lmc_transfer_publish(lmc_event_bus *bus, const char *type, const lmc_ipc_key *k,
                          int64_t instance, const char *device, size_t chunks, uint64_t bytes);
/* The same event's session id and metadata, for publishing it later (an
 * END once a device copy completes).  meta: a new reference or NULL. */
json_t *lmc_transfer_meta(const lmc_ipc_key *k, int64_t instance, const char *device,
                          size_t chunks, uint64_t bytes, char *sid, size_t sid_len);

#endif
