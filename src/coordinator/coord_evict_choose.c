/* Which keys one eviction pass asks to delete (docs/coordinator.md,
 * "Usage and eviction"). */
#include <math.h>

#include "coordinator/coord_state.h"

size_t coordinator_evict_choose(const coordinator_state *s, uint32_t salt, double ratio, uint32_t *out,
                          size_t max)
{
    double limit = 0;
    if (salt >= s->salt_cap || !coordinator_quota_limit(s, salt, &limit))
        return 0;
    const coordinator_salt *sa = &s->salt[salt];
    uint64_t want = limit <= 0 ? sa->l2_count : (uint64_t)ceil(ratio * (double)sa->l2_count);
    size_t n = 0;
    for (uint32_t i = sa->lru_head; i != COORD_NONE && n < want && n < max;
         i = s->keys.e[i].lru_next) {
        if (!s->keys.e[i].pins)
            out[n++] = i;
    }
    return n;
}
