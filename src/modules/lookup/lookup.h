/* What the lookup module offers the modules above it: the LOOKUP that
 * CB_UNIFIED_LOOKUP's prefix leg makes (docs/cacheblend.md, "Unified
 * lookup"), leaving exactly the session, job and read locks a LOOKUP
 * leaves, so that RETRIEVE, FREE_LOOKUP_LOCKS and END_SESSION treat them
 * alike.  `lookup` is the module's state (lmc_module_ctx.lookup). */
#ifndef LMC_MODULES_LOOKUP_LOOKUP_H
#define LMC_MODULES_LOOKUP_LOOKUP_H

#include <stddef.h>
#include <stdint.h>

#include "modules/services/ipc_key.h"
#include "modules/services/prefetch_jobs.h"

/* LOOKUP of k, run in the caller's thread up to the L2 prefetch (which
 * completes the job later).  0, or -1 out of memory. */
int lmc_lookup_prefix_begin(void *lookup, const lmc_ipc_key *k);
/* QUERY_PREFETCH_STATUS of rid: RUNNING, DONE (consumed, *hits chunks,
 * recorded on the session as delivered) or UNKNOWN. */
lmc_job_status lmc_lookup_prefix_poll(void *lookup, const char *rid, size_t len, int64_t *hits);

#endif
