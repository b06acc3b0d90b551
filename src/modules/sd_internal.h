/* Internal to the server-driven transfer module (sd_register.c:
 * registration, mappings, reaping, lifetime; lmcache_driven.c: STORE,
 * RETRIEVE and the module's face). */
#ifndef LMC_MODULES_SD_INTERNAL_H
#define LMC_MODULES_SD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "modules/bulk_copy.h"
#include "modules/kv_plan.h"
#include "modules/layout_registry.h"
#include "modules/module.h"
#include "modules/reaper.h"

/* One shared-memory segment of the engine, mapped read/write. */
typedef struct {
    char name[LMC_SHM_NAME_MAX + 1];
    uint8_t *addr;
    size_t len;
} sd_mapping;

/* A registered engine worker.  The module's list holds one reference and
 * every op in flight one more; the last one unmaps, so an unregister or a
 * reap never pulls pages from under a copy. */
typedef struct sd_ctx {
    int64_t instance_id;
    atomic_int refs;
    const char *model;           /* interned; NULL until known (2-frame REGISTER) */
    uint32_t world_size;
    bool layout_held;            /* a layout registry reference is ours */
    lmc_layout layout;
    lmc_kv_plan plan;
    uint32_t n_tensors;          /* registered */
    uint8_t ***bases;            /* [kernel group][tensor]: element 0 of each */
    sd_mapping *maps;
    size_t n_maps;
    char tag[40];                /* writer tag "sd:<instance_id>" */
} sd_ctx;

typedef struct {
    lmc_module_ctx *ctx;
    uint32_t cs;
    lmc_copy_method copy;
    bool force_hnd;              /* vLLM tensors on a server without a GPU */
    pthread_mutex_t lock;        /* ctxs, and each ctx's model/layout_held */
    sd_ctx **ctxs;
    size_t n_ctxs, cap_ctxs;
    lmc_reaper *reaper;
    atomic_uint_fast64_t registrations, registrations_refused, unregisters, reaped,
        stores_ok, stores_failed, retrieves_ok, retrieves_failed, chunks_stored,
        chunks_retrieved, bytes_stored, bytes_retrieved, store_ns, retrieve_ns;
} sd_mod;

/* The context of `id` with a reference for the caller, or NULL. */
sd_ctx *lmc_sd_get(sd_mod *m, int64_t id);
void lmc_sd_put(sd_mod *m, sd_ctx *c);
/* Registers the layout under the key's (model, world size) the first time
 * an op names them, for contexts registered without a model name. */
void lmc_sd_adopt_model(sd_mod *m, sd_ctx *c, const char *model, size_t len, uint32_t ws);

lmc_handler_result lmc_sd_register(void *state, lmc_rpc_call *call);
lmc_handler_result lmc_sd_unregister(void *state, lmc_rpc_call *call);
int lmc_sd_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen);
void lmc_sd_close(void *state);
json_t *lmc_sd_contexts_json(sd_mod *m);

#endif
