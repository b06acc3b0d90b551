/* Per-tenant (cache_salt) L2 quotas (docs/l2.md, "L2 eviction and quotas"):
 * a thread-safe registry
 * of soft limits.  Writes are never refused; the IsolatedLRU L2 eviction
 * enforces the limits, and an unregistered salt has limit 0 ("allowlist":
 * its objects are evicted at the next cycle).  The HTTP quota endpoints
 * call this API. */
#ifndef LMC_STORAGE_QUOTA_H
#define LMC_STORAGE_QUOTA_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct lmc_quotas lmc_quotas;

lmc_quotas *lmc_quotas_new(void);
void lmc_quotas_free(lmc_quotas *q);

/* 0 on success, -1 on allocation failure.  0 bytes is a valid limit. */
int lmc_quotas_set(lmc_quotas *q, const char *salt, uint64_t limit_bytes);
bool lmc_quotas_delete(lmc_quotas *q, const char *salt);
bool lmc_quotas_has(lmc_quotas *q, const char *salt);
/* The salt's limit, 0 when unregistered. */
uint64_t lmc_quotas_get_limit(lmc_quotas *q, const char *salt);
/* Default for unregistered salts (coordinator semantics): has_default
 * false = exempt. */
void lmc_quotas_set_default(lmc_quotas *q, bool has_default, uint64_t limit_bytes);
/* The salt's limit, else the default; false when exempt. */
bool lmc_quotas_effective_limit(lmc_quotas *q, const char *salt, uint64_t *limit_bytes);
/* {"limits": {salt: bytes}, "default_limit_bytes": n | null}; restore()
 * replaces the registry with such an object (capture's output).  -1 when
 * the object is malformed (the registry is unchanged then). */
json_t *lmc_quotas_capture(lmc_quotas *q);
int lmc_quotas_restore(lmc_quotas *q, const json_t *snapshot);

#endif
