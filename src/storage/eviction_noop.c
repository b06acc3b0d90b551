/* "noop": tracks nothing and never evicts. */
#include <stdlib.h>

#include "storage/eviction_policy.h"

static void ignore_keys(lmc_eviction_policy *p, const lmc_object_key *keys, size_t n)
{
    (void)p;
    (void)keys;
    (void)n;
}

static size_t select_nothing(lmc_eviction_policy *p, size_t max, lmc_evictable_fn evictable,
                             void *user, lmc_object_key *out)
{
    (void)p;
    (void)max;
    (void)evictable;
    (void)user;
    (void)out;
    return 0;
}

static size_t track_nothing(lmc_eviction_policy *p)
{
    (void)p;
    return 0;
}

static void destroy_noop(lmc_eviction_policy *p)
{
    free(p);
}

static const lmc_eviction_policy_ops noop_ops = {
    .name = "noop",
    .on_keys_added = ignore_keys,
    .on_keys_accessed = ignore_keys,
    .on_keys_removed = ignore_keys,
    .select_victims = select_nothing,
    .num_tracked = track_nothing,
    .destroy = destroy_noop,
};

lmc_eviction_policy *lmc_eviction_policy_noop_new(void)
{
    lmc_eviction_policy *p = malloc(sizeof(*p));
    if (p)
        p->ops = &noop_ops;
    return p;
}
