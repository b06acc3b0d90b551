#include "modules/services/reaper.h"

#include <stdlib.h>

#include "core/periodic.h"

struct lmc_reaper {
    lmc_reaper_options o;
    lmc_core_periodic *thread; /* NULL when the options ask for none */
};

void lmc_reaper_set_timeouts(lmc_reaper_options *o, double timeout_s, double grace_s)
{
    const char *env = getenv("LMCACHED_TEST_REAP_SCALE");
    double scale = env ? strtod(env, NULL) : 1.0;
    if (!(scale >= 1.0))
        scale = 1.0;
    o->timeout_ms = (int64_t)(timeout_s * 1000 / scale);
    o->grace_ms = (int64_t)(grace_s * 1000 / scale);
}

static int64_t now_ms(const lmc_reaper *r)
{
    return r->o.clock ? r->o.clock(r->o.clock_user) : lmc_monotonic_ms(NULL);
}

bool lmc_reaper_due(const lmc_reaper_options *o, const lmc_liveness_entry *e, bool known,
                    int64_t now_ms)
{
    if (o->timeout_ms <= 0)
        return false;
    if (!known)
        return true;   /* registered but forgotten by liveness: nothing vouches for it */
    int64_t limit = e->pinged ? o->timeout_ms : o->grace_ms;
    return now_ms - e->last_seen_ms > limit;
}

size_t lmc_reaper_run_once(lmc_reaper *r)
{
    int64_t stack_ids[64], *ids = stack_ids;
    size_t n = r->o.list(r->o.user, ids, 64);
    if (n > 64) {
        ids = malloc(n * sizeof *ids);
        if (!ids)
            return 0;
        size_t m = r->o.list(r->o.user, ids, n);
        n = m < n ? m : n;
    }
    size_t reaped = 0;
    int64_t now = now_ms(r);
    for (size_t i = 0; i < n; i++) {
        lmc_liveness_entry e;
        bool known = lmc_liveness_get(r->o.liveness, ids[i], &e);
        if (lmc_reaper_due(&r->o, &e, known, now)) {
            r->o.reap(r->o.user, ids[i]);
            reaped++;
        }
    }
    if (ids != stack_ids)
        free(ids);
    return reaped;
}

static void reap_once(void *r)
{
    lmc_reaper_run_once(r);
}

lmc_reaper *lmc_reaper_new(const lmc_reaper_options *o)
{
    lmc_reaper *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->o = *o;
    if (r->o.period_ms <= 0)
        r->o.period_ms = r->o.timeout_ms / 4 > 0 ? r->o.timeout_ms / 4 : 1;
    if (o->start_thread && o->timeout_ms > 0) {
        r->thread = lmc_core_periodic_start(NULL, r->o.period_ms, reap_once, r);
        if (!r->thread) {
            free(r);
            return NULL;
        }
    }
    return r;
}

void lmc_reaper_free(lmc_reaper *r)
{
    if (!r)
        return;
    lmc_core_periodic_stop(r->thread);
    free(r);
}
