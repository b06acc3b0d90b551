/* Quota arithmetic (docs/coordinator.md, "Quotas"): limits are in GB of
 * 2^30 bytes, soft, and enforced only by the fleet eviction loop. */
#include "coordinator/coord_state.h"

bool coordinator_quota_limit(const coordinator_state *s, uint32_t salt, double *limit_bytes)
{
    if (salt < s->salt_cap && s->salt[salt].has_quota) {
        *limit_bytes = s->salt[salt].quota_gb * COORD_GB;
        return true;
    }
    if (s->has_default_quota) {
        *limit_bytes = s->default_quota_gb * COORD_GB;
        return true;
    }
    return false;
}

bool coordinator_quota_over(const coordinator_state *s, uint32_t salt, double watermark)
{
    double limit;
    if (salt >= s->salt_cap || !coordinator_quota_limit(s, salt, &limit))
        return false;
    const coordinator_salt *sa = &s->salt[salt];
    if (limit <= 0)
        return sa->l2_count > 0; /* a zero quota: every key goes */
    return (double)sa->l2_bytes >= watermark * limit;
}
