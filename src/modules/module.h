/* Module compositor contract (upstream's MPCacheServer modules).
 *
 * A module is a static descriptor plus per-server state.  It contributes RPC
 * handler specs, a status report, its HTTP routes and metrics and a close step; the
 * server composes the enabled modules without knowing what they do.  Adding a capability (lookup,
 * transfer, P2P, blend) means adding a descriptor to the server's module list;
 * the RPC core and the other modules stay untouched. */
#ifndef LMC_MODULES_MODULE_H
#define LMC_MODULES_MODULE_H

#include <jansson.h>
#include <stddef.h>

#include "http/http_routes.h"
#include "modules/context.h"
#include "obs/metrics.h"
#include "rpc/rpc.h"

typedef struct lmc_module_def {
    const char *name;
    /* Creates the module state.  On failure writes one line to err. */
    int (*create)(lmc_module_ctx *ctx, void **state, char *err, size_t errlen);
    const lmc_rpc_handler_spec *handlers;  /* handler ctx = the module state */
    size_t n_handlers;
    /* Optional.  A new JSON object describing the module (owned by caller). */
    json_t *(*report_status)(void *state);
    /* Optional.  Adds the module's HTTP rows to the frontend's table
     * (docs/architecture.md, "HTTP routes"), handler ctx = the state.
     * Called once the module exists, and with state NULL for a module the
     * configuration leaves out, so that its rows can say so (501) rather
     * than vanish (404).  0, or -1 when the table is full. */
    int (*register_http)(void *state, lmc_http_routes *routes);
    /* Optional.  Registers the module's metric families and a collector
     * reading its typed counters (docs/metrics.md).  Called once the module
     * exists, unless metrics are disabled; with state NULL for a module the
     * configuration leaves out, which registers its families alone (they
     * stay 0, as docs/metrics.md lists them either way).  0 or -1. */
    int (*register_metrics)(void *state, lmc_metrics *metrics);
    /* Stops the module's threads, completes any deferred calls, frees state.
     * Called after the RPC workers are joined, in reverse creation order. */
    void (*close)(void *state);
} lmc_module_def;

extern const lmc_module_def lmc_management_module;
extern const lmc_module_def lmc_kv_events_module;
extern const lmc_module_def lmc_lookup_module;
extern const lmc_module_def lmc_engine_driven_module;
extern const lmc_module_def lmc_server_driven_module;

#endif
