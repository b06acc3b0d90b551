/* Prefetch-job registry: one job per request id, created by LOOKUP and
 * consumed by the first QUERY/WAIT_PREFETCH_STATUS that sees it done.
 *
 * A job is RUNNING from submit() until complete(); an L1-only LOOKUP
 * completes it at once, an L2 prefetch completes it from its own thread.  WAIT_PREFETCH_STATUS never blocks a thread: wait() either
 * answers at once or parks a waiter callback that complete(), drop(),
 * a timeout (expire(), driven by the registry's timer thread or by tests
 * with an injected clock) or free() calls exactly once.
 *
 * Thread-safe.  Callbacks run without the registry lock held. */
#ifndef LMC_MODULES_SERVICES_PREFETCH_JOBS_H
#define LMC_MODULES_SERVICES_PREFETCH_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/ttl_lock.h"

typedef enum {
    LMC_JOB_UNKNOWN,   /* no job (never submitted, consumed, or dropped): answer 0 */
    LMC_JOB_RUNNING,   /* not done yet: answer None */
    LMC_JOB_DONE,      /* done: *hits holds the result, the job is consumed */
    LMC_JOB_WAITING,   /* wait() parked the callback */
} lmc_job_status;

/* st: DONE (hits = result), UNKNOWN (answer 0) or RUNNING (timed out or
 * shutting down: answer None). */
typedef void (*lmc_job_waiter_fn)(void *user, lmc_job_status st, int64_t hits);

typedef struct {
    size_t max_jobs;          /* bound; the least recently used job goes first */
    size_t max_waiters;       /* parked waits, all jobs; past it wait() answers RUNNING
                               * at once.  0: 4096 */
    int64_t max_age_ms;       /* jobs idle longer are dropped on submit; 0 = never */
    lmc_clock_ms_fn clock;    /* NULL: CLOCK_MONOTONIC */
    void *clock_user;
    bool timer_thread;        /* false: the owner calls expire() (tests) */
} lmc_jobs_options;

typedef struct lmc_jobs lmc_jobs;

lmc_jobs *lmc_jobs_new(const lmc_jobs_options *o);
/* Stops the timer; parked waiters get RUNNING (None). */
void lmc_jobs_free(lmc_jobs *j);

/* Registers a RUNNING job for rid, replacing an older one in place (its
 * waiters keep waiting for the new result).  *replaced_unconsumed tells
 * whether an older job existed that nobody had consumed yet.  Returns the
 * job's id (never 0), or 0 when out of memory. */
uint64_t lmc_jobs_submit(lmc_jobs *j, const char *rid, size_t len, bool *replaced_unconsumed);
/* The lookup phase is over (QUERY_PREFETCH_LOOKUP_HITS may answer). */
void lmc_jobs_set_lookup_hits(lmc_jobs *j, const char *rid, size_t len, uint64_t id,
                              int64_t hits);
/* Finishes job `id` (ignored if it was replaced or dropped meanwhile).  The
 * first parked waiter receives the result and consumes the job. */
void lmc_jobs_complete(lmc_jobs *j, const char *rid, size_t len, uint64_t id, int64_t hits);

/* True while job `id` is rid's job and not yet completed (an asynchronous
 * prefetch checks that its result still belongs to the request). */
bool lmc_jobs_is_current(lmc_jobs *j, const char *rid, size_t len, uint64_t id);

/* QUERY_PREFETCH_STATUS: DONE (consumed), RUNNING or UNKNOWN. */
lmc_job_status lmc_jobs_query(lmc_jobs *j, const char *rid, size_t len, int64_t *hits);
/* QUERY_PREFETCH_LOOKUP_HITS: DONE with *hits once the lookup phase is
 * over (not consuming), RUNNING before, UNKNOWN without a job. */
lmc_job_status lmc_jobs_lookup_hits(lmc_jobs *j, const char *rid, size_t len, int64_t *hits);
/* WAIT_PREFETCH_STATUS: DONE/UNKNOWN at once (fn not called), or WAITING
 * when fn(user, ...) will be called later, at the latest after timeout_ms;
 * RUNNING at once (fn not called) when max_waiters are parked already. */
lmc_job_status lmc_jobs_wait(lmc_jobs *j, const char *rid, size_t len, int64_t timeout_ms,
                             lmc_job_waiter_fn fn, void *user, int64_t *hits);
/* Removes rid's job; its waiters get UNKNOWN.  True if an unconsumed job
 * was dropped. */
bool lmc_jobs_drop(lmc_jobs *j, const char *rid, size_t len);
/* Times out waiters whose deadline has passed; returns how many. */
size_t lmc_jobs_expire(lmc_jobs *j);

size_t lmc_jobs_count(lmc_jobs *j);
size_t lmc_jobs_waiter_count(lmc_jobs *j);

#endif
