#include "storage/eviction_policy.h"

#include <string.h>

lmc_eviction_policy *lmc_eviction_policy_new(const char *name)
{
    if (!name)
        return NULL;
    if (strcmp(name, "LRU") == 0)
        return lmc_eviction_policy_lru_new();
    if (strcmp(name, "noop") == 0)
        return lmc_eviction_policy_noop_new();
    return NULL;
}

void lmc_eviction_policy_free(lmc_eviction_policy *p)
{
    if (p)
        p->ops->destroy(p);
}
