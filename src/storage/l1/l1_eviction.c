#include "storage/l1/l1_eviction.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/periodic.h"
#include "obs/log.h"

struct lmc_l1_eviction {
    lmc_l1_manager *l1;
    lmc_eviction_policy *policy;
    lmc_l1_eviction_options opts;
    pthread_mutex_t mutex;       /* guards the fields below */
    lmc_core_periodic *thread;   /* NULL when not running */
    uint64_t cycles, triggered_cycles, evicted_keys;
    double last_usage_ratio;
};

void lmc_l1_eviction_feed(lmc_eviction_policy *policy, lmc_l1_event_kind kind,
                          const lmc_object_key *keys, size_t n)
{
    switch (kind) {
    case LMC_L1_EVENT_WRITE_RESERVED:
    case LMC_L1_EVENT_WRITE_FINISHED:
    case LMC_L1_EVENT_WRITE_FINISHED_READ_RESERVED:
        policy->ops->on_keys_added(policy, keys, n);
        break;
    case LMC_L1_EVENT_ACCESSED:
        policy->ops->on_keys_accessed(policy, keys, n);
        break;
    case LMC_L1_EVENT_DELETED:
        policy->ops->on_keys_removed(policy, keys, n);
        break;
    default:
        break;
    }
}

static void feed_policy(void *user, lmc_l1_event_kind kind, const lmc_object_key *keys,
                        size_t n)
{
    lmc_l1_eviction_feed(user, kind, keys, n);
}

static lmc_l1_evictability ask_l1(void *user, const lmc_object_key *key)
{
    return lmc_l1_manager_is_evictable(user, key);
}

lmc_l1_eviction *lmc_l1_eviction_new(lmc_l1_manager *l1, lmc_eviction_policy *policy,
                                     const lmc_l1_eviction_options *opts)
{
    lmc_l1_eviction *e = calloc(1, sizeof(*e));
    if (!e || !policy)
        goto fail;
    e->l1 = l1;
    e->policy = policy;
    e->opts = *opts;
    if (lmc_l1_manager_add_listener(l1, feed_policy, policy) != 0)
        goto fail;
    pthread_mutex_init(&e->mutex, NULL);
    return e;
fail:
    lmc_eviction_policy_free(policy);
    free(e);
    return NULL;
}

bool lmc_l1_eviction_triggered(uint64_t used, uint64_t total, double trigger_watermark)
{
    return total > 0 && (double)used / (double)total >= trigger_watermark;
}

size_t lmc_l1_eviction_plan(uint64_t used, uint64_t total, size_t tracked,
                            double trigger_watermark, double ratio)
{
    if (!lmc_l1_eviction_triggered(used, total, trigger_watermark))
        return 0;
    if (tracked == 0 || ratio <= 0)
        return 0;
    size_t target = (size_t)((double)tracked * ratio);   /* floor: both >= 0 */
    if (target == 0)
        target = 1;
    return target > tracked ? tracked : target;
}

/* Reports the evicted keys (compacted in place) to the observer. */
static void report_evicted(lmc_l1_eviction *e, lmc_object_key *victims, lmc_l1_object_age *ages,
                           const lmc_l1_result *results, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (results[i] != LMC_L1_SUCCESS)
            continue;
        victims[k] = victims[i];
        ages[k++] = ages[i];
    }
    if (k > 0)
        e->opts.on_evicted(e->opts.observer_user, victims, ages, k);
}

static size_t evict_victims(lmc_l1_eviction *e, size_t target)
{
    lmc_object_key *victims = malloc(target * sizeof(*victims));
    lmc_l1_result *results = malloc(target * sizeof(*results));
    lmc_l1_object_age *ages = e->opts.on_evicted ? malloc(target * sizeof(*ages)) : NULL;
    size_t evicted = 0, n = 0;
    if (!victims || !results || (e->opts.on_evicted && !ages)) {
        LMC_WARN("L1 eviction: out of memory for %zu victims", target);
        goto out;
    }
    n = e->policy->ops->select_victims(e->policy, target, ask_l1, e->l1, victims);
    if (n == 0 || lmc_l1_manager_delete_aged(e->l1, victims, n, false, ages, results) != 0)
        goto out;
    for (size_t i = 0; i < n; i++)
        evicted += results[i] == LMC_L1_SUCCESS;
    if (ages)
        report_evicted(e, victims, ages, results, n);
out:
    if (victims)
        lmc_keys_drop(victims, n);
    free(victims);
    free(results);
    free(ages);
    return evicted;
}

