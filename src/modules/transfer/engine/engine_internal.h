/* Internal to the engine-driven transfer module (engine_driven.c: the
 * transfer ops; contexts.c: registration, how a context ends, lifetime). */
#ifndef LMC_MODULES_TRANSFER_ENGINE_ENGINE_INTERNAL_H
#define LMC_MODULES_TRANSFER_ENGINE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "modules/transfer/engine/group_wire.h"
#include "modules/services/ipc_key.h"
#include "modules/services/layout_registry.h"
#include "modules/module.h"
#include "modules/transfer/instance_registry.h"
#include "storage/lease.h"

/* Reserved-but-unpublished writes, or handed-out reads, of one op key. */
typedef struct ed_pending {
    uint64_t digest;          /* of the key range, tokens, rank and salt */
    lmc_object_key *keys;     /* owned, each holding its string references */
    lmc_lease *leases;        /* WRITE leases (writes) or COPY leases (reads), owned */
    size_t n;
    uint64_t bytes;           /* of the n objects, for the COMMIT's event */
    struct ed_pending *next;
} ed_pending;

typedef struct {
    int64_t instance_id;
    const char *model;        /* interned, one reference held */
    uint32_t world_size;
    lmc_layout layout;
    lmc_engine_driven_groups *groups;    /* one reference; NULL for a single-group layout */
    char tag[40];             /* writer tag "ed:<instance_id>" */
    ed_pending *writes, *reads;
} ed_ctx;

typedef struct {
    lmc_module_ctx *ctx;
    uint32_t cs;
    /* ed_ctx by instance id; its lock guards every pending list too */
    lmc_transfer_registry instances;
    double cfg_reap_s, cfg_grace_s;
    atomic_uint_fast64_t chunks_reserved, chunks_committed, retrieves_ok, retrieves_failed;
} engine_mod;

/* One transfer op's decoded key and resolved single-rank ObjectKeys. */
typedef struct {
    int64_t instance_id;
    lmc_ipc_key key;
    lmc_object_key *keys;     /* n_keys, chunk-major: keys[c * groups + g] */
    size_t n;                 /* chunks */
    size_t n_keys;            /* n x the layout's object groups */
    size_t n_held;            /* keys filled, each holding its string references */
    uint64_t digest;
    bool registered;
    /* No object can have these keys: keys[] is not filled (a name never
     * interned, or one a full interner refused to a PREPARE_STORE). */
    bool unknown_names;
    lmc_layout layout;        /* copy (valid when registered) */
    lmc_engine_driven_groups *groups;    /* a reference, when the context has several groups */
    char tag[40];
} ed_op;

void lmc_engine_driven_op_free(ed_op *op);

/* engine_driven.c, shared with group_ops.c */
ed_ctx *lmc_engine_driven_find_ctx_locked(engine_mod *m, int64_t id);
/* Records `keys` (owned from here on success, with the string references
 * they hold) and a copy of their leases under (instance, op key); false if
 * the instance's context is gone (or memory ran out): the caller still
 * holds the leases then. */
bool lmc_engine_driven_add_pending(engine_mod *m, const ed_op *op, lmc_object_key *keys,
                        const lmc_lease *leases, size_t n, uint64_t bytes, bool write);
/* Records a PREPARE_STORE's `ok` reservations as pending writes
 * (`reserved`, owned from here either way).  Returns ok, or 0 when the
 * instance went away meanwhile: then they are given back, never published. */
size_t lmc_engine_driven_keep_reserved(engine_mod *m, const ed_op *op, lmc_object_key *reserved,
                            lmc_lease *granted, size_t ok, uint64_t bytes);
/* STORE_* / RETRIEVE_* of the op (obs/events.h). */
void lmc_engine_driven_publish_transfer(engine_mod *m, const char *type, const ed_op *op, size_t chunks,
                             uint64_t bytes);
/* Slot = {"offset", "length", "shape", "dtype"} (docs/protocol.md). */
void lmc_engine_driven_pack_slot(msgpack_packer *pk, uint64_t offset, uint64_t length, uint32_t ndim,
                      const uint64_t *shape, const char *dtype);
/* {"success", "data": b"", "context": <packed next by the caller>} */
void lmc_engine_driven_pack_retrieve_head(msgpack_packer *pk, bool success);

/* group_ops.c: the PREPAREs of a multi-group context (op->groups
 * set), which reply on `call`. */
void lmc_engine_driven_pack_groups_context(msgpack_packer *pk, const lmc_engine_driven_groups *g, size_t n,
                                const lmc_lease *leases, const bool *in);
void lmc_engine_driven_prepare_store_groups(engine_mod *m, lmc_rpc_call *call, ed_op *op);
void lmc_engine_driven_prepare_retrieve_groups(engine_mod *m, lmc_rpc_call *call, ed_op *op);
void lmc_engine_driven_ctx_destroy(engine_mod *m, ed_ctx *c);
lmc_handler_result lmc_engine_driven_register(void *state, lmc_rpc_call *call);
lmc_handler_result lmc_engine_driven_unregister(void *state, lmc_rpc_call *call);
int lmc_engine_driven_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen);
void lmc_engine_driven_close(void *state);

#endif
