/* Internal to the engine-driven transfer module (engine_driven.c: the
 * transfer ops; engine_driven_ctx.c: registration, reaping, lifetime). */
#ifndef LMC_MODULES_ED_INTERNAL_H
#define LMC_MODULES_ED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "modules/ipc_key.h"
#include "modules/layout_registry.h"
#include "modules/module.h"
#include "modules/reaper.h"
#include "storage/lease.h"

/* Reserved-but-unpublished writes, or handed-out reads, of one op key. */
typedef struct ed_pending {
    uint64_t digest;          /* of the key range, tokens, rank and salt */
    lmc_object_key *keys;     /* owned, each holding its string references */
    lmc_lease *leases;        /* WRITE leases (writes) or COPY leases (reads), owned */
    size_t n;
    struct ed_pending *next;
} ed_pending;

typedef struct {
    int64_t instance_id;
    const char *model;        /* interned, one reference held */
    uint32_t world_size;
    lmc_layout layout;
    char tag[40];             /* writer tag "ed:<instance_id>" */
    ed_pending *writes, *reads;
} ed_ctx;

typedef struct {
    lmc_module_ctx *ctx;
    uint32_t cs;
    pthread_mutex_t lock;     /* ctxs and every pending list */
    ed_ctx **ctxs;
    size_t n_ctxs, cap_ctxs;
    lmc_reaper *reaper;
    int64_t reap_timeout_ms, grace_ms;
    double cfg_reap_s, cfg_grace_s;
    atomic_uint_fast64_t chunks_reserved, chunks_committed, retrieves_ok, retrieves_failed,
        reaped;
} engine_mod;

/* One transfer op's decoded key and resolved single-rank ObjectKeys. */
typedef struct {
    int64_t instance_id;
    lmc_ipc_key key;
    lmc_object_key *keys;     /* n, chunk order */
    size_t n;
    size_t n_held;            /* keys filled, each holding its string references */
    uint64_t digest;
    bool registered;
    /* No object can have these keys: keys[] is not filled (a name never
     * interned, or one a full interner refused to a PREPARE_STORE). */
    bool unknown_names;
    lmc_layout layout;        /* copy (valid when registered) */
    char tag[40];
} ed_op;

void lmc_ed_op_free(ed_op *op);
void lmc_ed_ctx_destroy(engine_mod *m, ed_ctx *c);
lmc_handler_result lmc_ed_register(void *state, lmc_rpc_call *call);
lmc_handler_result lmc_ed_unregister(void *state, lmc_rpc_call *call);
int lmc_ed_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen);
void lmc_ed_close(void *state);

#endif