size_t lmc_l1_eviction_run_once(lmc_l1_eviction *e)
{
    uint64_t used, total;
    lmc_l1_manager_usage(e->l1, &used, &total);
    double ratio = total ? (double)used / (double)total : 0.0;
    bool triggered = lmc_l1_eviction_triggered(used, total, e->opts.trigger_watermark);
    size_t evicted = 0;
    if (triggered) {
        size_t target = lmc_l1_eviction_plan(used, total, e->policy->ops->num_tracked(e->policy),
                                             e->opts.trigger_watermark, e->opts.eviction_ratio);
        if (target > 0)
            evicted = evict_victims(e, target);
        LMC_DEBUG("L1 eviction: usage %.3f >= %.3f, evicted %zu of %zu targeted", ratio,
                  e->opts.trigger_watermark, evicted, target);
    }
    pthread_mutex_lock(&e->mutex);
    e->cycles++;
    e->triggered_cycles += triggered;
    e->evicted_keys += evicted;
    e->last_usage_ratio = ratio;
    pthread_mutex_unlock(&e->mutex);
    if (e->opts.on_cycle)
        e->opts.on_cycle(e->opts.observer_user, ratio, triggered);
    return evicted;
}

static void run_cycle(void *e)
{
    lmc_l1_eviction_run_once(e);
}

int lmc_l1_eviction_start(lmc_l1_eviction *e)
{
    if (e->opts.period_ms == 0)
        return 0;
    pthread_mutex_lock(&e->mutex);
    if (!e->thread)
        e->thread = lmc_core_periodic_start(NULL, e->opts.period_ms, run_cycle, e);
    int rc = e->thread ? 0 : -1;
    pthread_mutex_unlock(&e->mutex);
    return rc;
}

void lmc_l1_eviction_stop(lmc_l1_eviction *e)
{
    pthread_mutex_lock(&e->mutex);
    lmc_core_periodic *thread = e->thread;
    e->thread = NULL;
    pthread_mutex_unlock(&e->mutex);
    lmc_core_periodic_stop(thread); /* unlocked: its last cycle takes the mutex */
}

const char *lmc_l1_eviction_policy_name(const lmc_l1_eviction *e)
{
    return e->policy->ops->name;
}

double lmc_l1_eviction_trigger_watermark(const lmc_l1_eviction *e)
{
    return e->opts.trigger_watermark;
}

json_t *lmc_l1_eviction_report_status(lmc_l1_eviction *e)
{
    size_t tracked = e->policy->ops->num_tracked(e->policy);
    pthread_mutex_lock(&e->mutex);
    json_t *st = json_pack("{s:b, s:b, s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:f, s:I}",
                           "is_healthy", 1, "running", e->thread != NULL,
                           "eviction_policy", e->policy->ops->name,
                           "trigger_watermark", e->opts.trigger_watermark,
                           "eviction_ratio", e->opts.eviction_ratio,
                           "num_tracked_keys", (json_int_t)tracked,
                           "cycles", (json_int_t)e->cycles,
                           "triggered_cycles", (json_int_t)e->triggered_cycles,
                           "evicted_keys", (json_int_t)e->evicted_keys,
                           "last_usage_ratio", e->last_usage_ratio,
                           "period_ms", (json_int_t)e->opts.period_ms);
    pthread_mutex_unlock(&e->mutex);
    return st;
}

lmc_l1_eviction_counts lmc_l1_eviction_get_counts(lmc_l1_eviction *e)
{
    pthread_mutex_lock(&e->mutex);
    lmc_l1_eviction_counts c = {e->cycles, e->triggered_cycles, e->evicted_keys};
    pthread_mutex_unlock(&e->mutex);
    return c;
}

void lmc_l1_eviction_free(lmc_l1_eviction *e)
{
    if (!e)
        return;
    lmc_l1_eviction_stop(e);
    lmc_l1_manager_remove_listener(e->l1, feed_policy, e->policy);
    lmc_eviction_policy_free(e->policy);
    pthread_mutex_destroy(&e->mutex);
    free(e);
}
