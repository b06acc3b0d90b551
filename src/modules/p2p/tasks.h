/* The P2P serving side's lookup results (docs/p2p.md, "Serving side",
 * "Bounds"): each waits, under its task id, to be handed out once by
 * P2P_QUERY_LOOKUP_RESULTS.  Bounded in count and in total addresses; a
 * result nobody queries within the TTL is dropped, and when a new one does
 * not fit the oldest go first.  Thread-safe. */
#ifndef LMC_MODULES_P2P_TASKS_H
#define LMC_MODULES_P2P_TASKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/p2p/lease_registry.h"
#include "storage/ttl_lock.h"

/* One key's TransferChannelAddress: offset -1, size 0 for a miss. */
typedef struct lmc_p2p_serve_addr {
    int64_t offset;
    uint64_t size;
} lmc_p2p_serve_addr;

typedef struct lmc_p2p_serve_tasks lmc_p2p_serve_tasks;

typedef struct lmc_p2p_serve_task_counts {
    size_t pending, entries;
    uint64_t expired, dropped;   /* lapsed unqueried / dropped for room */
} lmc_p2p_serve_task_counts;

/* max_tasks, max_entries, ttl_ms > 0.  clock NULL: CLOCK_MONOTONIC. */
lmc_p2p_serve_tasks *lmc_p2p_serve_tasks_new(size_t max_tasks, size_t max_entries,
                                             int64_t ttl_ms, lmc_clock_ms_fn clock,
                                             void *clock_user);
void lmc_p2p_serve_tasks_free(lmc_p2p_serve_tasks *t);

/* Keeps addrs[0..n) (taking over the malloc'd array; n <= max_entries),
 * the result of a lookup by `owner`, and returns its id, never reused and
 * never 0; 0 when n is over the bound or memory ran out (addrs is freed
 * either way). */
uint64_t lmc_p2p_serve_tasks_add(lmc_p2p_serve_tasks *t, const lmc_p2p_serve_owner *owner,
                                 lmc_p2p_serve_addr *addrs, size_t n);
/* Hands the result of task `id` over (the caller frees *addrs) and forgets
 * it; false for an unknown, lapsed or already taken id. */
bool lmc_p2p_serve_tasks_take(lmc_p2p_serve_tasks *t, uint64_t id, lmc_p2p_serve_addr **addrs,
                              size_t *n);
/* Drops the results older than the TTL; returns how many. */
size_t lmc_p2p_serve_tasks_sweep(lmc_p2p_serve_tasks *t);
/* Results dropped without being handed out (lapsed, or for room) are
 * abandoned: no one learnt of their leases, so no one will unlock them.
 * Calls fn(user, owner, addrs, n) for each abandoned since the last call,
 * outside the table's lock, and forgets it; returns how many. */
typedef void (*lmc_p2p_serve_abandoned_fn)(void *user, const lmc_p2p_serve_owner *owner,
                                           const lmc_p2p_serve_addr *addrs, size_t n);
size_t lmc_p2p_serve_tasks_reap(lmc_p2p_serve_tasks *t, lmc_p2p_serve_abandoned_fn fn,
                                void *user);
void lmc_p2p_serve_tasks_counts(lmc_p2p_serve_tasks *t, lmc_p2p_serve_task_counts *out);

#endif
