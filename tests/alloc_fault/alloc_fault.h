/* Allocation-failure testing (docs/testing.md, "Allocation-failure
 * testing"): "the n-th allocation fails".
 *
 * A test binary links alloc_fault.c with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,--wrap=strndup
 * (cmake/alloc_fault.cmake does it), so every allocation made by code linked
 * into the binary, the project libraries included, goes through the
 * wrappers here.  jansson is routed through them too (json_set_alloc_funcs,
 * before main), and so is msgpack-c when the build links its static
 * archive.  jansson's loader (json_loads, json_loadb: also wrapped) counts
 * as one allocation that fails as a whole with an out-of-memory error, see
 * alloc_fault.c.  Other shared libraries (libzmq, OpenSSL, libc itself)
 * allocate on their own and are neither counted nor failed.
 *
 * The wrappers count allocations, fail the armed one, and keep the set of
 * live blocks they handed out, so that a run can be checked for leaks.  A
 * free() of a pointer not in the set (memory from a library) passes
 * through uncounted.  The wrappers are thread-safe, and allocations on every
 * thread count and can fail; the driver runs one scenario at a time. */
#ifndef LMC_TESTS_ALLOC_FAULT_H
#define LMC_TESTS_ALLOC_FAULT_H

#include <stdbool.h>
#include <stddef.h>

/* ---- the injector -------------------------------------------------------- */

/* Starts a new count: the n-th allocation from now (1 = the next one)
 * returns NULL (errno ENOMEM); with `persistent`, every allocation after it
 * fails as well.  n <= 0 only counts.  Resets lmc_fault_count() and
 * lmc_fault_fired(). */
void lmc_fault_arm(long n, bool persistent);
/* No allocation fails from now on; the count stops. */
void lmc_fault_disarm(void);
/* Whether an allocation failed (was made to fail) since the last arm. */
bool lmc_fault_fired(void);
/* Allocation calls since the last arm, the failed ones included. */
long lmc_fault_count(void);

/* On the calling thread, allocations between pause and resume are neither
 * counted nor failed (they are still tracked for leaks).  Pauses nest.  For
 * set-up inside a scenario that is not what the scenario tests. */
void lmc_fault_pause(void);
void lmc_fault_resume(void);

/* Blocks handed out by the wrappers and not freed yet. */
long lmc_fault_live_blocks(void);

/* ---- the driver ---------------------------------------------------------- */

/* What a scenario returns. */
enum {
    LMC_FAULT_OK = 0,        /* the operation succeeded and its result is right */
    LMC_FAULT_ERROR = 1,     /* it failed, the caller was told (the scenario
                              * checked the error code or message), and
                              * nothing half-built is visible */
    LMC_FAULT_VIOLATION = -1 /* anything else: use lmc_fault_violation() */
};

/* Records why a run broke the contract (printed by the driver with the
 * failure point) and returns LMC_FAULT_VIOLATION, so a scenario or a check
 * can write `return lmc_fault_violation("...", ...);`. */
int lmc_fault_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One scenario for lmc_fault_run_spec(). */
typedef struct {
    const char *name;            /* "ipc_key.decode", printed in every line */
    int (*scenario)(void *arg);  /* one self-contained operation: LMC_FAULT_* */
    void *arg;
    /* Optional invariant check after every run, with nothing armed: 0 when
     * the state the scenario left is consistent, else a violation. */
    int (*check)(void *arg);
    /* Failure points to try.  0: LMC_ALLOC_FAULT_MAX_N from the environment,
     * else every point.  When the scenario makes more allocations than this,
     * the first half of the budget goes to points 1, 2, 3, ... and the rest
     * is spread evenly over the remaining points up to the last one.  The
     * environment variable, when set, overrides this (0 = every point). */
    long max_n;
    bool transient_only;         /* skip the persistent pass */
} lmc_fault_spec;

/* Runs the scenario once with nothing failing, to count its allocations
 * (that run must return LMC_FAULT_OK), then, for each failure point n, once
 * with the n-th allocation failing (transient) and once with it and every
 * later one failing (persistent).  After each run it requires a scenario
 * result that fits what happened (LMC_FAULT_ERROR only when a failure was
 * injected), no block allocated during the run still live, and a passing
 * check.  Prints one summary line, plus one line per problem.  Returns the
 * number of runs with a problem (0 = pass). */
int lmc_fault_run_spec(const lmc_fault_spec *spec);

/* Shorthand for the common case (both passes, max_n as in the spec). */
int lmc_fault_run(const char *name, int (*scenario)(void *), void *arg,
                  int (*check)(void *), long max_n);

#endif
