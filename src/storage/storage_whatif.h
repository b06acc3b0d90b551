/* The trace what-if (docs/trace.md, "What-if"): a storage trace replayed,
 * without a server, against a simulated L1 of a given size that evicts
 * through the server's own policy (eviction_policy.h) and the L1
 * controller's own rules (lmc_l1_eviction_plan, l1_eviction.h).
 *
 * A trace is read once into a compact form (its distinct keys once, each
 * record an op and the indices of its keys), then simulated as often as
 * there are sizes and policies. */
#ifndef LMC_STORAGE_STORAGE_WHATIF_H
#define LMC_STORAGE_STORAGE_WHATIF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/storage_trace_reader.h"

typedef struct lmc_storage_whatif_trace lmc_storage_whatif_trace;

typedef struct {
    uint64_t records;                          /* every record, UNKNOWN ones included */
    uint64_t by_op[LMC_STORAGE_TRACE_UNKNOWN + 1];
    uint64_t distinct_keys;                    /* over every record's keys */
    uint64_t distinct_bytes;                   /* sum of each key's largest reserve_write */
    uint64_t min_object, max_object;           /* over reserve_writes of > 0 bytes; 0: none */
    double t_first, t_last;                    /* t_mono of the first and last record */
} lmc_storage_whatif_summary;

lmc_storage_whatif_trace *lmc_storage_whatif_trace_new(void);
void lmc_storage_whatif_trace_free(lmc_storage_whatif_trace *t);
/* Appends one record (its keys are copied).  0, or -1 out of memory. */
int lmc_storage_whatif_trace_add(lmc_storage_whatif_trace *t, const lmc_trace_record *rec);
void lmc_storage_whatif_trace_summary(const lmc_storage_whatif_trace *t,
                                      lmc_storage_whatif_summary *out);

typedef struct {
    const char *policy;          /* "LRU" or "noop", as --eviction-policy */
    uint64_t l1_bytes;           /* the simulated L1's size */
    double trigger_watermark;    /* as --eviction-trigger-watermark */
    double eviction_ratio;       /* as --eviction-ratio */
} lmc_storage_whatif_config;

typedef struct {
    uint64_t lookups;            /* submit_prefetch_task records */
    uint64_t lookup_keys;        /* their keys */
    uint64_t hit_keys;           /* the leading keys of each that were readable */
    uint64_t evictions;          /* keys the controller evicted */
    uint64_t writes_refused;     /* keys of reserve_writes that did not fit */
} lmc_storage_whatif_result;

/* Whether `name` is a policy lmc_storage_whatif_run accepts. */
bool lmc_storage_whatif_policy_known(const char *name);

/* One simulation.  0, or -1 with a reason in err (an unknown policy,
 * out of memory). */
int lmc_storage_whatif_run(const lmc_storage_whatif_trace *t, const lmc_storage_whatif_config *c,
                           lmc_storage_whatif_result *out, char *err, size_t errlen);

#endif
