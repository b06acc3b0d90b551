/* A thread that calls a function every period, sooner when woken, until
 * stopped (docs/architecture.md, "Libraries"): the wait on a monotonic
 * clock, the stop flag and the join written once, so that a background
 * task is only its callback. */
#ifndef LMC_CORE_PERIODIC_H
#define LMC_CORE_PERIODIC_H

#include <stdint.h>

typedef struct lmc_core_periodic lmc_core_periodic;

typedef void (*lmc_core_periodic_fn)(void *user);

/* Starts the thread, named `name` (at most 15 bytes; NULL keeps the
 * process's name): fn(user) runs one period after the start, then one
 * period after each call returns (a period under 1 ms is 1 ms).  NULL when
 * no thread could be made. */
lmc_core_periodic *lmc_core_periodic_start(const char *name, int64_t period_ms,
                                           lmc_core_periodic_fn fn, void *user);

/* Makes the next call come now instead of at the end of the period. */
void lmc_core_periodic_wake(lmc_core_periodic *p);

/* Stops the thread (a call under way finishes first), joins it and frees
 * p.  NULL is allowed. */
void lmc_core_periodic_stop(lmc_core_periodic *p);

#endif
