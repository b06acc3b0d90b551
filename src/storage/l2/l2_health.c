/* The health of the L2 adapters (docs/l2.md, "Health"): each backend's
 * probe runs once when the tier starts, before the server is ready, then
 * every --l2-health-interval-s seconds on a thread of its own, so a probe
 * that waits on a dead host never delays a request.  Readers (/status,
 * /healthcheck, /metrics) only copy the last verdict. */
#include "storage/l2/l2_health.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/periodic.h"
#include "obs/log.h"

struct lmc_l2_health {
    lmc_l2_adapter *const *ad;     /* borrowed: the service's, outlive us */
    size_t n;
    pthread_mutex_t mu;            /* guards st[] */
    lmc_l2_health_state *st;
    lmc_core_periodic *timer;      /* NULL: probed at start only */
};

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

lmc_l2_health_change lmc_l2_health_record(lmc_l2_health_state *st, bool healthy,
                                          const char *reason, int64_t now_ms)
{
    bool first = st->since_ms == 0;
    bool same_reason = strncmp(st->reason, healthy ? "" : reason, sizeof st->reason - 1) == 0;
    if (!first && st->healthy == healthy && same_reason)
        return LMC_L2_HEALTH_SAME;
    lmc_l2_health_change ch = healthy ? (first ? LMC_L2_HEALTH_SAME : LMC_L2_HEALTH_RECOVERED)
                                      : LMC_L2_HEALTH_FAILED;
    if (first || st->healthy != healthy)
        st->since_ms = now_ms;
    st->healthy = healthy;
    snprintf(st->reason, sizeof st->reason, "%s", healthy ? "" : reason);
    /* A server's error line may hold any byte; /status is JSON text. */
    for (char *p = st->reason; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
            *p = '?';
    return ch;
}

/* Probes adapter i (no lock held while it runs) and logs a change. */
static void probe_one(lmc_l2_health *h, size_t i)
{
    char why[sizeof h->st[i].reason];
    bool ok = lmc_l2_adapter_probe(h->ad[i], why, sizeof why) == 0;
    if (!ok && !why[0])
        snprintf(why, sizeof why, "the probe failed without a reason");
    pthread_mutex_lock(&h->mu);
    lmc_l2_health_change ch = lmc_l2_health_record(&h->st[i], ok, why, wall_ms());
    memcpy(why, h->st[i].reason, sizeof why);
    pthread_mutex_unlock(&h->mu);
    const char *type = lmc_l2_adapter_type(h->ad[i]);
    if (ch == LMC_L2_HEALTH_FAILED)
        LMC_WARN("L2 adapter %zu (%s) unhealthy: %s", i, type, why);
    else if (ch == LMC_L2_HEALTH_RECOVERED)
        LMC_INFO("L2 adapter %zu (%s) healthy again", i, type);
}

static void probe_all(void *user)
{
    lmc_l2_health *h = user;
    for (size_t i = 0; i < h->n; i++)
        probe_one(h, i);
}

lmc_l2_health *lmc_l2_health_new(lmc_l2_adapter *const *ad, size_t n, double period_s)
{
    lmc_l2_health *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->ad = ad;
    h->n = n;
    h->st = calloc(n ? n : 1, sizeof *h->st);
    pthread_mutex_init(&h->mu, NULL);
    if (!h->st)
        goto fail;
    probe_all(h);
    if (n && period_s > 0) {
        h->timer = lmc_core_periodic_start("l2-health", (int64_t)(period_s * 1000), probe_all, h);
        if (!h->timer)
            goto fail;
    }
    return h;
fail:
    lmc_l2_health_free(h);
    return NULL;
}

void lmc_l2_health_free(lmc_l2_health *h)
{
    if (!h)
        return;
    lmc_core_periodic_stop(h->timer);
    pthread_mutex_destroy(&h->mu);
    free(h->st);
    free(h);
}

void lmc_l2_health_get(lmc_l2_health *h, size_t i, lmc_l2_health_state *out)
{
    if (!h || i >= h->n) {
        *out = (lmc_l2_health_state){.healthy = true};
        return;
    }
    pthread_mutex_lock(&h->mu);
    *out = h->st[i];
    pthread_mutex_unlock(&h->mu);
}

int lmc_l2_health_annotate(lmc_l2_health *h, size_t i, json_t *adapter_status)
{
    lmc_l2_health_state st;
    lmc_l2_health_get(h, i, &st);
    int rc = json_object_set_new(adapter_status, "is_healthy", json_boolean(st.healthy));
    rc |= json_object_set_new(adapter_status, "health_reason",
                              st.healthy ? json_null() : json_string(st.reason));
    rc |= json_object_set_new(adapter_status, "health_since_ms", json_integer(st.since_ms));
    return rc ? -1 : 0;
}
