/* Module compositor contract (upstream's MPCacheServer modules).
 *
 * A module is a static descriptor plus per-server state.  It contributes RPC
 * handler specs, a status report and a close step; the server composes the
 * enabled modules without knowing what they do.  Adding a capability (lookup,
 * transfer, P2P, blend) means adding a descriptor to the server's module list;
 * the RPC core and the other modules stay untouched. */
#ifndef LMC_MODULES_MODULE_H
#define LMC_MODULES_MODULE_H

#include <jansson.h>
#include <stddef.h>

#include "modules/context.h"
#include "rpc/rpc.h"

typedef struct lmc_module_def {
    const char *name;
    /* Creates the module state.  On failure writes one line to err. */
    int (*create)(lmc_module_ctx *ctx, void **state, char *err, size_t errlen);
    const lmc_rpc_handler_spec *handlers;  /* handler ctx = the module state */
    size_t n_handlers;
    /* Optional.  A new JSON object describing the module (owned by caller). */
    json_t *(*report_status)(void *state);
    /* Stops the module's threads, completes any deferred calls, frees state.
     * Called after the RPC workers are joined, in reverse creation order. */
    void (*close)(void *state);
} lmc_module_def;

extern const lmc_module_def lmc_management_module;
extern const lmc_module_def lmc_lookup_module;
extern const lmc_module_def lmc_engine_driven_module;
extern const lmc_module_def lmc_server_driven_module;

#endif
