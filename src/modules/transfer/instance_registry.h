/* The registered instances of one transfer mode (engine-driven or
 * server-driven), by instance id, with their reaper (docs/architecture.md,
 * "Reaper"): finding, adding, unregistering and reaping an instance are
 * the same in both modes; what an instance's context holds, and how it
 * ends, is the mode's.
 *
 * Locking: `lock` guards the list, and the mode may guard its own state
 * with it too (the engine-driven pending lists, the server-driven model
 * binding); the mode's `drop` runs without it.  The struct lives inside
 * the mode's state, so a request pays no allocation for it. */
#ifndef LMC_MODULES_TRANSFER_INSTANCE_REGISTRY_H
#define LMC_MODULES_TRANSFER_INSTANCE_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/services/liveness.h"
#include "modules/services/reaper.h"

typedef struct {
    int64_t instance_id;
    void *ctx;                   /* the mode's context */
} lmc_transfer_instance;

typedef struct {
    const char *mode;            /* "engine-driven", "server-driven": in log lines */
    /* Ends an instance unregistered or reaped, already unlinked; the mode
     * forgets its liveness in the order it needs. */
    void (*drop)(void *user, void *ctx, int64_t instance_id);
    void *user;
} lmc_transfer_registry_ops;

typedef struct {
    pthread_mutex_t lock;
    lmc_transfer_instance *items;
    size_t n, cap;
    lmc_transfer_registry_ops ops;
    lmc_reaper *reaper;
    int64_t reap_timeout_ms;     /* 0: reaping disabled */
    atomic_uint_fast64_t reaped;
} lmc_transfer_registry;

/* Starts the reaper over liveness `lv` with the flags' timeouts.  0, or -1
 * when it cannot start (nothing to undo then). */
int lmc_transfer_registry_init(lmc_transfer_registry *r, const lmc_transfer_registry_ops *ops,
                               lmc_liveness *lv, double reap_timeout_s, double grace_s);
/* Stops the reaper: no drop runs after this. */
void lmc_transfer_registry_stop(lmc_transfer_registry *r);
/* After stop: unlinks the last instance, or NULL when none is left (the
 * mode's close ends each without forgetting its liveness). */
void *lmc_transfer_registry_pop(lmc_transfer_registry *r);
/* After the last pop, and after the mode's last use of `lock`. */
void lmc_transfer_registry_destroy(lmc_transfer_registry *r);

/* The context of `id`, or NULL; `lock` held. */
void *lmc_transfer_registry_find_locked(const lmc_transfer_registry *r, int64_t id);
bool lmc_transfer_registry_has(lmc_transfer_registry *r, int64_t id);
/* 0, or -1 when memory ran out (the context is not added then). */
int lmc_transfer_registry_add(lmc_transfer_registry *r, int64_t id, void *ctx);
/* Unlinks `id` and hands it to the mode's drop; false if not registered. */
bool lmc_transfer_registry_drop(lmc_transfer_registry *r, int64_t id);

#endif
