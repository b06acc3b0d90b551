/* What the server hands to every module: shared services, all owned by the
 * server and valid for the modules' whole lifetime. */
#ifndef LMC_MODULES_CONTEXT_H
#define LMC_MODULES_CONTEXT_H

#include "config/config.h"
#include "hash/token_hash.h"
#include "modules/services/layout_registry.h"
#include "modules/services/liveness.h"
#include "modules/services/sessions.h"
#include "obs/event_bus.h"
#include "storage/object_key.h"

typedef struct lmc_storage_manager lmc_storage_manager;
typedef struct lmc_kv_events lmc_kv_events;

typedef struct lmc_module_ctx {
    const lmc_config *config;
    lmc_storage_manager *storage;   /* the L1 (and later L2) storage */
    lmc_event_bus *events;          /* NULL with --disable-observability */
    lmc_liveness *liveness;         /* worker heartbeats (PING) */
    const lmc_token_hasher *hasher; /* --hash-algorithm, --chunk-size */
    lmc_key_interner *interner;     /* model names and salts of object keys */
    lmc_layout_registry *layouts;   /* (model, world_size) -> object layout */
    lmc_sessions *sessions;         /* per request id: hash chain, lookup locks */
    lmc_kv_events *kv_events;       /* NULL with --kv-event-log-size 0 (docs/kv_events.md) */
    /* Modules that later modules build on, set by each at its creation
     * (NULL when the configuration leaves it out): the lookup module's
     * state (modules/lookup/lookup.h) and the server-driven transfer's
     * (the blend module reads its registrations). */
    void *lookup;
    void *server_driven;
} lmc_module_ctx;

#endif
